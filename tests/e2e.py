"""Running the real service for end-to-end tests: `vips up` (embedded), or `vips serve` + `vips worker`
on PostgreSQL and Redis, as subprocesses on free ports; plus the CLI as users run it."""

from __future__ import annotations

import contextlib
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
from sqlalchemy import Engine

from control.store.keys import create_key
from privacy_wall.accounting.weak import WEAK_EPSILON
from privacy_wall.data.ingest import ingest
from privacy_wall.data.settings import WallSettings
from privacy_wall.sqlengine import create_db_engine
from service.http.client import VipsClient
from tests.dbservers import fresh_database
from tests.servers import may_use
from vips.choices import DEFAULT_LABEL
from vips.migrate import upgrade

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

    may_use("Redis", "redis")
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

    # Setting a service up for a test that is not about these verbs: what `vips data ingest`, `vips admin
    # create-key` and `vips budget set` do, done in this process through the functions they call (each
    # `vips` subprocess pays seconds of imports). The verbs themselves are tested in test_cli*.py, and as
    # subprocesses end to end in test_e2e.py's full_flow.

    @contextmanager
    def _store(self) -> Iterator[tuple[Engine, Engine]]:
        """The service's control and sensitive databases, as its server-side CLI opens them (its VIPS_HOME
        and database URLs); under umask 077 as the CLI runs, so that a file SQLite creates is private."""
        wall = wall_settings(self.env)
        with private_umask():
            control, sensitive = create_db_engine(wall.control_url()), create_db_engine(wall.sensitive_url())
            try:
                yield control, sensitive
            finally:
                control.dispose()
                sensitive.dispose()

    def ingest(
        self,
        name: str,
        kind: str,
        path: Path,
        label: str | None = None,
        *,
        vocab: Path | None = None,
        public: bool = False,
    ) -> None:
        """`vips data ingest NAME --kind KIND --input PATH [--label LABEL] [--vocab VOCAB --vocab-is-public]
        [--public]` (a tabular or regression dataset's label column is `label` unless given, as the verb's;
        the tests' word lists are public)."""
        if label is None and kind in ("tabular", "regression"):
            label = DEFAULT_LABEL
        with self._store() as (control, sensitive):
            ingest(
                control=control,
                sensitive=sensitive,
                name=name,
                kind=kind,
                path=path,
                label=label,
                vocab=vocab,
                vocabulary_public=vocab is not None,
                public=public,
            )

    def synthetic_dataset(self, folder: Path, name: str = "synth", seed: int = 0) -> np.ndarray:
        """Ingest the synthetic tabular data (`synthetic_csv`) as a private dataset `name`; returns the true
        weights."""
        csv = folder / f"{name}.csv"
        weights = synthetic_csv(csv, seed=seed)
        self.ingest(name, "tabular", csv, "label")
        return weights

    def key(self, role: str, dataset: str | None = None) -> str:
        """A new key, as `vips admin create-key` makes it; an analyst or client key without a dataset sees
        every dataset (--all-datasets)."""
        with self._store() as (control, _):
            _, key = create_key(
                control, role, dataset, all_datasets=dataset is None and role in ("analyst", "client")
            )
        return key

    def set_budget(self, dataset: str, epsilon: float, custodian: str, delta: float = 1e-5) -> None:
        """`vips budget set DATASET --epsilon EPSILON --delta DELTA` with the custodian's key, over HTTP."""
        with VipsClient(self.url, custodian) as api:  # the tests' caps above 10 are meant
            api.set_budget(dataset, epsilon, delta, weak_privacy_ok=epsilon > WEAK_EPSILON)


def wall_settings(env: dict[str, str]) -> WallSettings:
    """The store a server-side `vips` command run with `env` opens: its VIPS_HOME and database URLs."""
    return WallSettings(
        home=Path(env["VIPS_HOME"]),
        control_database_url=env.get("VIPS_CONTROL_DATABASE_URL"),
        sensitive_database_url=env.get("VIPS_SENSITIVE_DATABASE_URL"),
    )


@contextmanager
def private_umask() -> Iterator[None]:
    """Umask 077 for the block, as the `vips` commands run (vips.cli): what they create is private."""
    umask = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(umask)


def migrate_store(env: dict[str, str]) -> None:
    """`vips migrate all` with `env`, in this process: VIPS_HOME made (0700) and both databases brought to
    their Alembic heads (SQLite files under VIPS_HOME created where no URL is given)."""
    wall = wall_settings(env)
    with private_umask():
        wall.home.resolve().mkdir(mode=0o700, parents=True, exist_ok=True)
        upgrade("control", wall.control_url())
        upgrade("sensitive", wall.sensitive_url())


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
    """End a test's service at once: SIGKILL to each process's group (start_vips gives each its own, which
    its children share: the embedded worker and its job processes, uvicorn's workers). What a test checks
    never depends on a graceful stop, which costs seconds per service (a Celery worker's warm shutdown)."""
    for process in processes.values():
        with contextlib.suppress(ProcessLookupError):  # the group is gone already (the test killed it)
            os.killpg(process.pid, signal.SIGKILL)
    for process in processes.values():
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
        migrate_store(wall_env)
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
