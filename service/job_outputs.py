"""What a job has released: its noisy statistics by iteration, in pages bounded in bytes and streamed as
JSON, and its stored posterior document."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter
from sqlalchemy import Engine, LargeBinary, Row, Text, cast, func, select

from privacy_wall.sqlengine import reading
from service.errors import Conflict, Gone, NotFound
from service.job_storage import posterior_text_bytes
from service.models import posteriors, releases
from service.release_arrays import array_json, decode_arrays
from service.timestamps import aware

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
    time and their text is never whole in memory (service.release_arrays.array_json)."""
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
    return dict(json.loads(job_posterior_bytes(engine, job)))


def outputs_gone(job: Row[Any]) -> None:
    """410 for a job whose outputs its analyst, custodian or an admin deleted (service.job_storage)."""
    if job.outputs_deleted_at is not None:
        when = f"{aware(job.outputs_deleted_at):%Y-%m-%d %H:%M} UTC"
        raise Gone(
            f"job {job.id}'s releases and posterior were deleted at {when} (its record and charges stay)"
        )


def posterior_size(engine: Engine, job_id: str) -> int | None:
    """Bytes of the job's stored posterior document (its JSON text), None without one: measured by the
    database, so a page can decline to load a large one."""
    with reading(engine) as conn:
        found = conn.execute(
            select(posterior_text_bytes(conn.dialect)).where(posteriors.c.job_id == job_id)
        ).scalar()
    return None if found is None else int(found)


def job_posterior_bytes(engine: Engine, job: Row[Any]) -> bytes:
    """The job's posterior document as stored: its UTF-8 JSON text, never parsed (a download costs its size
    once, not the ~8x of parsing it and writing it again)."""
    if job.status != "succeeded":
        raise Conflict(f"job {job.id} is {job.status}: a posterior exists once the job has succeeded")
    outputs_gone(job)
    if engine.dialect.name == "postgresql":  # json is kept as its text: sent as bytes, no str in between
        stored: Any = func.convert_to(cast(posteriors.c.document, Text), "UTF8")
    else:
        stored = cast(posteriors.c.document, LargeBinary)
    with reading(engine) as conn:
        document = conn.execute(select(stored).where(posteriors.c.job_id == job.id)).scalar()
    if document is None:
        raise NotFound(f"job {job.id} has no stored posterior")
    return bytes(document)
