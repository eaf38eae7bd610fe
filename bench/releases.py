"""Stored releases and their download, against JSON text (what the service stored before revision 0007).

The job of issue 21's storage finding: SBN with 50 hidden units on 256 pixels, 5 releases of 666,162
values each. Stored: the .npz blobs (control.store.release_arrays) vs json.dumps of the same statistics.
Served: the API's peak traced memory (tracemalloc, in process) while a client downloads every page of
GET /v1/jobs/ID/releases, vs the size of the JSON it receives and vs a plain in-process json.dumps of the
same releases at once (the old endpoint built that whole list).

    python -m bench.releases [--iterations 5] [--hidden 50] [--pixels 256]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient

from control.store.release_arrays import encode_arrays
from tests.dbservers import fresh_database
from tests.test_api import make_api, store_release


def sbn_release(rng: np.random.Generator, hidden: int, pixels: int) -> dict[str, np.ndarray]:
    """The blocks of one SBN release (privacy_wall.queries.sbn): s1 (K), s3, s4 (J), s5, s6 (J K), s7
    (J K K)."""
    k, j = hidden, pixels
    return {
        "s1": rng.normal(size=k),
        "s3": rng.normal(size=j),
        "s4": rng.normal(size=j),
        "s5": rng.normal(size=(j, k)),
        "s6": rng.normal(size=(j, k)),
        "s7": rng.normal(size=(j, k, k)),
    }


def download(client: TestClient, path: str, headers: dict[str, str]) -> tuple[int, int]:
    """Every page of releases from `path` on, following Link rel="next": (bytes received, pages)."""
    received, pages = 0, 0
    while path:
        with client.stream("GET", path, headers=headers) as r:
            received += sum(len(chunk) for chunk in r.iter_bytes())
            link = r.headers.get("link")
        pages += 1
        path = str(r.url.join(link[1 : link.index(">")])) if link else ""
    return received, pages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=50)
    parser.add_argument("--pixels", type=int, default=256)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    released = [sbn_release(rng, args.hidden, args.pixels) for _ in range(args.iterations)]
    values = sum(v.size for v in released[0].values())
    blobs = [encode_arrays(r) for r in released]
    texts = [json.dumps({k: v.tolist() for k, v in r.items()}) for r in released]
    print(f"{args.iterations} releases of {values:,} values")
    stored, text = sum(map(len, blobs)), sum(map(len, texts))
    print(f"stored .npz {stored / 1e6:.1f} MB vs JSON {text / 1e6:.1f} MB: ratio {stored / text:.3f}")

    started = time.perf_counter()
    whole = json.dumps([{k: v.tolist() for k, v in r.items()} for r in released])
    plain_seconds = time.perf_counter() - started
    del whole
    tracemalloc.start()
    whole = json.dumps([{k: v.tolist() for k, v in r.items()} for r in released])
    _, plain_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del whole

    with tempfile.TemporaryDirectory() as home, fresh_database("sqlite", Path(home)) as url:
        for api in make_api(url, Path(home)):
            job_id = api.submit().json()["id"]
            for t, release in enumerate(released, start=1):
                store_release(api.engine, job_id, t, release, {name: 1.0 for name in release})
            headers = {"Authorization": f"Bearer {api.keys['analyst']}"}

            path = f"/v1/jobs/{job_id}/releases"
            started = time.perf_counter()
            received, pages = download(api.client, path, headers)
            seconds = time.perf_counter() - started
            tracemalloc.start()
            download(api.client, path, headers)
            _, served_peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
    print(
        f"download: {received / 1e6:.1f} MB of JSON in {pages} pages, {seconds:.2f} s (plain json.dumps of "
        f"the whole list {plain_seconds:.2f} s: ratio {seconds / plain_seconds:.2f})"
    )
    print(
        f"peak traced memory serving it {served_peak / 1e6:.1f} MB ({served_peak / received:.3f} of the JSON "
        f"received); plain json.dumps of the whole list {plain_peak / 1e6:.1f} MB (served / plain "
        f"{served_peak / plain_peak:.3f})"
    )


if __name__ == "__main__":
    main()
