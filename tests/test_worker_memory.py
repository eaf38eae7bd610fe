"""The worker's hard memory limit (VIPS_WORKER_MEMORY_MB, an address-space cap it puts on itself): a job
whose real memory exceeds what admission estimated fails alone, refunded, and the same worker process runs
the next job without a restart."""

from __future__ import annotations

import resource
import time
from datetime import datetime
from pathlib import Path

import pytest

from service.http.client import VipsClient
from tests.e2e import embedded_service
from tests.test_e2e_latent import write_binary_csv
from vips.commands.server import limit_address_space
from vips.datasets.digits import load_binary_digits

DELTA = 1e-5
#: An idle `vips worker` maps about 670 MB (measured: VmSize 668 MB, RSS 172 MB); 1,200 MB leaves a small
#: job room and no room for SBN with 500 hidden units on 64 pixels (its working arrays alone are ~0.8 GB).
WORKER_MEMORY_MB = 1200


def wait(api: VipsClient, job_id: str, seconds: float = 120) -> dict[str, object]:
    deadline = time.monotonic() + seconds
    while (job := api.job(job_id))["status"] in ("queued", "running"):
        assert time.monotonic() < deadline, f"job {job_id} is still {job['status']}"
        time.sleep(0.2)
    return job


@pytest.mark.slow
def test_a_job_over_the_workers_limit_fails_alone_and_the_next_job_runs(tmp_path: Path) -> None:
    """The big job and a neighbour run at once, each in its own job process: the big one fails with
    MemoryError, the neighbour succeeds, and the worker (same pid) then runs the next job."""
    home = tmp_path / "home"
    # Admission lets the job through (its limits raised), as it would a job whose estimate was wrong.
    limits = {
        "VIPS_WORKER_MEMORY_MB": str(WORKER_MEMORY_MB),
        "VIPS_MAX_RELEASE_MB": "100000",
        "VIPS_MAX_JOB_STORED_MB": "100000",
    }
    with embedded_service(home, limits) as service:
        write_binary_csv(tmp_path / "digits.csv", load_binary_digits("train"))
        service.ingest("digits", "binary", tmp_path / "digits.csv")
        service.synthetic_dataset(tmp_path)
        for dataset in ("digits", "synth"):
            service.set_budget(dataset, 100, service.key("custodian", dataset), DELTA)
        pid_before = (home / "worker.pid").read_text().strip()
        analyst, neighbour = service.key("analyst"), service.key("analyst")
        with VipsClient(service.url, analyst) as api, VipsClient(service.url, neighbour) as other:
            # The neighbour's job releases all along the big job's life (another key: it is not deferred).
            beside = other.submit_job(dataset="synth", model="blr", iterations=300, sigma=50.0)
            big = api.submit_job(
                dataset="digits",
                model="sbn",
                iterations=2,
                sigma=1000.0,  # epsilon near 0; exact noise has a grid for it up to ~3,000 at this size
                options={"hidden": 500},
                batch_size=100,
            )
            failed = wait(api, big["id"])
            assert failed["status"] == "failed", failed
            assert "ran out of memory" in str(failed["error"])
            assert wait(other, beside["id"])["status"] == "succeeded"
            started = datetime.fromisoformat(str(other.job(beside["id"])["started_at"]))
            assert started < datetime.fromisoformat(str(failed["finished_at"]))  # they did overlap
            small = api.submit_job(dataset="synth", model="blr", iterations=5, sigma=5.0)
            assert wait(api, small["id"])["status"] == "succeeded"
            budget = api.dataset("digits")["budget"]
            assert budget["epsilon_reserved"] == budget["epsilon_spent"]  # nothing left reserved
        assert (home / "worker.pid").read_text().strip() == pid_before  # the same worker, never restarted


def test_the_limit_is_the_processs_address_space() -> None:
    """limit_address_space sets the soft RLIMIT_AS and never raises it above the hard limit (in a child
    process, so this test process keeps its own)."""
    import multiprocessing

    def child(queue: multiprocessing.Queue[tuple[int, int, int]]) -> None:
        # Room above what the forked test process already maps (libraries such as pyarrow reserve
        # gigabytes of address space), so that the child can still start the queue's feeder thread.
        limit = mapped_bytes() + (1 << 30)
        limit_address_space(limit)
        queue.put((limit, *resource.getrlimit(resource.RLIMIT_AS)))

    context = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[tuple[int, int, int]] = context.Queue()
    process = context.Process(target=child, args=(queue,))
    process.start()
    limit, soft, hard = queue.get(timeout=30)
    process.join()
    assert soft == limit and (hard == resource.RLIM_INFINITY or hard >= soft)


def mapped_bytes() -> int:
    """This process's address space now (VmSize)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize in /proc/self/status")


@pytest.mark.parametrize(("given", "expected"), [(0.0, None), (512.0, 512 << 20)])
def test_the_limit_is_configured_in_mib(given: float, expected: int | None) -> None:
    from control.settings import ServiceSettings, machine_memory_mb

    assert ServiceSettings(worker_memory_mb=given).worker_memory_bytes() == expected
    # Per job process, whatever the concurrency: its start, its cache and one job.
    for concurrency in (1, 2, 8):
        settings = ServiceSettings(max_job_memory_mb=1000, worker_concurrency=concurrency)
        expected_mb = min(1024 + 1024 + 1000, 2 * machine_memory_mb())
        assert settings.worker_memory_bytes() == int(expected_mb * (1 << 20))


@pytest.mark.parametrize("concurrency", [1, 2, 4])
def test_default_limits_of_all_job_processes_fit_the_machine(concurrency: int) -> None:
    """Issue 34: the defaults admitted jobs of half the machine and capped each job process above it, so two
    processes could ask for 29.6 GB of a 24 GB machine. Now concurrency x (a process's limit) <= 80% of the
    machine's memory, and the admitted job fits one process's limit."""
    from control.settings import JOB_PROCESS_BASE_MB, ServiceSettings, machine_memory_mb

    settings = ServiceSettings(worker_concurrency=concurrency, worker_cache_mb=256)
    limit = settings.worker_memory_bytes()
    assert limit is not None
    if settings.max_job_memory_mb > 512:  # not the floor a small machine gets
        assert concurrency * limit <= 0.8 * machine_memory_mb() * (1 << 20) + concurrency
    assert JOB_PROCESS_BASE_MB + 256 + settings.max_job_memory_mb <= limit / (1 << 20) + 1e-6


@pytest.mark.parametrize(("shards", "broker"), [(1, None), (2, None), (4, None), (4, "redis://x")])
def test_embedded_shard_workers_count_among_the_job_processes(shards: int, broker: str | None) -> None:
    """Issue 52 item 7: `vips up` with VIPS_SHARDS=2 ran 2 job processes and 2 shard workers, each capped at
    a quarter... of nothing: 4 x 10.11 GB on a 25.3 GB machine. The embedded mode's shard workers now count
    among the processes the default limits share 80% of the machine between; full mode's run elsewhere."""
    from control.settings import ServiceSettings, machine_memory_mb

    settings = ServiceSettings(worker_concurrency=2, worker_cache_mb=256, shards=shards, broker_url=broker)
    processes = 2 + (shards if broker is None and shards > 1 else 0)
    assert settings.job_processes == processes
    limit = settings.worker_memory_bytes()
    assert limit is not None
    if settings.max_job_memory_mb > 512:
        assert processes * limit <= 0.8 * machine_memory_mb() * (1 << 20) + processes


def test_vips_up_caps_given_limits_that_would_sum_past_the_machine(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Limits the operator raised past the machine are capped at an equal share, with a warning, and the
    largest admitted job follows; limits that fit, or none (0), are left alone."""
    from control.settings import JOB_PROCESS_BASE_MB, ServiceSettings
    from vips.commands import server

    monkeypatch.setattr(server, "machine_memory_mb", lambda: 24_000.0)
    given = ServiceSettings(shards=2, worker_concurrency=2, worker_cache_mb=512, max_job_memory_mb=9_000)
    caps = server.embedded_memory_caps(given)
    assert caps == {
        "VIPS_WORKER_MEMORY_MB": "6000",
        "VIPS_MAX_JOB_MEMORY_MB": str(6000 - JOB_PROCESS_BASE_MB - 512),
    }
    assert given.max_job_memory_mb == 6000 - JOB_PROCESS_BASE_MB - 512  # what the API admits by
    warning = capsys.readouterr().err
    assert "4 job processes (2 of the worker, 2 shard workers)" in warning and "capped at 6000 MiB" in warning
    fits = ServiceSettings(shards=2, worker_concurrency=2, worker_cache_mb=512, max_job_memory_mb=3_000)
    assert server.embedded_memory_caps(fits) == {} and capsys.readouterr().err == ""
    unlimited = ServiceSettings(shards=2, worker_memory_mb=0)
    assert server.embedded_memory_caps(unlimited) == {}
