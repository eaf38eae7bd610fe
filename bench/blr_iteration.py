"""One batch VIPS-BLR iteration on Adult train through the gate vs the two matrix products it needs.

The products: the quadratic forms x_n^T M x_n (rowsum((X M) * X)) and X^T diag(xi) X. The ratio
(gate iteration time) / (products time) is measured in one run, median of repeats.

    python -m bench.blr_iteration
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from privacy_wall.gate import Gate
from privacy_wall.ledger import InMemoryLedger
from privacy_wall.queries.blr import LogisticRegressionQuery
from privacy_wall.store import InMemoryTabularStore
from worker.datasets.adult import load_adult
from worker.models.blr import BayesianLogisticRegression


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()

    data = load_adult("train")
    x, y = data.features, data.labels
    n, d = x.shape
    model = BayesianLogisticRegression()
    state = model.initial_state(d)
    params = model.public_params(state)
    moment = params["second_moment"]
    xi = np.full(n, 0.2)

    def products() -> None:
        np.einsum("ij,ij->i", x @ moment, x)
        (x * xi[:, None]).T @ x

    store = InMemoryTabularStore("adult", x, y)
    gate = Gate(store, InMemoryLedger(delta=1e-5))
    query = LogisticRegressionQuery()
    counter = iter(range(1, 10**9))

    def iteration() -> None:
        release = gate.release(
            query, params, job_id="bench", iteration=next(counter), sigma=10.0, batch_size=n
        )
        model.m_step(state, release.statistics, n, 1.0)

    t_products, t_iteration = interleaved_medians([products, iteration], args.repeats)
    print(f"Adult train: N = {n}, d = {d}")
    print("| measure | ms |")
    print("|---|---|")
    print(f"| the two products (X M quadratic forms, X^T diag(xi) X) | {1e3 * t_products:.2f} |")
    print(f"| one batch iteration through the gate (+ M-step) | {1e3 * t_iteration:.2f} |")
    print(f"| ratio | {t_iteration / t_products:.2f} |")


if __name__ == "__main__":
    main()
