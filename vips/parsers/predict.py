"""`vips predict`, `evaluate` and `topics` (handlers: vips.commands.predict, vips.commands.topics)."""

from __future__ import annotations

from vips import choices
from vips.parsers.base import (
    Parser,
    Subparsers,
    at_most,
)


def add_no_header(parser: Parser, *, evaluate: bool = False) -> None:
    """--no-header of predict / evaluate: without it a CSV's columns are matched by their header's names."""
    then = ", then the label column" if evaluate else ""
    parser.add_argument(
        "--no-header",
        action="store_true",
        help="BLR/linreg: the CSV has no header row; its columns are the posterior's feature columns in the "
        f"posterior's order{then} (without this flag, columns are matched by their header names, any order)",
    )


def add_predict_evaluate(commands: Subparsers) -> None:
    parser = commands.add_parser(
        "predict",
        help="predict with a posterior (BLR: column p = P(y=1); LDA: topic proportions; SBN: "
        "reconstruction probabilities)",
    )
    parser.add_argument(
        "--posterior", metavar="P", required=True, help="a posterior document (vips posterior, fit -o)"
    )
    parser.add_argument(
        "--input", metavar="FILE", required=True, help="BLR: numeric CSV; LDA: UCI docword; SBN: 0/1 CSV"
    )
    parser.add_argument(
        "--label", metavar="COLUMN", help="BLR: a column of the input to drop (not a feature)"
    )
    parser.add_argument("--vocab", metavar="FILE", help="LDA: the input's vocabulary, one word per line")
    add_no_header(parser)
    parser.add_argument("-o", "--output", metavar="predictions.csv", help="default: stdout")
    parser.set_defaults(handler="predict:run_predict")

    parser = commands.add_parser("evaluate", help="metrics of a posterior on held-out data (one JSON line)")
    parser.add_argument(
        "--posterior", metavar="P", required=True, help="a posterior document (vips posterior, fit -o)"
    )
    parser.add_argument(
        "--input", metavar="FILE", required=True, help="BLR: labelled CSV; LDA: UCI docword; SBN: 0/1 CSV"
    )
    parser.add_argument(
        "--label", metavar="COLUMN", help=f"BLR label column (default {choices.DEFAULT_LABEL})"
    )
    parser.add_argument("--vocab", metavar="FILE", help="LDA: the input's vocabulary, one word per line")
    add_no_header(parser, evaluate=True)
    parser.set_defaults(handler="predict:run_evaluate")

    parser = commands.add_parser(
        "topics",
        help="an LDA posterior's topics: each one's share and most probable words",
        description="One line per topic: its index, its share of the topic-word mass and its most "
        "probable words under E[beta_k] = lambda_k / sum_w lambda_kw.",
    )
    parser.add_argument("--posterior", metavar="P", required=True, help="an LDA posterior document")
    parser.add_argument(
        "--words",
        type=at_most(20),
        default=10,
        metavar="N",
        help="words per topic (at most 20: the posterior keeps 20)",
    )
    parser.add_argument("--by-share", action="store_true", help="largest topics first")
    parser.set_defaults(handler="topics:run")
