"""Liveness and readiness probes (no authentication)."""

from __future__ import annotations

import logging

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from control.schemas import Health, Readiness
from control.store.db import ping
from service.http.deps import EngineDep, QueueDep

log = logging.getLogger(__name__)

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    """The process is up (touches nothing)."""
    return Health()


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
def readyz(engine: EngineDep, queue: QueueDep) -> JSONResponse:
    """The control database answers SELECT 1, the broker is reachable and a worker is alive; 503 names
    what failed."""
    checks: dict[str, str] = {}
    try:
        ping(engine)
        checks["database"] = "ok"
    except Exception as exc:  # the probe reports any failure; details go to the log only
        log.warning("readiness: control database check failed: %s", type(exc).__name__)
        checks["database"] = f"the control database is unreachable ({type(exc).__name__})"
    try:
        queue.check()
        checks["broker"] = "ok"
    except Exception as exc:
        log.warning("readiness: broker check failed: %s", type(exc).__name__)
        checks["broker"] = f"the broker is unreachable ({type(exc).__name__})"
    try:
        queue.check_workers()
        checks["worker"] = "ok"
    except Exception as exc:
        log.warning("readiness: worker check failed: %s", exc)
        checks["worker"] = f"no live worker ({exc})"
    ready = all(v == "ok" for v in checks.values())
    body = Readiness(status="ok" if ready else "unavailable", checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)
