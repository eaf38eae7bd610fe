"""Running the real service for end-to-end tests: `vips up` (embedded), or `vips serve` + `vips worker`
on PostgreSQL and Redis, as subprocesses on free ports; plus the CLI as users run it."""

from __future__ import annotations

import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.dbservers import fresh_database

REDIS_URL = os.environ.get("VIPS_TEST_REDIS", "redis://127.0.0.1:6379")


#: Tests run several jobs of one key back to back: a job deferred behind its key's running one (fair
#: queues) is retried every half second instead of every 2 s.
FAST_DEFERRALS = {"VIPS_DEFER_SECONDS": "0.5"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def require_redis() -> None:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Redis at {REDIS_URL} is down under CI; .ci/run should have started it")
        pytest.skip(f"SKIPPED: no Redis at {REDIS_URL} (start it to run this test)")


@dataclass
class Service:
    """A running service: its URL, the environment of its server-side CLI, and its processes."""

    url: str
    env: dict[str, str]
    worker_env: dict[str, str] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def vips(
        self, *argv: str, key: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        env = {**self.env, "VIPS_URL": self.url}
        if key is not None:
            env["VIPS_API_KEY"] = key
        done = subprocess.run(
            [sys.executable, "-m", "vips.cli", *argv], env=env, text=True, capture_output=True
        )
        if check:
            assert done.returncode == 0, f"vips {' '.join(argv)}: {done.stderr}"
        return done

    def synthetic_dataset(self, folder: Path, name: str = "synth") -> None:
        """Ingest the synthetic tabular data (`synthetic_csv`) as a private dataset `name`."""
        csv = folder / f"{name}.csv"
        synthetic_csv(csv)
        self.vips("data", "ingest", name, "--kind", "tabular", "--input", str(csv), "--label", "label")

    def key(self, role: str, dataset: str | None = None) -> str:
        """A new key; an analyst or client key without a dataset sees every dataset (--all-datasets)."""
        if dataset is not None:
            scope = ["--dataset", dataset]
        else:
            scope = ["--all-datasets"] if role in ("analyst", "client") else []
        return self.vips("admin", "create-key", "--role", role, *scope).stdout.strip()


def _clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for name in list(env):
        if name.startswith("VIPS_"):
            del env[name]
    return env


def start_vips(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """A `vips` server process in its own session (so a test can kill its whole group), logging to `log`."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "vips.cli", *argv],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_ready(url: str, processes: dict[str, subprocess.Popen[bytes]], logs: list[Path]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for name, process in processes.items():
            if process.poll() is not None:
                text = "\n".join(p.read_text() for p in logs if p.exists())
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{text[-3000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the service did not become ready within 60 s")


def _stop(processes: dict[str, subprocess.Popen[bytes]]) -> None:
    for process in processes.values():
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
    for process in processes.values():
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextmanager
def embedded_service(home: Path, env: dict[str, str] | None = None) -> Iterator[Service]:
    """`vips up`: API + one real Celery worker, SQLite and a file-system broker, no Redis or PostgreSQL;
    `env` adds settings."""
    port = free_port()
    env = {**_clean_env(), "VIPS_HOME": str(home), **FAST_DEFERRALS, **(env or {})}
    service = Service(f"http://127.0.0.1:{port}", env)
    log = home / "test-up.log"
    # `vips up` refuses a VIPS_HOME open to others and chmods nothing: the harness's log is private too.
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    log.touch(mode=0o600)
    service.processes["up"] = start_vips(["up", "--port", str(port)], env, log)
    try:
        _wait_ready(service.url, service.processes, [log, home / "worker.log"])
        yield service
    finally:
        _stop(service.processes)


#: Which of this process's Redis databases the next private_redis_url hands out (from a random one: two
#: suites sharing a Redis server rarely start on the same database).
_NEXT_REDIS_DATABASE = itertools.count(random.randrange(15))


def private_redis_url() -> str:
    """A Redis database for one test's use (the test flushes it before and after): databases 1-15 are
    split between pytest-xdist's worker processes, so that two tests running at once never share one;
    within a process, tests run one after another and consecutive uses take different databases."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    mine = [index for index in range(1, 16) if (index - 1) % workers == worker]
    return f"{REDIS_URL}/{mine[next(_NEXT_REDIS_DATABASE) % len(mine)]}"


@contextmanager
def production_service(
    tmp_path: Path, heartbeat_timeout: float = 60.0, api_workers: int = 1, env: dict[str, str] | None = None
) -> Iterator[Service]:
    """`vips serve` (`api_workers` processes) and `vips worker` on fresh PostgreSQL databases and a
    private Redis database; `env` adds settings to every process."""
    import redis

    require_redis()
    with ExitStack() as stack:
        control = stack.enter_context(fresh_database("postgresql", tmp_path))
        sensitive = stack.enter_context(fresh_database("postgresql", tmp_path))
        broker = private_redis_url()
        redis.Redis.from_url(broker).flushdb()
        stack.callback(lambda: redis.Redis.from_url(broker).flushdb())
        base = {
            **_clean_env(),
            "VIPS_HOME": str(tmp_path / "home"),
            "VIPS_HEARTBEAT_TIMEOUT_SECONDS": str(heartbeat_timeout),
            **FAST_DEFERRALS,
            **(env or {}),
        }
        wall_env = {**base, "VIPS_CONTROL_DATABASE_URL": control, "VIPS_SENSITIVE_DATABASE_URL": sensitive}
        api_env = {**base, "VIPS_CONTROL_DATABASE_URL": control, "VIPS_BROKER_URL": broker}
        worker_env = {**wall_env, "VIPS_BROKER_URL": broker}
        subprocess.run(
            [sys.executable, "-m", "vips.cli", "migrate", "all"],
            env=wall_env,
            check=True,
            capture_output=True,
        )
        port = free_port()
        service = Service(f"http://127.0.0.1:{port}", wall_env, worker_env)
        logs = [tmp_path / "api.log", tmp_path / "worker.log"]
        service.processes["api"] = start_vips(
            ["serve", "--port", str(port), "--workers", str(api_workers)], api_env, logs[0]
        )
        service.processes["worker"] = start_vips(["worker"], worker_env, logs[1])
        stack.callback(_stop, service.processes)
        _wait_ready(service.url, service.processes, logs)
        yield service


def synthetic_csv(path: Path, n: int = 2000, d: int = 5, seed: int = 0) -> np.ndarray:
    """Logistic data with known weights, rows scaled to norm <= 1; returns the true weights."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=d) * 4
    x = rng.normal(size=(n, d))
    x /= np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))
    y = (rng.random(n) < 1 / (1 + np.exp(-x @ weights))).astype(int)
    header = ",".join([f"x{j}" for j in range(d)] + ["label"])
    lines = [",".join(f"{v:.17g}" for v in row) + f",{label}" for row, label in zip(x, y, strict=True)]
    path.write_text("\n".join([header, *lines]) + "\n")
    return weights
