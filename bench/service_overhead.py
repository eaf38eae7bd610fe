"""What the service adds to a job: HTTP, Redis, Celery, the gate over the databases, the ledger writes.

The same tiny VIPS-BLR job (synthetic, N = 500, d = 5, S = 100, sigma = 2) runs end to end through the
production shape (`vips serve` + `vips worker` subprocesses on PostgreSQL and Redis, as tests/e2e.py starts
them) and in-process through the estimator (in-memory store and ledger), in one run. A job's service time
is from the POST until the worker wrote its end (the job's `finished_at`, read from the API), so the
client's polling interval does not count. Jobs of T = 1 and T = T_long give the fixed cost per job and
the cost per iteration (the slope). Then 32 client threads GET one job concurrently: p50 and p99. They
share one analyst key, so the service runs with its per-key guards on reads raised above what the clients
send (VIPS_READS_IN_FLIGHT_PER_KEY, 4 by default, and VIPS_READ_RATE_PER_KEY / VIPS_READ_BURST_PER_KEY,
20 a second in bursts of 200: a 429 beyond, which tests/test_rate_limits.py checks): what is measured is
the server's latency under that many concurrent reads, not one key's fair share.

    python -m bench.service_overhead            # needs PostgreSQL and Redis, as the tests do

Targets (issue 3): < 250 ms extra per job, < 5 ms extra per iteration, GET job p99 < 50 ms.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import httpx
import numpy as np

from service.http.client import VipsClient
from tests.e2e import production_service, synthetic_csv
from vips.estimators import VIPSLogisticRegression

N, D, BATCH, SIGMA = 500, 5, 100, 2.0
#: How often `vips fit --wait` polls a job (vips/commands/remote.py).
POLL_SECONDS = 0.25


def _seconds(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def service_job_seconds(api: VipsClient, iterations: int) -> float:
    """POST to finished_at of one job (the job's own timestamps; the POST's round trip added)."""
    before = time.perf_counter()
    job = api.submit_job(dataset="synth", model="blr", iterations=iterations, batch_size=BATCH, sigma=SIGMA)
    submit = time.perf_counter() - before
    done = api.wait(job["id"], interval=0.005, timeout=120)
    assert done["status"] == "succeeded", done
    return submit + _seconds(done["created_at"], done["finished_at"])


def in_process_job_seconds(x: np.ndarray, y: np.ndarray, iterations: int) -> float:
    model = VIPSLogisticRegression(sigma=SIGMA, batch_size=BATCH, iterations=iterations)
    before = time.perf_counter()
    model.fit(x, y)
    return time.perf_counter() - before


def get_latencies(
    url: str, key: str, path: str, clients: int, requests: int, interval: float = 0.0
) -> list[float]:
    """`clients` threads, each with its own connection, GET `path` `requests` times; seconds each.

    interval 0 is a closed loop (every client sends its next request as soon as the answer arrives: the
    server's saturation); interval > 0 paces each client like `vips fit --wait`, which polls every
    0.25 s, with the clients' phases spread evenly over one interval.
    """
    latencies: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(clients)

    def run(phase: float) -> None:
        mine: list[float] = []
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
            http.get(path).raise_for_status()  # connect outside the timing
            start.wait()
            next_at = time.perf_counter() + phase
            for _ in range(requests):
                if interval > 0:
                    time.sleep(max(0.0, next_at - time.perf_counter()))
                    next_at += interval
                before = time.perf_counter()
                http.get(path).raise_for_status()
                mine.append(time.perf_counter() - before)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=run, args=(interval * i / clients,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--long", type=int, default=50, help="iterations of the long job")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=50, help="GETs per client")
    parser.add_argument("--api-workers", type=int, default=1, help="`vips serve --workers`")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        csv = tmp_path / "synth.csv"
        synthetic_csv(csv, n=N, d=D)
        raw = np.loadtxt(csv, delimiter=",", skiprows=1)
        x, y = raw[:, :D], raw[:, D]
        reads = {
            "VIPS_READS_IN_FLIGHT_PER_KEY": str(max(args.clients, 4)),
            "VIPS_READ_RATE_PER_KEY": "1e6",
            "VIPS_READ_BURST_PER_KEY": str(10**6),
        }
        with production_service(tmp_path, api_workers=args.api_workers, env=reads) as service:
            service.vips(
                "data", "ingest", "synth", "--kind", "tabular", "--input", str(csv), "--label", "label"
            )
            custodian, analyst = service.key("custodian", "synth"), service.key("analyst")
            service.vips("budget", "set", "synth", "--epsilon", "1e6", "--delta", "1e-5", key=custodian)
            with VipsClient(service.url, analyst) as api:
                service_job_seconds(api, 1)  # warm-up: connections, imports, caches
                in_process_job_seconds(x, y, 1)
                timings: dict[tuple[str, int], list[float]] = {}
                for _ in range(args.repeats):  # interleaved, so background load hits both alike
                    for t in (1, args.long):
                        timings.setdefault(("service", t), []).append(service_job_seconds(api, t))
                        timings.setdefault(("in-process", t), []).append(in_process_job_seconds(x, y, t))
                last = api.jobs(limit=1)[0]["id"]
            job_path = f"/v1/jobs/{last}"
            single = get_latencies(service.url, analyst, job_path, 1, args.requests)
            saturated = get_latencies(service.url, analyst, job_path, args.clients, args.requests)
            polling = get_latencies(service.url, analyst, job_path, args.clients, args.requests, POLL_SECONDS)
            # The floor of the closed loop on this machine: an endpoint that does no work.
            floor = get_latencies(service.url, analyst, "/healthz", args.clients, args.requests)

    med = {k: statistics.median(v) for k, v in timings.items()}
    per_job = med[("service", 1)] - med[("in-process", 1)]
    slope_service = (med[("service", args.long)] - med[("service", 1)]) / (args.long - 1)
    slope_local = (med[("in-process", args.long)] - med[("in-process", 1)]) / (args.long - 1)
    print(f"Tiny VIPS-BLR job: N = {N}, d = {D}, S = {BATCH}, sigma = {SIGMA}; medians of {args.repeats}")
    print("\n| measure | service | in-process | extra | ratio |")
    print("|---|---|---|---|---|")
    for t in (1, args.long):
        s, i = med[("service", t)], med[("in-process", t)]
        print(f"| job, T = {t} (ms) | {1e3 * s:.1f} | {1e3 * i:.1f} | {1e3 * (s - i):.1f} | {s / i:.1f} |")
    print(
        f"| per iteration (ms, slope) | {1e3 * slope_service:.2f} | {1e3 * slope_local:.2f} | "
        f"{1e3 * (slope_service - slope_local):.2f} | {slope_service / slope_local:.1f} |"
    )
    print(f"\nExtra per job (T = 1): {1e3 * per_job:.1f} ms (target < 250)")
    print(f"Extra per iteration: {1e3 * (slope_service - slope_local):.2f} ms (target < 5)")
    print(f"\nGET /v1/jobs/{{id}} of a T = {args.long} job, {args.requests} requests per client (ms):\n")
    print("| clients | pacing | p50 | p99 | max |")
    print("|---|---|---|---|---|")
    for clients, pacing, seconds in (
        (1, "closed loop", single),
        (args.clients, "closed loop (saturation)", saturated),
        (args.clients, f"each polls every {POLL_SECONDS} s, as `vips fit --wait`", polling),
        (args.clients, "closed loop on /healthz (no work: the harness's floor)", floor),
    ):
        ms = np.asarray(seconds) * 1e3
        print(
            f"| {clients} | {pacing} | {np.percentile(ms, 50):.1f} | {np.percentile(ms, 99):.1f} "
            f"| {ms.max():.1f} |"
        )
    print("\nTarget: p99 < 50 ms with 32 concurrent clients.")


if __name__ == "__main__":
    main()
