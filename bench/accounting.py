"""The accountants side by side: epsilons of the reference settings and the time to price or calibrate.

First, the cost of validity under fully adaptive composition: how many repeated jobs of the usual schedules
fit under eps 1 by the path-wise `pld` rule (the default before issue 50, not a filter) and by the filter (the
default). Then rows: each accountant of privacy_wall.accounting.accountants (filter, the default; pld; rdp;
paper) and dp_accounting's own RdpAccountant (REPLACE_ONE, SampledWithoutReplacementDpEvent) and PLD of the
reachable pair (a floor, not an accountant: see tests/privacy_wall/accounting/test_accountants.py). Times are
medians of fresh (uncached) evaluations on one core: each run uses a sigma the process has not priced before.

    python -m bench.accounting
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from dp_accounting import dp_event
from dp_accounting.pld import privacy_loss_distribution as pld
from dp_accounting.rdp import rdp_privacy_accountant as rdp

from privacy_wall.accounting import pld as tight
from privacy_wall.accounting.accountants import ACCOUNTANTS
from privacy_wall.accounting.calibration import calibrate_sigma, epsilon
from privacy_wall.accounting.events import SubsampledGaussianEvent

# (label, sigma, S, N, T, delta)
SETTINGS = [
    ("LDA (paper)", 1.24, 20_000, 400_000, 20, 1e-4),
    ("Adult q=0.004", 1.0, 130, 32_561, 100, 1e-3),
    ("Adult batch", 14.46, 32_561, 32_561, 10, 1e-5),
    ("S=50 of 398, T=2000", 4.0, 50, 398, 2000, 1e-5),
    ("T=100,000", 2.0, 100, 60_000, 100_000, 1e-5),
    *[
        (f"sigma 2.765, S={size} of 2,786", 2.765, size, 2_786, 20, 1e-4)
        for size in (500, 1_000, 2_000, 2_700, 2_786)
    ],
]
CALIBRATIONS = [
    ("Adult batch eps 0.8", 0.8, 32_561, 32_561, 10, 1e-5),
    ("S=50 of 398, T=2000, eps 1", 1.0, 50, 398, 2000, 1e-5),
    ("LDA eps 1.9", 1.9, 20_000, 400_000, 20, 1e-4),
    ("README LDA eps 2.4 (S=2000 of 2786)", 2.4, 2_000, 2_786, 20, 1e-4),
    ("S=1 of 2786, T=20, eps 0.1", 0.1, 1, 2_786, 20, 1e-4),
]


def timed(
    fn: Callable[..., float], args: tuple[Any, ...], repeats: int, **kwargs: Any
) -> tuple[float, float]:
    """(value, median seconds) of fn(*args, **kwargs), args[0] perturbed afresh each time (no cache hits)."""
    times, value = [], 0.0
    for k in range(repeats):
        start = time.perf_counter()
        result = fn(args[0] * (1.0 + 1e-7 * (k + 1)), *args[1:], **kwargs)
        times.append(time.perf_counter() - start)
        value = value or result
    return value, statistics.median(times)


def dp_accounting_rdp(sigma: float, size: int, population: int, iterations: int, delta: float) -> float:
    acct = rdp.RdpAccountant(neighboring_relation=rdp.NeighborRel.REPLACE_ONE)
    event = dp_event.GaussianDpEvent(sigma)
    if size < population:
        event = dp_event.SampledWithoutReplacementDpEvent(population, size, event)
    acct.compose(event, iterations)
    return float(acct.get_epsilon(delta))


def reachable_pair_pld(sigma: float, size: int, population: int, iterations: int, delta: float) -> float:
    pair = pld.from_gaussian_mechanism(
        sigma,
        sampling_prob=size / population,
        pessimistic_estimate=False,
        value_discretization_interval=1e-3,
        use_connect_dots=False,
    )
    return float(pair.self_compose(iterations).get_epsilon_for_delta(delta))


#: Repeated jobs (label, S, N, T, delta; sigma: the job alone costs JOB_EPSILON by `pld`, or a fixed sigma):
#: how many fit under COST_CAP by the path-wise `pld` rule and by the filter.
REPEATED_JOBS = [
    ("VIPS-BLR one full-batch release, Adult", 32_561, 32_561, 1, 1e-6, None),
    ("VIPS-BLR one full-batch release, COMPAS", 6_172, 6_172, 1, 1e-5, None),
    ("VIPS-BLR T 10 full-batch, Adult", 32_561, 32_561, 10, 1e-6, None),
    ("DPVI's automatic schedule up to eps x N 150,000 (T 300, S N), Adult", 32_561, 32_561, 300, 1e-6, None),
    ("DPVI T 1,000, S N/50, Adult", 651, 32_561, 1_000, 1e-6, None),
    ("DPVI T 1,000, S N/50, COMPAS", 123, 6_172, 1_000, 1e-5, None),
    ("LDA (paper: sigma 1.24, S 20,000 of 400,000, T 20)", 20_000, 400_000, 20, 1e-4, 1.24),
]
JOB_EPSILON = 0.25
COST_CAP = 1.0


def jobs_within(
    cap: float, sigma: float, size: int, population: int, iterations: int, delta: float, name: str
) -> int:
    """How many copies of the job compose within `cap` by the accountant (at most 1,000)."""
    job = ACCOUNTANTS[name].cost(SubsampledGaussianEvent(sigma, size, population)).scaled(iterations)
    total, count = job, 0
    while count < 1_000 and total.epsilon(delta) <= cap:
        count, total = count + 1, total + job
    return count


def cost_table() -> None:
    """Jobs of each usual schedule that fit under COST_CAP: the path-wise `pld` rule against the filter."""
    print(
        f"| repeated job (each eps {JOB_EPSILON} alone by pld, unless sigma is given) | sigma | jobs within "
        f"eps {COST_CAP:g}: pld (not a filter) | filter | one job: pld eps | filter eps |"
    )
    print("|---|---|---|---|---|---|")
    for label, size, population, iterations, delta, fixed in REPEATED_JOBS:
        sigma = fixed or calibrate_sigma(JOB_EPSILON, size, population, iterations, delta, accountant="pld")
        counts = [
            jobs_within(COST_CAP, sigma, size, population, iterations, delta, name)
            for name in ("pld", "filter")
        ]
        alone = [epsilon(sigma, size, population, iterations, delta, name) for name in ("pld", "filter")]
        print(f"| {label} | {sigma:.3g} | {counts[0]} | {counts[1]} | {alone[0]:.3g} | {alone[1]:.3g} |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cost_table()
    print("| setting | " + " | ".join(ACCOUNTANTS) + " | dp_accounting RDP | reachable-pair PLD (floor) |")
    print("|---|" + "---|" * (len(ACCOUNTANTS) + 2))
    for label, sigma, size, population, iterations, delta in SETTINGS:
        cells = []
        for name in ACCOUNTANTS:
            repeats = 1 if name == "paper" else args.repeats
            value, seconds = timed(epsilon, (sigma, size, population, iterations, delta, name), repeats)
            cells.append(f"{value:.4g} ({seconds * 1e3:.1f} ms)")
        for reference in (dp_accounting_rdp, reachable_pair_pld):
            if reference is reachable_pair_pld and iterations > 10_000:
                cells.append("-")
                continue
            value, seconds = timed(reference, (sigma, size, population, iterations, delta), 1)
            cells.append(f"{value:.4g} ({seconds * 1e3:.0f} ms)")
        print(f"| {label} | " + " | ".join(cells) + " |")
    print()
    print("| calibration | " + " | ".join(ACCOUNTANTS) + " |")
    print("|---|" + "---|" * len(ACCOUNTANTS))
    for label, target, size, population, iterations, delta in CALIBRATIONS:
        cells = []
        for name in ACCOUNTANTS:
            repeats = 1 if name == "paper" else args.repeats
            schedule = (target, size, population, iterations, delta)
            value, seconds = timed(calibrate_sigma, schedule, repeats, accountant=name)
            cells.append(f"sigma {value:.4g} ({seconds * 1e3:.0f} ms)")
        print(f"| {label} | " + " | ".join(cells) + " |")
    print()
    for cap in (None, 2.0):
        first, quote, reserve, spent, held = ledger_with_events(10_000, 100, cap)
        print(
            f"Ledger of 10,000 charges from 100 jobs with distinct sigmas (SQLite, cap {cap}): first read "
            f"{first * 1e3:.0f} ms, quote {quote * 1e3:.1f} ms, reservation {reserve * 1e3:.1f} ms (new "
            f"schedules, medians of 5), epsilon spent {spent:.4g}; PMFs cached: {held / 2**20:.1f} MiB"
        )
    calibrate = ["privacy", "sigma", "--epsilon", "1", "--batch-size", "50", "--population", "398"]
    calibrate += ["--iterations", "2000", "--delta", "1e-5"]
    one = ["privacy", "epsilon", "--sigma", "4", "--batch-size", "50", "--population", "398"]
    one += ["--iterations", "1", "--delta", "1e-5"]
    print(
        f"`vips {' '.join(calibrate)}`: {cli_seconds(calibrate):.2f} s wall; "
        f"`vips {' '.join(one)}`: {cli_seconds(one):.2f} s (medians of 5)"
    )


def cli_seconds(argv: list[str], repeats: int = 5) -> float:
    """Median wall seconds of `vips ARGV` in a fresh process (imports included)."""
    import subprocess
    import sys

    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "vips.cli", *argv], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def ledger_with_events(charges: int, jobs: int, cap: float | None) -> tuple[float, float, float, float, int]:
    """A SQLite ledger holding `charges` charges of `jobs` jobs with distinct sigmas: the seconds of the
    first read (composing the ledger), the median seconds of a quote and of a reservation of a new
    schedule, the epsilon spent and the bytes of composed PMFs cached. With a cap the quote also prices the
    largest epsilon that still fits (a calibration)."""
    import tempfile
    from pathlib import Path

    from privacy_wall.accounting.accountants import clear_caches
    from privacy_wall.accounting.events import SubsampledGaussianEvent
    from privacy_wall.ledger import database as ledger_db
    from privacy_wall.ledger.base import Charge
    from privacy_wall.sqlengine import create_db_engine
    from vips.migrate import upgrade

    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{Path(folder) / 'control.db'}"
        upgrade("control", url)
        engine = create_db_engine(url)
        ledger_db.set_budget(engine, "d", None, 1e-5)  # the cap is set once the charges are in
        per_job = charges // jobs
        for j in range(jobs):
            event = SubsampledGaussianEvent(2.0 + j / jobs, 100, 60_000)
            ledger_db.reserve(engine, "d", f"job{j}", event, per_job)
            for t in range(per_job):
                ledger_db.commit_charge(engine, Charge("d", f"job{j}", t, event))
        clear_caches()  # the first read after a restart: nothing composed yet
        start = time.perf_counter()
        ledger_db.set_budget(engine, "d", cap, 1e-5)  # prices the ledger: its composition, once
        first = time.perf_counter() - start
        quotes, reserves = [], []
        for k in range(5):
            event = SubsampledGaussianEvent(1.5 + 1e-3 * k, 200, 60_000)
            start = time.perf_counter()
            ledger_db.quote(engine, "d", event, 100)
            quotes.append(time.perf_counter() - start)
            start = time.perf_counter()
            ledger_db.reserve(engine, "d", f"new{k}", event, 100)
            reserves.append(time.perf_counter() - start)
        spent = ledger_db.budget_status(engine, "d").epsilon_spent
        engine.dispose()
    return first, statistics.median(quotes), statistics.median(reserves), spent, tight.cached_bytes()


if __name__ == "__main__":
    main()
