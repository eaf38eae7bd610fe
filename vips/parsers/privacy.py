"""`vips privacy epsilon|sigma`: the accountant on its own (handlers: vips.commands.privacy)."""

from __future__ import annotations

from privacy_wall.accounting.names import ACCOUNTANT_NAMES
from vips.parsers.base import (
    Subparsers,
    delta,
    epsilon,
    positive_int,
    sigma,
)


def add_privacy(commands: Subparsers) -> None:
    parser = commands.add_parser("privacy", help="the accountant on its own: quotes before anything runs")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="{epsilon,sigma}")
    for verb, helptext, handler in (
        ("epsilon", "epsilon of a schedule with noise multiplier --sigma", "privacy:run_epsilon"),
        ("sigma", "smallest noise multiplier whose epsilon is <= --epsilon", "privacy:run_sigma"),
    ):
        sub = verbs.add_parser(verb, help=helptext, description=helptext)
        if verb == "epsilon":
            sub.add_argument("--sigma", type=sigma, required=True, help="noise multiplier (>= 0)")
        else:
            sub.add_argument("--epsilon", type=epsilon, required=True, help="target epsilon (> 0)")
        sub.add_argument("--batch-size", type=positive_int, required=True, help="S records per iteration")
        sub.add_argument("--population", type=positive_int, required=True, help="N records in the dataset")
        sub.add_argument("--iterations", type=positive_int, required=True, help="T iterations")
        sub.add_argument("--delta", type=delta, required=True, help="delta of (epsilon, delta)-DP")
        sub.add_argument(
            "--accountant",
            choices=ACCOUNTANT_NAMES,
            default=None,
            help="filter (the budget's rule, valid however analysts adapt), pld (one job alone, exact "
            "for S = N), rdp or paper (the papers' numbers); default: VIPS_ACCOUNTANT or filter",
        )
        sub.set_defaults(handler=handler)
