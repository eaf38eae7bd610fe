"""Fault injection against the production shape (issue 11.6): `vips serve` and two `vips worker`s as
subprocesses on fresh PostgreSQL databases and a private Redis. The workers reach PostgreSQL through a
proxy the test can cut. Timeouts are shortened through settings (heartbeat 3 s, queued 6 s, reaper every
0.5 s), not skipped. Every scenario ends with every job terminal within its bound, charges = releases
(a kill between a charge and its stored release may leave one charge more: over-counting only), and
nothing left reserved."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from sqlalchemy import Engine

from privacy_wall.sqlengine import create_db_engine
from service.http.client import VipsClient
from tests.dbservers import fresh_database
from tests.e2e import (
    Service,
    _clean_env,
    _stop,
    _wait_ready,
    migrate_store,
    production_service,
    start_vips,
)
from tests.faults import (
    KILL_TEST_HEARTBEAT_SECONDS,
    KILLED_JOB_FAILS_WITHIN_SECONDS,
    PrivateRedis,
    TcpProxy,
    assert_accounted,
    assert_killed_job_failed,
    child_pids,
    stable_port,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

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


def resumes(control: Engine, job_id: str) -> int:
    """How many times the reaper sent the job again (jobs.resumes)."""
    from sqlalchemy import select

    from control.store.models import jobs

    with control.connect() as conn:
        return int(conn.execute(select(jobs.c.resumes).where(jobs.c.id == job_id)).scalar_one())


@contextmanager
def faulty_service(tmp_path: Path, heartbeat: float = HEARTBEAT, workers: int = 2) -> Iterator[Faulty]:
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
            "VIPS_HEARTBEAT_TIMEOUT_SECONDS": str(heartbeat),
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
        migrate_store(wall_env)
        port = stable_port()  # the API is restarted on it
        service = Service(f"http://127.0.0.1:{port}", wall_env, worker_env)
        engine = create_db_engine(control)
        stack.callback(engine.dispose)
        faulty = Faulty(service, engine, proxy, redis, api_env, worker_env, tmp_path)
        faulty.start_api(port)
        for number in range(1, workers + 1):
            faulty.start_worker(f"worker{number}")
        stack.callback(_stop, service.processes)
        _wait_ready(service.url, service.processes, [tmp_path / "api.log", tmp_path / "worker1.log"])
        service.synthetic_dataset(tmp_path)
        service.set_budget("synth", 1000, service.key("custodian", "synth"), DELTA)
        faulty.analyst = service.key("analyst")
        yield faulty


def test_broker_and_database_outages(tmp_path: Path) -> None:
    with faulty_service(tmp_path) as f:
        # 1. Redis restarted without persistence while jobs are queued (no worker running): the tasks are
        #    lost; the control database still holds the jobs, and the API's reaper sends them again
        #    (issue 52.2): they run.
        f.kill("worker1")
        f.kill("worker2")
        lost = [f.submit(5) for _ in range(3)]
        f.redis.restart()
        f.start_worker("worker1")
        f.start_worker("worker2")
        wait_for(
            lambda: all(f.job(j)["status"] == "succeeded" for j in lost), HEARTBEAT + BOUND, "the lost jobs"
        )
        assert all(resumes(f.control, j) >= 1 for j in lost)
        assert_accounted(f.control, lost)

        # 2. The database unreachable from the workers when the task starts: retried, then the job runs.
        f.proxy.cut()
        early = f.submit(5)
        time.sleep(2.0)
        f.proxy.restore()
        wait_for(lambda: f.job(early)["status"] == "succeeded", BOUND, "the job to run after the outage")

        # 3. The database lost mid-job for longer than the heartbeat: the API's reaper sends the job again
        #    and, once the database is back, it resumes from its stored releases (the worker that ran it
        #    sees it is no longer its run and stops); then it is cancelled.
        long = f.submit(100_000)
        wait_for(lambda: f.job(long)["iteration"] >= 3, BOUND, "three iterations")
        f.proxy.cut()
        time.sleep(HEARTBEAT + 2 * REAPER + 1)
        f.proxy.restore()
        before = f.job(long)["iteration"]
        wait_for(
            lambda: f.job(long)["status"] == "running" and f.job(long)["iteration"] > before + 2,
            BOUND,
            "the cut-off job resuming",
        )
        assert resumes(f.control, long) >= 1
        with f.api() as api:
            api.cancel(long)
        wait_for(lambda: f.job(long)["status"] == "cancelled", BOUND, "the resumed job cancelled")
        assert_accounted(f.control, [*lost, early, long], killed=True)


def test_killed_worker_and_restarted_api(tmp_path: Path) -> None:
    with faulty_service(tmp_path) as f:
        # 4. Both workers killed mid-job (kill -9 of each process group): the API's reaper sends the job
        #    again once its heartbeat is stale (issue 52.2: it had failed it), and new workers resume it
        #    from its stored releases; then it is cancelled.
        long = f.submit(100_000)
        wait_for(lambda: f.job(long)["iteration"] >= 3, BOUND, "three iterations")
        f.kill("worker1")
        f.kill("worker2")  # whichever ran it, it is gone now
        wait_for(lambda: resumes(f.control, long) >= 1, HEARTBEAT + BOUND, "the orphan job sent again")
        assert f.job(long)["status"] == "queued"
        before = f.job(long)["iteration"]
        f.start_worker("worker1")
        f.start_worker("worker2")
        wait_for(lambda: f.job(long)["iteration"] > before + 2, BOUND, "the orphan job resuming")
        with f.api() as api:
            api.cancel(long)
        wait_for(lambda: f.job(long)["status"] == "cancelled", BOUND, "the resumed job cancelled")

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


def test_a_killed_job_process_fails_its_job_at_once_and_it_does_not_run_again(tmp_path: Path) -> None:
    """Issue 34.6, with Redis: the kernel kills the worker's job processes (the OOM killer's SIGKILL) under
    a job; the worker's main process fails the job at once (not on its stale heartbeat, 600 s here) and
    acknowledges its task: the broker no longer holds it and nothing runs it again."""
    import redis

    with production_service(tmp_path, heartbeat_timeout=KILL_TEST_HEARTBEAT_SECONDS) as service:
        service.synthetic_dataset(tmp_path)
        custodian, analyst = service.key("custodian", "synth"), service.key("analyst")
        service.set_budget("synth", 100, custodian, DELTA)
        control = create_db_engine(service.env["VIPS_CONTROL_DATABASE_URL"])
        try:
            with VipsClient(service.url, analyst) as api:
                job = api.submit_job(
                    dataset="synth", model="blr", iterations=100_000, batch_size=50, sigma=50.0
                )
                wait_for(lambda: api.job(job["id"])["iteration"] >= 3, 300, "three iterations")
                worker = service.processes["worker"].pid
                for pid in child_pids(worker):  # the job's process among them
                    os.kill(pid, signal.SIGKILL)
                killed_at = time.monotonic()
                wait_for(
                    lambda: api.job(job["id"])["status"] == "failed",
                    KILLED_JOB_FAILS_WITHIN_SECONDS,
                    "the job failing",
                )
                assert_killed_job_failed(api.job(job["id"]), killed_at)
                assert service.processes["worker"].poll() is None  # the worker lives on
                charged = assert_accounted(control, [job["id"]], killed=True)
                assert charged[job["id"]] >= 3  # what it released stays charged
                time.sleep(1.0)
                broker = redis.Redis.from_url(service.worker_env["VIPS_BROKER_URL"])
                held = cast(list[bytes], broker.lrange("celery", 0, -1))
                held += cast(list[bytes], broker.hvals("unacked"))
                assert not any(job["id"].encode() in message for message in held)
                assert assert_accounted(control, [job["id"]], killed=True) == charged
                assert api.job(job["id"])["status"] == "failed"
        finally:
            control.dispose()


#: Issue 34.9: the default heartbeat timeout and the issue's 20 s control-database outage (the worker's old
#: retry, 5 s back-off plus the heartbeat, lost that race to the reaper).
RESUMING_HEARTBEAT, DATABASE_OUTAGE = 60.0, 20.0


def test_a_database_outage_shorter_than_the_heartbeat_timeout_resumes_the_running_job(tmp_path: Path) -> None:
    """Issue 34.9: the databases unreachable from the worker for 20 s of the 60 s heartbeat timeout while a
    job runs: the worker waits for them, refreshes the job's heartbeat as soon as they are back and goes on
    from the job's stored releases in the same task; the reaper (in the API, which still reaches the
    database) never sees the heartbeat stale. The job succeeds, every charge has its stored release. (The
    task used to retry only after back-off plus the heartbeat timeout: the reaper failed the job first.)"""
    with faulty_service(tmp_path, heartbeat=RESUMING_HEARTBEAT, workers=1) as f:
        job = f.submit(400)
        wait_for(lambda: f.job(job)["iteration"] >= 3, BOUND, "three iterations")
        f.proxy.cut()
        time.sleep(DATABASE_OUTAGE)
        assert f.job(job)["status"] == "running"
        f.proxy.restore()
        wait_for(lambda: f.job(job)["status"] != "running", BOUND * 2, "the job ending")
        assert f.job(job)["status"] == "succeeded", f.job(job)
        assert_accounted(f.control, [job], killed=True)
        log = (f.logs / "worker1.log").read_text()
        assert "resuming from its stored releases" in log


#: Issue 34.9: how long the test below keeps Redis stopped, the issue's 30 s (the worker used to exit
#: within a second).
REDIS_OUTAGE = 30.0


def test_a_worker_survives_a_redis_outage_during_a_job_and_runs_the_next_job(tmp_path: Path) -> None:
    """Issue 34.9: Redis stopped while the worker runs a job, then started again on its port: the same
    worker process reconnects (control.jobs.redis_broker) and runs a job submitted afterwards. It used to exit
    at once ("'NoneType' object has no attribute 'hostname'" in kombu, closing the lost connection of the
    unacknowledged running job), and new jobs stayed queued."""
    with faulty_service(tmp_path, workers=1) as f:
        worker = f.service.processes["worker1"]
        running = f.submit(150)
        wait_for(lambda: f.job(running)["iteration"] >= 3, BOUND, "three iterations")
        f.redis.stop()
        time.sleep(REDIS_OUTAGE)
        assert worker.poll() is None, (f.logs / "worker1.log").read_text()[-3000:]
        f.redis.start()
        after = f.submit(3)
        wait_for(
            lambda: f.job(after)["status"] == "succeeded", BOUND * 2, "the job submitted after the outage"
        )
        wait_for(lambda: f.job(running)["status"] == "succeeded", BOUND, "the job that ran through it")
        assert f.service.processes["worker1"] is worker and worker.poll() is None
        assert_accounted(f.control, [running, after])


@pytest.fixture(autouse=True)
def _needs_postgres() -> None:
    from tests.dbservers import require_postgres

    require_postgres()
