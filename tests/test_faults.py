"""Fault injection against the production shape (issue 11.6): `vips serve` and two `vips worker`s as
subprocesses on fresh PostgreSQL databases and a private Redis. The workers reach PostgreSQL through a
proxy the test can cut. Timeouts are shortened through settings (heartbeat 3 s, queued 6 s, reaper every
0.5 s), not skipped. Every scenario ends with every job terminal within its bound, charges = releases
(a kill between a charge and its stored release may leave one charge more: over-counting only), and
nothing left reserved."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from privacy_wall.sqlengine import create_db_engine
from service.client import VipsClient
from tests.dbservers import fresh_database
from tests.e2e import Service, _clean_env, _stop, _wait_ready, start_vips, synthetic_csv
from tests.faults import PrivateRedis, TcpProxy, assert_accounted, stable_port, wait_for

DELTA = 1e-5
HEARTBEAT, QUEUED, REAPER = 3.0, 6.0, 0.5
#: A worker cut off mid-transaction leaves its PostgreSQL session idle in that transaction, holding its
#: locks (the budget row's) until this timeout ends it (the proxy's cut never reaches the server).
IDLE_TRANSACTION = 3.0
#: Every job must be terminal this long after the fault ends (reaper bounds plus a margin for 2 busy cores).
BOUND = 30.0


@dataclass
class Faulty:
    service: Service
    control: Engine
    proxy: TcpProxy
    redis: PrivateRedis
    api_env: dict[str, str]
    worker_env: dict[str, str]
    logs: Path
    analyst: str = ""

    def start_worker(self, name: str) -> None:
        log = self.logs / f"{name}.log"
        self.service.processes[name] = start_vips(["worker"], self.worker_env, log)

    def start_api(self, port: int) -> None:
        self.service.processes["api"] = start_vips(
            ["serve", "--port", str(port)], self.api_env, self.logs / "api.log"
        )

    def kill(self, name: str) -> None:
        process = self.service.processes.pop(name)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def api(self) -> VipsClient:
        return VipsClient(self.service.url, self.analyst, timeout=10)

    def submit(self, iterations: int, batch_size: int = 50) -> str:
        with self.api() as api:
            job = api.submit_job(
                dataset="synth", model="blr", iterations=iterations, batch_size=batch_size, sigma=50.0
            )
        return str(job["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        with self.api() as api:
            return api.job(job_id)


@contextmanager
def faulty_service(tmp_path: Path) -> Iterator[Faulty]:
    with ExitStack() as stack:
        control = stack.enter_context(fresh_database("postgresql", tmp_path))
        sensitive = stack.enter_context(fresh_database("postgresql", tmp_path))
        redis = PrivateRedis(tmp_path / "redis")
        stack.callback(redis.stop)
        proxy = TcpProxy(5432)
        stack.callback(proxy.close)
        via_proxy = {
            url: url.replace("@127.0.0.1:5432/", f"@127.0.0.1:{proxy.port}/") for url in (control, sensitive)
        }
        base = {
            **_clean_env(),
            "VIPS_HOME": str(tmp_path / "home"),
            "VIPS_HEARTBEAT_TIMEOUT_SECONDS": str(HEARTBEAT),
            "VIPS_IDLE_TRANSACTION_TIMEOUT_SECONDS": str(IDLE_TRANSACTION),
            "VIPS_QUEUED_TIMEOUT_SECONDS": str(QUEUED),
            "VIPS_REAPER_INTERVAL_SECONDS": str(REAPER),
            "VIPS_BROKER_URL": redis.url,
        }
        wall_env = {**base, "VIPS_CONTROL_DATABASE_URL": control, "VIPS_SENSITIVE_DATABASE_URL": sensitive}
        worker_env = {
            **base,
            "VIPS_CONTROL_DATABASE_URL": via_proxy[control],
            "VIPS_SENSITIVE_DATABASE_URL": via_proxy[sensitive],
        }
        api_env = {**base, "VIPS_CONTROL_DATABASE_URL": control}
        subprocess.run(
            [sys.executable, "-m", "vips.cli", "migrate", "all"],
            env=wall_env,
            check=True,
            capture_output=True,
        )
        port = stable_port()  # the API is restarted on it
        service = Service(f"http://127.0.0.1:{port}", wall_env, worker_env)
        engine = create_db_engine(control)
        stack.callback(engine.dispose)
        faulty = Faulty(service, engine, proxy, redis, api_env, worker_env, tmp_path)
        faulty.start_api(port)
        faulty.start_worker("worker1")
        faulty.start_worker("worker2")
        stack.callback(_stop, service.processes)
        _wait_ready(service.url, service.processes, [tmp_path / "api.log", tmp_path / "worker1.log"])
        synthetic_csv(tmp_path / "train.csv")
        data = ["--kind", "tabular", "--input", str(tmp_path / "train.csv"), "--label", "label"]
        service.vips("data", "ingest", "synth", *data)
        custodian = service.key("custodian", "synth")
        service.vips("budget", "set", "synth", "--epsilon", "1000", "--delta", str(DELTA), key=custodian)
        faulty.analyst = service.key("analyst")
        yield faulty


def test_broker_and_database_outages(tmp_path: Path) -> None:
    with faulty_service(tmp_path) as f:
        # 1. Redis restarted without persistence while jobs are queued (no worker running): the tasks are
        #    lost; the API's reaper fails the jobs with a message and refunds them.
        f.kill("worker1")
        f.kill("worker2")
        lost = [f.submit(5) for _ in range(3)]
        f.redis.restart()
        f.start_worker("worker1")
        f.start_worker("worker2")
        wait_for(
            lambda: all(f.job(j)["status"] == "failed" for j in lost), QUEUED + BOUND, "the lost jobs failing"
        )
        assert all("no worker started this job" in f.job(j)["error"] for j in lost)
        assert_accounted(f.control, lost)

        # 2. The database unreachable from the workers when the task starts: retried, then the job runs.
        f.proxy.cut()
        early = f.submit(5)
        time.sleep(2.0)
        f.proxy.restore()
        wait_for(lambda: f.job(early)["status"] == "succeeded", BOUND, "the job to run after the outage")

        # 3. The database lost mid-job: the job ends (resumed, or failed by the reaper with a message).
        long = f.submit(100_000)
        wait_for(lambda: f.job(long)["iteration"] >= 3, BOUND, "three iterations")
        f.proxy.cut()
        time.sleep(HEARTBEAT + 2 * REAPER + 1)
        f.proxy.restore()
        wait_for(lambda: f.job(long)["status"] in ("failed", "succeeded"), BOUND, "the cut-off job ending")
        ended = f.job(long)
        if ended["status"] == "failed":
            assert "no worker reported progress" in ended["error"]
        assert_accounted(f.control, [*lost, early, long], killed=True)


def test_killed_worker_and_restarted_api(tmp_path: Path) -> None:
    with faulty_service(tmp_path) as f:
        # 4. One of two workers killed mid-job: the job ends (finished by the other, or reaped).
        long = f.submit(100_000)
        wait_for(lambda: f.job(long)["iteration"] >= 3, BOUND, "three iterations")
        f.kill("worker1")
        f.kill("worker2")  # whichever ran it, it is gone now
        wait_for(lambda: f.job(long)["status"] == "failed", HEARTBEAT + BOUND, "the orphan job failing")
        assert "no worker reported progress" in f.job(long)["error"]
        f.start_worker("worker1")
        f.start_worker("worker2")

        # 5. The API killed and restarted mid-job: the job goes on and the new API reports it.
        running = f.submit(300)
        wait_for(lambda: f.job(running)["iteration"] >= 3, BOUND, "three iterations")
        port = int(f.service.url.rsplit(":", 1)[1])
        f.kill("api")
        time.sleep(1.0)
        f.start_api(port)
        wait_for(lambda: f.job(running)["status"] == "succeeded", BOUND * 2, "the job finishing")
        after = f.submit(3)
        wait_for(lambda: f.job(after)["status"] == "succeeded", BOUND, "a new job after the restart")
        assert_accounted(f.control, [long, running, after], killed=True)


@pytest.fixture(autouse=True)
def _needs_postgres() -> None:
    from tests.dbservers import require_postgres

    require_postgres()
