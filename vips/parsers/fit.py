"""`vips fit` (handler: vips.commands.fit)."""

from __future__ import annotations

from control.planning.options import option_summary
from privacy_wall.accounting.weak import WEAK_EPSILON, WEAK_FLAG
from vips import choices
from vips.parsers.base import (
    Subparsers,
    delta,
    epsilon,
    positive_float,
    positive_int,
    sigma,
)


def add_fit(commands: Subparsers) -> None:
    parser = commands.add_parser(
        "fit",
        help="fit a model (--local: in-process on your own file)",
        description="Fit a model by VIPS. With --local, in-process through the same gate and accountant, "
        "with an in-memory store and a throwaway ledger; prints one JSON line with the privacy spent.",
    )
    parser.add_argument("--local", action="store_true", help="fit in-process on --input (no server)")
    parser.add_argument(
        "--dataset", metavar="NAME", help="server: the dataset; --local: its name in the posterior"
    )
    parser.add_argument("--wait", action="store_true", help="server: wait for the job and print it")
    parser.add_argument(
        "--timeout",
        type=positive_float,
        metavar="SECONDS",
        help="server, with --wait: stop waiting after this long (the job goes on; exit 124)",
    )
    parser.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="server: resend a submission (e.g. after Ctrl-C) without creating a second job",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="server: print the quote (the job's epsilon, the budget's spent, reserved and remaining "
        "epsilon, admissible, largest_epsilon: the most this schedule could still have) and submit nothing",
    )
    parser.add_argument("--kind", choices=choices.KINDS, help="--local: the input's kind")
    parser.add_argument("--input", metavar="FILE", help="--local: the input file")
    parser.add_argument("--label", metavar="COLUMN", help=f"label column (default {choices.DEFAULT_LABEL})")
    parser.add_argument("--vocab", metavar="FILE", help="vocabulary, one word per line (--kind bow)")
    parser.add_argument(
        "--model",
        choices=choices.MODELS,
        required=True,
        help="blr: Bayesian logistic regression (tabular); linreg: linear regression (regression); lda: "
        "topics (bow); sbn: sigmoid belief network (binary)",
    )
    parser.add_argument(
        "--algorithm",
        choices=choices.ALGORITHMS,
        default="vips",
        help="vips (default: the paper's noisy sufficient statistics), dpvi (noisy clipped gradients) or "
        "dpsep (noisy site updates); see docs/design.md section 5",
    )
    parser.add_argument(
        "--iterations",
        type=positive_int,
        metavar="T",
        help="T iterations (default: chosen by the service for --epsilon from the model, the algorithm and "
        "N, see the quote's schedule, control/planning/schedules.py and docs/schedules.md; with --sigma, "
        "the same rule's choice for little noise: 10 for blr, lda and sbn by VIPS, 5 for linreg, 1000 for "
        "dpvi)",
    )
    parser.add_argument(
        "--batch-size", type=positive_int, metavar="S", help="S rows per iteration (default: chosen as T is)"
    )
    noise = parser.add_mutually_exclusive_group()
    noise.add_argument("--sigma", type=sigma, help="noise multiplier (0 = non-private, --local only)")
    noise.add_argument("--epsilon", type=epsilon, help="target epsilon; sigma is calibrated for it")
    parser.add_argument("--delta", type=delta, default=choices.DEFAULT_DELTA, help="--local: delta")
    parser.add_argument(
        WEAK_FLAG,
        action="store_true",
        help=f"confirm an --epsilon above {WEAK_EPSILON:g}, which protects little (refused without it)",
    )
    parser.add_argument(
        "--option",
        action="append",
        metavar="KEY=VALUE",
        help=f"model option (repeatable): {option_summary()}",
    )
    parser.add_argument("-o", "--output", metavar="posterior.json", help="write the posterior here")
    parser.set_defaults(handler="fit:run")
