"""Submissions under contention (issue 52 item 5): many clients submitting jobs to one embedded `vips up`
(SQLite) at once, each with its own analyst key (one key's pricing requests are rate-limited), one-iteration
jobs that the worker runs meanwhile. Reports how long each POST /v1/jobs took to answer: p50, p95, p99
and the longest, against the client's 60 s timeout.

    python -m bench.submissions [--threads 50] [--per-thread 4]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import httpx

from tests.e2e import embedded_service, synthetic_csv

#: The job each client submits: one release of 100 of 2,000 rows.
JOB = {"dataset": "s", "model": "blr", "iterations": 1, "batch_size": 100, "sigma": 5.0}


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--threads", type=int, default=50)
    parser.add_argument("--per-thread", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, embedded_service(Path(folder) / "home") as service:
        csv = Path(folder) / "s.csv"
        synthetic_csv(csv, n=2_000)
        service.ingest("s", "tabular", csv, "label")
        service.set_budget("s", 1_000.0, service.key("custodian", "s"), delta=1e-4)
        keys = [service.key("analyst", "s") for _ in range(args.threads)]
        seconds: list[float] = []
        refused: list[int] = []
        lock = threading.Lock()

        def submit(key: str, client: int) -> None:
            headers = {"Authorization": f"Bearer {key}"}
            with httpx.Client(base_url=service.url, headers=headers, timeout=120) as http:
                for i in range(args.per_thread):
                    started = time.perf_counter()
                    answer = http.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": f"c{client}-{i}"})
                    with lock:
                        seconds.append(time.perf_counter() - started)
                        if answer.status_code != 202:
                            refused.append(answer.status_code)

        threads = [threading.Thread(target=submit, args=(key, k)) for k, key in enumerate(keys)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        total = time.perf_counter() - started
    print(
        f"{len(seconds)} submissions from {args.threads} clients in {total:.1f} s: p50 "
        f"{quantile(seconds, 0.5):.2f} s, p95 {quantile(seconds, 0.95):.2f} s, p99 "
        f"{quantile(seconds, 0.99):.2f} s, longest {max(seconds):.2f} s; not 202: {len(refused)}"
    )


if __name__ == "__main__":
    main()
