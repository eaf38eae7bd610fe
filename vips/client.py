"""The HTTP API for analysts in notebooks (`from vips import Client`): quote, fit, wait, jobs, ledger,
budget, cancel.

    from vips import Client
    client = Client()                      # VIPS_URL (default http://127.0.0.1:8000), VIPS_API_KEY
    client.quote("adult", "blr", epsilon=0.5)              # the dry run: nothing is reserved
    model = client.fit("adult", "blr", epsilon=0.5)        # submits, waits under a bar: an estimator
    model.predict_proba(X_test)[:, 1]                      # as `vips predict` on the same posterior
    client.jobs(), client.ledger("adult"), client.budget() # pandas DataFrames

The transport is service.http.client's VipsClient: an answer other than 2xx raises its ApiError, whose text is
what the CLI prints after "vips: error: " (ApiConnectionError, status 0, when the service is unreachable).
fit's estimator is VipsEstimator.from_posterior of the released posterior (vips.estimators): the same
scikit-learn estimator a local fit returns, predicting exactly as `vips predict` does. A job that fails or is
cancelled raises JobFailed with the CLI's message; an interrupted or timed-out wait leaves the job running
and says how to reattach. The progress bar: in a Jupyter kernel an HTML <progress> updated in place (no
widget library needed), elsewhere the CLI's bar (vips.progress). pandas is imported only by the methods
that return DataFrames.
"""

from __future__ import annotations

import html
import math
import os
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from control.store.job_status import TERMINAL
from service.http.client import DEFAULT_URL, POLL_SECONDS, ApiTimeout, VipsClient
from vips.commands.remote import budget_left
from vips.progress import epsilon_text, fit_progress

if TYPE_CHECKING:
    import pandas as pd  # type: ignore[import-untyped,unused-ignore]

    from vips.estimators import VipsEstimator

#: Attempts of a submission whose answer timed out (each resent with the same Idempotency-Key), as the CLI.
SUBMIT_ATTEMPTS = 3

LedgerView = Literal["job", "key", "charge"]


class JobFailed(RuntimeError):
    """A job that ended failed or cancelled: the message is the CLI's ("job ID failed: reason"); `job` is
    the job as the API last showed it."""

    def __init__(self, job: dict[str, Any]) -> None:
        reason = f": {job['error']}" if job.get("error") else ""
        super().__init__(f"job {job['id']} {job['status']}{reason}")
        self.job = job


def _reattach_hint(job_id: str) -> str:
    return (
        f"reattach with client.wait({job_id!r}), follow it with client.job({job_id!r}); "
        f"client.cancel({job_id!r}) stops it and refunds the rest"
    )


class Client:
    """One analyst's (or custodian's, or client's) view of a VIPS service, for notebooks.

    url and key default to VIPS_URL (else http://127.0.0.1:8000) and VIPS_API_KEY, as the CLI reads them;
    `timeout` bounds each HTTP request (not a job: see wait). `progress=False` turns the bar off.
    """

    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        *,
        timeout: float = 60.0,
        progress: bool = True,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        self.url = (url or env.get("VIPS_URL") or DEFAULT_URL).rstrip("/")
        self.progress = progress
        self.api = VipsClient(self.url, key or env.get("VIPS_API_KEY") or None, timeout=timeout)

    def __repr__(self) -> str:
        return f"Client({self.url!r})"  # never the key

    def close(self) -> None:
        self.api.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ---- jobs ---------------------------------------------------------------------------------------

    def quote(
        self,
        dataset: str,
        model: str,
        *,
        epsilon: float | None = None,
        sigma: float | None = None,
        iterations: int | None = None,
        batch_size: int | None = None,
        algorithm: str = "vips",
        options: Mapping[str, float] | None = None,
        weak_privacy_ok: bool = False,
    ) -> dict[str, Any]:
        """What the job would cost and whether the budget admits it (`vips fit --dry-run`): its schedule,
        sigma, epsilon_job, epsilon_after, admissible, largest_epsilon, resources... Nothing is reserved."""
        spec = _spec(dataset, model, epsilon, sigma, iterations, batch_size, algorithm, options)
        return self.api.submit_job(**spec, dry_run=True, weak_privacy_ok=weak_privacy_ok)

    def submit(
        self,
        dataset: str,
        model: str,
        *,
        epsilon: float | None = None,
        sigma: float | None = None,
        iterations: int | None = None,
        batch_size: int | None = None,
        algorithm: str = "vips",
        options: Mapping[str, float] | None = None,
        idempotency_key: str | None = None,
        weak_privacy_ok: bool = False,
    ) -> dict[str, Any]:
        """Submit the job without waiting; returns it queued (its "id" for wait, estimator, cancel). A
        timed-out answer is resent with the same idempotency key: one job however many attempts arrive.
        weak_privacy_ok confirms an epsilon above 10, which protects little (refused without it)."""
        spec = _spec(dataset, model, epsilon, sigma, iterations, batch_size, algorithm, options)
        key = idempotency_key or uuid.uuid4().hex
        for attempt in range(1, SUBMIT_ATTEMPTS + 1):
            try:
                return self.api.submit_job(**spec, idempotency_key=key, weak_privacy_ok=weak_privacy_ok)
            except ApiTimeout as exc:
                if attempt == SUBMIT_ATTEMPTS:
                    raise ApiTimeout(
                        f"{exc.detail}, {SUBMIT_ATTEMPTS} times; the job may exist: submit again with "
                        f"idempotency_key={key!r} to get it without submitting it twice"
                    ) from None
        raise AssertionError("unreachable")

    def fit(
        self,
        dataset: str,
        model: str,
        *,
        epsilon: float | None = None,
        sigma: float | None = None,
        iterations: int | None = None,
        batch_size: int | None = None,
        algorithm: str = "vips",
        options: Mapping[str, float] | None = None,
        timeout: float | None = None,
        output: str | Path | None = None,
        classes: Any = None,
        weak_privacy_ok: bool = False,
    ) -> VipsEstimator:
        """Submit the job, wait for it under a progress bar and return the fitted scikit-learn estimator of
        its released posterior (VIPSLogisticRegression for blr by vips, ...; its `posterior_` is the
        document, `job_` the finished job). Give epsilon (iterations and batch_size left None: the service
        chooses them, as the quote says) or sigma. `output` also writes the posterior document to that file;
        `classes` is a classifier's label set (default [0, 1]). Raises JobFailed if the job fails or is
        cancelled, TimeoutError after `timeout` seconds (the job goes on) and ApiError as the CLI reports."""
        job = self.submit(
            dataset,
            model,
            epsilon=epsilon,
            sigma=sigma,
            iterations=iterations,
            batch_size=batch_size,
            algorithm=algorithm,
            options=options,
            weak_privacy_ok=weak_privacy_ok,
        )
        self._say(f"job {job['id']} submitted; client.wait({job['id']!r}) reattaches if this wait stops")
        self.wait(job["id"], timeout=timeout)
        return self.estimator(job["id"], output=output, classes=classes)

    def wait(
        self, job_id: str, *, timeout: float | None = None, interval: float = POLL_SECONDS
    ) -> dict[str, Any]:
        """Follow the job to its end under a progress bar (iterations, epsilon spent, elapsed, ETA) and
        return it finished; the budget left is printed as `vips wait` does. Raises JobFailed if it failed or
        was cancelled, TimeoutError after `timeout` seconds; an interrupt (the notebook's stop button) stops
        the wait, not the job."""
        job = self.api.job(job_id)
        try:
            with self._bar(job) as show:
                job = self.api.wait(job["id"], interval=interval, timeout=timeout, on_progress=show)
        except KeyboardInterrupt:
            print(
                f"vips: stopped waiting; job {job['id']} goes on: {_reattach_hint(job['id'])}",
                file=sys.stderr,
            )
            raise
        except TimeoutError:
            raise TimeoutError(
                f"job {job['id']} is not finished after {timeout:g} s and goes on: "
                f"{_reattach_hint(job['id'])}"
            ) from None
        if job["status"] != "succeeded":
            raise JobFailed(job)
        self._say(budget_left(self.api, job))
        return job

    def estimator(
        self, job_id: str, *, output: str | Path | None = None, classes: Any = None
    ) -> VipsEstimator:
        """The scikit-learn estimator of a finished job's posterior (VipsEstimator.from_posterior), `job_`
        set to the job; `output` also writes the document to that file (streamed, as `vips posterior`)."""
        from vips.estimators import VipsEstimator
        from vips.posterior import load_posterior

        job = self.api.job(job_id)
        if output is not None:
            self.api.save_posterior(job["id"], Path(output))
            document = load_posterior(Path(output))
        else:
            document = self.api.posterior(job["id"])
        fitted = VipsEstimator.from_posterior(document, classes=classes)
        fitted.job_ = job
        return fitted

    def posterior(self, job_id: str) -> dict[str, Any]:
        """A finished job's posterior document (docs/posterior-format.md), parsed."""
        return self.api.posterior(job_id)

    def job(self, job_id: str) -> dict[str, Any]:
        """The job now (id or its first 8+ characters): status, iteration of iterations, epsilon spent..."""
        return self.api.job(job_id)

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Ask the job to stop (`vips cancel`); what it has not charged is refunded. Returns the job."""
        return self.api.cancel(job_id)

    # ---- tables ---------------------------------------------------------------------------------------

    def jobs(
        self, dataset: str | None = None, *, status: str | None = None, limit: int | None = None
    ) -> pd.DataFrame:
        """The jobs this key may read, newest first (`vips jobs`): one row each, times as UTC datetimes."""
        return _frame(self.api.jobs(dataset=dataset, status=status, limit=limit))

    def ledger(self, dataset: str, *, by: LedgerView = "job") -> pd.DataFrame:
        """The dataset's ledger (`vips ledger`): by "job" (each job's key name, status, iterations and
        epsilon spent at the dataset's delta; custodians), by "key" (each key's jobs, epsilon spent and
        quota; an analyst sees its own row) or every "charge" (each iteration's event, all pages). `attrs`
        holds the dataset, its delta (and with "charge", its budget)."""
        if by == "job":
            answer = self.api.ledger_jobs(dataset)
            table = _frame(answer["jobs"])
        elif by == "key":
            answer = self.api.ledger_keys(dataset)
            table = _frame(answer["keys"])
        elif by == "charge":
            answer = self.api.ledger(dataset)
            table = _frame([_flat(entry) for entry in answer["entries"]])
        else:
            raise ValueError(f"by must be 'job', 'key' or 'charge', not {by!r}")
        table.attrs.update(
            {name: value for name, value in answer.items() if name not in ("jobs", "keys", "entries")}
        )
        return table

    def budget(self, dataset: str | None = None) -> pd.DataFrame:
        """Each dataset this key may read (or the one named) with its budget (`vips budget show`): name,
        kind, population, public, epsilon, delta, epsilon_spent, epsilon_reserved, epsilon_remaining (None
        where no budget is set), indexed by name."""
        found = [self.api.dataset(dataset)] if dataset is not None else self.api.datasets()
        rows = []
        for entry in found:
            row = {name: value for name, value in entry.items() if name not in ("budget", "schema")}
            row.update(_flat(entry.get("budget") or {}))
            rows.append(row)
        table = _frame(rows)
        return table.set_index("name") if "name" in table.columns else table

    # ---- around the wait ----------------------------------------------------------------------------

    def _say(self, message: str) -> None:
        """A line for the reader under the cell (stdout in a notebook, stderr elsewhere, as the CLI)."""
        if self.progress:
            print(f"vips: {message}", file=sys.stdout if _in_notebook() else sys.stderr, flush=True)

    @contextmanager
    def _bar(self, job: dict[str, Any]) -> Iterator[Callable[[dict[str, Any]], None]]:
        """The function that shows each polled job: a notebook's HTML bar, the CLI's bar, or nothing."""
        if not self.progress:
            yield lambda _job: None
        elif _in_notebook():
            yield _NotebookBar(job).show
        else:
            with fit_progress(f"job {job['id'][:8]}", job["iterations"], job["status"]) as update:
                yield lambda now: update(now["iteration"], now.get("epsilon_spent"), now["status"])


def _spec(
    dataset: str,
    model: str,
    epsilon: float | None,
    sigma: float | None,
    iterations: int | None,
    batch_size: int | None,
    algorithm: str,
    options: Mapping[str, float] | None,
) -> dict[str, Any]:
    if (sigma is None) == (epsilon is None):
        raise ValueError("give exactly one of sigma and epsilon")
    return {
        "dataset": dataset,
        "model": model,
        "algorithm": algorithm,
        "iterations": iterations,
        "batch_size": batch_size,
        "sigma": sigma,
        "epsilon": epsilon,
        "options": options,
    }


def _in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (IPython's shell with a kernel), where HTML output shows."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and getattr(shell, "kernel", None) is not None


def _clock(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-:--:--"
    whole = max(0, int(seconds))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def _when(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


class _BarView:
    """One state of the bar, shown as HTML by a notebook and as one line of text elsewhere."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.done, self.total = int(job["iteration"]), int(job["iterations"])
        created, started, finished = (_when(job.get(n)) for n in ("created_at", "started_at", "finished_at"))
        end = finished or datetime.now(UTC)
        self.elapsed = None if created is None else (end - created).total_seconds()
        self.eta: float | None = None
        if job["status"] in TERMINAL:
            self.eta = 0.0
        elif started is not None and self.done > 0:
            per_iteration = (end - started).total_seconds() / self.done
            self.eta = per_iteration * (self.total - self.done)
        self.text = (
            f"job {job['id'][:8]} {job['status']} {self.done}/{self.total} "
            f"eps {epsilon_text(job.get('epsilon_spent'))} {_clock(self.elapsed)} "
            f"ETA {_clock(self.eta) if self.eta is not None else 'unknown'}"
        )

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return (
            f'<div class="vips-progress"><progress value="{self.done}" max="{max(self.total, 1)}" '
            'style="width: 20em; vertical-align: middle"></progress> '
            f"<code>{html.escape(self.text)}</code></div>"
        )


class _NotebookBar:
    """A progress bar in a notebook cell's output, updated in place (IPython's display handle)."""

    def __init__(self, job: dict[str, Any]) -> None:
        from IPython.display import display

        self._handle = display(_BarView(job), display_id=True)  # type: ignore[no-untyped-call]

    def show(self, job: dict[str, Any]) -> None:
        if self._handle is not None:
            self._handle.update(_BarView(job))


def _flat(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A record with its nested objects spread into columns (event.type -> event_type)."""
    row: dict[str, Any] = {}
    for name, value in record.items():
        if isinstance(value, Mapping):
            row.update(_flat(value, f"{prefix}{name}_"))
        else:
            row[f"{prefix}{name}"] = value
    return row


def _frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """The records as a DataFrame, their *_at columns as UTC datetimes."""
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("the Client's tables are pandas DataFrames: pip install pandas") from None
    table = pd.DataFrame.from_records(records)
    for column in table.columns:
        if str(column).endswith("_at"):
            table[column] = pd.to_datetime(table[column], utc=True, format="ISO8601")
    return table
