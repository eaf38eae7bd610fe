"""Whether the release each charge paid for was kept (issue 52): a charge is committed before its release is
computed (privacy_wall.gate), so a job process killed in between, or a store that failed, leaves a charge
whose release never left the wall. The charge stays (over-counting, never under-counting); the ledger says
which charges those are."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Engine, func, select

from control.store.job_status import TERMINAL
from control.store.models import jobs, releases
from privacy_wall.ledger.schema import charges
from privacy_wall.sqlengine import reading


def charge_outcomes(engine: Engine, entries: Iterable[Mapping[str, Any]]) -> dict[int, bool | None]:
    """Charge id -> True when its release was stored (the latest attempt of its iteration, with a stored
    release or at most the job's recorded iteration, which outlives `vips delete`), False when it never
    was (a later attempt of the same iteration replaced it, or the job ended without it), None while the
    job may still store it (its latest charge, the job not ended) or when the service has no such job.
    `entries`: ledger rows with id, job_id, iteration and attempt."""
    entries = list(entries)
    ids = sorted({entry["job_id"] for entry in entries})
    if not ids:
        return {}
    with reading(engine) as conn:
        found = {
            row.id: row
            for row in conn.execute(
                select(jobs.c.id, jobs.c.status, jobs.c.iteration).where(jobs.c.id.in_(ids))
            )
        }
        latest = {
            (row.job_id, row.iteration): int(row.attempt)
            for row in conn.execute(
                select(charges.c.job_id, charges.c.iteration, func.max(charges.c.attempt).label("attempt"))
                .where(charges.c.job_id.in_(ids))
                .group_by(charges.c.job_id, charges.c.iteration)
            )
        }
        stored = select(releases.c.job_id, releases.c.iteration).where(releases.c.job_id.in_(ids))
        kept = {(row.job_id, row.iteration) for row in conn.execute(stored)}
    outcomes: dict[int, bool | None] = {}
    for entry in entries:
        job, iteration, attempt = entry["job_id"], entry["iteration"], entry["attempt"]
        row = found.get(job)
        if attempt < latest.get((job, iteration), attempt):
            outcomes[entry["id"]] = False
        elif row is None:
            outcomes[entry["id"]] = None
        elif (job, iteration) in kept or iteration <= (row.iteration or 0):
            outcomes[entry["id"]] = True
        else:
            outcomes[entry["id"]] = False if row.status in TERMINAL else None
    return outcomes
