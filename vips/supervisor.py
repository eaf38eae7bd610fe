"""The embedded workers under `vips up`: child processes (`vips worker`, and `vips worker --shard K` per
shard), each restarted when it dies.

When the job worker dies, every job it was running is failed at once with a message that says so, and
its unspent reservation refunded (there is one job worker in the embedded mode, so every running job was
its); then a new worker starts, after a short back-off if the last one died young. A shard worker's death
fails no job: its replacement answers the shard's tasks that the coordinator sends again
(privacy_wall.shards). A worker that stops without dying (SIGSTOP, a hung process) is found by its alive
file, which it touches every WORKER_ALIVE_SECONDS: once its time stamp has not moved for `stall_seconds`
of this process's monotonic clock (VIPS_WORKER_STALL_SECONDS, 30 s, as a full-mode shard lease goes stale)
the worker is killed, with its job processes (found through Linux's /proc), and replaced like a dead one.
A hang inside one job process, its worker still alive, is the job's heartbeat's to find. When the
supervisor itself dies (even by SIGKILL), its worker notices within ORPHAN_POLL_SECONDS and ends too (its
job processes with it), so no orphaned worker serves a store that a later `vips up` may take.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from sqlalchemy import Engine

from control.jobs.reaper import fail_running_jobs

log = logging.getLogger(__name__)

#: How often the supervisor looks at the worker (seconds), and the longest back-off between restarts.
POLL_SECONDS = 0.5
MAX_BACKOFF_SECONDS = 30.0
#: The environment variable naming the supervising process, and how often its worker checks on it.
SUPERVISOR_PID_ENV = "VIPS_SUPERVISOR_PID"
ORPHAN_POLL_SECONDS = 1.0
#: A worker that has not touched its alive file this long after its start never came up: it is killed and
#: replaced, as one whose file is older than the settings' worker_stall_seconds.
STARTUP_SECONDS = 300.0


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


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (children first, then theirs), from Linux's /proc/PID/task/*/children;
    none where /proc does not say."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
        for child in children:
            found += [child, *descendants(child)]
    return found


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
        stall_seconds: float = 30.0,  # the settings' worker_stall_seconds default
    ) -> None:
        """`alive_path`: the file the worker touches while it lives (the job worker's is read by /readyz
        too); removed when it dies. None: the worker is watched for its exit only."""
        self._env = env
        self._stall_seconds = stall_seconds
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
        # Signs of life are changes of the alive file's time stamp, timed on this process's monotonic clock
        # (no false alarm after a suspend, a clock step or a file system whose clock differs).
        self._last_sign = time.monotonic()
        self._seen: float | None = self._stamp()
        self._touched = False
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
                stalled = self._stalled()
                if stalled is None:
                    continue
                print(f"vips: {self._name()} {stalled}; killing it", file=sys.stderr)
                below = descendants(self._process.pid)  # before the worker dies and they are re-parented
                for pid in [self._process.pid, *below]:  # the worker first: it starts no replacement
                    with contextlib.suppress(ProcessLookupError):  # SIGKILL ends a stopped process too
                        os.kill(pid, signal.SIGKILL)
                code = self._process.wait()
            if self._alive_path is not None:
                self._alive_path.unlink(missing_ok=True)  # the next process's own touches count
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

    def _name(self) -> str:
        return "the worker" if self._shard is None else f"shard worker {self._shard}"

    def _stamp(self) -> float | None:
        """The alive file's time stamp, None without one."""
        if self._alive_path is None:
            return None
        try:
            return self._alive_path.stat().st_mtime
        except FileNotFoundError:
            return None

    def _stalled(self) -> str | None:
        """Why the running worker counts as stalled (no new time stamp on its alive file for stall_seconds,
        or none at all for STARTUP_SECONDS since its start), or None."""
        if self._alive_path is None:
            return None
        now, stamp = time.monotonic(), self._stamp()
        if stamp is not None and stamp != self._seen:
            self._seen, self._last_sign, self._touched = stamp, now, True
        quiet = now - self._last_sign
        if not self._touched:
            return f"has not come up in {quiet:.0f} s" if quiet > STARTUP_SECONDS else None
        if quiet > self._stall_seconds:
            return f"stopped answering ({quiet:.0f} s without a sign of life)"
        return None

    def _job_worker_died(self, code: int) -> None:
        """Fail and refund the dead job worker's running jobs (/readyz: no live worker until the next one
        starts, its alive file being gone)."""
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
