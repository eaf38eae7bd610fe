"""`vips privacy epsilon|sigma`: the accountant on its own, for quotes before anything runs.

A delta that is not below 1/N is priced all the same (the papers' settings have one), with a warning on
stderr and in the JSON line's "warning" (null otherwise): a private dataset's budget with that delta is
refused (privacy_wall.ledger.delta_policy)."""

from __future__ import annotations

import argparse
import math
from typing import Any

from privacy_wall.accounting.accountants import Accountant, configured_accountant, get_accountant
from privacy_wall.accounting.calibration import calibrate_sigma, epsilon
from vips.errors import UsageError
from vips.output import finite_or_none, print_json
from vips.progress import delta_warning


def check_schedule(batch_size: int, population: int, iterations: int, delta: float) -> None:
    """The checks argparse's types cannot make on their own (they relate two arguments)."""
    if batch_size > population:
        raise UsageError(f"--batch-size {batch_size} is larger than --population {population}")
    if iterations < 1:
        raise UsageError("--iterations must be >= 1")
    if not 0 < delta < 1:
        raise UsageError("--delta must be in (0, 1)")


def _accountant(args: argparse.Namespace) -> Accountant:
    return get_accountant(args.accountant) if args.accountant else configured_accountant()


def _quote(sigma: float, eps: float, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "epsilon": finite_or_none(eps),
        "epsilon_is_infinite": not math.isfinite(eps),
        "sigma": sigma,
        "batch_size": args.batch_size,
        "population": args.population,
        "iterations": args.iterations,
        "delta": args.delta,
        "sampling_rate": args.batch_size / args.population,
        "sampling": "without_replacement",
        "neighbouring": "replace_one",
        "accountant": _accountant(args).version,
        "warning": delta_warning(args.delta, args.population),
    }


def run_epsilon(args: argparse.Namespace) -> int:
    check_schedule(args.batch_size, args.population, args.iterations, args.delta)
    eps = epsilon(
        args.sigma, args.batch_size, args.population, args.iterations, args.delta, _accountant(args)
    )
    print_json(_quote(args.sigma, eps, args))
    return 0


def run_sigma(args: argparse.Namespace) -> int:
    check_schedule(args.batch_size, args.population, args.iterations, args.delta)
    accountant = _accountant(args)
    sigma = calibrate_sigma(
        args.epsilon, args.batch_size, args.population, args.iterations, args.delta, accountant=accountant
    )
    eps = epsilon(sigma, args.batch_size, args.population, args.iterations, args.delta, accountant)
    print_json({**_quote(sigma, eps, args), "target_epsilon": args.epsilon})
    return 0
