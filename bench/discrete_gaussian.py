"""Speed of privacy_wall.discrete_gaussian: samples per second at several sigmas (grid steps).

    .venv/bin/python -m bench.discrete_gaussian [--n 1000000] [--repeats 3]

Reports the best of --repeats runs per sigma (wall clock, and CPU time of this process, which other jobs on
a shared machine disturb less), next to numpy's float normal sampler on the same AES stream.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from fractions import Fraction
from functools import partial

from privacy_wall.discrete_gaussian import rational_sigma2, sample_discrete_gaussian
from privacy_wall.mechanisms import private_generator

SIGMAS = (1.0, 1.5, 10.0, 1000.5, 2.0**20, 2.0**20 * 1.37, 2.0**24)


def best_of(repeats: int, run: Callable[[], object]) -> tuple[float, float]:
    """(wall, cpu) seconds of the fastest of `repeats` runs."""
    times = []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        run()
        times.append((time.perf_counter() - wall, time.process_time() - cpu))
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rng = private_generator()
    wall, cpu = best_of(args.repeats, lambda: rng.normal(0.0, 1.0, size=args.n))
    print(f"{'numpy normal (float)':>24}: wall {wall:.3f} s, cpu {cpu:.3f} s per {args.n:,}")
    for sigma in SIGMAS:
        sigma2: Fraction = rational_sigma2(sigma)
        wall, cpu = best_of(args.repeats, partial(sample_discrete_gaussian, sigma2, args.n, rng))
        print(
            f"{f'sigma = {sigma:,.2f}':>24}: wall {wall:.3f} s, cpu {cpu:.3f} s per {args.n:,} "
            f"({args.n / cpu:,.0f} samples per cpu second)"
        )


if __name__ == "__main__":
    main()
