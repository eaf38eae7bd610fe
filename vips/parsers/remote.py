"""The client verbs that talk to a server: budgets, datasets, jobs, the ledger and posteriors (handlers:
vips.commands.remote)."""

from __future__ import annotations

from control.store.job_status import JOB_STATUSES
from privacy_wall.accounting.weak import WEAK_EPSILON, WEAK_FLAG
from vips.parsers.base import (
    Subparsers,
    at_most,
    delta,
    epsilon,
    key_id,
    non_negative_int,
    positive_float,
)

#: The help of every verb's JOB argument.
JOB_HELP = "the job's id, or a prefix of it of 8+ characters that starts only this job"


def add_client(commands: Subparsers) -> None:
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
        type=epsilon,
        help="the epsilon cap (> 0) on everything the dataset's jobs release, composed at --delta; "
        "required for a private dataset, refused for a public one",
    )
    sub.add_argument(
        "--delta",
        type=delta,
        required=True,
        help="the delta every job on the dataset is priced at; below 1/N for a private dataset "
        "(delta << 1/N, e.g. 1e-5 for N up to 10,000)",
    )
    sub.add_argument(
        WEAK_FLAG,
        action="store_true",
        help=f"confirm a cap above epsilon {WEAK_EPSILON:g}, which protects little (refused without it)",
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
    sub.add_argument("--key", metavar="KEY_ID", type=key_id, help="the analyst key's id (see list-keys)")
    action = sub.add_mutually_exclusive_group()
    action.add_argument("--epsilon", type=epsilon, help="the key's quota at the dataset's delta")
    action.add_argument("--clear", action="store_true", help="remove the key's quota")
    sub.set_defaults(handler="remote:run_budget_quota")
    parser = commands.add_parser(
        "jobs", help="the jobs this key may read, newest first (one JSON line per job)"
    )
    parser.add_argument("--dataset", metavar="NAME", help="only this dataset's jobs")
    parser.add_argument("--status", choices=JOB_STATUSES, help="only jobs in this state")
    parser.add_argument("--limit", type=at_most(1000), metavar="N", help="at most N jobs (default 100)")
    parser.set_defaults(handler="remote:run_jobs")
    parser = commands.add_parser("job", help="a job's status, progress and epsilon spent (one JSON line)")
    parser.add_argument("job", metavar="JOB", help=JOB_HELP)
    parser.set_defaults(handler="remote:run_job_show")
    parser = commands.add_parser(
        "releases",
        help="a job's released (noised) statistics, one JSON line per iteration (analyst, custodian)",
    )
    parser.add_argument("job", metavar="JOB", help=JOB_HELP)
    parser.add_argument("--after", type=non_negative_int, default=0, metavar="T", help="from iteration T + 1")
    parser.add_argument("--limit", type=at_most(100_000), metavar="N", help="at most N iterations")
    parser.set_defaults(handler="remote:run_releases")
    parser = commands.add_parser(
        "wait",
        help="reattach to a job (e.g. after Ctrl-C in fit --wait): progress bar and ending of fit --wait",
        description="Wait for a job with the progress bar of `vips fit --wait` and end as it does: the "
        "finished job as one JSON line, where the posterior went (-o) and the budget left; exit 1 if the "
        "job did not succeed.",
    )
    parser.add_argument("job", metavar="JOB", help=JOB_HELP)
    parser.add_argument(
        "--timeout",
        type=positive_float,
        metavar="SECONDS",
        help="stop waiting after this long (the job goes on; exit 124)",
    )
    parser.add_argument("-o", "--output", metavar="posterior.json", help="write the posterior here")
    parser.set_defaults(handler="remote:run_wait")
    parser = commands.add_parser("cancel", help="cancel a job; its unspent budget is refunded")
    parser.add_argument("job", metavar="JOB", help=JOB_HELP)
    parser.set_defaults(handler="remote:run_cancel")
    helptext = (
        "delete an ended job's releases and posterior to free your key's storage (VIPS_MAX_KEY_STORED_MB); "
        "its record and the epsilon it spent stay"
    )
    parser = commands.add_parser("delete", help=helptext, description=helptext)
    parser.add_argument("job", metavar="JOB", help=JOB_HELP)
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
    parser.add_argument("--limit", type=at_most(1000), metavar="N", help="--entries: entries per page")
    pages = parser.add_mutually_exclusive_group()
    pages.add_argument("--cursor", metavar="C", help="--entries: the next_cursor of the previous page")
    pages.add_argument("--all", action="store_true", help="--entries: follow every page")
    parser.set_defaults(handler="remote:run_ledger")

    parser = commands.add_parser("posterior", help="download a finished job's posterior")
    parser.add_argument("job", metavar="JOB", help=JOB_HELP)
    parser.add_argument(
        "-o", "--output", metavar="posterior.json", required=True, help="write the posterior here"
    )
    parser.set_defaults(handler="remote:run_posterior")
