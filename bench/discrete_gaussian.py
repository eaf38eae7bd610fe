"""Speed of privacy_wall.noise.discrete_gaussian, and what the exact noise costs a model's iteration.

    .venv/bin/python -m bench.discrete_gaussian [--n 1000000] [--repeats 3]   # samples per second per sigma
    .venv/bin/python -m bench.discrete_gaussian --per-call                    # CPU per call at release sizes
    .venv/bin/python -m bench.discrete_gaussian --iterations                  # CPU and wall ms per iteration

Default: the best of --repeats runs per sigma (wall clock, and CPU time of this process, which other jobs on
a shared machine disturb less), next to numpy's float normal sampler on the same AES stream.

--per-call: the median CPU time of one call at the sizes releases make (BLR minibatch 253 ... paper-scale LDA
770,000 numbers), each at the parameter `fixed_point_grid(1.0, size)` gives (2^22 to 2^23 grid steps).

--iterations: CPU and wall ms per iteration (time.process_time, whose CPU counts every thread of the process,
and time.perf_counter between consecutive iterations of `run_vips`, median
over the iterations; single-threaded BLAS) of BLR on Adult (batch, sigma 10; minibatch S = 1,000, sigma 1),
SBN on bench.sbn's synthetic data (J = 64, K = 8, S = 1,600, sigma 1), and `release_blocks` alone on LDA's
paper-scale lambda statistics (K x V = 50 x 8,000, sigma 1.24). It uses only Gate.release, run_vips and
release_blocks, so it also runs against an older tree for a before/after comparison (PYTHONPATH=that tree;
the first line printed names the privacy_wall package in use).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from fractions import Fraction
from functools import partial

import numpy as np

import privacy_wall
from privacy_wall.noise.csprng import private_generator
from privacy_wall.noise.discrete_gaussian import rational_sigma2, sample_discrete_gaussian

SIGMAS = (1.0, 1.5, 10.0, 1000.5, 2.0**20, 2.0**20 * 1.37, 2.0**24)
#: numbers released per call: BLR minibatch's smallest block, SBN, BLR on Adult, LDA lambda, paper-scale LDA
SIZES = (253, 3_464, 6_669, 400_000, 770_000)


def best_of(repeats: int, run: Callable[[], object]) -> tuple[float, float]:
    """(wall, cpu) seconds of the fastest of `repeats` runs."""
    times = []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        run()
        times.append((time.perf_counter() - wall, time.process_time() - cpu))
    return min(times)


def median_cpu(run: Callable[[], object], repeats: int) -> float:
    run()  # warm up
    times = []
    for _ in range(repeats):
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return statistics.median(times)


def throughput(n: int, repeats: int) -> None:
    rng = private_generator()
    wall, cpu = best_of(repeats, lambda: rng.normal(0.0, 1.0, size=n))
    print(f"{'numpy normal (float)':>24}: wall {wall:.3f} s, cpu {cpu:.3f} s per {n:,}")
    for sigma in SIGMAS:
        sigma2: Fraction = rational_sigma2(sigma)
        wall, cpu = best_of(repeats, partial(sample_discrete_gaussian, sigma2, n, rng))
        print(
            f"{f'sigma = {sigma:,.2f}':>24}: wall {wall:.3f} s, cpu {cpu:.3f} s per {n:,} "
            f"({n / cpu:,.0f} samples per cpu second)"
        )


def per_call() -> None:
    from privacy_wall.noise.mechanisms import fixed_point_grid

    rng = private_generator()
    print("| draws per call | sigma (grid steps) | exact: CPU ms per call | ns per draw | float: CPU ms |")
    print("|---|---|---|---|---|")
    for size in SIZES:
        sigma2 = fixed_point_grid(1.0, size).sigma2
        repeats = max(5, 2_000_000 // size)
        exact = median_cpu(partial(sample_discrete_gaussian, sigma2, size, rng), repeats)
        normal = median_cpu(partial(rng.normal, 0.0, 1.0, size), repeats)
        print(
            f"| {size:,} | 2^{np.log2(float(sigma2)) / 2:.2f} | {1e3 * exact:.3f} | {1e9 * exact / size:.0f} "
            f"| {1e3 * normal:.3f} |"
        )


def iteration_times(run: Callable[[Callable[..., None]], object]) -> tuple[float, float]:
    """Median (CPU, wall) seconds between consecutive iterations of a run_vips call: CPU of the whole
    process (every thread, the noise drawn ahead included), wall by the clock."""
    stamps: list[tuple[float, float]] = []
    run(lambda *_: stamps.append((time.process_time(), time.perf_counter())))
    cpu, wall = np.diff(np.array(stamps), axis=0).T
    return statistics.median(cpu.tolist()), statistics.median(wall.tolist())


def iterations() -> dict[str, tuple[float, float]]:
    from threadpoolctl import threadpool_limits

    from bench.sbn import sample_sbn, synthetic_sbn
    from privacy_wall.data.store import InMemoryBinaryStore, InMemoryTabularStore
    from privacy_wall.gate import Gate
    from privacy_wall.ledger.base import InMemoryLedger
    from privacy_wall.noise.mechanisms import release_blocks
    from privacy_wall.queries.blr import LogisticRegressionQuery
    from vips.datasets.adult import load_adult
    from vips.models.blr.model import BayesianLogisticRegression
    from vips.models.sbn.model import SigmoidBeliefNetwork
    from vips.runner import LoopSettings, run_vips

    out: dict[str, tuple[float, float]] = {}
    with threadpool_limits(1):
        adult = load_adult("train")
        x, y = adult.features, adult.labels
        n, d = x.shape
        for name, size, sigma, count in [("blr_batch", n, 10.0, 16), ("blr_minibatch", 1_000, 1.0, 61)]:
            gate = Gate(InMemoryTabularStore("adult", x, y), InMemoryLedger(delta=1e-5), padded=False)
            settings = LoopSettings(count, size, sigma, 1.0, 0.7)
            model = BayesianLogisticRegression(laplace_from=0)
            fit = partial(
                run_vips, gate, LogisticRegressionQuery(), model, settings, job_id=name, dimension=d
            )
            out[name] = iteration_times(lambda hook, fit=fit: fit(population=n, on_iteration=hook))
        w, b, c = synthetic_sbn()
        train = sample_sbn(w, b, c, 60_000, np.random.default_rng(0))
        gate = Gate(InMemoryBinaryStore("synthetic", train), InMemoryLedger(delta=1e-4), padded=False)
        sbn = SigmoidBeliefNetwork(hidden=8, seed=0)
        sbn_settings = LoopSettings(21, 1_600, 1.0, 1.0, 0.7)

        def fit_sbn(hook: Callable[..., None]) -> None:
            rows, pixels = train.shape
            run_vips(
                gate,
                sbn.query(),
                sbn,
                sbn_settings,
                job_id="sbn",
                dimension=pixels,
                population=rows,
                on_iteration=hook,
            )

        out["sbn"] = iteration_times(fit_sbn)
        lam = np.random.default_rng(1).gamma(1.0, 1.0, size=(50, 8_000))
        rng = private_generator()
        lda = median_cpu(lambda: release_blocks({"lambda": lam}, {"lambda": 1.0}, 1.24, rng), 5)
        out["lda_release"] = (lda, math.nan)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--per-call", action="store_true", help="CPU per call at the sizes releases make")
    mode.add_argument("--iterations", action="store_true", help="CPU ms per iteration of BLR, SBN, LDA")
    args = parser.parse_args()
    print(f"privacy_wall from {privacy_wall.__file__}")
    if args.per_call:
        per_call()
    elif args.iterations:
        result = iterations()
        print("| per iteration | CPU ms | wall ms |")
        print("|---|---|---|")
        for name, (cpu, wall) in result.items():
            print(f"| {name} | {1e3 * cpu:.2f} | {1e3 * wall:.2f} |")
        print(
            json.dumps(
                {name: [round(1e3 * cpu, 3), round(1e3 * wall, 3)] for name, (cpu, wall) in result.items()}
            )
        )
    else:
        throughput(args.n, args.repeats)


if __name__ == "__main__":
    main()
