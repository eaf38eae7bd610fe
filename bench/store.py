"""The sensitive store on its own (issue 22): ingest, a full pass and minibatch reads, SQLite and
PostgreSQL, as plain in-process calls (no service), on the CSV of bench/scale.py.

Prints per backend: ingest seconds, a full pass (`DatabaseStore.take(slice(None))`, best of 2), and a
minibatch of 1,000 uniform ids read from the blocks (no cache: what a worker does for data larger than
VIPS_WORKER_CACHE_MB) and from the worker's cache (best of 3 each).

    python -m bench.store                  # N = 10^6
    python -m bench.store --rows 200000
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.scale import write_csv
from privacy_wall.data.dataset_cache import DatasetCache
from privacy_wall.data.db_store import DatabaseStore
from privacy_wall.data.ingest import ingest
from privacy_wall.sqlengine import create_db_engine
from tests.dbservers import fresh_database
from vips.migrate import upgrade


def best(repeats: int, call: object) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()  # type: ignore[operator]
        times.append(time.perf_counter() - started)
    return min(times)


def measure(backend: str, csv: Path, rows: int, folder: Path) -> dict[str, float]:
    with fresh_database(backend, folder) as control_url, fresh_database(backend, folder) as sensitive_url:
        upgrade("control", control_url)
        upgrade("sensitive", sensitive_url)
        control, sensitive = create_db_engine(control_url), create_db_engine(sensitive_url)
        try:
            started = time.perf_counter()
            ingest(control=control, sensitive=sensitive, name="d", kind="tabular", path=csv, label="label")
            result = {"ingest_s": time.perf_counter() - started}
            store = DatabaseStore(sensitive, "d")
            result["full_s"] = best(2, lambda: store.take(slice(None)))
            rng = np.random.default_rng(0)
            result["mini_blocks_s"] = best(3, lambda: store.take(rng.choice(rows, 1000, replace=False)))
            cached = DatabaseStore(sensitive, "d", DatasetCache(1 << 32))
            cached.take(slice(None))
            result["mini_cached_s"] = best(3, lambda: cached.take(rng.choice(rows, 1000, replace=False)))
            return result
        finally:
            control.dispose()
            sensitive.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    print("backend N ingest_s full_pass_s minibatch_blocks_s minibatch_cached_s")
    with tempfile.TemporaryDirectory() as folder:
        csv = Path(folder) / "store.csv"
        write_csv(csv, args.rows)
        for backend in ("sqlite", "postgresql"):
            r = measure(backend, csv, args.rows, Path(folder))
            print(
                f"{backend} {args.rows:,} {r['ingest_s']:.2f} {r['full_s']:.3f} {r['mini_blocks_s']:.4f} "
                f"{r['mini_cached_s']:.5f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
