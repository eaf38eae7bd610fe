"""A posterior document in the control database: its UTF-8 JSON text, as the worker wrote it, in chunks of
CHUNK_BYTES (`posterior_chunks`, in `seq` order) under one `posteriors` row that holds the total size.

A download reads one chunk per query (each its own short read), so the API holds one chunk of a posterior,
whatever its size, and no database connection while a slow client reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from sqlalchemy import Connection, Engine, delete, insert, select

from control.store.models import posterior_chunks, posteriors
from privacy_wall.sqlengine import reading

#: Bytes of JSON text in one stored chunk (the last may be shorter).
CHUNK_BYTES = 1 << 20


class PosteriorMissing(LookupError):
    """A posterior chunk was not found: the job's outputs were deleted while they were read."""


def store_posterior(conn: Connection, job_id: str, text: bytes, created_at: datetime) -> None:
    """Store `text` (a posterior document's UTF-8 JSON) as the job's posterior, in the caller's
    transaction."""
    conn.execute(insert(posteriors).values(job_id=job_id, stored_bytes=len(text), created_at=created_at))
    for seq, start in enumerate(range(0, len(text), CHUNK_BYTES)):
        conn.execute(
            insert(posterior_chunks).values(job_id=job_id, seq=seq, text=text[start : start + CHUNK_BYTES])
        )


def delete_posterior(conn: Connection, job_id: str) -> None:
    """Delete the job's posterior (its chunks first), in the caller's transaction."""
    conn.execute(delete(posterior_chunks).where(posterior_chunks.c.job_id == job_id))
    conn.execute(delete(posteriors).where(posteriors.c.job_id == job_id))


def posterior_bytes(engine: Engine, job_id: str) -> int | None:
    """Bytes of the job's stored posterior text, None without one."""
    with reading(engine) as conn:
        found = conn.execute(select(posteriors.c.stored_bytes).where(posteriors.c.job_id == job_id)).scalar()
    return None if found is None else int(found)


def iter_posterior(engine: Engine, job_id: str) -> Iterator[bytes]:
    """The job's posterior text chunk by chunk, each read on its own (at most CHUNK_BYTES held at a time).
    Raises PosteriorMissing when a chunk is gone (the outputs were deleted meanwhile): the text would be
    cut short, and a download's Content-Length then tells the client so."""
    seq = 0
    while True:
        with reading(engine) as conn:
            chunk = conn.execute(
                select(posterior_chunks.c.text).where(
                    posterior_chunks.c.job_id == job_id, posterior_chunks.c.seq == seq
                )
            ).scalar()
            if chunk is None:
                found = conn.execute(
                    select(posteriors.c.stored_bytes).where(posteriors.c.job_id == job_id)
                ).scalar()
        if chunk is None:
            if found is None or seq * CHUNK_BYTES < int(found):
                raise PosteriorMissing(f"job {job_id}'s posterior is no longer stored")
            return
        yield bytes(chunk)
        seq += 1


def posterior_text(engine: Engine, job_id: str) -> bytes:
    """The job's whole posterior text (for the pages that parse a small one; a download streams it)."""
    return b"".join(iter_posterior(engine, job_id))
