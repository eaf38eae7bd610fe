"""What a job has released: its noisy statistics by iteration and its stored posterior document."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, Row, select

from privacy_wall.sqlengine import reading
from service.errors import Conflict, NotFound
from service.models import posteriors, releases
from service.schemas import ReleasePublic
from service.timestamps import aware


def job_releases(
    engine: Engine, job_id: str, after: int = 0, limit: int | None = None
) -> list[ReleasePublic]:
    query = (
        select(releases)
        .where(releases.c.job_id == job_id, releases.c.iteration > after)
        .order_by(releases.c.iteration)
    )
    if limit is not None:
        query = query.limit(limit)
    with reading(engine) as conn:
        rows = conn.execute(query).all()
    return [
        ReleasePublic(
            iteration=r.iteration,
            statistics=dict(r.statistics),
            noise_std=dict(r.noise_std),
            created_at=aware(r.created_at),
        )
        for r in rows
    ]


def job_posterior(engine: Engine, job: Row[Any]) -> dict[str, Any]:
    if job.status != "succeeded":
        raise Conflict(f"job {job.id} is {job.status}: a posterior exists once the job has succeeded")
    with reading(engine) as conn:
        document = conn.execute(select(posteriors.c.document).where(posteriors.c.job_id == job.id)).scalar()
    if document is None:
        raise NotFound(f"job {job.id} has no stored posterior")
    return dict(document)
