"""The `vips` command line (docs/design.md section 6): the argument parser and the dispatch to vips.commands.

Errors are one line `vips: error: ...` on stderr, exit 2 for usage or input errors and 1 for runtime
failures; no traceback (set VIPS_DEBUG=1 to get one for unexpected errors). Messages never carry data
values of the input: the readers and the store name lines, columns and rows only.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import math
import os
import re
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

from privacy_wall.accounting.names import ACCOUNTANT_NAMES
from privacy_wall.names import NAME_RULE, did_you_mean, is_dataset_name
from service.planning.options import option_summary
from service.store.job_status import JOB_STATUSES
from vips import choices
from vips.errors import CliError, UsageError

Handler = Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are raised (one line, exit 2 from main) instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{_with_suggestion(message)} (see {self.prog} --help)")


#: argparse's message for a value outside an option's choices.
_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<given>[^']*)' \(choose from (?P<choices>.*)\)$")


def _with_suggestion(message: str) -> str:
    """argparse's "invalid choice" with the closest choices (a model, an algorithm, a kind, a status)."""
    found = _INVALID_CHOICE.search(message)
    if found is None:
        return message
    choices = re.findall(r"'([^']*)'", found["choices"])
    return message + did_you_mean(found["given"], choices)


def _whole(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
    return value


def _positive_int(text: str) -> int:
    return _whole(text, 1)


def _shard(text: str) -> int | str:
    return "auto" if text == "auto" else _non_negative_int(text)


def _non_negative_int(text: str) -> int:
    return _whole(text, 0)


def _at_most(limit: int) -> Callable[[str], int]:
    """A whole number in 1..limit (the server's bound), checked before any request."""

    def parse(text: str) -> int:
        value = _positive_int(text)
        if value > limit:
            raise argparse.ArgumentTypeError(f"must be <= {limit}, got {value}")
        return value

    return parse


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def _sigma(text: str) -> float:
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"a noise multiplier must be >= 0, got {text!r}")
    return value


def _epsilon(text: str) -> float:
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"epsilon must be > 0, got {text!r}")
    return value


def _key_id(text: str) -> str:
    """A key's id (1-32 letters and digits), never the key: `vips_ID_SECRET` is refused, not split."""
    if not re.fullmatch(r"[A-Za-z0-9]{1,32}", text):
        raise argparse.ArgumentTypeError(
            "give the key's id (the part between `vips_` and the next `_` of the key, as list-keys shows "
            "it), not the key itself"
        )
    return text


def _delta(text: str) -> float:
    value = _number(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"delta must be in (0, 1), got {text!r}")
    return value


def _add_privacy(commands: argparse._SubParsersAction[_Parser]) -> None:
    parser = commands.add_parser("privacy", help="the accountant on its own: quotes before anything runs")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="{epsilon,sigma}")
    for verb, helptext, handler in (
        ("epsilon", "epsilon of a schedule with noise multiplier --sigma", "privacy:run_epsilon"),
        ("sigma", "smallest noise multiplier whose epsilon is <= --epsilon", "privacy:run_sigma"),
    ):
        sub = verbs.add_parser(verb, help=helptext, description=helptext)
        if verb == "epsilon":
            sub.add_argument("--sigma", type=_sigma, required=True, help="noise multiplier (>= 0)")
        else:
            sub.add_argument("--epsilon", type=_epsilon, required=True, help="target epsilon (> 0)")
        sub.add_argument("--batch-size", type=_positive_int, required=True, help="S records per iteration")
        sub.add_argument("--population", type=_positive_int, required=True, help="N records in the dataset")
        sub.add_argument("--iterations", type=_positive_int, required=True, help="T iterations")
        sub.add_argument("--delta", type=_delta, required=True, help="delta of (epsilon, delta)-DP")
        sub.add_argument(
            "--accountant",
            choices=ACCOUNTANT_NAMES,
            default=None,
            help="filter (the budget's rule, valid however analysts adapt), pld (one job alone, exact "
            "for S = N), rdp or paper (the papers' numbers); default: VIPS_ACCOUNTANT or filter",
        )
        sub.set_defaults(handler=handler)


def _add_fit(commands: argparse._SubParsersAction[_Parser]) -> None:
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
        type=_positive_float,
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
        type=_positive_int,
        metavar="T",
        help="T iterations (default: chosen by the service for --epsilon from the model, the algorithm and "
        "N, see the quote's schedule, service/planning/schedules.py and docs/schedules.md; with --sigma, "
        "the same rule's choice for little noise: 10 for blr, lda and sbn by VIPS, 5 for linreg, 1000 for "
        "dpvi)",
    )
    parser.add_argument(
        "--batch-size", type=_positive_int, metavar="S", help="S rows per iteration (default: chosen as T is)"
    )
    noise = parser.add_mutually_exclusive_group()
    noise.add_argument("--sigma", type=_sigma, help="noise multiplier (0 = non-private, --local only)")
    noise.add_argument("--epsilon", type=_epsilon, help="target epsilon; sigma is calibrated for it")
    parser.add_argument("--delta", type=_delta, default=choices.DEFAULT_DELTA, help="--local: delta")
    parser.add_argument(
        "--option",
        action="append",
        metavar="KEY=VALUE",
        help=f"model option (repeatable): {option_summary()}",
    )
    parser.add_argument("-o", "--output", metavar="posterior.json", help="write the posterior here")
    parser.set_defaults(handler="fit:run")


def _add_no_header(parser: _Parser, *, evaluate: bool = False) -> None:
    """--no-header of predict / evaluate: without it a CSV's columns are matched by their header's names."""
    then = ", then the label column" if evaluate else ""
    parser.add_argument(
        "--no-header",
        action="store_true",
        help="BLR/linreg: the CSV has no header row; its columns are the posterior's feature columns in the "
        f"posterior's order{then} (without this flag, columns are matched by their header names, any order)",
    )


def _add_predict_evaluate(commands: argparse._SubParsersAction[_Parser]) -> None:
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
    _add_no_header(parser)
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
    _add_no_header(parser, evaluate=True)
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
        type=_at_most(20),
        default=10,
        metavar="N",
        help="words per topic (at most 20: the posterior keeps 20)",
    )
    parser.add_argument("--by-share", action="store_true", help="largest topics first")
    parser.set_defaults(handler="topics:run")


def _add_server(commands: argparse._SubParsersAction[_Parser]) -> None:
    for name, helptext, handler in (
        (
            "up",
            "embedded all-in-one: API + one worker, SQLite and a file broker under $VIPS_HOME",
            "server:run_up",
        ),
        ("serve", "the API (configured by environment; embedded files without URLs)", "server:run_serve"),
    ):
        parser = commands.add_parser(name, help=helptext, description=helptext)
        parser.add_argument(
            "--host",
            default="127.0.0.1",
            help="the address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: every interface)",
        )
        parser.add_argument(
            "--port", type=_positive_int, default=8000, help="the TCP port to listen on (default 8000)"
        )
        parser.set_defaults(handler=handler)
    parser.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        help="API processes (about one per core serves most reads)",
    )
    helptext = (
        "a Celery worker that runs jobs through the privacy wall (configured by environment: the database "
        "URLs and VIPS_BROKER_URL; without them, the embedded files under $VIPS_HOME)"
    )
    parser = commands.add_parser("worker", help=helptext, description=helptext)
    parser.add_argument(
        "--concurrency",
        type=_positive_int,
        default=None,
        help="jobs run at once, each in its own process (default VIPS_WORKER_CONCURRENCY, 2: one key's long "
        "job never holds every slot, as a key runs at most VIPS_MAX_RUNNING_PER_KEY jobs at once)",
    )
    parser.add_argument(
        "--shard",
        type=_shard,
        default=None,
        metavar="K|auto",
        help="serve shard K of VIPS_SHARDS only (its part of every full pass, its rows kept in memory) "
        "instead of running jobs; auto: the lowest shard no live worker serves (waits for one to free up), "
        "so `docker compose up --scale shard-worker=K` needs no numbering",
    )
    parser.set_defaults(handler="server:run_worker")
    helptext = (
        "Celery beat: queues the periodic reaper, which fails and refunds jobs no worker runs (production; "
        "`vips up` and the API run the reaper themselves)"
    )
    parser = commands.add_parser("beat", help=helptext, description=helptext)
    parser.set_defaults(handler="server:run_beat")
    helptext = "bring a database to its latest Alembic migration (run before serve and worker)"
    parser = commands.add_parser("migrate", help=helptext, description=helptext)
    parser.add_argument(
        "database",
        choices=("control", "sensitive", "all"),
        help="control (keys, jobs, budgets, the ledger), sensitive (the rows behind the wall) or all",
    )
    parser.set_defaults(handler="server:run_migrate")


def _add_admin_data(commands: argparse._SubParsersAction[_Parser]) -> None:
    parser = commands.add_parser("admin", help="server side: API keys")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="{create-key,list-keys,revoke-key}")
    sub = verbs.add_parser(
        "create-key",
        help="print a new API key (shown once)",
        description="Print a new API key (shown once). Custodian keys need --dataset NAME; analyst and "
        "client keys a scope: --dataset NAME or --all-datasets.",
    )
    sub.add_argument(
        "--role",
        choices=("admin", "custodian", "analyst", "client"),
        required=True,
        help="admin: keys and every dataset; custodian: one dataset's budget and ledger; analyst: submits "
        "jobs and reads its own; client: downloads posteriors",
    )
    scope = sub.add_mutually_exclusive_group()
    scope.add_argument(
        "--dataset",
        metavar="NAME",
        help="scope of a custodian, analyst or client key: it sees only this dataset (which need not "
        "exist yet)",
    )
    scope.add_argument(
        "--all-datasets",
        action="store_true",
        help="an analyst or client key that sees every dataset",
    )
    sub.add_argument(
        "--expires-in", type=_positive_float, metavar="DAYS", help="the key is refused after this many days"
    )
    sub.add_argument(
        "--name",
        dest="key_name",  # not `name`: that attribute is checked as a dataset name (_check_names)
        metavar="TEXT",
        help="a label of the key (1-64 printable characters, not unique), public inside the deployment: "
        "shown with its jobs, in the ledger and on the dashboard",
    )
    sub.set_defaults(handler="admin:run_create_key")
    sub = verbs.add_parser(
        "list-keys", help="every key's id, name, role, scope, creation, expiry, revocation (JSON lines)"
    )
    sub.set_defaults(handler="admin:run_list_keys")
    sub = verbs.add_parser("revoke-key", help="revoke a key (it answers 401 from now on)")
    sub.add_argument("id", metavar="ID", help="the key id (vips admin list-keys; vips_<ID>_...)")
    sub.set_defaults(handler="admin:run_revoke_key")

    parser = commands.add_parser("data", help="custodian side: datasets into the sensitive store")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="{ingest,prepare-text,examples}")
    sub = verbs.add_parser(
        "ingest",
        help="validate a file and store it behind the privacy wall",
        description="Validate a file and store it behind the privacy wall. The formats, by --kind: "
        "tabular: a numeric CSV with a header line; one column (--label, default label) holds 0/1 labels, "
        "the others the features, every row of norm <= 1 (vips scale maps raw columns there from public "
        "bounds). regression: the same with a numeric target in [-1, 1] as the label. binary: a CSV of 0/1 "
        "columns with a header line, no label (the sigmoid belief network's images). bow: a UCI docword "
        "file (three lines D, W, NNZ, then one line `docID wordID count` per entry, 1-based ids, sorted by "
        "docID as UCI's files are) with its public vocabulary (--vocab: one word per line, W lines). Files "
        "are read in blocks: memory does not grow with the file. Errors name the line and column, never a "
        "value.",
    )
    sub.add_argument("name", metavar="NAME", help="the dataset's name (analysts submit jobs by it)")
    sub.add_argument("--kind", choices=choices.KINDS, required=True, help="the file's format (see above)")
    sub.add_argument("--input", metavar="FILE", required=True, help="the file of rows to store")
    sub.add_argument(
        "--label", metavar="COLUMN", help="tabular / regression: the label column (default label)"
    )
    sub.add_argument("--vocab", metavar="FILE", help="bow: the public vocabulary, one word per line")
    sub.add_argument(
        "--vocab-is-public",
        action="store_true",
        help="bow: confirm that --vocab is public, not derived from the sensitive texts (needed unless it is "
        "wordfreq's N most frequent English words, as `data prepare-text --vocab-size N` builds it; "
        "analysts see the vocabulary, and the dataset records its source)",
    )
    sub.add_argument("--public", action="store_true", help="mark the dataset non-sensitive (demos, tests)")
    sub.add_argument(
        "--append",
        action="store_true",
        help="add the file's rows to the existing dataset NAME (same kind and columns), allowed while it has "
        "no charge and no open reservation",
    )
    sub.set_defaults(handler="admin:run_ingest")
    _add_prepare_text(verbs)
    sub = verbs.add_parser(
        "examples",
        help="write the bundled public datasets (UCI Adult, a Wikipedia excerpt) as files to try the service",
        description="Write UCI Adult's training and test splits (encoded, rows of norm <= 1: "
        "adult_train.csv, adult_test.csv, label column `label`) and the bundled Wikipedia excerpt's training "
        "and test paragraphs (wiki.docword.txt, wiki_test.docword.txt over wiki.vocab.txt) into DIR, for "
        "`vips data ingest`, `vips fit --local`, `vips evaluate` and `vips predict`. Public data only; an "
        "existing file is never replaced.",
    )
    sub.add_argument("-o", "--output", metavar="DIR", required=True, help="the folder (made if missing)")
    sub.set_defaults(handler="examples:run")

    parser = commands.add_parser(
        "scale",
        help="scale a raw numeric CSV to rows of norm <= 1 from public bounds (before ingest or --local)",
        description="Map each feature column from its public [lower, upper] onto [-1, 1] (clipping values "
        "outside), add an intercept column and divide every row by sqrt(columns): rows of norm <= 1. A "
        "label column with bounds (a regression target) goes onto [-1, 1]; a 0/1 label passes through. "
        "The bounds must be public knowledge, never computed from the data.",
    )
    parser.add_argument("--input", metavar="FILE", required=True, help="numeric CSV with a header")
    parser.add_argument(
        "--bounds", metavar="FILE", required=True, help="CSV column,lower,upper for every feature column"
    )
    parser.add_argument(
        "--label", metavar="COLUMN", help=f"the label column (default {choices.DEFAULT_LABEL})"
    )
    parser.add_argument("--no-intercept", action="store_true", help="do not add the intercept column")
    parser.add_argument(
        "-o", "--output", metavar="scaled.csv", required=True, help="the scaled CSV (made private: 0600)"
    )
    parser.set_defaults(handler="scale:run")


def _add_prepare_text(verbs: argparse._SubParsersAction[_Parser]) -> None:
    """`vips data prepare-text`: texts to the docword and vocab files of `vips data ingest --kind bow`."""
    from vips.tokens import TOKEN_RULES  # the standard library only

    sub = verbs.add_parser(
        "prepare-text",
        help="turn sensitive texts into PREFIX.docword.txt and PREFIX.vocab.txt for `data ingest --kind bow`",
        description="Count the words of each document (a .txt file of --input-dir, sorted by path and "
        "searched in subfolders, or a row of --input-csv) over a PUBLIC vocabulary and write "
        "PREFIX.docword.txt (UCI docword: D, W, NNZ, then `doc word count` lines) and PREFIX.vocab.txt "
        f"(one word per line). Tokenising: {TOKEN_RULES}. The vocabulary is public by construction: by "
        "default the --vocab-size most frequent English words of wordfreq's list (a public word list, in "
        "its order), or the --vocab-size most frequent words of --vocab-from, another corpus that must be "
        "public, or --vocab (used as given); never the sensitive texts. Words outside the vocabulary are "
        "dropped and reported only as a total and a share; the output and messages carry no text. Texts "
        "are UTF-8.",
    )
    source = sub.add_mutually_exclusive_group(required=True)
    source.add_argument("--input-dir", metavar="DIR", help="a folder of .txt files, one document each")
    source.add_argument("--input-csv", metavar="FILE", help="a CSV with a header, one document per row")
    sub.add_argument("--text-column", metavar="C", help="with --input-csv: the column holding the texts")
    vocabulary = sub.add_mutually_exclusive_group()
    vocabulary.add_argument(
        "--vocab", metavar="PUBLIC_VOCAB.txt", help="the public vocabulary, one word a line"
    )
    vocabulary.add_argument(
        "--vocab-from",
        metavar="PATH",
        help="a public corpus (a folder of .txt files or one .txt file) whose most frequent words are the "
        "vocabulary",
    )
    sub.add_argument(
        "--vocab-size",
        type=_positive_int,
        metavar="N",
        help="how many words: of wordfreq's English list (the default source) or of --vocab-from "
        "(default 5000)",
    )
    sub.add_argument(
        "-o", "--output", metavar="PREFIX", required=True, help="writes PREFIX.docword.txt, PREFIX.vocab.txt"
    )
    sub.set_defaults(handler="prepare_text:run")


#: The help of every verb's JOB argument.
_JOB_HELP = "the job's id, or a prefix of it of 8+ characters that starts only this job"


def _add_client(commands: argparse._SubParsersAction[_Parser]) -> None:
    parser = commands.add_parser(
        "budget", help="a dataset's privacy budget (custodian; VIPS_URL, VIPS_API_KEY)"
    )
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="{set,show,quota}")
    sub = verbs.add_parser(
        "set",
        help="set the epsilon cap and delta of a dataset",
        description="Set the dataset's epsilon cap and delta. A private dataset needs a cap and a delta "
        "below 1/N (N its record count); a public dataset takes no cap (its sigma-0 jobs spend an unbounded "
        "epsilon), only a delta. Delta is fixed once anything is charged.",
    )
    sub.add_argument("name", metavar="NAME", help="the dataset")
    sub.add_argument(
        "--epsilon",
        type=_epsilon,
        help="the epsilon cap (> 0) on everything the dataset's jobs release, composed at --delta; "
        "required for a private dataset, refused for a public one",
    )
    sub.add_argument(
        "--delta",
        type=_delta,
        required=True,
        help="the delta every job on the dataset is priced at; below 1/N for a private dataset "
        "(delta << 1/N, e.g. 1e-5 for N up to 10,000)",
    )
    sub.set_defaults(handler="remote:run_budget_set")
    sub = verbs.add_parser("show", help="a dataset with its budget and spend")
    sub.add_argument("name", metavar="NAME", help="the dataset")
    sub.add_argument(
        "--schema", action="store_true", help="add the dataset's schema (its column names or vocabulary)"
    )
    sub.set_defaults(handler="remote:run_budget_show")
    sub = verbs.add_parser(
        "quota",
        help="cap what one analyst key may spend on a dataset (--key KEY_ID --epsilon E), remove the cap "
        "(--clear), or list the dataset's quotas (no --key)",
        description="A job is admitted only if it fits the dataset's budget and the submitting key's quota: "
        "the key's own releases on the dataset (charged and reserved), composed at the dataset's delta. "
        "Without --key: one JSON line per quota on the dataset.",
    )
    sub.add_argument("name", metavar="NAME", help="the dataset")
    sub.add_argument("--key", metavar="KEY_ID", type=_key_id, help="the analyst key's id (see list-keys)")
    action = sub.add_mutually_exclusive_group()
    action.add_argument("--epsilon", type=_epsilon, help="the key's quota at the dataset's delta")
    action.add_argument("--clear", action="store_true", help="remove the key's quota")
    sub.set_defaults(handler="remote:run_budget_quota")
    parser = commands.add_parser(
        "jobs", help="the jobs this key may read, newest first (one JSON line per job)"
    )
    parser.add_argument("--dataset", metavar="NAME", help="only this dataset's jobs")
    parser.add_argument("--status", choices=JOB_STATUSES, help="only jobs in this state")
    parser.add_argument("--limit", type=_at_most(1000), metavar="N", help="at most N jobs (default 100)")
    parser.set_defaults(handler="remote:run_jobs")
    parser = commands.add_parser("job", help="a job's status, progress and epsilon spent (one JSON line)")
    parser.add_argument("job", metavar="JOB", help=_JOB_HELP)
    parser.set_defaults(handler="remote:run_job_show")
    parser = commands.add_parser(
        "releases",
        help="a job's released (noised) statistics, one JSON line per iteration (analyst, custodian)",
    )
    parser.add_argument("job", metavar="JOB", help=_JOB_HELP)
    parser.add_argument(
        "--after", type=_non_negative_int, default=0, metavar="T", help="from iteration T + 1"
    )
    parser.add_argument("--limit", type=_at_most(100_000), metavar="N", help="at most N iterations")
    parser.set_defaults(handler="remote:run_releases")
    parser = commands.add_parser(
        "wait",
        help="reattach to a job (e.g. after Ctrl-C in fit --wait): progress bar and ending of fit --wait",
        description="Wait for a job with the progress bar of `vips fit --wait` and end as it does: the "
        "finished job as one JSON line, where the posterior went (-o) and the budget left; exit 1 if the "
        "job did not succeed.",
    )
    parser.add_argument("job", metavar="JOB", help=_JOB_HELP)
    parser.add_argument(
        "--timeout",
        type=_positive_float,
        metavar="SECONDS",
        help="stop waiting after this long (the job goes on; exit 124)",
    )
    parser.add_argument("-o", "--output", metavar="posterior.json", help="write the posterior here")
    parser.set_defaults(handler="remote:run_wait")
    parser = commands.add_parser("cancel", help="cancel a job; its unspent budget is refunded")
    parser.add_argument("job", metavar="JOB", help=_JOB_HELP)
    parser.set_defaults(handler="remote:run_cancel")
    helptext = (
        "delete an ended job's releases and posterior to free your key's storage (VIPS_MAX_KEY_STORED_MB); "
        "its record and the epsilon it spent stay"
    )
    parser = commands.add_parser("delete", help=helptext, description=helptext)
    parser.add_argument("job", metavar="JOB", help=_JOB_HELP)
    parser.set_defaults(handler="remote:run_delete")

    parser = commands.add_parser(
        "ledger",
        help="a dataset's ledger (custodian): per job, its key's name, iterations charged and epsilon "
        "spent; --entries: the charges; --by-key: per key",
        description="Per job on the dataset: its key's name, status, iterations charged and epsilon spent "
        "(one JSON line). With --entries, the charged releases one page at a time (follow next_cursor with "
        "--cursor) or all of them (--all).",
    )
    parser.add_argument("name", metavar="DATASET", help="the dataset")
    summary = parser.add_mutually_exclusive_group()
    summary.add_argument("--entries", action="store_true", help="the charge entries instead of the summary")
    summary.add_argument(
        "--by-key",
        action="store_true",
        help="per key: its name, jobs, iterations charged and its own releases' epsilon composed, with its "
        "quota (an analyst: its own row only)",
    )
    parser.add_argument("--limit", type=_at_most(1000), metavar="N", help="--entries: entries per page")
    pages = parser.add_mutually_exclusive_group()
    pages.add_argument("--cursor", metavar="C", help="--entries: the next_cursor of the previous page")
    pages.add_argument("--all", action="store_true", help="--entries: follow every page")
    parser.set_defaults(handler="remote:run_ledger")

    parser = commands.add_parser("posterior", help="download a finished job's posterior")
    parser.add_argument("job", metavar="JOB", help=_JOB_HELP)
    parser.add_argument(
        "-o", "--output", metavar="posterior.json", required=True, help="write the posterior here"
    )
    parser.set_defaults(handler="remote:run_posterior")


def package_version() -> str:
    """The installed version of the vips-service distribution ("unknown" when run from a bare tree)."""
    from importlib import metadata  # ~30 ms with its email parser: only for --version

    try:
        return metadata.version("vips-service")
    except metadata.PackageNotFoundError:
        return "unknown"


class _VersionAction(argparse.Action):
    """--version, looked up only when asked for (argparse's own needs the text when the parser is built)."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(f"vips {package_version()}")
        parser.exit()


def build_parser() -> _Parser:
    parser = _Parser(prog="vips", description="Variational Bayes in private settings.")
    parser.add_argument("--version", action=_VersionAction, help="show the installed version and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_server(commands)
    _add_admin_data(commands)
    _add_client(commands)
    _add_privacy(commands)
    _add_fit(commands)
    _add_predict_evaluate(commands)
    return parser


# Errors whose messages are written for users and carry no data values: usage or input errors (exit 2),
# and a refused budget (exit 1). Named by module so that a verb that never loads a module pays nothing for
# it: an exception of a class can only be raised once its module is loaded.
_INPUT_ERRORS = (
    ("privacy_wall.data.formats", "FormatError"),
    ("worker.posterior", "PosteriorError"),
    ("privacy_wall.data.store", "BoundViolation"),
    ("privacy_wall.accounting.calibration", "CalibrationError"),
    ("privacy_wall.gate", "PrivacyError"),
)
_BUDGET_ERRORS = (("privacy_wall.ledger.base", "BudgetExceeded"),)


def _is_one_of(exc: Exception, classes: tuple[tuple[str, str], ...]) -> bool:
    return any(
        module in sys.modules and isinstance(exc, getattr(sys.modules[module], name))
        for module, name in classes
    )


def _handler(target: str, *, settle: bool = False) -> Handler:
    """The handler "module:function" of vips.commands, imported only when its verb runs. `settle` (a process
    of one client-side verb, see _skip_the_final_collection): what the import creates (numpy's and scipy's
    ~10^5 objects, alive until exit) goes to the collector's permanent generation instead of through ~100
    collections that free nothing (~15 ms of a `vips fit --local`)."""
    module, _, function = target.partition(":")
    collecting = settle and gc.isenabled()
    if collecting:
        gc.disable()
    try:
        handler: Handler = getattr(importlib.import_module(f"vips.commands.{module}"), function)
    finally:
        if collecting:
            gc.freeze()
            gc.enable()
    return handler


#: The modules of vips.commands whose verbs act on this machine's store (migrate, data ingest, admin, up,
#: serve, worker, beat). They run under umask 077, so that whatever they create (VIPS_HOME, the SQLite files,
#: logs, the file broker) is private to its owner; client-side verbs keep the user's umask for the files
#: they write for the user (posteriors, predictions). The custodian's own verbs that write sensitive rows
#: to a file run under it too, so the file comes out 0600: prepare_text (`data prepare-text`, the counts of
#: sensitive texts) and scale (`vips scale -o`, the scaled rows).
_SERVER_SIDE = ("server", "admin", "prepare_text", "scale")


def _client_side(target: str) -> bool:
    return target.partition(":")[0] not in _SERVER_SIDE


def _run(target: str, args: argparse.Namespace, *, settle: bool = False) -> int:
    """Run the verb's handler; a server-side verb under umask 077 (restored after, for in-process callers)."""
    handler = _handler(target, settle=settle)
    if target.partition(":")[0] not in _SERVER_SIDE:
        return handler(args)
    previous = os.umask(0o077)
    try:
        return handler(args)
    finally:
        os.umask(previous)


def _fail(message: str, code: int) -> int:
    print(f"vips: error: {message}", file=sys.stderr)
    return code


def _check_names(args: argparse.Namespace) -> None:
    """Every verb that takes a dataset name (ingest NAME, budget set/show NAME, create-key --dataset,
    fit --dataset) takes it under the one rule the server enforces (privacy_wall.names)."""
    for attribute, label in (("name", "NAME"), ("dataset", "--dataset")):
        value = getattr(args, attribute, None)
        if value is not None and not is_dataset_name(value):
            raise UsageError(f"argument {label}: {NAME_RULE}")


def _skip_the_final_collection() -> None:
    """Leave every object to the operating system when this process exits: the interpreter's last garbage
    collection walks all of them (scipy alone brings ~10^5) and took ~0.2 s of a one-second `vips fit
    --local`. Files, atexit handlers and weakref finalizers (temporary directories) still run; only
    objects in reference cycles are not finalized. For processes of one client-side verb only (main()
    with argv None): an in-process caller (tests) keeps its collector, server verbs are left as they are."""
    gc.freeze()


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush does not fail on the closed pipe again
    (the Python docs' recipe for SIGPIPE)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main(argv: list[str] | None = None) -> int:
    args: argparse.Namespace | None = None
    try:
        args = build_parser().parse_args(argv)
        _check_names(args)
        return _run(args.handler, args, settle=argv is None and _client_side(args.handler))
    except SystemExit as exc:  # --help and --version exit through argparse
        return exc.code if isinstance(exc.code, int) else 0
    except CliError as exc:
        return _fail(str(exc), exc.exit_code)
    except BrokenPipeError:  # `vips jobs | head -1`: the reader has what it wanted; end quietly as cat does
        _silence_stdout()
        return 128 + signal.SIGPIPE
    except Exception as exc:
        if _is_one_of(exc, _INPUT_ERRORS):
            return _fail(str(exc), 2)
        if _is_one_of(exc, _BUDGET_ERRORS):
            return _fail(str(exc), 1)
        # The message of an unexpected error might quote data: name its type only.
        if os.environ.get("VIPS_DEBUG"):
            raise
        return _fail(f"internal error ({type(exc).__name__}); set VIPS_DEBUG=1 for a traceback", 1)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    finally:
        if argv is None and args is not None and _client_side(args.handler):
            _skip_the_final_collection()


if __name__ == "__main__":
    sys.exit(main())
