"""Jobs: submit (analysts), read, cancel, the per-iteration releases, and deleting an ended job's outputs."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response, status
from fastapi.responses import StreamingResponse
from sqlalchemy import Engine, Row

from control.budgets.datasets import load_dataset
from control.errors import NotFound
from control.jobs.control import cancel_job
from control.jobs.queue import JobQueue
from control.jobs.storage import delete_outputs
from control.planning.admission import plan_job, quote_job
from control.planning.pricing import pricing_slot, take_pricing_request
from control.schemas import (
    INT_MAX,
    BudgetRefusal,
    JobCreate,
    JobPublic,
    JobQuote,
    Message,
    ReleasePublic,
    StorageRefusal,
)
from control.settings import ServiceSettings
from control.store.job_status import JobStatus
from control.store.keys import Principal
from control.store.release_arrays import coalesced
from service.http.auth import (
    AUTH_RESPONSES,
    AnalystKey,
    JobCancellerKey,
    JobReaderKey,
    ReleaseReaderKey,
    cancels_job,
    reads_releases,
)
from service.http.deps import EngineDep, QueueDep, SettingsDep
from service.http.params import DatasetNameQuery, JobIdPath, Offset
from service.routes.datasets import visible_dataset
from service.routes.job_outputs import outputs_gone, release_page, releases_json
from service.routes.job_reads import list_jobs, to_public, visible_job
from service.routes.submission import idempotency_turn, previous_submission, submit_job

router = APIRouter(prefix="/jobs", tags=["jobs"], responses=AUTH_RESPONSES)


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobPublic | JobQuote,
    responses={
        200: {"model": JobQuote, "description": "dry run: the quote; nothing is reserved or queued"},
        404: {"model": Message},
        409: {
            "model": BudgetRefusal | StorageRefusal,
            "description": "the budget or the key's quota cannot admit the job (or none is set), or the "
            "key's stored outputs have no room for it (VIPS_MAX_KEY_STORED_MB)",
        },
        429: {
            "model": Message,
            "description": "this key has its most queued jobs, or prices too often (Retry-After says when)",
        },
        503: {
            "model": Message,
            "description": "the job queue is unavailable or the accountant busy; nothing stays reserved",
        },
    },
)
def submit(
    spec: JobCreate,
    response: Response,
    engine: EngineDep,
    queue: QueueDep,
    settings: SettingsDep,
    principal: AnalystKey,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=128,
            pattern=r"^[A-Za-z0-9_.:-]+$",
            description="a key of your choice (e.g. a UUID): resending with it returns the same job",
        ),
    ] = None,
) -> JobPublic | JobQuote:
    """Submit a fitting job: 202 with the queued job, after its whole privacy cost was reserved.

    Give `sigma` (noise multiplier) or `epsilon` (the job's own target; the server reports the sigma it
    chose). With `dry_run` the answer is a quote (200) and nothing is reserved. With an
    `Idempotency-Key` header, a retried submission, also one racing the first, returns the job the key
    first created (202, header `Idempotent-Replayed: true`) and never reserves twice nor is refused for
    the first one's reservation; the same key with another spec is a 409.
    """
    dataset = visible_dataset(engine, principal, spec.dataset)
    if idempotency_key is None or spec.dry_run:
        return _price_or_submit(spec, response, engine, queue, settings, principal, dataset, None)
    with idempotency_turn(principal.key_id, idempotency_key, settings.pricing_wait_seconds):
        previous = previous_submission(engine, principal, idempotency_key, spec)
        if previous is not None:
            response.headers["Idempotent-Replayed"] = "true"
            return to_public(engine, [previous])[0]
        return _price_or_submit(spec, response, engine, queue, settings, principal, dataset, idempotency_key)


def _price_or_submit(
    spec: JobCreate,
    response: Response,
    engine: Engine,
    queue: JobQueue,
    settings: ServiceSettings,
    principal: Principal,
    dataset: Row[Any],
    idempotency_key: str | None,
) -> JobPublic | JobQuote:
    """Price the job (one of the key's pricing requests): a dry run's quote, or the submitted job."""
    take_pricing_request(settings, principal.key_id)
    plan = plan_job(engine, spec, dataset, settings)
    if spec.dry_run:
        response.status_code = status.HTTP_200_OK
        with pricing_slot(settings):  # the headroom is priced by calibration (tens of milliseconds)
            return quote_job(engine, spec, plan, principal.key_id, settings.max_key_stored_mb)
    job, replayed = submit_job(
        engine,
        queue,
        principal,
        spec,
        plan,
        idempotency_key,
        max_queued=settings.max_queued_per_key,
        max_key_stored_mb=settings.max_key_stored_mb,
    )
    if replayed:  # a concurrent submission with this key won: its job, as for any replay
        response.headers["Idempotent-Replayed"] = "true"
    return to_public(engine, [job])[0]


@router.get("", response_model=list[JobPublic])
def jobs(
    engine: EngineDep,
    principal: JobReaderKey,
    dataset: DatasetNameQuery = None,
    status: JobStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Offset = 0,
) -> list[JobPublic]:
    """The jobs this key may read, newest first (analysts: their own; clients: their dataset scope;
    custodians: the jobs on their datasets)."""
    rows = list_jobs(engine, principal, dataset=dataset, status=status, limit=limit, offset=offset)
    return to_public(engine, rows)


@router.get(
    "/{job_id}",
    response_model=JobPublic,
    responses={404: {"model": Message}, 409: {"model": Message, "description": "an ambiguous id prefix"}},
)
def job(job_id: JobIdPath, engine: EngineDep, principal: JobReaderKey) -> JobPublic:
    """A job's status, progress and privacy: epsilon_spent covers the iterations charged so far.

    Every `{job_id}` of these routes may be shortened to a prefix of 8 or more characters that starts
    exactly one job this key may read (409 when it starts several)."""
    return to_public(engine, [visible_job(engine, principal, job_id)])[0]


def _managed_job(engine: Engine, principal: Principal, job_id: str) -> Row[Any]:
    """The job, if `principal` may cancel it or delete its outputs (its analyst, the custodian of its
    dataset, admins); 404 otherwise, as for a job it cannot see."""
    row = visible_job(engine, principal, job_id)
    dataset = load_dataset(engine, row.dataset) if principal.role == "custodian" else None
    if not cancels_job(principal, row, dataset):
        raise NotFound(f"job {job_id} not found")
    return row


@router.post(
    "/{job_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobPublic,
    responses={404: {"model": Message}, 409: {"model": Message}},
)
def cancel(job_id: JobIdPath, engine: EngineDep, principal: JobCancellerKey) -> JobPublic:
    """Cancel: a queued job stops now and its reservation is refunded; a running one stops before its
    next release. The job's analyst, the custodian of its dataset and admins may cancel it."""
    row = _managed_job(engine, principal, job_id)
    cancel_job(engine, row)
    return to_public(engine, [visible_job(engine, principal, row.id)])[0]


@router.delete(
    "/{job_id}/outputs",
    response_model=JobPublic,
    responses={404: {"model": Message}, 409: {"model": Message, "description": "the job has not ended"}},
)
def delete_job_outputs(job_id: JobIdPath, engine: EngineDep, principal: JobCancellerKey) -> JobPublic:
    """Delete an ended job's releases and posterior to free its key's storage (VIPS_MAX_KEY_STORED_MB):
    its record, epsilon spent and the ledger's charges stay; reading them afterwards is a 410. The job's
    analyst, the custodian of its dataset and admins may; deleting again changes nothing."""
    row = _managed_job(engine, principal, job_id)
    delete_outputs(engine, row)
    return to_public(engine, [visible_job(engine, principal, row.id)])[0]


@router.get(
    "/{job_id}/releases",
    response_model=list[ReleasePublic],
    responses={
        200: {
            "description": "a page of releases; when more follow, the `Link` header holds the next page's "
            'URL (rel="next")'
        },
        404: {"model": Message},
        410: {"model": Message, "description": "the job's outputs were deleted"},
    },
)
def releases(
    request: Request,
    job_id: JobIdPath,
    engine: EngineDep,
    settings: SettingsDep,
    principal: ReleaseReaderKey,
    after: Annotated[int, Query(ge=0, le=INT_MAX, description="only iterations after this one")] = 0,
    limit: Annotated[int | None, Query(ge=1, le=100_000, description="at most this many releases")] = None,
) -> StreamingResponse:
    """The released (noised) statistics of each iteration, in order (the job's analyst, the custodian of
    its dataset, admins). Pages hold up to VIPS_RELEASES_PAGE_MB of stored releases (at least one); the
    `Link` header's rel="next" URL continues after the page's last iteration."""
    row = visible_job(engine, principal, job_id)
    dataset = load_dataset(engine, row.dataset) if principal.role == "custodian" else None
    if not reads_releases(principal, row, dataset):
        raise NotFound(f"job {job_id} not found")
    outputs_gone(row)
    max_bytes = int(settings.releases_page_mb * (1 << 20))
    page = release_page(engine, row.id, after=after, limit=limit, max_bytes=max_bytes)
    headers = {}
    left = None if limit is None else limit - len(page.rows)
    if page.next_after is not None and left != 0:
        following = request.url.include_query_params(after=page.next_after)
        if left is not None:
            following = following.include_query_params(limit=left)
        # A reference relative to this request's URL (RFC 3986: the same path, this query), right behind
        # any proxy that adds or strips a path prefix.
        headers["Link"] = f'<?{following.query}>; rel="next"'
    body = coalesced(releases_json(page.rows))
    return StreamingResponse(body, media_type="application/json", headers=headers)
