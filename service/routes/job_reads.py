"""Reading jobs: by id or unambiguous prefix, listed newest first, each restricted to what the key may
read (service.http.auth.sees_job), and the public view of each with what it has spent."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, Row, Select, select

from control.budgets.datasets import finite, load_dataset
from control.budgets.job_costs import epsilon_spent
from control.errors import Conflict, NotFound
from control.planning.options import typed_options
from control.schemas import JobPublic
from control.store.keys import Principal, key_names
from control.store.models import jobs
from control.store.timestamps import aware
from privacy_wall.ledger.schema import datasets
from privacy_wall.sqlengine import reading
from service.http.auth import sees_job


def get_job(engine: Engine, job_id: str) -> Row[Any] | None:
    with reading(engine) as conn:
        return conn.execute(select(jobs).where(jobs.c.id == job_id)).one_or_none()


#: The shortest job id prefix resolved to a job (`vips job 1f3a9c0e`).
MIN_ID_PREFIX = 8


def visible_job(engine: Engine, principal: Principal, job_id: str) -> Row[Any]:
    """The job if this key may read it, by its id or by a prefix of at least MIN_ID_PREFIX characters
    that starts exactly one job this key may read (409 naming them if several); otherwise 404, as if it
    did not exist."""
    job = _readable(engine, principal, get_job(engine, job_id))
    if job is None and len(job_id) >= MIN_ID_PREFIX:
        job = _by_prefix(engine, principal, job_id)
    if job is None:
        short = len(job_id) < MIN_ID_PREFIX
        hint = f" (a shortened id needs at least {MIN_ID_PREFIX} characters)" if short else ""
        raise NotFound(f"job {job_id} not found{hint}")
    return job


def _readable(engine: Engine, principal: Principal, job: Row[Any] | None) -> Row[Any] | None:
    dataset = load_dataset(engine, job.dataset) if job is not None and principal.role == "custodian" else None
    return job if job is not None and sees_job(principal, job, dataset) else None


#: How many candidate ids an ambiguous prefix's 409 names.
_AMBIGUOUS_SHOWN = 3


def _by_prefix(engine: Engine, principal: Principal, prefix: str) -> Row[Any] | None:
    query = _visible_to(principal, select(jobs.c.id))
    if query is None:
        return None
    query = query.where(jobs.c.id.startswith(prefix, autoescape=True)).order_by(jobs.c.id)
    with reading(engine) as conn:
        ids = list(conn.execute(query.limit(_AMBIGUOUS_SHOWN + 1)).scalars())
    if len(ids) > 1:
        shown = ", ".join(ids[:_AMBIGUOUS_SHOWN]) + (", ..." if len(ids) > _AMBIGUOUS_SHOWN else "")
        raise Conflict(f"job id prefix {prefix} is ambiguous: it starts {shown}; give more characters")
    return _readable(engine, principal, get_job(engine, ids[0])) if ids else None


def _visible_to(principal: Principal, query: Select[Any]) -> Select[Any] | None:
    """`query` over jobs restricted to the jobs this key may read (as auth.sees_job); None: none."""
    if principal.role == "analyst":
        return query.where(jobs.c.owner == principal.key_id)
    if principal.role == "client" and principal.dataset is not None:
        return query.where(jobs.c.dataset == principal.dataset)
    if principal.role == "custodian":  # the jobs on the datasets it owns (auth.owns_dataset)
        owned = select(datasets.c.name).where(
            (datasets.c.owner == principal.key_id) | (datasets.c.name == principal.dataset)
        )
        return query.where(jobs.c.dataset.in_(owned))
    if principal.role in ("admin", "client"):
        return query
    return None


def list_jobs(
    engine: Engine,
    principal: Principal,
    *,
    dataset: str | None = None,
    status: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> list[Row[Any]]:
    """The jobs this key may read, newest first."""
    visible = _visible_to(principal, select(jobs))
    if visible is None:
        return []
    query = visible.order_by(jobs.c.created_at.desc(), jobs.c.id).limit(limit).offset(offset)
    if dataset is not None:
        query = query.where(jobs.c.dataset == dataset)
    if status is not None:
        query = query.where(jobs.c.status == status)
    with reading(engine) as conn:
        return list(conn.execute(query).all())


def to_public(engine: Engine, rows: Sequence[Row[Any]]) -> list[JobPublic]:
    """The public view of each job (rows of the whole jobs table): what it has spent and the name of the
    key that submitted it."""
    spent = epsilon_spent(engine, {row.id: row.delta for row in rows})
    names = key_names(engine, (row.owner for row in rows))
    return [
        JobPublic(
            id=row.id,
            dataset=row.dataset,
            key_name=names.get(row.owner),
            model=row.model,
            algorithm=row.algorithm,
            status=row.status,
            iteration=row.iteration,
            iterations=row.iterations,
            batch_size=row.batch_size,
            sigma=row.sigma,
            epsilon_target=row.epsilon_target,
            epsilon_job=row.epsilon_job,
            epsilon_spent=finite(spent[row.id]),
            delta=row.delta,
            options=typed_options(row.model, dict(row.options), row.algorithm),
            cancel_requested=bool(row.cancel_requested),
            error=row.error,
            created_at=aware(row.created_at),
            started_at=aware(row.started_at),
            finished_at=aware(row.finished_at),
            stored_bytes=row.stored_bytes,
            outputs_deleted_at=aware(row.outputs_deleted_at),
        )
        for row in rows
    ]
