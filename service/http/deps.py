"""Typed dependencies: the per-app settings, control-database engine and job queue (on app.state)."""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import Depends, Request
from sqlalchemy import Engine

from control.jobs.queue import JobQueue
from control.settings import ServiceSettings


def get_app_settings(request: Request) -> ServiceSettings:
    return cast(ServiceSettings, request.app.state.settings)


def get_engine(request: Request) -> Engine:
    return cast(Engine, request.app.state.engine)


def get_queue(request: Request) -> JobQueue:
    return cast(JobQueue, request.app.state.queue)


SettingsDep = Annotated[ServiceSettings, Depends(get_app_settings)]
#: The control database. Routes get the engine, not a session: the ledger runs its own transactions
#: (each admission locks its budget row), so a request-wide session would only hold locks longer.
EngineDep = Annotated[Engine, Depends(get_engine)]
QueueDep = Annotated[JobQueue, Depends(get_queue)]
