"""Releases stored compactly (issue 21, item 2): .npz arrays deflated where that pays, read back exactly,
streamed as the same JSON; migration 0007 converts stored JSON releases and back; withdrawn charges."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import Engine, insert, select

from control.store import release_arrays
from control.store.release_arrays import array_json, decode_arrays, encode_arrays, stored_bound
from privacy_wall.accounting.accountants import privacy_cost
from privacy_wall.accounting.events import SubsampledGaussianEvent
from privacy_wall.ledger import database as ledger_db
from privacy_wall.ledger.base import Charge
from privacy_wall.ledger.schema import datasets
from privacy_wall.sqlengine import create_db_engine
from tests.dbservers import fresh_database

DELTA = 1e-5
EVENT = SubsampledGaussianEvent(noise_multiplier=1.0, sample_size=100, population=10_000)


def noisy(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.normal(0.3, 0.01, size=shape)


def test_arrays_round_trip_exactly_with_their_shapes() -> None:
    rng = np.random.default_rng(0)
    arrays = {
        "s1": noisy(rng, 114),
        "s2": noisy(rng, 114, 114),
        "scalar": np.float64(-2.5e-300),
        "empty": np.zeros((0, 3)),
        "fortran": np.asfortranarray(noisy(rng, 3, 5)),
        "extremes": np.array([np.finfo(float).max, np.finfo(float).tiny, -0.0, 5e-324]),
    }
    decoded = decode_arrays(encode_arrays(arrays))
    assert list(decoded) == list(arrays)
    for name, value in arrays.items():
        assert decoded[name].shape == np.shape(value) and decoded[name].dtype == np.float64
        assert np.array_equal(decoded[name], value) and np.array_equal(
            np.signbit(decoded[name]), np.signbit(value)
        )
    with np.load(io.BytesIO(encode_arrays(arrays))) as plain:  # any numpy reads it, pickles refused
        assert sorted(plain.files) == sorted(arrays)


@pytest.mark.parametrize(
    "shapes",
    [
        {"s1": (3,), "s2": (9,)},
        {"precision_times_mean": (114,), "precision": (114, 114)},
        {"s": (10, 5000)},
        {"c": ()},
        {"x": (2, 3, 4, 5), "y": (0,), "z": (1, 1, 1, 1)},
    ],
)
def test_the_bound_from_shapes_holds_whatever_the_values(shapes: dict[str, tuple[int, ...]]) -> None:
    """The worker refuses a release above VIPS_MAX_RELEASE_MB by this bound, from names and shapes only,
    so that the refusal never depends on values (whether a block deflates does)."""
    rng = np.random.default_rng(4)
    for fill in (np.zeros, lambda shape: rng.normal(size=shape)):
        arrays = {name: np.asarray(fill(shape)) for name, shape in shapes.items()}
        assert len(encode_arrays(arrays)) <= stored_bound(arrays)
    assert stored_bound(arrays) <= 8 * sum(a.size for a in arrays.values()) + 320 * len(arrays) + 22


def test_only_arrays_that_shrink_are_deflated() -> None:
    """Noisy dense values deflate to ~90% (stored as they are); LDA-like arrays with half their entries
    zeroed deflate to ~48% (deflated); the blob is then about 8 bytes per stored value."""
    rng = np.random.default_rng(1)
    dense = noisy(rng, 100_000)
    sparse = noisy(rng, 100_000)
    sparse[rng.random(sparse.size) < 0.5] = 0.0
    blob = encode_arrays({"dense": dense, "sparse": sparse})
    members = {m.filename: m for m in zipfile.ZipFile(io.BytesIO(blob)).infolist()}
    assert members["dense.npy"].compress_type == zipfile.ZIP_STORED
    assert members["sparse.npy"].compress_type == zipfile.ZIP_DEFLATED
    assert members["sparse.npy"].compress_size < 0.6 * members["sparse.npy"].file_size
    assert 8 * 100_000 < len(blob) < 8 * 100_000 + 0.6 * 8 * 100_000 + 1024
    assert release_arrays.COMPRESS_IF == 0.75


@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 4), (2, 3, 2)])
def test_streamed_json_is_what_json_dumps_writes(
    shape: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(release_arrays, "JSON_PIECE_VALUES", 3)  # several pieces per row
    value = np.random.default_rng(2).normal(size=shape)
    pieces = list(array_json(value))
    assert "".join(pieces) == json.dumps(value.tolist())
    assert json.loads("".join(pieces)) == value.tolist()


def test_non_finite_values_are_refused_in_json() -> None:
    with pytest.raises(ValueError):
        "".join(array_json(np.array([1.0, np.nan])))


# --------------------------------------------------------------------------------------------------------
# Migration 0007: JSON releases to .npz and back.


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migration_0007_converts_stored_releases_and_back(backend: str, tmp_path: Path) -> None:
    import sqlalchemy as sa
    from alembic import command

    from vips.migrate import alembic_config

    rng = np.random.default_rng(3)
    stored = {
        (job, t): {
            "s1": noisy(rng, 4).tolist(),
            "s2": noisy(rng, 4, 4).tolist(),
            "c": float(noisy(rng, 1)[0]),
        }
        for job in ("a" * 32, "b" * 32)
        for t in range(1, 80)  # more than one batch of the migration
    }
    with fresh_database(backend, tmp_path) as url:
        config = alembic_config("control", url)
        command.upgrade(config, "0006")
        engine = create_db_engine(url)
        old = sa.table(
            "releases",
            sa.column("job_id", sa.String),
            sa.column("iteration", sa.Integer),
            sa.column("statistics", sa.JSON),
            sa.column("noise_std", sa.JSON),
            sa.column("created_at", sa.DateTime(timezone=True)),
        )
        try:
            _add_jobs(engine, ["a" * 32, "b" * 32])
            with engine.begin() as conn:
                for (job, t), statistics in stored.items():
                    conn.execute(
                        insert(old).values(
                            job_id=job, iteration=t, statistics=statistics, noise_std={"s1": 0.1},
                            created_at=datetime.now(UTC),
                        )
                    )  # fmt: skip
            command.upgrade(config, "0007")
            from control.store.models import releases

            with engine.connect() as conn:
                rows = conn.execute(select(releases)).all()
            assert len(rows) == len(stored)
            for row in rows:
                assert row.stored_bytes == len(row.arrays)
                decoded = decode_arrays(row.arrays)
                assert {k: v.tolist() for k, v in decoded.items()} == stored[(row.job_id, row.iteration)]
                assert row.noise_std == {"s1": 0.1}
            command.downgrade(config, "0006")
            with engine.connect() as conn:
                back = {(r.job_id, r.iteration): r.statistics for r in conn.execute(select(old))}
            assert back == stored
        finally:
            engine.dispose()


def _add_jobs(engine: Engine, ids: list[str]) -> None:
    """The key, dataset and job rows releases point to (as revision 0006 has them)."""
    from control.store.models import api_keys, jobs

    now = datetime.now(UTC)
    with engine.begin() as conn:
        conn.execute(
            insert(api_keys).values(id="k", key_hash="0" * 64, role="analyst", created_at=now, revoked=False)
        )
        conn.execute(
            insert(datasets).values(
                name="d", kind="tabular", population=10, dimension=3, schema={}, public=False, created_at=now
            )
        )
        for job_id in ids:
            conn.execute(
                insert(jobs).values(
                    id=job_id, dataset="d", owner="k", model="blr", algorithm="vips", options={},
                    iterations=79, batch_size=10, sigma=1.0, delta=DELTA, status="succeeded", iteration=79,
                    cancel_requested=False, created_at=now,
                )
            )  # fmt: skip


# --------------------------------------------------------------------------------------------------------
# Withdrawn charges in the control database.


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    with fresh_database(request.param, tmp_path, "control") as url:
        eng = create_db_engine(url)
        try:
            yield eng
        finally:
            eng.dispose()


def test_a_withdrawn_charge_is_gone_and_its_iteration_reserved_again(engine: Engine) -> None:
    ledger_db.set_budget(engine, "d", 100.0, DELTA)
    ledger_db.reserve(engine, "d", "j", EVENT, 3)
    for t in (1, 2):
        ledger_db.commit_charge(engine, Charge("d", "j", t, EVENT))
    one = privacy_cost(EVENT)
    assert ledger_db.withdraw_charge(engine, Charge("d", "j", 2, EVENT))
    assert not ledger_db.withdraw_charge(engine, Charge("d", "j", 2, EVENT))  # already gone
    assert ledger_db.charged_iterations(engine, "j") == [(1, 0)]
    status = ledger_db.budget_status(engine, "d")
    assert status.epsilon_spent == pytest.approx(one.epsilon(DELTA), rel=1e-9)
    assert status.epsilon_reserved == pytest.approx(one.scaled(3).epsilon(DELTA), rel=1e-9)
    for t in (2, 3):  # the reservation covers both again, and no more
        ledger_db.commit_charge(engine, Charge("d", "j", t, EVENT))
    ledger_db.commit_charge(engine, Charge("d", "j", 4, EVENT))  # beyond it: admitted on its own
    ledger_db.withdraw_charge(engine, Charge("d", "j", 4, EVENT))  # the reservation stays used up
    status = ledger_db.budget_status(engine, "d")
    assert status.epsilon_spent == pytest.approx(one.scaled(3).epsilon(DELTA), rel=1e-9)
    assert status.epsilon_reserved == pytest.approx(status.epsilon_spent, rel=1e-9)
    assert ledger_db.refund(engine, "j") == 0
