"""Data at scale on one machine (issue 22): ingest, full-batch and minibatch iterations through `vips up`,
the worker's memory, and the numpy floor, in one run.

For each N: a synthetic tabular CSV (20 features scaled to norm <= 1 and a 0/1 label: 21 columns, about
420 bytes a row) is ingested by `vips data ingest` (wall time and the process's peak RSS); then, on an
embedded `vips up` with default settings, a 10-iteration full-batch BLR job and a 50-iteration minibatch
job (S = 1,000). Seconds per iteration are the median gap between consecutive releases (their created_at),
so the job's start and its posterior do not count. The floor is numpy's X^T (w X) and X^T y on the same
arrays in this process (best of 3); the worker's peak RSS is the largest VmHWM of its processes after
the jobs.

    python -m bench.scale                      # N = 10^4, 10^5 and 10^6
    python -m bench.scale --rows 5000000       # one N (5 x 10^6 needs ~2 GB of CSV in /tmp)
    python -m bench.scale --rows 1000000 --shards 1 --shards 2   # VIPS_SHARDS = 1 and 2 on one store

With K > 1 the worker's peak is the largest over the job worker's and the shard workers' processes.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import numpy as np

from privacy_wall.ledger.delta_policy import suggested_delta
from service.http.client import VipsClient
from tests.e2e import embedded_service

D = 20
#: The child's peak RSS in kB, measured by a wrapper process that waits for it (RUSAGE_CHILDREN).
_PEAK = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def write_csv(path: Path, rows: int, seed: int = 0) -> None:
    """`rows` synthetic rows in pieces of 10^5 (features of norm < 1, labels from a logistic model)."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=D)
    with path.open("w") as out:
        out.write(",".join([*(f"x{j}" for j in range(D)), "label"]) + "\n")
        for start in range(0, rows, 100_000):
            n = min(100_000, rows - start)
            x = rng.normal(size=(n, D))
            x /= np.linalg.norm(x, axis=1, keepdims=True) * rng.uniform(1.0, 2.0, size=(n, 1))
            y = (rng.random(n) < 1 / (1 + np.exp(-3 * x @ w))).astype(int)
            np.savetxt(out, np.column_stack([x, y]), fmt=[*["%.6f"] * D, "%d"], delimiter=",")


def numpy_floor(rows: int) -> float:
    """Best of 3 seconds of X^T (w X) and X^T y over the whole table: what any full pass costs."""
    rng = np.random.default_rng(1)
    x, y, w = rng.normal(size=(rows, D)), rng.random(rows), rng.random(rows)
    times = []
    for _ in range(3):
        started = time.perf_counter()
        _ = x.T @ (w[:, None] * x), x.T @ y
        times.append(time.perf_counter() - started)
    return min(times)


def seconds_per_iteration(api: VipsClient, job_id: str) -> float:
    stamps = [datetime.fromisoformat(r["created_at"]) for r in api.iter_releases(job_id)]
    return statistics.median((b - a).total_seconds() for a, b in itertools.pairwise(stamps))


def peak_rss_kb(pid: int) -> int:
    """The largest VmHWM of the worker and of its job processes (Celery's prefork children)."""
    peaks = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        except OSError:  # the process ended while we looked
            continue
        if int(fields["Pid"]) == pid or int(fields["PPid"]) == pid:
            peaks.append(int(fields.get("VmHWM", "0 kB").split()[0]))
    return max(peaks, default=0)


def run(rows: int, folder: Path, shards: list[int]) -> list[dict[str, float]]:
    """Ingest N rows once; then, for each K in `shards`, a `vips up` with VIPS_SHARDS=K on that store runs
    the full-batch and the minibatch job (K = 1: no shard workers)."""
    csv = folder / f"scale-{rows}.csv"
    write_csv(csv, rows)
    home = folder / f"home-{rows}"
    ingested: dict[str, float] = {"rows": rows, "csv_mb": csv.stat().st_size / 1e6}
    results = []
    for index, count in enumerate(shards):
        result = dict(ingested, shards=count)
        with embedded_service(home, {"VIPS_SHARDS": str(count)}) as service:
            if index == 0:
                started = time.perf_counter()
                argv = [sys.executable, "-m", "vips.cli", "data", "ingest", "scale", "--kind", "tabular"]
                argv += ["--label", "label", "--input", str(csv)]
                done = subprocess.run(
                    [sys.executable, "-c", _PEAK, *argv],
                    env=service.env,
                    text=True,
                    capture_output=True,
                    check=True,
                )
                ingested["ingest_s"] = time.perf_counter() - started
                ingested["ingest_rss_mb"] = int(done.stdout.strip().splitlines()[-1]) / 1024
                result.update(ingested)
                custodian = service.key("custodian", "scale")
                delta = f"{suggested_delta(rows):g}"  # below 1/N, as a private dataset's budget's must be
                service.vips("budget", "set", "scale", "--epsilon", "1000", "--delta", delta, key=custodian)
            with VipsClient(service.url, service.key("analyst"), timeout=60) as api:
                full = api.submit_job(dataset="scale", model="blr", iterations=10, batch_size=rows, sigma=5.0)
                assert api.wait(full["id"], interval=0.5, timeout=3600)["status"] == "succeeded"
                result["full_s_per_it"] = seconds_per_iteration(api, full["id"])
                mini = api.submit_job(dataset="scale", model="blr", iterations=50, batch_size=1000, sigma=5.0)
                assert api.wait(mini["id"], interval=0.5, timeout=3600)["status"] == "succeeded"
                result["mini_s_per_it"] = seconds_per_iteration(api, mini["id"])
            worker_pids = [int((home / "worker.pid").read_text())]
            worker_pids += [
                int((home / f"shard-{k}.pid").read_text()) for k in range(count if count > 1 else 0)
            ]
            result["worker_rss_mb"] = max(peak_rss_kb(pid) for pid in worker_pids) / 1024
        results.append(result)
    csv.unlink()
    floor = numpy_floor(rows)
    for result in results:
        result["floor_s"] = floor
        result["data_mb"] = rows * (D + 2) * 8 / 1e6  # float64 features, intercept-free, labels
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows", type=int, action="append", help="N (repeatable); default 10^4, 10^5 and 10^6"
    )
    parser.add_argument(
        "--shards", type=int, action="append", help="VIPS_SHARDS values to run (repeatable); default 1"
    )
    args = parser.parse_args()
    header = "N K ingest_s ingest_RSS_MB full_s/it floor_s ratio mini_s/it worker_RSS_MB data_MB"
    print(header)
    with tempfile.TemporaryDirectory() as folder:
        for rows in args.rows or [10_000, 100_000, 1_000_000]:
            for r in run(rows, Path(folder), args.shards or [1]):
                print(
                    f"{rows:,} {r['shards']:.0f} {r['ingest_s']:.1f} {r['ingest_rss_mb']:.0f} "
                    f"{r['full_s_per_it']:.3f} {r['floor_s']:.4f} {r['full_s_per_it'] / r['floor_s']:.1f}x "
                    f"{r['mini_s_per_it']:.4f} {r['worker_rss_mb']:.0f} {r['data_mb']:.0f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
