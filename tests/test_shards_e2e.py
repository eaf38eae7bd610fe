"""Sharded passes through the service (issue 26): with VIPS_SHARDS=2 and two shard workers (leasing their
shards, `--shard auto`, in production; numbered by `vips up` in the embedded mode), a public BLR fit at
sigma 0 gives the unsharded posterior (to 1e-9 relative), on PostgreSQL and Redis and under the embedded
`vips up`, and minibatches of data larger than the job's cache run on the shards; the shards' partial sums
never reach Redis (every command the server executed during the job, read with MONITOR) or the control
database; a shard worker killed or stopped (SIGSTOP) mid-job is replaced, its part asked again, and the job
succeeds with charges = releases."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import MetaData, select

from privacy_wall.data.db_store import DatabaseStore
from privacy_wall.sqlengine import create_db_engine
from service.http.client import VipsClient
from tests.e2e import Service, embedded_service, production_service, start_vips, synthetic_csv
from tests.faults import assert_accounted, wait_for
from vips.models.registry import model_setup
from vips.supervisor import descendants

pytestmark = pytest.mark.slow

#: 40,000 rows of 5 features: three blocks of 16,384 rows at most, so each of two shards holds rows.
ROWS = 40_000
ITERATIONS = 4


def public_dataset(service: Service, folder: Path) -> Path:
    csv = folder / "pub.csv"
    synthetic_csv(csv, n=ROWS)
    service.ingest("pub", "tabular", csv, "label", public=True)
    return csv


def unsharded_parameters(service: Service, csv: Path, folder: Path) -> dict[str, Any]:
    """The same fit computed in one process (`vips fit --local`: no shards)."""
    out = folder / "local.json"
    service.vips(
        "fit", "--local", "--kind", "tabular", "--input", str(csv), "--label", "label", "--model", "blr",
        "--iterations", str(ITERATIONS), "--sigma", "0", "-o", str(out),
    )  # fmt: skip
    return dict(json.loads(out.read_text()))


def assert_same_posterior(sharded: dict[str, Any], unsharded: dict[str, Any]) -> None:
    for name in ("mean", "covariance"):
        a, b = np.asarray(sharded[name]), np.asarray(unsharded[name])
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12 * np.abs(b).max())


def fit(service: Service, analyst: str) -> tuple[str, dict[str, Any]]:
    with VipsClient(service.url, analyst, timeout=60) as api:
        job = api.submit_job(dataset="pub", model="blr", iterations=ITERATIONS, batch_size=ROWS, sigma=0.0)
        done = api.wait(job["id"], interval=0.2, timeout=300)
        assert done["status"] == "succeeded", done
        return job["id"], api.posterior(job["id"])


def first_partial_sums(sensitive_url: str) -> list[bytes]:
    """Shard 0's clipped sums of the first iteration (the prior's parameters), as the shard computes them:
    byte strings to look for wherever they must not be."""
    engine = create_db_engine(sensitive_url)
    try:
        store = DatabaseStore(engine, "pub")
        setup = model_setup("blr", {}, sigma=0.0, algorithm="vips")
        params = setup.model.public_params(setup.model.initial_state(store.info.dimension))
        sums = setup.query.clipped_sums(store.shard(0, 2), params, np.random.default_rng(0))
    finally:
        engine.dispose()
    needles = []
    for value in sums.values():
        flat = np.ascontiguousarray(value, dtype=np.float64).ravel()
        needles.append(flat[:2].tobytes())  # 16 raw bytes
        needles.append(repr(float(flat[0])).encode())  # as text (JSON, logs)
    return needles


@pytest.mark.redis
@pytest.mark.postgres
def test_sharded_fit_on_postgresql_and_redis_matches_and_keeps_partial_sums_inside(tmp_path: Path) -> None:
    import redis

    with production_service(tmp_path, env={"VIPS_SHARDS": "2"}) as service:
        for shard in (0, 1):  # as docker-compose's `--scale shard-worker=2` starts them: each leases a shard
            service.processes[f"shard{shard}"] = start_vips(
                ["worker", "--shard", "auto"], service.worker_env, tmp_path / f"shard{shard}.log"
            )
        csv = public_dataset(service, tmp_path)
        analyst = service.key("analyst", "pub")
        commands: list[bytes] = []
        monitor_client = redis.Redis.from_url(service.worker_env["VIPS_BROKER_URL"])
        stop = threading.Event()

        def record() -> None:
            with monitor_client.monitor() as monitor:
                for command in monitor.listen():
                    commands.append(str(command.get("command", "")).encode())
                    if stop.is_set():
                        return

        watcher = threading.Thread(target=record, daemon=True)
        watcher.start()
        time.sleep(0.3)
        job_id, posterior = fit(service, analyst)
        stop.set()
        monitor_client.ping()  # one more command, so the watcher sees `stop`
        watcher.join(timeout=10)
        assert_same_posterior(posterior, unsharded_parameters(service, csv, tmp_path))

        # The shards did the passes: the job's tasks crossed Redis (the monitor saw them), their bodies
        # (base64 JSON in kombu's envelope, decoded here) carrying public ids only: two per iteration.
        bodies = [
            base64.b64decode(body)
            for command in commands
            for body in re.findall(rb'body\\?": \\?"([A-Za-z0-9+/=]+)', command)
        ]
        shard_args = [
            args
            for args, *_ in map(json.loads, bodies)
            if isinstance(args, list) and len(args) == 6 and args[0] == job_id
        ]
        assert len(shard_args) >= 2 * ITERATIONS
        for args in shard_args:
            assert [type(a) for a in args] == [str, int, int, int, int, str] and args[4] == 2, args
        needles = first_partial_sums(service.env["VIPS_SENSITIVE_DATABASE_URL"])
        redis_text = b"\n".join(commands + bodies)
        for needle in needles:
            assert needle not in redis_text
        control = create_db_engine(service.env["VIPS_CONTROL_DATABASE_URL"])
        try:
            tables = MetaData()
            tables.reflect(control)
            with control.connect() as conn:
                dump = b"\n".join(
                    repr(row).encode() + b"".join(bytes(v) for v in row if isinstance(v, bytes | memoryview))
                    for table in tables.sorted_tables
                    for row in conn.execute(select(table))
                )
        finally:
            control.dispose()
        assert job_id.encode() in dump  # the dump holds the job's rows
        for needle in needles:
            assert needle not in dump


def test_embedded_up_runs_shard_workers_and_survives_a_killed_or_stopped_one(tmp_path: Path) -> None:
    """... and a SIGSTOPped shard worker is replaced once its alive file is VIPS_WORKER_STALL_SECONDS old
    (issue 52 item 7: it had never been, and its job failed after 303 s)."""
    home = tmp_path / "home"
    # A dataset cache too small for the data: minibatches go to the shards too.
    env = {
        "VIPS_SHARDS": "2",
        "VIPS_SHARD_RESEND_SECONDS": "1",
        "VIPS_WORKER_CACHE_MB": "1",
        "VIPS_WORKER_STALL_SECONDS": "8",
    }
    with embedded_service(home, env) as service:
        csv = public_dataset(service, tmp_path)
        analyst = service.key("analyst", "pub")
        _, posterior = fit(service, analyst)
        assert_same_posterior(posterior, unsharded_parameters(service, csv, tmp_path))

        with VipsClient(service.url, analyst, timeout=60) as api:
            mini = api.submit_job(dataset="pub", model="blr", iterations=5, batch_size=500, sigma=0.0)
            assert api.wait(mini["id"], interval=0.2, timeout=120)["status"] == "succeeded"

        # A longer job; shard 1's worker is killed once the job has released something.
        with VipsClient(service.url, analyst, timeout=60) as api:
            job = api.submit_job(dataset="pub", model="blr", iterations=40, batch_size=ROWS, sigma=0.0)
            wait_for(lambda: api.job(job["id"])["iteration"] >= 2, 120, "two iterations")
            victim = int((home / "shard-1.pid").read_text())
            os.kill(victim, signal.SIGKILL)
            done = api.wait(job["id"], interval=0.2, timeout=300)
            assert done["status"] == "succeeded", done
            assert len(list(api.iter_releases(job["id"]))) == 40
        control = create_db_engine(f"sqlite:///{home / 'control.db'}")
        try:
            assert assert_accounted(control, [job["id"]]) == {job["id"]: 40}  # charges = releases = 40
        finally:
            control.dispose()
        # the supervisor started a new one
        wait_for(lambda: int((home / "shard-1.pid").read_text()) != victim, 30, "a new shard worker")

        # Shard 0's worker stops without dying (its process and its job process, which lingers for the
        # job's next releases): the supervisor kills both (the alive file goes stale) and starts another,
        # which answers the re-sent tasks.
        with VipsClient(service.url, analyst, timeout=60) as api:
            job = api.submit_job(dataset="pub", model="blr", iterations=20, batch_size=ROWS, sigma=0.0)
            wait_for(lambda: api.job(job["id"])["iteration"] >= 2, 120, "two iterations")
            stopped = int((home / "shard-0.pid").read_text())
            tree = [stopped, *descendants(stopped)]
            for pid in tree:
                os.kill(pid, signal.SIGSTOP)
            try:
                done = api.wait(job["id"], interval=0.2, timeout=300)
            finally:
                for pid in tree:  # only those the supervisor has not killed after all
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
            assert done["status"] == "succeeded", done
        assert int((home / "shard-0.pid").read_text()) != stopped
        assert "shard worker 0 stopped answering" in (home / "test-up.log").read_text()
        control = create_db_engine(f"sqlite:///{home / 'control.db'}")
        try:
            assert assert_accounted(control, [job["id"]]) == {job["id"]: 20}
        finally:
            control.dispose()
