"""The embedded workers under `vips up`: child processes (`vips worker`, and `vips worker --shard K` per
shard), each restarted when it dies.

When the job worker dies, every job it was running is failed at once with a message that says so, and
its unspent reservation refunded (there is one job worker in the embedded mode, so every running job was
its); then a new worker starts, after a short back-off if the last one died young. A shard worker's death
fails no job: its replacement answers the shard's tasks that the coordinator sends again
(privacy_wall.shards). When the supervisor
itself dies (even by SIGKILL), its worker notices within ORPHAN_POLL_SECONDS and ends too (its job
processes with it), so no orphaned worker serves a store that a later `vips up` may take.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from sqlalchemy import Engine

from service.jobs.reaper import fail_running_jobs

log = logging.getLogger(__name__)

#: How often the supervisor looks at the worker (seconds), and the longest back-off between restarts.
POLL_SECONDS = 0.5
MAX_BACKOFF_SECONDS = 30.0
#: The environment variable naming the supervising process, and how often its worker checks on it.
SUPERVISOR_PID_ENV = "VIPS_SUPERVISOR_PID"
ORPHAN_POLL_SECONDS = 1.0


def end_when_orphaned() -> None:
    """In a supervised worker: a daemon thread that kills this process (SIGKILL, as if it had died with its
    supervisor; its jobs end as a killed worker's do) once its parent is no longer the supervisor."""
    supervisor = os.environ.get(SUPERVISOR_PID_ENV)
    if supervisor is None or not supervisor.isdigit():
        return

    def watch() -> None:
        while os.getppid() == int(supervisor):
            time.sleep(ORPHAN_POLL_SECONDS)
        log.warning("the supervising `vips up` is gone; this worker ends with it")
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


class WorkerSupervisor:
    """Starts `vips worker` (`--shard K` with `shard`) with `env`, logging to `log_path`, and keeps it
    running until `stop()`."""

    def __init__(
        self,
        env: dict[str, str],
        log_path: Path,
        control: Engine,
        alive_path: Path | None,
        shard: int | None = None,
    ) -> None:
        """`alive_path`: the file the job worker touches (/readyz reads it); removed when it dies."""
        self._env = env
        self._shard = shard
        self._alive_path = alive_path
        self._log_path = log_path
        self._control = control
        self._stop = threading.Event()
        self._process = self._start()
        self.restarts = 0
        self._thread = threading.Thread(target=self._watch, name="worker-supervisor", daemon=True)
        self._thread.start()

    @property
    def pid(self) -> int:
        return self._process.pid

    def _start(self) -> subprocess.Popen[bytes]:
        shard = self._shard
        with self._log_path.open("ab") as out:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "vips.cli",
                    "worker",
                    *([] if shard is None else ["--shard", str(shard)]),
                ],
                env={**self._env, SUPERVISOR_PID_ENV: str(os.getpid())},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        pid_file = "worker.pid" if shard is None else f"shard-{shard}.pid"
        (self._log_path.parent / pid_file).write_text(f"{process.pid}\n")
        return process

    def _watch(self) -> None:
        backoff = 1.0
        started = time.monotonic()
        while not self._stop.wait(POLL_SECONDS):
            code = self._process.poll()
            if code is None:
                continue
            if self._shard is not None:
                print(
                    f"vips: shard worker {self._shard} died (exit status {code}); restarting it",
                    file=sys.stderr,
                )
            else:
                self._job_worker_died(code)
            backoff = 1.0 if time.monotonic() - started > 60 else min(backoff * 2, MAX_BACKOFF_SECONDS)
            if self._stop.wait(backoff):
                return
            self._process = self._start()
            self.restarts += 1
            started = time.monotonic()

    def _job_worker_died(self, code: int) -> None:
        """Fail and refund the dead job worker's running jobs."""
        if self._alive_path is not None:
            self._alive_path.unlink(missing_ok=True)  # /readyz: no live worker until the next one starts
        message = (
            f"the embedded worker running this job died (exit status {code}); the job was failed "
            "and its unspent budget refunded"
        )
        try:
            failed = fail_running_jobs(self._control, message)
        except Exception:  # the reaper will fail them once their heartbeat is stale
            log.exception("could not fail the dead worker's jobs")
            failed = []
        print(
            f"vips: the worker died (exit status {code}); {len(failed)} running job(s) failed and "
            "refunded; restarting it",
            file=sys.stderr,
        )

    def stop(self, timeout: float = 20.0) -> None:
        """Stop supervising, then stop the worker (SIGTERM, then SIGKILL after `timeout`)."""
        self._stop.set()
        self._thread.join()
        self._process.terminate()
        try:
            self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
