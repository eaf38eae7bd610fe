"""Client verbs over HTTP (VIPS_URL, VIPS_API_KEY): `vips budget`, `vips fit`, `vips wait`, `vips jobs`,
`vips job`, `vips cancel`, `vips posterior`, `vips ledger`."""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from service.client import ApiError, ApiTimeout, VipsClient
from vips.errors import RuntimeFailure, UsageError
from vips.output import check_writable, print_json
from vips.progress import epsilon_text, fit_progress, note


@contextmanager
def client() -> Iterator[VipsClient]:
    """The environment's client; API errors become one-line CLI errors (exit 1, 2 for a bad request)."""
    try:
        with VipsClient.from_env() as api:
            yield api
    except ApiError as exc:
        code = 2 if exc.status_code in (400, 422) else 1
        error = UsageError(f"{exc}") if code == 2 else RuntimeFailure(f"{exc}")
        raise error from None


def run_budget_set(args: argparse.Namespace) -> int:
    """The new budget as one JSON line; its warning (a cap at or below the spend) also on stderr."""
    with client() as api:
        answer = api.set_budget(args.name, args.epsilon, args.delta)
    print_json(answer)
    if answer.get("warning"):
        note(f"warning: {answer['warning']}")
    return 0


def run_budget_quota(args: argparse.Namespace) -> int:
    """Set (--epsilon) or remove (--clear) a key's quota on a dataset, printing it as one JSON line (epsilon
    null once removed); without --key, one JSON line per quota on the dataset."""
    if args.key is None:
        if args.epsilon is not None or args.clear:
            raise UsageError("--epsilon and --clear need --key KEY_ID")
        with client() as api:
            for quota in api.quotas(args.name):
                print_json(quota)
        return 0
    if args.epsilon is None and not args.clear:
        raise UsageError("give --epsilon E (set the key's quota) or --clear (remove it)")
    with client() as api:
        if args.clear:
            api.clear_quota(args.name, args.key)
            print_json({"dataset": args.name, "key_id": args.key, "epsilon": None})
        else:
            answer = api.set_quota(args.name, args.key, args.epsilon)
            print_json(answer)
            if answer.get("warning"):
                note(f"warning: {answer['warning']}")
    return 0


def run_budget_show(args: argparse.Namespace) -> int:
    """The dataset with its budget and spend as one JSON line; its schema (the column names or the
    vocabulary, which may run to thousands of entries) only with --schema."""
    with client() as api:
        dataset = api.dataset(args.name)
    if not args.schema:
        dataset.pop("schema", None)
    print_json(dataset)
    return 0


def run_jobs(args: argparse.Namespace) -> int:
    """One JSON line per job this key may read, newest first."""
    with client() as api:
        for job in api.jobs(dataset=args.dataset, status=args.status, limit=args.limit):
            print_json(job)
    return 0


def run_ledger(args: argparse.Namespace) -> int:
    """The per-job summary (one JSON line), with --by-key the per-key one, or with --entries one page of
    charges (--cursor: the next_cursor of the previous page) or every page (--all: one document, no
    next_cursor)."""
    if not args.entries and (args.limit is not None or args.cursor is not None or args.all):
        raise UsageError("--limit, --cursor and --all page the charge entries: add --entries")
    with client() as api:
        if args.by_key:
            print_json(api.ledger_keys(args.name))
        elif not args.entries:
            print_json(api.ledger_jobs(args.name))
        elif args.all:
            print_json(api.ledger(args.name, page_size=args.limit or LEDGER_PAGE))
        else:
            print_json(api.ledger_page(args.name, limit=args.limit, cursor=args.cursor))
    return 0


#: Entries per page when `vips ledger --entries --all` follows the pages (the server's maximum).
LEDGER_PAGE = 1000


def run_posterior(args: argparse.Namespace) -> int:
    check_writable(Path(args.output))
    with client() as api:
        job = api.job(args.job)
        _save(api, job["id"], Path(args.output))
    note(f"posterior of job {job['id']} written to {args.output}; {_privacy_text(job)}")
    return 0


def _privacy_text(job: dict[str, Any]) -> str:
    """The job's own epsilon at its delta (JobPublic's epsilon_job: null for sigma 0, not private)."""
    if job.get("epsilon_job") is None:
        return "the job's epsilon is inf (sigma 0: not private)"
    return f"the job's epsilon {epsilon_text(job['epsilon_job'])} at delta {job['delta']:g}"


def _save(api: VipsClient, job_id: str, path: Path) -> None:
    """Download the posterior into `path` as the server streams it (never parsed nor whole in memory)."""
    try:
        api.save_posterior(job_id, path)
    except OSError as exc:
        raise RuntimeFailure(f"cannot write {path}: {exc.strerror}") from None


#: Attempts of a submission whose answer timed out (each resent with the same Idempotency-Key).
SUBMIT_ATTEMPTS = 3
#: Exit status of `fit --wait --timeout` when the job is still going (as timeout(1)).
WAIT_TIMED_OUT = 124


def _follow_hint(job_id: str) -> str:
    return (
        f"reattach with `vips wait {job_id}`, follow it with `vips job {job_id}`; `vips cancel {job_id}` "
        "stops it and refunds the rest"
    )


def _submit(api: VipsClient, key: str, **spec: Any) -> dict[str, Any]:
    """Submit, resending after a timeout with the same key: one job however many attempts arrive."""
    for attempt in range(1, SUBMIT_ATTEMPTS + 1):
        try:
            return api.submit_job(idempotency_key=key, **spec)
        except ApiTimeout as exc:
            if attempt == SUBMIT_ATTEMPTS:
                raise RuntimeFailure(
                    f"{exc.detail}, {SUBMIT_ATTEMPTS} times; the job may exist: rerun with "
                    f"--idempotency-key {key} to get its id without submitting it twice"
                ) from None
            print(f"vips: {exc.detail}; resending with the same idempotency key", file=sys.stderr)
    raise AssertionError("unreachable")


def run_fit_remote(args: argparse.Namespace, options: dict[str, float]) -> int:
    if args.dataset is None:
        raise UsageError("fit needs --dataset NAME (or --local with --input FILE)")
    if args.input is not None or args.kind is not None:
        raise UsageError("--input and --kind are for --local; the server fits a registered --dataset")
    if (args.sigma is None) == (args.epsilon is None):
        raise UsageError("give exactly one of --sigma and --epsilon")
    if args.timeout is not None and not args.wait:
        raise UsageError("--timeout is for --wait")
    if args.dry_run:
        return _quote(args, options)
    if args.output is not None:
        check_writable(Path(args.output))
    key = args.idempotency_key or uuid.uuid4().hex
    with client() as api:
        try:
            job = _submit(
                api,
                key,
                dataset=args.dataset,
                model=args.model,
                algorithm=args.algorithm,
                iterations=args.iterations,
                batch_size=args.batch_size,
                sigma=args.sigma,
                epsilon=args.epsilon,
                options=options,
            )
        except KeyboardInterrupt:
            print(
                "vips: interrupted before the service answered; if it received the submission, the job "
                f"exists: rerun the same command with --idempotency-key {key} to get its id (never a "
                "second job)",
                file=sys.stderr,
            )
            return 130
        _announce(job["id"], key)
        if not args.wait:
            print(job["id"])
            return 0
        return _wait_and_end(api, job, args.timeout, args.output)


def _announce(job_id: str, key: str) -> None:
    """On stderr at submission: the job id with its idempotency key, and how to get back to the job."""
    note(
        f"job {job_id} submitted with idempotency key {key} (rerunning the command with --idempotency-key "
        f"{key} gets this job back, never a second one); reattach with `vips wait {job_id}`"
    )


def _wait_and_end(api: VipsClient, job: dict[str, Any], timeout: float | None, output: str | None) -> int:
    """`fit --wait` and `vips wait`: the progress bar to the job's end, then the finished job as one JSON
    line, where the posterior went (-o) and the budget left; 1 if the job did not succeed, 130 on Ctrl-C
    and 124 after `timeout` seconds (the job goes on in both)."""
    try:
        job = _wait_with_progress(api, job, timeout)
    except KeyboardInterrupt:
        print(f"vips: stopped waiting; job {job['id']} goes on: {_follow_hint(job['id'])}", file=sys.stderr)
        return 130
    except TimeoutError:
        print(
            f"vips: job {job['id']} is not finished after {timeout:g} s and goes on: "
            f"{_follow_hint(job['id'])}",
            file=sys.stderr,
        )
        return WAIT_TIMED_OUT
    print(json.dumps(job, allow_nan=False))
    if job["status"] != "succeeded":
        if job.get("error"):
            print(f"vips: job {job['id']} {job['status']}: {job['error']}", file=sys.stderr)
        return 1
    if output is not None:
        _save(api, job["id"], Path(output))
        note(f"posterior written to {output}")
    else:
        note(f"posterior not saved: download it with `vips posterior {job['id'][:8]} -o posterior.json`")
    note(_budget_left(api, job))
    return 0


def run_wait(args: argparse.Namespace) -> int:
    """`vips wait JOB`: reattach to a job (a running one, e.g. after Ctrl-C in `fit --wait`) and end as
    `fit --wait` does."""
    if args.output is not None:
        check_writable(Path(args.output))
    with client() as api:
        return _wait_and_end(api, api.job(args.job), args.timeout, args.output)


def _budget_left(api: VipsClient, job: dict[str, Any]) -> str:
    """What the job spent and what the dataset's budget has left (if this key may read the budget)."""
    spent = f"job {job['id'][:8]} spent epsilon {epsilon_text(job.get('epsilon_spent'))}"
    try:
        budget = api.dataset(job["dataset"]).get("budget")
    except ApiError:
        return spent
    if budget is None or budget.get("epsilon_remaining") is None:
        return f"{spent}; dataset {job['dataset']} has no budget cap"
    return (
        f"{spent}; dataset {job['dataset']} has epsilon {epsilon_text(budget['epsilon_remaining'])} left "
        f"of {epsilon_text(budget['epsilon'])} (delta {budget['delta']:g})"
    )


def _quote(args: argparse.Namespace, options: dict[str, float]) -> int:
    """`fit --dry-run`: the quote as one JSON line; nothing is reserved or queued."""
    submission = ((args.wait, "--wait"), (args.output, "-o"), (args.idempotency_key, "--idempotency-key"))
    for given, flag in submission:
        if given:
            raise UsageError(f"{flag} is for a submission, not --dry-run")
    with client() as api:
        quote = api.submit_job(
            dataset=args.dataset,
            model=args.model,
            algorithm=args.algorithm,
            iterations=args.iterations,
            batch_size=args.batch_size,
            sigma=args.sigma,
            epsilon=args.epsilon,
            options=options,
            dry_run=True,
        )
    print_json(quote)
    return 0


def run_job_show(args: argparse.Namespace) -> int:
    with client() as api:
        print_json(api.job(args.job))
    return 0


def run_releases(args: argparse.Namespace) -> int:
    """One JSON line per released iteration (its noised statistics and noise std), oldest first."""
    with client() as api:
        for release in api.iter_releases(args.job, after=args.after, limit=args.limit):
            print_json(release)
    return 0


def run_cancel(args: argparse.Namespace) -> int:
    with client() as api:
        print_json(api.cancel(args.job))
    return 0


def run_delete(args: argparse.Namespace) -> int:
    with client() as api:
        print_json(api.delete_outputs(args.job))
    return 0


def _wait_with_progress(api: VipsClient, job: dict[str, Any], timeout: float | None) -> dict[str, Any]:
    """Poll the job to its end under a bar: iterations, epsilon spent so far, elapsed and ETA."""
    with fit_progress(f"job {job['id'][:8]}", job["iterations"], job["status"]) as update:

        def show(current: dict[str, Any]) -> None:
            update(current["iteration"], current.get("epsilon_spent"), current["status"])

        return api.wait(job["id"], interval=0.25, timeout=timeout, on_progress=show)
