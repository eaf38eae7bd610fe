"""What a job has released: its noisy statistics by iteration, in pages bounded in bytes and streamed as
JSON, and its stored posterior document, streamed as stored."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fastapi.responses import Response, StreamingResponse
from pydantic import TypeAdapter
from sqlalchemy import Engine, Row, select

from control.errors import Conflict, Gone, NotFound
from control.store.models import releases
from control.store.posteriors import iter_posterior, posterior_bytes, posterior_text
from control.store.release_arrays import array_json, decode_arrays
from control.store.timestamps import aware
from privacy_wall.sqlengine import reading

#: At most this many releases in one page, whatever their size.
RELEASES_PER_PAGE = 10_000
_DATETIME = TypeAdapter(datetime)


@dataclass(frozen=True)
class ReleasePage:
    """Stored releases of one page, in order, and the iteration after which the next page starts (None:
    this page ends the job's releases so far)."""

    rows: list[Any]  # Rows of (iteration, arrays, noise_std, created_at)
    next_after: int | None


def release_page(
    engine: Engine, job_id: str, *, after: int, limit: int | None, max_bytes: int
) -> ReleasePage:
    """Releases after iteration `after`: as many as fit in `max_bytes` of stored arrays (at least one), at
    most `limit` and RELEASES_PER_PAGE."""
    count = min(limit or RELEASES_PER_PAGE, RELEASES_PER_PAGE)
    with reading(engine) as conn:
        sizes = conn.execute(
            select(releases.c.iteration, releases.c.stored_bytes)
            .where(releases.c.job_id == job_id, releases.c.iteration > after)
            .order_by(releases.c.iteration)
            .limit(count + 1)
        ).all()
        total, last = 0, None
        for index, (iteration, size) in enumerate(sizes):
            if index == count or (last is not None and total + size > max_bytes):
                break
            total, last = total + size, iteration
        if last is None:
            return ReleasePage([], None)
        rows = conn.execute(
            select(releases.c.iteration, releases.c.arrays, releases.c.noise_std, releases.c.created_at)
            .where(releases.c.job_id == job_id, releases.c.iteration > after, releases.c.iteration <= last)
            .order_by(releases.c.iteration)
        ).all()
    more = sizes[-1].iteration > last
    return ReleasePage(list(rows), last if more else None)


def releases_json(rows: list[Any]) -> Iterator[str]:
    """The JSON array of ReleasePublic for `rows`, in pieces: one stored release's arrays are decoded at a
    time and their text is never whole in memory (control.store.release_arrays.array_json)."""
    yield "["
    for index, row in enumerate(rows):
        created = _DATETIME.dump_json(aware(row.created_at)).decode()
        yield f'{", " if index else ""}{{"iteration": {int(row.iteration)}, "statistics": {{'
        for position, (name, array) in enumerate(decode_arrays(row.arrays).items()):
            yield f"{', ' if position else ''}{json.dumps(name)}: "
            yield from array_json(array)
        noise_std = json.dumps(dict(row.noise_std), allow_nan=False)
        yield f'}}, "noise_std": {noise_std}, "created_at": {created}}}'
    yield "]"


def job_posterior(engine: Engine, job: Row[Any]) -> dict[str, Any]:
    """The job's posterior document, parsed (a Python float per value: ~4x the JSON text's bytes)."""
    stored_posterior_size(engine, job)
    return dict(json.loads(posterior_text(engine, job.id)))


def outputs_gone(job: Row[Any]) -> None:
    """410 for a job whose outputs its analyst, custodian or an admin deleted (control.jobs.storage)."""
    if job.outputs_deleted_at is not None:
        when = f"{aware(job.outputs_deleted_at):%Y-%m-%d %H:%M} UTC"
        raise Gone(
            f"job {job.id}'s releases and posterior were deleted at {when} (its record and charges stay)"
        )


def stored_posterior_size(engine: Engine, job: Row[Any]) -> int:
    """Bytes of the succeeded job's stored posterior text (its download's Content-Length); 409 before the
    job has succeeded, 410 once its outputs were deleted, 404 without one."""
    if job.status != "succeeded":
        raise Conflict(f"job {job.id} is {job.status}: a posterior exists once the job has succeeded")
    outputs_gone(job)
    size = posterior_bytes(engine, job.id)
    if size is None:
        raise NotFound(f"job {job.id} has no stored posterior")
    return size


def posterior_response(engine: Engine, job: Row[Any], headers: Mapping[str, str] | None = None) -> Response:
    """The job's posterior document as stored (its JSON text, never parsed), streamed a chunk at a time
    (control.store.posteriors) with its Content-Length: the API holds one chunk of it, whatever its size."""
    size = stored_posterior_size(engine, job)
    return StreamingResponse(
        iter_posterior(engine, job.id),
        media_type="application/json",
        headers={**(headers or {}), "Content-Length": str(size)},
    )
