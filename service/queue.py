"""The job queue as the API sees it: work is sent by task NAME; the API never imports worker code."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

from celery import Celery

from service.settings import RUN_JOB_TASK, WORKER_STALE_SECONDS, ServiceSettings

#: How long the readiness probe waits for the broker, and for workers to answer a ping, in seconds.
BROKER_PROBE_TIMEOUT_SECONDS = 3.0
WORKER_PROBE_TIMEOUT_SECONDS = 1.0


class JobQueue(Protocol):
    """What the API needs from a queue; tests substitute a recorder."""

    def send_run_job(self, job_id: str) -> None:
        """Queue the job; raise if the broker did not take it."""
        ...

    def check(self) -> None:
        """Raise if the broker cannot be reached (the readiness probe)."""
        ...

    def check_workers(self) -> None:
        """Raise unless a worker is alive (the readiness probe)."""
        ...

    def close(self) -> None: ...


class CeleryQueue:
    """A Celery client that only sends: configured like the worker (service.settings.celery_config)."""

    def __init__(self, settings: ServiceSettings) -> None:
        self._config: dict[str, Any] = settings.celery_config()
        self._alive_path = settings.worker_alive_path()
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

    def check_workers(self) -> None:
        if self._config["broker_url"] == "filesystem://":  # embedded: the worker's alive file
            try:
                age = time.time() - self._alive_path.stat().st_mtime
            except FileNotFoundError:
                raise RuntimeError("no worker has started") from None
            if age > WORKER_STALE_SECONDS:
                raise RuntimeError(f"the worker last reported {age:.0f} s ago")
            return
        if not self._celery.control.ping(timeout=WORKER_PROBE_TIMEOUT_SECONDS):
            raise RuntimeError("no worker answered a ping")

    def close(self) -> None:
        self._celery.close()


class RecordingQueue:
    """A queue that records the job ids it was given (tests, dry setups); `fail` makes sending raise."""

    def __init__(self, *, fail: bool = False, workers: bool = True) -> None:
        self.sent: list[str] = []
        self.fail = fail
        self.workers = workers

    def send_run_job(self, job_id: str) -> None:
        if self.fail:
            raise ConnectionError("the broker refused the task")
        self.sent.append(job_id)

    def check(self) -> None:
        if self.fail:
            raise ConnectionError("the broker is unreachable")

    def check_workers(self) -> None:
        if not self.workers:
            raise RuntimeError("no worker answered a ping")

    def close(self) -> None:
        return None
