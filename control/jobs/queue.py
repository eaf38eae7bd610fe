"""The job queue as the API sees it: work is sent by task NAME; the API never imports worker code."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any, Protocol, cast

from celery import Celery

from control.settings import RUN_JOB_TASK, WORKER_STALE_SECONDS, ServiceSettings

log = logging.getLogger(__name__)

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

    def holds(self, job_ids: AbstractSet[str], taken: bool = True) -> set[str] | None:
        """Those of `job_ids` whose task the broker still holds (waiting, or with `taken` also delivered
        and not acknowledged), from one read of the broker; None when that cannot be told (the broker is
        unreachable)."""
        ...

    def check_workers(self) -> None:
        """Raise unless a worker is alive (the readiness probe)."""
        ...

    def close(self) -> None: ...


class CeleryQueue:
    """A Celery client that only sends: configured like the worker (control.settings.celery_config)."""

    def __init__(self, settings: ServiceSettings) -> None:
        self._config: dict[str, Any] = settings.celery_config()
        self._alive_path = settings.worker_alive_path()
        self._celery = Celery("vips-api", set_as_current=False)
        self._celery.conf.update(self._config)

    def send_run_job(self, job_id: str) -> None:
        send_run_job(self._celery, job_id)

    def holds(self, job_ids: AbstractSet[str], taken: bool = True) -> set[str] | None:
        """One pass over the broker's messages: a job is held when a message names its id (its task id)."""
        held: set[str] = set()
        if not job_ids:
            return held
        try:
            for message in self._messages(taken):
                held.update(job_id for job_id in job_ids if job_id in message)
        except Exception as exc:  # unreachable or unreadable: cannot tell, so nothing is reaped for it
            log.warning("could not read the broker's queue (%s)", type(exc).__name__)
            return None
        return held

    def _messages(self, taken: bool) -> Iterator[str]:
        """Every message the broker holds for the default queue, as text: the file-system broker's
        files (a taken one was renamed away), or Redis's queue lists (one per priority step) and, with
        `taken`, its unacknowledged deliveries."""
        options = self._config.get("broker_transport_options", {})
        if self._config["broker_url"] == "filesystem://":
            for path in Path(options["data_folder_out"]).iterdir():
                with contextlib.suppress(FileNotFoundError):  # consumed while we looked
                    yield path.read_text(errors="replace")
            return
        import redis

        client = redis.Redis.from_url(self._config["broker_url"], socket_timeout=BROKER_PROBE_TIMEOUT_SECONDS)
        try:
            queue = self._celery.conf.task_default_queue
            lists = [queue, *(f"{queue}\x06\x16{step}" for step in (3, 6, 9))]  # kombu's priority lists
            held: list[bytes] = [m for key in lists for m in cast(list[bytes], client.lrange(key, 0, -1))]
            if taken:
                held += cast(list[bytes], client.hvals("unacked"))
            for message in held:
                yield message.decode(errors="replace")
        finally:
            client.close()

    def check(self) -> None:
        options = self._config.get("broker_transport_options", {})
        if self._config["broker_url"] == "filesystem://":
            for key in ("data_folder_in", "data_folder_out", "processed_folder", "staging_folder"):
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


def send_run_job(celery: Celery, job_id: str, countdown: float | None = None) -> None:
    """Queue the job's task, by name, with the job id as the task id (so the broker's messages name it)."""
    celery.send_task(RUN_JOB_TASK, args=[job_id], task_id=job_id, countdown=countdown)


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

    def holds(self, job_ids: AbstractSet[str], taken: bool = True) -> set[str] | None:
        return None if self.fail else {job_id for job_id in job_ids if job_id in self.sent}

    def close(self) -> None:
        return None
