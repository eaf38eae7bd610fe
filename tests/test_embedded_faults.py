"""The embedded mode (`vips up`) keeps the boundary it can and survives its worker's death (issue 11.3):
VIPS_HOME is private to its owner, the API process never opens sensitive.db, /readyz reports the
worker, and kill -9 of the worker fails its running job at once with charges = releases, refunds the
rest, and brings a new worker that runs the next job."""

from __future__ import annotations

import os
import signal
import stat
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from control.store.models import jobs
from privacy_wall.sqlengine import create_db_engine
from service.http.client import VipsClient
from tests.e2e import embedded_service
from tests.faults import (
    KILL_TEST_HEARTBEAT_SECONDS,
    KILLED_JOB_FAILS_WITHIN_SECONDS,
    assert_accounted,
    assert_killed_job_failed,
    child_pids,
    wait_for,
)

pytestmark = pytest.mark.slow

DELTA = 1e-5


def readiness(url: str) -> dict[str, str]:
    checks: dict[str, str] = httpx.get(f"{url}/readyz", timeout=5).json()["checks"]
    return checks


def test_the_embedded_worker_dies_and_comes_back_with_every_charge_accounted(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with embedded_service(home) as service:
        # Private to its owner: the folder 0700, every file in it 0600.
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        for path in home.iterdir():
            if path.is_file():
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        # The API process (`vips up` itself) holds no descriptor on the sensitive database.
        api_pid = service.processes["up"].pid
        opened = {os.path.realpath(f"/proc/{api_pid}/fd/{fd}") for fd in os.listdir(f"/proc/{api_pid}/fd")}
        assert str((home / "sensitive.db").resolve()) not in opened
        assert readiness(service.url)["worker"] == "ok"

        service.synthetic_dataset(tmp_path)
        custodian, analyst = service.key("custodian", "synth"), service.key("analyst")
        service.set_budget("synth", 100, custodian, DELTA)
        with VipsClient(service.url, analyst) as api:
            job = api.submit_job(dataset="synth", model="blr", iterations=100_000, batch_size=50, sigma=50.0)
            wait_for(lambda: api.job(job["id"])["iteration"] >= 5, 60, "five iterations")
            os.kill(int((home / "worker.pid").read_text()), signal.SIGKILL)
            killed_at = time.monotonic()
            wait_for(lambda: api.job(job["id"])["status"] == "failed", 60, "the job failing")
            assert time.monotonic() - killed_at < 60
            failed = api.job(job["id"])
            assert "embedded worker running this job died" in failed["error"]
            wait_for(lambda: readiness(service.url)["worker"] == "ok", 90, "a new worker")
            again = api.submit_job(dataset="synth", model="blr", iterations=3, batch_size=50, sigma=50.0)
            assert api.wait(again["id"], interval=0.2, timeout=60)["status"] == "succeeded"
        control = create_db_engine(f"sqlite:///{home / 'control.db'}")
        try:
            # A kill between a charge and its stored release can only over-count (one charge more).
            charged = assert_accounted(control, [job["id"], again["id"]], killed=True)
        finally:
            control.dispose()
        assert charged[job["id"]] >= 5
        with VipsClient(service.url, custodian) as api:  # what `vips budget show` prints
            budget = api.dataset("synth")["budget"]
        assert budget["epsilon_spent"] == budget["epsilon_reserved"]


def test_a_killed_job_process_fails_its_job_at_once_and_it_does_not_run_again(tmp_path: Path) -> None:
    """Issue 34.6: the kernel kills the process running a job (the OOM killer's SIGKILL): the worker's main
    process fails the job at once, not when its heartbeat goes stale (600 s here), and does not requeue it."""
    home = tmp_path / "home"
    heartbeat = {"VIPS_HEARTBEAT_TIMEOUT_SECONDS": str(KILL_TEST_HEARTBEAT_SECONDS)}
    with embedded_service(home, heartbeat) as service:
        service.synthetic_dataset(tmp_path)
        custodian, analyst = service.key("custodian", "synth"), service.key("analyst")
        service.set_budget("synth", 100, custodian, DELTA)
        worker_pid = int((home / "worker.pid").read_text())
        control = create_db_engine(f"sqlite:///{home / 'control.db'}")
        try:
            with VipsClient(service.url, analyst) as api:
                job = api.submit_job(
                    dataset="synth", model="blr", iterations=100_000, batch_size=50, sigma=50.0
                )
                wait_for(lambda: api.job(job["id"])["iteration"] >= 3, 300, "three iterations")
                sensitive = str((home / "sensitive.db").resolve())
                (runner,) = [  # the job process: the one that holds the sensitive database open
                    pid
                    for pid in child_pids(worker_pid)
                    if sensitive in {os.path.realpath(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()}
                ]
                os.kill(runner, signal.SIGKILL)
                killed_at = time.monotonic()
                wait_for(
                    lambda: api.job(job["id"])["status"] == "failed",
                    KILLED_JOB_FAILS_WITHIN_SECONDS,
                    "the job failing",
                )
                assert_killed_job_failed(api.job(job["id"]), killed_at)
                os.kill(worker_pid, 0)  # its worker lives on (the supervisor did not fail the job)
                charged = assert_accounted(control, [job["id"]], killed=True)
                assert charged[job["id"]] >= 3  # what it released stays charged
                # Not requeued: no message names it, and nothing runs it again.
                time.sleep(1.0)
                assert not any(job["id"] in p.read_text() for p in (home / "broker" / "out").iterdir())
                assert assert_accounted(control, [job["id"]], killed=True) == charged
                assert api.job(job["id"])["status"] == "failed"
        finally:
            control.dispose()


def test_a_restarted_vips_up_resumes_the_jobs_its_last_run_left_running(tmp_path: Path) -> None:
    """Issue 34.13: `vips up` stopped under a running job (here killed outright, worker and all, as a power
    cut would) left the job `running`; the next `vips up` failed it at ~65 s, its epsilon spent and no
    posterior. Now the next `vips up` requeues it before its worker starts, and the worker resumes it from
    its stored releases: it succeeds, with charges = releases (one more allowed for the release the kill
    cut) and nothing reserved."""
    home = tmp_path / "home"
    with embedded_service(home) as service:
        service.synthetic_dataset(tmp_path)
        custodian, analyst = service.key("custodian", "synth"), service.key("analyst")
        service.set_budget("synth", 100, custodian, DELTA)
        with VipsClient(service.url, analyst) as api:
            job = api.submit_job(dataset="synth", model="blr", iterations=400, batch_size=50, sigma=50.0)
            wait_for(lambda: api.job(job["id"])["iteration"] >= 3, 60, "three iterations")
        up = service.processes["up"]
        os.killpg(up.pid, signal.SIGKILL)
        up.wait()
    control = create_db_engine(f"sqlite:///{home / 'control.db'}")
    try:
        with control.connect() as conn:
            left = conn.execute(select(jobs.c.status, jobs.c.iteration).where(jobs.c.id == job["id"])).one()
        assert left.status == "running" and left.iteration < 400, left  # the kill cut it mid-job
        with embedded_service(home) as service, VipsClient(service.url, analyst) as api:
            started = time.monotonic()
            finished = api.wait(job["id"], interval=0.5, timeout=180)
            assert finished["status"] == "succeeded", finished
            assert finished["iteration"] == 400
            assert time.monotonic() - started < 180
            assert api.posterior(job["id"])["model"] == "blr"
            charged = assert_accounted(control, [job["id"]], killed=True)
            assert 400 <= charged[job["id"]] <= 401
    finally:
        control.dispose()
