"""The delta policy (docs/design.md, section 3): a private dataset's budget has a delta below 1/N.

(epsilon, delta)-DP with delta >= 1/N permits releasing records outright: the mechanism that publishes
each record with probability delta (and nothing else) is (0, delta)-DP under replace-one neighbours, and
at delta = 1/N it publishes one whole record in expectation. The accountant would price such a job at a
small epsilon with almost no noise. So a budget's delta must be below 1/N, N the dataset's record count,
and the usual advice is delta << 1/N (suggested_delta: a power of ten at most 1/(10 N)).

Where a delta meets an N: budget set (ledger_db.set_budget, under the budget's lock), ingest and append
(privacy_wall.data.ingest: the rows a budget's delta allows, before the commit point), and admission (a
budget set before this rule stays in the ledger as it is, but admits no job). Datasets marked public are
exempt, as they are from the other invariants that protect records (sigma 0, seeds): nothing of theirs
is protected. The calculators that take a population (`vips privacy`, `vips fit --local`) warn instead
of refusing: they reproduce the papers, whose settings had delta >= 1/N.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy import Connection


class DeltaTooLarge(ValueError):
    """A budget's delta that is not below 1/N of its (private) dataset."""


def within_bound(delta: float, population: int) -> bool:
    """delta < 1/N (one comparison everywhere, so that every check agrees at the edge)."""
    return delta * population < 1.0


def largest_population(delta: float) -> int:
    """The largest N with delta < 1/N."""
    n = max(math.ceil(1.0 / delta) - 1, 0)
    while within_bound(delta, n + 1):
        n += 1
    while n > 0 and not within_bound(delta, n):
        n -= 1
    return n


def suggested_delta(population: int) -> float:
    """A delta far below 1/N to suggest: the largest power of ten at most 1/(10 N)."""
    return 10.0 ** -math.ceil(math.log10(10 * max(population, 1)))


def delta_problem(delta: float, population: int) -> str | None:
    """Why `delta` is not allowed for a dataset of `population` records, with what to choose; None if it
    is."""
    if within_bound(delta, population):
        return None
    return (
        f"delta {delta:g} is not below 1/N = 1/{population} = {1 / population:.3g} (N, the dataset's "
        "record count): a delta of 1/N or more permits releasing whole records; choose delta far below "
        f"1/N (delta << 1/N), e.g. {suggested_delta(population):g}"
    )


def check_budget_delta(conn: Connection, dataset: str, delta: float) -> None:
    """Raise DeltaTooLarge if `dataset` is catalogued, private, and `delta` is not below 1/N. Locks the
    catalogue row (PostgreSQL), so that a concurrent append cannot change N meanwhile; take it after the
    budget row's lock, as an append does."""
    from sqlalchemy import select  # here: the CLI's calculators import this module without a database

    from privacy_wall.ledger.schema import datasets

    row = conn.execute(
        select(datasets.c.population, datasets.c.public).where(datasets.c.name == dataset).with_for_update()
    ).one_or_none()
    if row is None or row.public:
        return
    problem = delta_problem(delta, int(row.population))
    if problem is not None:
        raise DeltaTooLarge(f"dataset {dataset}: {problem}")
