"""The job queue as the API sees it: work is sent by task NAME; the API never imports worker code."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from celery import Celery

from service.settings import RUN_JOB_TASK, ServiceSettings

#: How long the readiness probe waits for the broker, in seconds.
BROKER_PROBE_TIMEOUT_SECONDS = 3.0


class JobQueue(Protocol):
    """What the API needs from a queue; tests substitute a recorder."""

    def send_run_job(self, job_id: str) -> None:
        """Queue the job; raise if the broker did not take it."""
        ...

    def check(self) -> None:
        """Raise if the broker cannot be reached (the readiness probe)."""
        ...

    def close(self) -> None: ...


class CeleryQueue:
    """A Celery client that only sends: configured like the worker (service.settings.celery_config)."""

    def __init__(self, settings: ServiceSettings) -> None:
        self._config: dict[str, Any] = settings.celery_config()
        self._celery = Celery("vips-api", set_as_current=False)
        self._celery.conf.update(self._config)

    def send_run_job(self, job_id: str) -> None:
        self._celery.send_task(RUN_JOB_TASK, args=[job_id])

    def check(self) -> None:
        options = self._config.get("broker_transport_options", {})
        if self._config["broker_url"] == "filesystem://":
            for key in ("data_folder_in", "data_folder_out", "processed_folder"):
                if not Path(options[key]).is_dir():
                    raise RuntimeError(f"the broker folder {options[key]} does not exist")
            return
        with self._celery.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, timeout=BROKER_PROBE_TIMEOUT_SECONDS)

    def close(self) -> None:
        self._celery.close()


class RecordingQueue:
    """A queue that records the job ids it was given (tests, dry setups); `fail` makes sending raise."""

    def __init__(self, *, fail: bool = False) -> None:
        self.sent: list[str] = []
        self.fail = fail

    def send_run_job(self, job_id: str) -> None:
        if self.fail:
            raise ConnectionError("the broker refused the task")
        self.sent.append(job_id)

    def check(self) -> None:
        if self.fail:
            raise ConnectionError("the broker is unreachable")

    def close(self) -> None:
        return None
