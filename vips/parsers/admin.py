"""`vips admin` (API keys) and `vips data` (datasets into the sensitive store); handlers:
vips.commands.admin, examples, scale and prepare_text."""

from __future__ import annotations

from vips import choices
from vips.parsers.base import (
    Subparsers,
    duration_days,
    positive_int,
)


def add_admin_data(commands: Subparsers) -> None:
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
        "--expires-in",
        type=duration_days,
        metavar="DURATION",
        help="the key is refused after this long: days, or a number with a unit: 12h, 30d, 2w",
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
    add_prepare_text(verbs)
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


def add_prepare_text(verbs: Subparsers) -> None:
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
        type=positive_int,
        metavar="N",
        help="how many words: of wordfreq's English list (the default source) or of --vocab-from "
        "(default 5000)",
    )
    sub.add_argument(
        "-o", "--output", metavar="PREFIX", required=True, help="writes PREFIX.docword.txt, PREFIX.vocab.txt"
    )
    sub.set_defaults(handler="prepare_text:run")
