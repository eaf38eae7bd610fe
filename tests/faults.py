"""Tools to inject faults into a running service: a TCP proxy that can be cut (a database that becomes
unreachable for the processes behind it) and a private Redis that can be restarted without persistence;
and what the fault tests check afterwards: waiting for a state, every job accounted for."""

from __future__ import annotations

import contextlib
import random
import shutil
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from control.store.models import jobs, releases
from privacy_wall.ledger.schema import charges, reservations


def wait_for(predicate: Callable[[], bool], seconds: float, what: str) -> None:
    """Poll `predicate` until it holds (an exception counts as not yet: the API may be down in a scenario
    that restarts it), else fail naming `what`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{what} did not happen within {seconds} s")


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is `pid` (a Celery worker's job processes)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
            if parent == pid:
                found.append(int(entry.name))
    return found


#: The heartbeat timeout of the kill tests' services, and how soon after the kill their job must have
#: failed: "at once" means well before a stale heartbeat could fail it, with room for a loaded machine
#: (a fixed 10 s against a 60 s heartbeat once failed at load 8-17 on 2 cores).
KILL_TEST_HEARTBEAT_SECONDS = 600.0
KILLED_JOB_FAILS_WITHIN_SECONDS = 120.0


def assert_killed_job_failed(job: dict[str, object], killed_at: float) -> None:
    """The job whose process was SIGKILLed failed at once (not on its stale heartbeat) and says why."""
    elapsed = time.monotonic() - killed_at
    assert elapsed < KILLED_JOB_FAILS_WITHIN_SECONDS < KILL_TEST_HEARTBEAT_SECONDS, (
        "failed only on its stale heartbeat"
    )
    assert job["status"] == "failed", job
    assert "the job's process was killed (signal 9: out of memory?" in str(job["error"]), job


def assert_accounted(control: Engine, job_ids: list[str], *, killed: bool = False) -> dict[str, int]:
    """Every job ended (succeeded, failed or cancelled), no reservation is left open, and each job's charges
    equal its stored releases (one more allowed with `killed`: a kill between a charge and its stored
    release over-counts). Returns each job's charge count."""
    charged: dict[str, int] = {}
    with control.connect() as conn:
        statuses = dict(conn.execute(select(jobs.c.id, jobs.c.status).where(jobs.c.id.in_(job_ids))).all())
        still_open = conn.execute(select(func.count()).where(reservations.c.open.is_(True))).scalar_one()
        for job_id in job_ids:
            charged[job_id] = conn.execute(
                select(func.count()).where(charges.c.job_id == job_id)
            ).scalar_one()
            released = conn.execute(select(func.count()).where(releases.c.job_id == job_id)).scalar_one()
            assert released <= charged[job_id] <= released + (1 if killed else 0), (job_id, charged, released)
    assert set(statuses.values()) <= {"succeeded", "failed", "cancelled"}, statuses
    assert still_open == 0
    return charged


class TcpProxy:
    """Forwards 127.0.0.1:port to target; `cut()` resets every connection, and every new one, until
    `restore()` (what a database on the other side of a lost network looks like). The listening port stays
    bound for the proxy's life: released during a cut, the kernel could hand it to another socket as an
    outgoing connection's source port, and `restore()` could not bind it again."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self._target = (target_host, target_port)
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._cut = False
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = int(self._listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            sockets, self._open = self._open, []
        for sock in sockets:
            _reset(sock)

    def close(self) -> None:
        self.cut()
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                refused = self._cut
            if refused:
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                _reset(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._cut:  # cut meanwhile
                    refused = True
                else:
                    self._open += [client, upstream]
            if refused:
                _reset(client)
                _reset(upstream)
                continue
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


def stable_port() -> int:
    """A free port below the kernel's ephemeral range, for a server that must bind it again after a
    restart: no outgoing connection can be given it as a source port in between (free_port()'s could)."""
    low = 32768
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10_000, low)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def _reset(sock: socket.socket) -> None:
    """End the connection for both peers at once, with a TCP reset (linger 0) where the kernel can.

    The shutdown matters: a pipe thread blocked reading this socket keeps the kernel's socket alive after
    close() until its read returns, so without it a peer waiting for an answer (a server idle in a
    transaction, a client waiting for a query's reply) would wait forever, its row locks held."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


class PrivateRedis:
    """A redis-server of this test's own on a free port, kept in memory only (no RDB, no AOF)."""

    def __init__(self, folder: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed (the machine's Redis package provides it)")
        self._binary = binary
        self._folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.port = stable_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        argv = [
            self._binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        self._process = subprocess.Popen(
            [*argv, "--dir", str(self._folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the private redis-server did not start")

    def restart(self) -> None:
        """kill -9 and start again: everything it held (queued tasks) is gone."""
        self.stop()
        self.start()

    def stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None
