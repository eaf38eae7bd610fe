"""The dashboard's spend curve (service.ui.spend_curve): the ledger's composition at the points drawn,
extended rather than recomputed as jobs end, computed once for all viewers (issue 52)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from sqlalchemy import delete, func, select

from control.budgets.job_costs import job_costs
from privacy_wall.accounting.accountants import PrivacyCost
from privacy_wall.ledger import database as ledger_db
from privacy_wall.ledger.schema import charges
from service.ui import spend_curve as curves
from tests.dbservers import fresh_database
from tests.test_api import Api, charge, finish, make_api

DELTA = 1e-5


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    monkeypatch.setattr(curves, "DRAWN_POINTS", 4)
    monkeypatch.setattr(curves, "CHECKPOINT", 2)
    curves.clear()
    with fresh_database("sqlite", tmp_path, "control") as url:
        yield from make_api(url, tmp_path)
    curves.clear()


def job(api: Api, iterations: int, done: bool = True) -> str:
    job_id: str = api.submit(iterations=5).json()["id"]
    for t in range(1, iterations + 1):
        charge(api.engine, job_id, t)
    if done:
        finish(api.engine, job_id)
    return job_id


def composed(api: Api, ids: list[str]) -> list[float]:
    """The reference: the composition of the first i + 1 jobs' costs, priced afresh for every i."""
    costs = job_costs(api.engine, ids)
    total = PrivacyCost.zero(costs[ids[0]].accountant)
    prefixes = []
    for job_id in ids:
        total = total + costs[job_id]
        prefixes.append(total.epsilon(DELTA))
    return prefixes


class Pricings:
    """Counts the compositions priced (PrivacyCost.epsilon) while active."""

    def __init__(self) -> None:
        self.count = 0
        self._real = PrivacyCost.epsilon

    def __enter__(self) -> Pricings:
        def counted(cost: PrivacyCost, delta: float) -> float:
            self.count += 1
            return self._real(cost, delta)

        self._patch = mock.patch.object(PrivacyCost, "epsilon", counted)
        self._patch.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._patch.stop()


def test_the_points_drawn_thin_out_by_powers_of_two_and_keep_the_last_and_every_running_job() -> None:
    assert [curves.stride(n) for n in (0, 512, 513, 1_024, 1_025, 10_000)] == [1, 1, 2, 2, 4, 32]
    points = curves.drawn(10_000, running_from=9_990)
    assert len(points) <= curves.DRAWN_POINTS + 10 and set(range(9_990, 10_000)) <= set(points)
    assert curves.drawn(10, 10) == list(range(10))
    # doubling the stride keeps every point priced before: a longer history re-prices nothing it drew
    before, after = curves.drawn(1_024, 1_024), curves.drawn(1_500, 1_500)  # stride 2, then 4
    assert {i for i in after if i < 1_024} <= set(before)


def test_the_curve_is_the_ledgers_composition_at_each_point_drawn(api: Api) -> None:
    ids = [job(api, 1 + i % 3) for i in range(9)]
    curve = curves.spend_curve(api.engine, "priv", DELTA)
    assert curve.jobs == 9 and curve.stride == 4  # 9 jobs, at most 4 points: one in 4 and the last
    assert curve.job_ids == [ids[3], ids[7], ids[8]]
    reference = composed(api, ids)
    assert curve.cumulative == pytest.approx([reference[3], reference[7], reference[8]], rel=1e-12)


def test_a_job_that_ends_prices_only_the_points_after_it(api: Api) -> None:
    ids = [job(api, 2) for _ in range(7)]
    curves.spend_curve(api.engine, "priv", DELTA)
    running = job(api, 1, done=False)
    with Pricings() as pricings:
        curve = curves.spend_curve(api.engine, "priv", DELTA)
    assert pricings.count == 1 and curve.job_ids[-1] == running  # the running job, at the end
    charge(api.engine, running, 2)
    finish(api.engine, running)
    with Pricings() as pricings:
        curve = curves.spend_curve(api.engine, "priv", DELTA)
    assert pricings.count == 1
    assert curve.cumulative[-1] == pytest.approx(composed(api, [*ids, running])[-1], rel=1e-12)
    with Pricings() as pricings:  # the same ledger state: cached, nothing priced
        assert curves.spend_curve(api.engine, "priv", DELTA) is curve
    assert pricings.count == 0


def test_viewers_of_one_ledger_state_share_one_computation(api: Api) -> None:
    for _ in range(5):
        job(api, 1)
    curves.clear()
    calls, results = [], []
    real = curves._extend
    start = threading.Barrier(6)

    def counted(*args: object) -> curves.SpendCurve:
        calls.append(1)
        return real(*args)  # type: ignore[arg-type]

    def view() -> None:
        start.wait()
        results.append(curves.spend_curve(api.engine, "priv", DELTA))

    with mock.patch.object(curves, "_extend", counted):
        threads = [threading.Thread(target=view) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=600)
    assert len(calls) == 1 and len(results) == 6 and all(r is results[0] for r in results)


def test_the_first_job_without_a_guarantee_is_drawn_where_the_spend_becomes_unbounded(api: Api) -> None:
    ids = [job(api, 1) for _ in range(6)]
    ledger_db.set_budget(api.engine, "priv", None, DELTA)  # no cap: a sigma-0 release is admitted
    public = api.submit(iterations=5).json()["id"]
    charge(api.engine, public, 1, sigma=0.0)
    finish(api.engine, public)
    ids += [public, job(api, 1)]
    curve = curves.spend_curve(api.engine, "priv", DELTA)
    assert curve.stride == 2 and public in curve.job_ids  # index 6: not a point of the stride
    at = curve.job_ids.index(public)
    assert curve.cumulative[at - 1] < float("inf") == curve.cumulative[at] == curve.cumulative[-1]


def test_a_new_state_reads_only_the_jobs_charged_since_and_those_running(api: Api) -> None:
    """O(new work): after a job ends, the curve reads the costs of that job and of the jobs running at the
    last composition, not of the whole history; a withdrawn charge (the count no longer adds up) makes it
    compose afresh, and either way the curve is the ledger's composition."""
    ids = [job(api, 1) for _ in range(6)]
    running = job(api, 1, done=False)
    curves.spend_curve(api.engine, "priv", DELTA)
    read: list[list[str]] = []
    real = curves.job_costs

    def recorded(engine: object, job_ids: list[str]) -> dict[str, PrivacyCost]:
        read.append(sorted(job_ids))
        return real(engine, job_ids)  # type: ignore[arg-type]

    with mock.patch.object(curves, "job_costs", recorded):
        newest = job(api, 2)
        curve = curves.spend_curve(api.engine, "priv", DELTA)
        assert read == [sorted([newest, running])]
        assert curve.cumulative[-1] == pytest.approx(composed(api, [*ids, newest, running])[-1], rel=1e-12)
        assert curve.job_ids[-1] == running  # still running: at the end
        with api.engine.begin() as conn:  # a charge withdrawn (its release never left the wall)
            last = conn.execute(select(func.max(charges.c.id)).where(charges.c.job_id == newest)).scalar_one()
            conn.execute(delete(charges).where(charges.c.id == last))
        charge(api.engine, running, 2)
        curve = curves.spend_curve(api.engine, "priv", DELTA)
        assert len(read) == 2 and len(read[1]) == 8  # composed afresh
    finish(api.engine, running)
    order = [*ids, newest, running]
    assert curves.spend_curve(api.engine, "priv", DELTA).cumulative[-1] == pytest.approx(
        composed(api, order)[-1], rel=1e-12
    )
