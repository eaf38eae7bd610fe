"""The Celery application of the worker process: `celery -A worker.celery_app worker` (or `vips worker`)."""

from __future__ import annotations

from celery import Celery

from service.settings import get_settings


def create_celery() -> Celery:
    app = Celery("vips", include=["worker.tasks"])
    app.conf.update(get_settings().celery_config())
    return app


app = create_celery()
