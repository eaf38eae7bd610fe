"""Client verbs over HTTP (VIPS_URL, VIPS_API_KEY): `vips budget`, `vips fit`, `vips wait`, `vips jobs`,
`vips job`, `vips cancel`, `vips posterior`, `vips ledger`."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from service.http.client import DEFAULT_URL, ApiConnectionError, ApiError, ApiTimeout, VipsClient
from vips.errors import RuntimeFailure, UsageError
from vips.output import check_writable, print_json
from vips.progress import epsilon_text, fit_progress, note


@contextmanager
def client() -> Iterator[VipsClient]:
    """The environment's client; API errors become one-line CLI errors (exit 1, 2 for a bad request)."""
    try:
        with VipsClient.from_env() as api:
            yield api
    except ApiConnectionError as exc:
        raise RuntimeFailure(f"{exc}{_url_hint()}") from None
    except ApiError as exc:
        code = 2 if exc.status_code in (400, 422) else 1
        error = UsageError(f"{exc}") if code == 2 else RuntimeFailure(f"{exc}")
        raise error from None


def _url_hint() -> str:
    """What an unreachable service's error adds: where the address comes from, and its default."""
    if os.environ.get("VIPS_URL"):
        return " (the address is VIPS_URL's; is the service running there?)"
    return (
        f"; VIPS_URL is not set, so the default {DEFAULT_URL} (`vips up`'s) was tried: start the service "
        "with `vips up`, or set VIPS_URL to its address"
    )


def run_budget_set(args: argparse.Namespace) -> int:
    """The new budget as one JSON line; its warning (a cap at or below the spend) also on stderr."""
    with client() as api:
        answer = api.set_budget(args.name, args.epsilon, args.delta, weak_privacy_ok=args.weak_privacy_ok)
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
        mine = _own_quota(api, args.name)
    if not args.schema:
        dataset.pop("schema", None)
    if mine is not None:
        dataset["key_quota"] = mine
    print_json(dataset)
    note(_what_is_left(dataset, mine))
    return 0


def _own_quota(api: VipsClient, dataset: str) -> dict[str, Any] | None:
    """This key's quota on the dataset and what it has left ({"key_id", "epsilon", "epsilon_reserved",
    "epsilon_remaining"}), or None when it has none or may not read it (only analysts have quotas)."""
    own = api.key_id
    if own is None:
        return None
    try:
        rows = api.ledger_keys(dataset).get("keys", [])
    except ApiError:
        return None
    for row in rows:
        if row.get("key_id") == own and row.get("quota_epsilon") is not None:
            quota, reserved = row["quota_epsilon"], row.get("epsilon_reserved")
            remaining = None if reserved is None else max(quota - reserved, 0.0)
            return {
                "key_id": own,
                "epsilon": quota,
                "epsilon_reserved": reserved,
                "epsilon_remaining": remaining,
            }
    return None


def _what_is_left(dataset: dict[str, Any], mine: dict[str, Any] | None) -> str:
    """`budget show`'s line for people: the dataset's epsilon left, this key's quota's, and how to learn
    the largest job that fits both."""
    budget = dataset.get("budget") or {}
    name = dataset["name"]
    if budget.get("epsilon") is None:
        parts = [f"dataset {name} has no budget cap"]
    else:
        parts = [
            f"dataset {name} has epsilon {epsilon_text(budget.get('epsilon_remaining'))} left of "
            f"{epsilon_text(budget['epsilon'])}"
        ]
    if mine is not None:
        parts.append(
            f"your key's quota has epsilon {epsilon_text(mine['epsilon_remaining'])} left of "
            f"{epsilon_text(mine['epsilon'])}"
        )
    if budget.get("epsilon") is not None or mine is not None:
        fits = "a job must fit both; s" if mine is not None else "S"
        parts.append(
            f"{fits}pends compose rather than add up, so the largest next job of a schedule can exceed what "
            f"is left: `vips fit --dataset {name} ... --dry-run` quotes it (largest_epsilon)"
        )
    return "; ".join(parts)


def run_jobs(args: argparse.Namespace) -> int:
    """One JSON line per job this key may read, newest first."""
    with client() as api:
        listed = api.jobs(dataset=args.dataset, status=args.status, limit=args.limit)
        if not listed and args.dataset is not None:
            _known_dataset(api, args.dataset)
        for job in listed:
            print_json(job)
    return 0


def _known_dataset(api: VipsClient, name: str) -> None:
    """A usage error naming a dataset this key cannot see (with the service's "did you mean"), so that
    `vips jobs --dataset adlt` does not print nothing and succeed."""
    try:
        api.dataset(name)
    except ApiError as exc:
        if exc.status_code == 404:
            raise UsageError(f"--dataset: {exc.detail}") from None
        raise


def run_ledger(args: argparse.Namespace) -> int:
    """The per-job summary (one JSON line), with --by-key the per-key one, or with --entries one page of
    charges (--cursor: the next_cursor of the previous page) or every page (--all: one document, no
    next_cursor)."""
    if not args.entries and (args.limit is not None or args.cursor is not None or args.all):
        raise UsageError("--limit, --cursor and --all page the charge entries: add --entries")
    with client() as api:
        if args.by_key or not args.entries:
            summary = api.ledger_keys(args.name) if args.by_key else api.ledger_jobs(args.name)
            print_json(summary)
            rows = summary.get("keys" if args.by_key else "jobs", [])
            composed = _composition_note(rows, "keys'" if args.by_key else "jobs'", _spent(api, args.name))
            if composed is not None:
                note(composed)
        elif args.all:
            print_json(api.ledger(args.name, page_size=args.limit or LEDGER_PAGE))
        else:
            print_json(api.ledger_page(args.name, limit=args.limit, cursor=args.cursor))
    return 0


def _spent(api: VipsClient, name: str) -> float | None:
    """The dataset's composed spend, or None when this key may not read it or it is unbounded."""
    try:
        budget = api.dataset(name).get("budget") or {}
    except ApiError:
        return None
    spent = budget.get("epsilon_spent")
    return float(spent) if isinstance(spent, (int, float)) else None


def _composition_note(rows: list[dict[str, Any]], whose: str, spent: float | None) -> str | None:
    """One line when the rows' epsilons (each a job's or key's releases on their own) add up to more than
    the dataset's spend, which composes them all: why the numbers do not add up (as the dashboard says)."""
    epsilons = [float(row["epsilon_spent"]) for row in rows if row.get("epsilon_spent") is not None]
    total = sum(epsilons)
    if spent is None or len(epsilons) < 2 or not total > spent * (1 + 1e-9):
        return None
    return (
        f"the {len(epsilons)} {whose} epsilons add up to {epsilon_text(total)}, more than the dataset's "
        f"spend {epsilon_text(spent)}: each is what those releases cost on their own; the budget holds their "
        "composition at the dataset's delta, which costs less than the sum (epsilons compose, not add)"
    )


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
                weak_privacy_ok=args.weak_privacy_ok,
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
    note(budget_left(api, job))
    return 0


def run_wait(args: argparse.Namespace) -> int:
    """`vips wait JOB`: reattach to a job (a running one, e.g. after Ctrl-C in `fit --wait`) and end as
    `fit --wait` does."""
    if args.output is not None:
        check_writable(Path(args.output))
    with client() as api:
        return _wait_and_end(api, api.job(args.job), args.timeout, args.output)


def budget_left(api: VipsClient, job: dict[str, Any]) -> str:
    """What the job spent, what the dataset's budget has left (if this key may read the budget) and, for a
    key with a quota on it, what the quota has left, with the largest next job of this schedule that fits
    both (the service's dry-run quote)."""
    spent = f"job {job['id'][:8]} spent epsilon {epsilon_text(job.get('epsilon_spent'))}"
    try:
        budget = api.dataset(job["dataset"]).get("budget")
    except ApiError:
        return spent
    if budget is None or budget.get("epsilon_remaining") is None:
        return f"{spent}; dataset {job['dataset']} has no budget cap"
    left = (
        f"{spent}; dataset {job['dataset']} has epsilon {epsilon_text(budget['epsilon_remaining'])} left "
        f"of {epsilon_text(budget['epsilon'])} (delta {budget['delta']:g})"
    )
    quote = _same_schedule_quote(api, job)
    if quote is None:
        return left
    if quote.get("quota_epsilon") is not None:
        left += (
            f"; your key's quota has epsilon {epsilon_text(quote.get('quota_remaining'))} left of "
            f"{epsilon_text(quote['quota_epsilon'])}"
        )
    largest = quote.get("largest_epsilon")
    within = "both" if quote.get("quota_epsilon") is not None else "it"
    if largest is None:
        return f"{left}; no further job of this schedule fits {within}"
    return (
        f"{left}; the largest next job of this schedule that fits {within}: epsilon {epsilon_text(largest)}"
    )


def _same_schedule_quote(api: VipsClient, job: dict[str, Any]) -> dict[str, Any] | None:
    """The dry-run quote of a job like `job` (same dataset, model, schedule and sigma) for this key: its
    largest_epsilon is within the dataset's budget and this key's quota; None if it cannot be had."""
    if not job.get("sigma"):
        return None  # sigma 0 (a public dataset): no epsilon to quote
    try:
        return api.submit_job(
            dataset=job["dataset"],
            model=job["model"],
            algorithm=job.get("algorithm", "vips"),
            iterations=job["iterations"],
            batch_size=job["batch_size"],
            sigma=job["sigma"],
            options=job.get("options") or {},
            dry_run=True,
        )
    except (ApiError, KeyError):
        return None


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
            weak_privacy_ok=args.weak_privacy_ok,
        )
    print_json(quote)
    if quote.get("note"):
        note(quote["note"])
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
    """Poll the job to its end under a bar: iterations, epsilon spent so far, elapsed and ETA. The clock
    runs from the job's start (from its submission while it is queued), so reattaching with `vips wait`
    shows the same bar as `fit --wait`; a queued job says why it waits and how long at least."""
    queue = _QueueView(api)
    with fit_progress(f"job {job['id'][:8]}", job["iterations"], job["status"]) as update:

        def show(current: dict[str, Any]) -> None:
            status, eta = current["status"], None
            if status == "queued":
                status, eta = queue.why(current)
            update(
                current["iteration"], current.get("epsilon_spent"), status, elapsed=_elapsed(current), eta=eta
            )

        return api.wait(job["id"], timeout=timeout, on_progress=show)


def _since(stamp: str | None) -> float | None:
    """Seconds since an ISO timestamp of the service (None when absent or unreadable)."""
    if not stamp:
        return None
    try:
        then = datetime.fromisoformat(stamp)
    except ValueError:
        return None
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    return max(0.0, (datetime.now(UTC) - then).total_seconds())


def _elapsed(job: dict[str, Any]) -> float | None:
    """The job's run time so far: since it started, or since its submission while it waits."""
    return _since(job.get("started_at")) if job.get("started_at") else _since(job.get("created_at"))


def _time_left(job: dict[str, Any]) -> float | None:
    """A running job's time left at the rate of its iterations so far (None before its first one)."""
    ran, done = _since(job.get("started_at")), int(job.get("iteration") or 0)
    if ran is None or done <= 0:
        return None
    return ran / done * max(0, int(job["iterations"]) - done)


class _QueueView:
    """Why a queued job waits, looked up every QUEUE_LOOKUP_SECONDS at most: behind a running job of the
    same key (a key runs VIPS_MAX_RUNNING_PER_KEY jobs at once, 1 by default), with that job's time left
    as the floor of the ETA, or for a free worker."""

    def __init__(self, api: VipsClient) -> None:
        self._api = api
        self._last = -math.inf
        self._answer: tuple[str, float | None] = ("queued", None)

    def why(self, job: dict[str, Any]) -> tuple[str, float | None]:
        now = time.monotonic()
        if now - self._last < QUEUE_LOOKUP_SECONDS:
            return self._answer
        self._last = now
        try:
            running = self._api.jobs(status="running", limit=100)
        except ApiError:
            return self._answer
        ahead = [
            other
            for other in running
            if other["id"] != job["id"] and other.get("key_name") == job.get("key_name")
        ]
        if not ahead:
            self._answer = ("queued: waiting for a free worker", None)
            return self._answer
        first = min(ahead, key=lambda other: _time_left(other) or math.inf)
        left = _time_left(first)
        more = f" (and {len(ahead) - 1} more)" if len(ahead) > 1 else ""
        self._answer = (f"queued: behind your job {first['id'][:8]}{more}", left)
        return self._answer


#: How often a queued job's bar asks why it waits (one list of the key's running jobs).
QUEUE_LOOKUP_SECONDS = 2.0
