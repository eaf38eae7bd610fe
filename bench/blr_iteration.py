"""One batch VIPS-BLR iteration on Adult train through the gate vs the two matrix products it needs.

The products: the quadratic forms x_n^T M x_n (rowsum((X M) * X)) and X^T diag(xi) X. The ratio
(gate iteration time) / (products time) is measured in one run, median of repeats. The iteration is
what a private job runs: the release (sigma 10, S = N) and the noise-aware M-step with the release's
noise std (the shrink_h path).

--against REF (repeatable) also times the same iteration with vips/models/blr/model.py and
privacy_wall/queries/blr.py as committed at REF (read with `git show`, loaded under other module names;
the rest of the code is the working tree's), interleaved with the current code in the same run, and
prints how far REF's posterior mean is from the current code's on the same release.

    python -m bench.blr_iteration
    python -m bench.blr_iteration --against 7538bcf^ --against HEAD
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from privacy_wall.data.store import InMemoryTabularStore
from privacy_wall.gate import Gate
from privacy_wall.ledger.base import InMemoryLedger
from privacy_wall.queries.blr import LogisticRegressionQuery
from vips.datasets.adult import load_adult
from vips.models.blr.model import BayesianLogisticRegression

SIGMA = 10.0


def interleaved_medians(fns: list[Callable[[], object]], repeats: int) -> list[float]:
    """Median seconds of each function, timed in alternation so background load hits all alike."""
    for fn in fns:
        fn()  # warm up
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, bucket in zip(fns, times, strict=True):
            start = time.perf_counter()
            fn()
            bucket.append(time.perf_counter() - start)
    return [statistics.median(bucket) for bucket in times]


def module_at(ref: str, path: str, name: str, directory: Path) -> ModuleType:
    """The file `path` as committed at `ref`, imported as module `name`."""
    source = subprocess.run(["git", "show", f"{ref}:{path}"], check=True, capture_output=True).stdout
    target = directory / f"{name}.py"
    target.write_bytes(source)
    spec = importlib.util.spec_from_file_location(name, target)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--against", action="append", default=[], help="a git revision to time too")
    args = parser.parse_args()

    data = load_adult("train")
    x, y = data.features, data.labels
    n, d = x.shape
    xi = np.full(n, 0.2)
    store = InMemoryTabularStore("adult", x, y)
    gate = Gate(store, InMemoryLedger(delta=1e-5), padded=False)
    counter = iter(range(1, 10**9))

    def setup(model: Any, query: Any) -> tuple[Callable[[], object], Callable[[], object], Any]:
        state = model.initial_state(d)
        params = model.public_params(state)
        release = gate.release(
            query, params, job_id="bench", iteration=next(counter), sigma=SIGMA, batch_size=n
        )

        def iteration() -> None:
            fresh = gate.release(
                query, params, job_id="bench", iteration=next(counter), sigma=SIGMA, batch_size=n
            )
            model.m_step(state, fresh.statistics, n, 1.0, fresh.noise_std)

        def m_step() -> object:
            return model.m_step(state, release.statistics, n, 1.0, release.noise_std)

        return iteration, m_step, release

    moment = BayesianLogisticRegression(laplace_from=0).public_params(
        BayesianLogisticRegression(laplace_from=0).initial_state(d)
    )
    moment_matrix = moment["second_moment"]

    def products() -> None:
        np.einsum("ij,ij->i", x @ moment_matrix, x)
        (x * xi[:, None]).T @ x

    labels = ["current"]
    current = BayesianLogisticRegression(laplace_from=0)
    iteration, m_step, release = setup(current, LogisticRegressionQuery())
    fns: list[Callable[[], object]] = [products, iteration, m_step]
    mean = current.m_step(current.initial_state(d), release.statistics, n, 1.0, release.noise_std).mean
    differences: list[float] = []
    with tempfile.TemporaryDirectory() as directory:
        for index, ref in enumerate(args.against):
            model_module = module_at(ref, "vips/models/blr/model.py", f"_blr_model_{index}", Path(directory))
            query_module = module_at(
                ref, "privacy_wall/queries/blr.py", f"_blr_query_{index}", Path(directory)
            )
            model = model_module.BayesianLogisticRegression()
            ref_iteration, ref_m_step, _ = setup(model, query_module.LogisticRegressionQuery())
            fns += [ref_iteration, ref_m_step]
            labels.append(ref)
            ref_mean = model.m_step(
                model.initial_state(d), release.statistics, n, 1.0, release.noise_std
            ).mean
            differences.append(float(np.max(np.abs(ref_mean - mean))))
        times = interleaved_medians(fns, args.repeats)
    t_products = times[0]
    print(f"Adult train: N = {n}, d = {d}, sigma {SIGMA}, S = N, median of {args.repeats}")
    print("| code | iteration through the gate + M-step (ms) | M-step (ms) | iteration / products |")
    print("|---|---|---|---|")
    for index, label in enumerate(labels):
        t_iteration, t_m_step = times[1 + 2 * index], times[2 + 2 * index]
        print(
            f"| {label} | {1e3 * t_iteration:.2f} | {1e3 * t_m_step:.2f} | {t_iteration / t_products:.2f} |"
        )
    print(f"the two products (X M quadratic forms, X^T diag(xi) X): {1e3 * t_products:.2f} ms")
    for ref, difference in zip(args.against, differences, strict=True):
        print(f"max |mean(current) - mean({ref})| on one release: {difference:.2e}")


if __name__ == "__main__":
    main()
