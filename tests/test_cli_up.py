"""`vips up` owns its store and its port (issue 24.3), and `vips wait` reattaches to a running job (issue
24.2): real `vips up` processes, one service for the module."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.http.client import VipsClient
from tests.e2e import Service, _clean_env, embedded_service, free_port
from vips.store_lock import LOCK_NAME

pytestmark = pytest.mark.slow

DELTA = 1e-5
#: What a `vips up` killed by SIGKILL leaves behind: its lock file, with no process holding the lock.
STALE = "pid 999999999\nurl http://127.0.0.1:1\n"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    home = tmp_path_factory.mktemp("up") / "home"
    home.mkdir(mode=0o700)
    (home / LOCK_NAME).write_text(STALE)
    (home / LOCK_NAME).chmod(0o600)
    with embedded_service(home) as running:
        yield running


def home_of(service: Service) -> Path:
    return Path(service.env["VIPS_HOME"])


def up(home: Path, port: int) -> subprocess.CompletedProcess[str]:
    """A second `vips up`, which must give up at once."""
    env = {**_clean_env(), "VIPS_HOME": str(home)}
    argv = [sys.executable, "-m", "vips.cli", "up", "--port", str(port)]
    return subprocess.run(argv, env=env, text=True, capture_output=True, timeout=60)


def test_a_stale_lock_of_a_dead_process_is_taken_over(service: Service) -> None:
    pid = service.processes["up"].pid
    assert (home_of(service) / LOCK_NAME).read_text() == f"pid {pid}\nurl {service.url}\n"


def test_a_second_up_on_the_same_store_is_refused_naming_the_running_one(service: Service) -> None:
    home = home_of(service)
    worker_pid = (home / "worker.pid").read_text()
    done = up(home, free_port())
    assert done.returncode == 1
    pid = service.processes["up"].pid
    assert "already served by another `vips up`" in done.stderr
    assert f"pid {pid}, serving on {service.url}" in done.stderr
    assert "serving on http" not in done.stderr.replace(f"serving on {service.url})", "")
    assert "export" not in done.stderr
    assert (home / "worker.pid").read_text() == worker_pid


def test_up_on_a_port_in_use_fails_before_printing_anything(service: Service, tmp_path: Path) -> None:
    port = service.url.rsplit(":", 1)[1]
    done = up(tmp_path / "other", int(port))
    assert done.returncode == 1
    assert done.stderr.startswith("vips: error: cannot listen on 127.0.0.1:")
    assert f"port {port} is in use" in done.stderr
    assert "serving on" not in done.stderr and "export" not in done.stderr
    assert not (tmp_path / "other" / "worker.pid").exists()


def test_wait_reattaches_to_a_running_job_and_ends_like_fit_wait(service: Service, tmp_path: Path) -> None:
    service.synthetic_dataset(tmp_path)
    custodian, analyst = service.key("custodian", "synth"), service.key("analyst")
    service.set_budget("synth", 100, custodian, DELTA)
    fit = ["fit", "--dataset", "synth", "--model", "blr", "--iterations", "300", "--batch-size", "50"]
    submitted = service.vips(*fit, "--sigma", "50", key=analyst)
    job_id = submitted.stdout.strip()
    assert f"vips wait {job_id}" in submitted.stderr
    with VipsClient(service.url, analyst) as api:
        deadline = time.monotonic() + 60
        while api.job(job_id)["status"] == "queued":
            assert time.monotonic() < deadline
            time.sleep(0.05)

    posterior = tmp_path / "posterior.json"
    waited = service.vips("wait", job_id[:8], "-o", str(posterior), key=analyst)
    finished = json.loads(waited.stdout)
    assert (finished["id"], finished["status"], finished["iteration"]) == (job_id, "succeeded", 300)
    assert f"posterior written to {posterior}" in waited.stderr
    assert f"job {job_id[:8]} spent epsilon" in waited.stderr and "left of" in waited.stderr
    assert json.loads(posterior.read_text())["job_id"] == job_id

    downloaded = tmp_path / "again.json"
    got = service.vips("posterior", job_id[:8], "-o", str(downloaded), key=analyst)
    assert f"written to {downloaded}" in got.stderr and "the job's epsilon " in got.stderr
    assert f"at delta {DELTA:g}" in got.stderr


def children_of(pid: int) -> list[int]:
    """The processes whose parent is `pid` (the worker's job processes)."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        if int(fields["PPid"]) == pid:
            found.append(int(fields["Pid"]))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; only its parent has not collected it yet


def test_a_worker_ends_with_its_killed_up_and_its_job_processes_with_it(tmp_path: Path) -> None:
    """`vips up` killed by SIGKILL gets no chance to stop its worker: the worker sees it gone and ends,
    with its job processes, so no orphan serves the store that the next `vips up` takes."""
    with embedded_service(tmp_path / "home") as killed:
        worker = int((tmp_path / "home" / "worker.pid").read_text())
        job_processes = children_of(worker)
        assert job_processes, "the worker runs its jobs in job processes"
        killed.processes["up"].send_signal(signal.SIGKILL)
        killed.processes["up"].wait()
        deadline = time.monotonic() + 15  # ORPHAN_POLL_SECONDS and the kernel's delivery, with room
        while any(alive(pid) for pid in (worker, *job_processes)):
            assert time.monotonic() < deadline, "the orphaned worker or a job process still runs"
            time.sleep(0.2)
