"""Sharded full passes (issue 26): shards tile the blocks; the coordinator's sum of the shards' clipped
sums equals the unsharded pass's (up to floating-point order) for every K, empty shards included; a shard
task lost with its worker is sent again and answered once; a failing shard fails the release with its
charge kept; the channel tables hold nothing once a release is done, nor, within the heartbeat's stale
bound, once its coordinator process is SIGKILLed (swept by the workers); a SIGSTOPped shard's lease goes to
a standby, which answers the re-sent task; a shard worker lingers for its job's next releases and yields to
another job's. On SQLite and PostgreSQL."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import Engine, func, insert, select

from privacy_wall import shards as shards_module
from privacy_wall.data import blocks as block_layout
from privacy_wall.data.dataset_cache import DatasetCache
from privacy_wall.data.db_store import DatabaseStore, shard_blocks
from privacy_wall.data.ingest import ingest
from privacy_wall.data.schema import shard_requests, shard_sums
from privacy_wall.data.store import Batch
from privacy_wall.gate import Gate
from privacy_wall.ledger.base import InMemoryLedger
from privacy_wall.queries.base import Array, Query
from privacy_wall.queries.blr import LogisticRegressionQuery
from privacy_wall.queries.sbn import SigmoidBeliefNetworkQuery
from privacy_wall.shards import (
    ShardedSums,
    ShardFailed,
    ShardsUnavailable,
    ShardTask,
    answer,
    encode,
    linger,
    pending,
)
from tests.dbservers import schema_drift
from tests.privacy_wall.data.test_ingest_store import tabular_data, write_tabular

N, D = 101, 4
PER_BLOCK = 7  # 101 rows: 14 full blocks and one of 3


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(block_layout, "block_rows", lambda kind, dimension: PER_BLOCK)


@pytest.fixture
def stored(engines: tuple[Engine, Engine], tmp_path: Path) -> tuple[Engine, Engine]:
    control, sensitive = engines
    x, y = tabular_data(n=N, d=D, seed=4)
    path = write_tabular(tmp_path / "t.csv", x, y)
    ingest(control=control, sensitive=sensitive, name="tab", kind="tabular", label="label", path=path)
    bits = np.random.default_rng(5).integers(0, 2, size=(N, 6))
    (tmp_path / "bits.csv").write_text(
        ",".join(f"c{j}" for j in range(6)) + "\n" + "".join(",".join(map(str, r)) + "\n" for r in bits)
    )
    ingest(control=control, sensitive=sensitive, name="bits", kind="binary", path=tmp_path / "bits.csv")
    return control, sensitive


def blr_params() -> dict[str, Array]:
    moment = np.eye(D) * 0.5 + 0.1
    return {"second_moment": moment}


def sbn_params(hidden: int = 3, visible: int = 6) -> dict[str, Array]:
    rng = np.random.default_rng(2)
    w = rng.normal(size=(visible, hidden))
    c = rng.normal(size=visible)
    centre = np.concatenate([w, c[:, None]], axis=1)  # (visible, hidden + 1): E[(w_j, c_j)]
    moment = centre[:, :, None] * centre[:, None, :] + 0.1 * np.eye(hidden + 1)
    return {"b_mean": rng.normal(size=hidden), "w_mean": w, "second_moment": moment}


def inline(sensitive: Engine, dataset: str, query: Query, drop: Callable[[ShardTask], bool] | None = None):  # type: ignore[no-untyped-def]
    """A `send` that answers each task at once in this process, as shard workers would (each shard with
    its own cache); `drop` loses the tasks it returns True for, as a dying worker would."""
    caches: dict[int, DatasetCache] = {}
    sent: list[ShardTask] = []

    def send(task: ShardTask) -> None:
        sent.append(task)
        if drop is not None and drop(task):
            return
        cache = caches.setdefault(task.shard, DatasetCache(1 << 30))
        answer(sensitive, task, DatabaseStore(sensitive, dataset, cache), query)

    send.sent = sent  # type: ignore[attr-defined]
    return send


def channel_rows(sensitive: Engine) -> int:
    with sensitive.connect() as conn:
        return sum(
            conn.execute(select(func.count()).select_from(t)).scalar_one()
            for t in (shard_requests, shard_sums)
        )


@pytest.mark.parametrize("blocks", [0, 1, 2, 5, 15, 64])
@pytest.mark.parametrize("shards", [1, 2, 3, 7])
def test_shards_tile_the_blocks_evenly(blocks: int, shards: int) -> None:
    ranges = [shard_blocks(blocks, shard, shards) for shard in range(shards)]
    assert ranges[0][0] == 0 and ranges[-1][1] == blocks
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    sizes = [stop - start for start, stop in ranges]
    assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError, match="shard"):
        shard_blocks(blocks, shards, shards)


@pytest.mark.parametrize("shards", [2, 3, 15, 20])  # 15 blocks: 20 shards leave 5 empty
@pytest.mark.parametrize(
    ("dataset", "query", "params"),
    [
        ("tab", LogisticRegressionQuery(), blr_params()),
        ("bits", SigmoidBeliefNetworkQuery(hidden=3), sbn_params()),
    ],
    ids=["blr", "sbn"],
)
def test_sharded_sums_equal_the_unsharded_pass(
    stored: tuple[Engine, Engine], shards: int, dataset: str, query: Query, params: dict[str, Array]
) -> None:
    _, sensitive = stored
    store = DatabaseStore(sensitive, dataset)
    whole = query.clipped_sums(store.take(slice(None)), params, np.random.default_rng(0))
    coordinator = ShardedSums(sensitive, shards, inline(sensitive, dataset, query))
    parts = coordinator.clipped_sums(params, job_id="j", iteration=1, attempt=0)
    assert set(parts) == set(whole)
    for name in whole:
        np.testing.assert_allclose(parts[name], whole[name], rtol=1e-12, atol=1e-12)
    assert channel_rows(sensitive) == 0


def test_a_shard_holds_only_its_blocks_rows(stored: tuple[Engine, Engine]) -> None:
    _, sensitive = stored
    store = DatabaseStore(sensitive, "tab")
    whole = store.take(slice(None))
    pieces: list[Batch] = [store.shard(shard, 3) for shard in range(3)]
    assert [p.size for p in pieces] == [5 * PER_BLOCK, 5 * PER_BLOCK, 4 * PER_BLOCK + 3]
    np.testing.assert_array_equal(np.concatenate([p.features for p in pieces]), whole.features)


def test_a_lost_task_is_sent_again_and_answered_once(stored: tuple[Engine, Engine]) -> None:
    _, sensitive = stored
    query = LogisticRegressionQuery()
    lost: list[ShardTask] = []

    def drop(task: ShardTask) -> bool:  # shard 1's first task dies with its worker
        if task.shard == 1 and not lost:
            lost.append(task)
            return True
        return False

    send = inline(sensitive, "tab", query, drop)
    coordinator = ShardedSums(sensitive, 2, send, resend_seconds=0.05, poll_seconds=0.01)
    parts = coordinator.clipped_sums(blr_params(), job_id="j", iteration=3, attempt=1)
    whole = query.clipped_sums(
        DatabaseStore(sensitive, "tab").take(slice(None)), blr_params(), np.random.default_rng()
    )
    np.testing.assert_allclose(parts["s1"], whole["s1"], rtol=1e-12)
    assert [t.shard for t in send.sent].count(1) == 2  # type: ignore[attr-defined]
    assert [t.shard for t in send.sent].count(0) == 1  # type: ignore[attr-defined]
    assert channel_rows(sensitive) == 0
    # The lost task, delivered after all (a redelivery), finds its release done and writes nothing.
    assert not answer(sensitive, lost[0], DatabaseStore(sensitive, "tab"), query)
    assert channel_rows(sensitive) == 0


def test_a_duplicate_task_writes_nothing(stored: tuple[Engine, Engine]) -> None:
    _, sensitive = stored
    query = LogisticRegressionQuery()
    twice: list[bool] = []

    def send(task: ShardTask) -> None:
        store = DatabaseStore(sensitive, "tab")
        twice.append(answer(sensitive, task, store, query))
        twice.append(answer(sensitive, task, store, query))

    ShardedSums(sensitive, 2, send).clipped_sums(blr_params(), job_id="j", iteration=1, attempt=0)
    assert twice == [True, False, True, False]


class Failing(LogisticRegressionQuery):
    def clipped_sums(
        self, batch: Batch, params: dict[str, Array], rng: np.random.Generator
    ) -> dict[str, Array]:
        raise ArithmeticError("a value-dependent failure")


def test_a_failing_shard_fails_the_release_and_its_charge_stays(stored: tuple[Engine, Engine]) -> None:
    _, sensitive = stored
    store = DatabaseStore(sensitive, "tab")
    ledger = InMemoryLedger(delta=1e-5)
    query = Failing()

    def send(task: ShardTask) -> None:
        with pytest.raises(ArithmeticError):
            answer(sensitive, task, DatabaseStore(sensitive, "tab"), query)

    # Unpadded: the failing query would fail on the slot's public stand-in, before the charge.
    gate = Gate(store, ledger, shards=ShardedSums(sensitive, 2, send), padded=False)
    with pytest.raises(ShardFailed):
        gate.release(query, blr_params(), job_id="j", iteration=1, sigma=1.0, batch_size=N)
    assert len(ledger.charges()) == 1
    assert channel_rows(sensitive) == 0


def test_minibatches_are_computed_by_the_gate_itself(stored: tuple[Engine, Engine]) -> None:
    _, sensitive = stored

    def send(task: ShardTask) -> None:
        raise AssertionError("a minibatch went to the shards")

    gate = Gate(
        DatabaseStore(sensitive, "tab"), InMemoryLedger(delta=1e-5), shards=ShardedSums(sensitive, 2, send)
    )
    release = gate.release(
        LogisticRegressionQuery(), blr_params(), job_id="j", iteration=1, sigma=1.0, batch_size=N - 1
    )
    assert release.batch_size == N - 1


def test_a_seeded_gate_takes_no_shards(stored: tuple[Engine, Engine]) -> None:
    _, sensitive = stored
    with pytest.raises(ValueError, match="seeded"):
        Gate(
            DatabaseStore(sensitive, "tab"),
            InMemoryLedger(delta=1e-5),
            seed=1,
            shards=ShardedSums(sensitive, 2, lambda task: None),
        )


def test_the_migrated_channel_tables_match_the_schema(tmp_path: Path) -> None:
    """Alembic's comparison of the migrated sensitive database with privacy_wall.data.schema finds nothing to
    do; before s0004 it finds the requests' missing shard count, before s0005 their missing heartbeat."""
    from alembic import command

    from privacy_wall.data.schema import metadata
    from privacy_wall.sqlengine import create_db_engine
    from vips.migrate import alembic_config, upgrade

    url = f"sqlite:///{tmp_path / 'sensitive.db'}"
    command.upgrade(alembic_config("sensitive", url), "s0003")
    engine = create_db_engine(url)
    try:
        assert "shards" in repr(schema_drift(engine, metadata, "shard_requests"))
        command.upgrade(alembic_config("sensitive", url), "s0004")
        assert "heartbeat_at" in repr(schema_drift(engine, metadata, "shard_requests"))
        upgrade("sensitive", url)
        assert schema_drift(engine, metadata, "shard") == []
    finally:
        engine.dispose()


def _dead_release(sensitive: Engine, job: str, beat_age: float, created_age: float = 0.0) -> None:
    """A request whose coordinator last beat `beat_age` seconds ago, and one shard's answer to it."""
    now = datetime.now(UTC)
    with sensitive.begin() as conn:
        conn.execute(
            insert(shard_requests).values(
                job_id=job,
                iteration=1,
                attempt=0,
                token="t",
                params=b"",
                created_at=now - timedelta(seconds=created_age),
                heartbeat_at=now - timedelta(seconds=beat_age),
            )
        )
        conn.execute(
            insert(shard_sums).values(
                job_id=job, iteration=1, attempt=0, shard=0, sums=b"", failed=False, created_at=now
            )
        )


def test_rows_of_a_dead_coordinator_are_purged_once_its_heartbeat_is_stale(
    stored: tuple[Engine, Engine],
) -> None:
    """Every coordinator sweeps before its release, and `keep_swept` (every worker's thread) sweeps: a
    request whose heartbeat is older than the stale time goes with its sums, however young the request (an
    old request still beating stays), and so do sums whose request is gone."""
    _, sensitive = stored
    _dead_release(sensitive, "dead", beat_age=31)
    _dead_release(sensitive, "alive", beat_age=1, created_age=7200)
    with sensitive.begin() as conn:  # an answer whose request is gone (left by an older version)
        conn.execute(
            insert(shard_sums).values(
                job_id="orphan", iteration=1, attempt=0, shard=1, sums=b"", failed=False,
                created_at=datetime.now(UTC),
            )
        )  # fmt: skip
    query = LogisticRegressionQuery()
    ShardedSums(sensitive, 2, inline(sensitive, "tab", query)).clipped_sums(
        blr_params(), job_id="j", iteration=1, attempt=0
    )
    assert channel_rows(sensitive) == 2  # the live one's request and sum
    assert shards_module.purge_abandoned(sensitive) == 0
    shards_module.keep_swept(sensitive, None, stale_seconds=0.5)  # once; "alive" stopped beating 1 s ago
    assert channel_rows(sensitive) == 0


def test_shard_leases_go_to_one_worker_each_and_stale_ones_are_taken_over(
    engines: tuple[Engine, Engine],
) -> None:
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import update

    from privacy_wall.data.schema import shard_leases
    from privacy_wall.shards import claim_shard, release_lease, renew_lease

    _, sensitive = engines
    assert claim_shard(sensitive, 2, "a:1", 30) == 0
    assert claim_shard(sensitive, 2, "b:2", 30) == 1
    assert claim_shard(sensitive, 2, "c:3", 30) is None  # a standby: every shard is served
    assert renew_lease(sensitive, 0, "a:1") and not renew_lease(sensitive, 0, "b:2")
    with sensitive.begin() as conn:  # a:1 stops renewing (its worker died)
        conn.execute(
            update(shard_leases)
            .where(shard_leases.c.shard == 0)
            .values(renewed_at=datetime.now(UTC) - timedelta(seconds=31))
        )
    assert claim_shard(sensitive, 2, "c:3", 30) == 0
    assert not renew_lease(sensitive, 0, "a:1")  # the old holder learns it lost the lease
    release_lease(sensitive, 1, "b:2")
    assert claim_shard(sensitive, 2, "d:4", 30) == 1


def test_shards_that_never_answer_fail_the_release_and_its_charge_is_withdrawn(
    stored: tuple[Engine, Engine],
) -> None:
    """Workers down: nothing computed from the rows left the wall, and tabular work has public shapes, so
    the release fails after the timeout and its charge is withdrawn (charges = releases)."""
    _, sensitive = stored
    ledger = InMemoryLedger(delta=1e-5)
    coordinator = ShardedSums(sensitive, 2, lambda task: None, timeout_seconds=0.3, poll_seconds=0.01)
    gate = Gate(DatabaseStore(sensitive, "tab"), ledger, shards=coordinator)
    with pytest.raises(ShardsUnavailable, match=r"shards \[0, 1\]"):
        gate.release(
            LogisticRegressionQuery(), blr_params(), job_id="j", iteration=1, sigma=1.0, batch_size=N
        )
    assert ledger.charges() == []
    assert channel_rows(sensitive) == 0


@pytest.mark.parametrize("shards", [2, 3])
def test_sharded_minibatch_sums_equal_the_sampled_rows_sums(
    stored: tuple[Engine, Engine], shards: int
) -> None:
    _, sensitive = stored
    store = DatabaseStore(sensitive, "tab")
    query = LogisticRegressionQuery()
    ids = np.random.default_rng(7).choice(N, size=30, replace=False)
    edges = [0, PER_BLOCK * 5 - 1, PER_BLOCK * 5, PER_BLOCK * 7 - 1, PER_BLOCK * 7, N - 1]  # K = 3 and K = 2
    ids = np.unique(np.concatenate([ids, edges]))
    whole = query.clipped_sums(store.take(ids), blr_params(), np.random.default_rng(0))
    coordinator = ShardedSums(sensitive, shards, inline(sensitive, "tab", query))
    parts = coordinator.clipped_sums(blr_params(), job_id="j", iteration=1, attempt=0, rows=ids)
    for name in whole:
        np.testing.assert_allclose(parts[name], whole[name], rtol=1e-12, atol=1e-12)
    # Ids all in one shard leave the others' answers empty.
    few = np.array([1, 2], dtype=np.int64)
    parts = coordinator.clipped_sums(blr_params(), job_id="j", iteration=2, attempt=0, rows=few)
    whole = query.clipped_sums(store.take(few), blr_params(), np.random.default_rng(0))
    np.testing.assert_allclose(parts["s1"], whole["s1"], rtol=1e-12)
    assert channel_rows(sensitive) == 0


def test_minibatches_go_to_the_shards_when_the_store_cannot_hold_the_data(
    stored: tuple[Engine, Engine],
) -> None:
    _, sensitive = stored
    query = LogisticRegressionQuery()
    send = inline(sensitive, "tab", query)
    gate = Gate(
        DatabaseStore(sensitive, "tab", DatasetCache(64)),  # a cache far too small for the dataset
        InMemoryLedger(delta=1e-5),
        shards=ShardedSums(sensitive, 2, send),
        shard_minibatches=not DatabaseStore(sensitive, "tab", DatasetCache(64)).fits_cache(),
    )
    release = gate.release(query, blr_params(), job_id="j", iteration=1, sigma=1.0, batch_size=20)
    assert release.batch_size == 20 and len(send.sent) == 2  # type: ignore[attr-defined]
    assert DatabaseStore(sensitive, "tab", DatasetCache(1 << 30)).fits_cache()


def test_an_answer_after_its_release_ended_is_not_written(stored: tuple[Engine, Engine]) -> None:
    """A shard finishing after the coordinator gave up (or for another request with the same key) leaves
    no partial sums behind."""
    _, sensitive = stored
    query = LogisticRegressionQuery()
    late: list[ShardTask] = []
    coordinator = ShardedSums(sensitive, 2, late.append, timeout_seconds=0.2, poll_seconds=0.01)
    with pytest.raises(ShardsUnavailable):
        coordinator.clipped_sums(blr_params(), job_id="j", iteration=1, attempt=0)
    assert not answer(sensitive, late[0], DatabaseStore(sensitive, "tab"), query)
    assert channel_rows(sensitive) == 0
    # A task of an earlier request under the same key (its token differs) does not answer a later one.
    stale = late[1]
    fresh: list[ShardTask] = []

    def send(task: ShardTask) -> None:
        fresh.append(task)
        assert not answer(sensitive, stale, DatabaseStore(sensitive, "tab"), query)  # the old token
        answer(sensitive, task, DatabaseStore(sensitive, "tab"), query)

    ShardedSums(sensitive, 2, send).clipped_sums(blr_params(), job_id="j", iteration=1, attempt=0)
    assert fresh[0].token != stale.token


def test_sharded_lda_sums_equal_the_unsharded_pass(engines: tuple[Engine, Engine], tmp_path: Path) -> None:
    """Bag-of-words shards (CSR blocks rebased to the shard's first row), with whole documents (doc_length
    0: no resampling, so the sums are deterministic). Float64 inner iterations: with the default float32
    ones a document's gamma depends on its chunk's padded width at float32 rounding (~4e-8 relative)."""
    from privacy_wall.data.ingest import ingest_bag_of_words
    from privacy_wall.queries.lda import LdaQuery
    from tests.privacy_wall.data.test_blocks import corpus

    _, sensitive = engines
    control = engines[0]
    ingest_bag_of_words(
        control=control, sensitive=sensitive, name="docs", corpus=corpus(), vocabulary_public=True
    )
    store = DatabaseStore(sensitive, "docs")
    query = LdaQuery(3, doc_length=0, max_document_length=50, float32_iterations=False)
    params = {"expected_log_beta": np.log(np.random.default_rng(1).dirichlet(np.ones(9), size=3))}
    query.validate_params(params, store.info.dimension)
    whole = query.clipped_sums(store.take(slice(None)), params, np.random.default_rng(0))
    for shards in (2, 3):
        parts = ShardedSums(sensitive, shards, inline(sensitive, "docs", query)).clipped_sums(
            params, job_id="j", iteration=shards, attempt=0
        )
        for name in whole:
            np.testing.assert_allclose(parts[name], whole[name], rtol=1e-12, atol=1e-12)


@pytest.mark.slow
def test_a_lingering_shard_answers_its_jobs_next_releases_without_their_tasks(
    stored: tuple[Engine, Engine],
) -> None:
    """After its first task, each shard worker answers the job's next releases as their requests are written
    (the broker here never delivers those tasks), each once, equal to the unsharded pass; it stops when no
    request comes within its linger time, and the tasks delivered late find their releases done."""
    _, sensitive = stored
    query = LogisticRegressionQuery()
    undelivered: list[ShardTask] = []
    workers: list[threading.Thread] = []
    lingered: dict[int, int] = {}

    errors: list[BaseException] = []

    def serve(task: ShardTask) -> None:
        try:
            store = DatabaseStore(sensitive, "tab", DatasetCache(1 << 30))
            assert answer(sensitive, task, store, query)
            lingered[task.shard] = linger(sensitive, task, store, query, seconds=1.0)
        except BaseException as exc:  # surfaced below, not lost with the thread
            errors.append(exc)

    def send(task: ShardTask) -> None:
        if task.iteration == 1:
            workers.append(threading.Thread(target=serve, args=(task,)))
            workers[-1].start()
        else:
            undelivered.append(task)

    coordinator = ShardedSums(sensitive, 2, send, resend_seconds=600, timeout_seconds=30)
    whole = query.clipped_sums(
        DatabaseStore(sensitive, "tab").take(slice(None)), blr_params(), np.random.default_rng()
    )
    for iteration in range(1, 5):
        parts = coordinator.clipped_sums(blr_params(), job_id="j", iteration=iteration, attempt=0)
        np.testing.assert_allclose(parts["s1"], whole["s1"], rtol=1e-12)
        np.testing.assert_allclose(parts["s2"], whole["s2"], rtol=1e-12)
    for worker in workers:
        worker.join(timeout=30)
    if errors:
        raise errors[0]
    assert lingered == {0: 3, 1: 3}
    assert channel_rows(sensitive) == 0
    for task in undelivered:  # the broker delivers them at last: nothing to do
        assert not pending(sensitive, task)
        assert not answer(sensitive, task, DatabaseStore(sensitive, "tab"), query)


def _request(
    sensitive: Engine, job: str, iteration: int, token: str, shards: int = 2, age: float = 0
) -> None:
    """A coordinator's request, written `age` seconds ago."""
    with sensitive.begin() as conn:
        conn.execute(
            insert(shard_requests).values(
                job_id=job,
                iteration=iteration,
                attempt=0,
                token=token,
                shards=shards,
                params=encode(blr_params()),
                rows=None,
                created_at=datetime.now(UTC) - timedelta(seconds=age),
            )
        )


def _answered(sensitive: Engine) -> list[tuple[str, int, int]]:
    with sensitive.connect() as conn:
        rows = conn.execute(select(shard_sums.c.job_id, shard_sums.c.iteration, shard_sums.c.shard)).all()
    return sorted((str(r[0]), int(r[1]), int(r[2])) for r in rows)


def test_another_jobs_waiting_request_ends_the_linger(stored: tuple[Engine, Engine]) -> None:
    """A shard serves jobs in the order their requests came: a lingering worker does not answer its job's
    next release ahead of another job's waiting one (that one's task comes next in its queue); once that
    one is answered, the job's next release is the oldest and a linger takes it."""
    _, sensitive = stored
    query = LogisticRegressionQuery()
    store = DatabaseStore(sensitive, "tab")
    for job, iteration, token in [("a", 1, "t-a-1"), ("b", 1, "t-b-1"), ("a", 2, "t-a-2")]:
        _request(sensitive, job, iteration, token)
        time.sleep(0.01)  # created in this order
    a1 = ShardTask("a", 1, 0, 0, 2, "t-a-1")
    assert answer(sensitive, a1, store, query)
    started = time.monotonic()
    assert linger(sensitive, a1, store, query, seconds=5.0) == 0
    assert time.monotonic() - started < 2.5
    assert _answered(sensitive) == [("a", 1, 0)]
    b1 = ShardTask("b", 1, 0, 0, 2, "t-b-1")
    assert pending(sensitive, b1) and not pending(sensitive, a1)
    assert answer(sensitive, b1, store, query)  # b's task, next in the queue
    assert not pending(sensitive, b1)
    assert linger(sensitive, a1, store, query, seconds=0.2) == 1
    assert _answered(sensitive) == [("a", 1, 0), ("a", 2, 0), ("b", 1, 0)]


def test_a_linger_answers_no_request_of_another_shard_count(stored: tuple[Engine, Engine]) -> None:
    """A worker lingering as shard 0 of 2 never answers a request of a coordinator with another K (its row
    range would not be the one that coordinator adds), and no task of another K answers it either."""
    _, sensitive = stored
    query = LogisticRegressionQuery()
    store = DatabaseStore(sensitive, "tab")
    _request(sensitive, "a", 1, "t1")
    _request(sensitive, "a", 2, "t2", shards=3)
    first = ShardTask("a", 1, 0, 0, 2, "t1")
    assert answer(sensitive, first, store, query)
    assert linger(sensitive, first, store, query, seconds=0.2) == 0
    assert not pending(sensitive, ShardTask("a", 2, 0, 0, 2, "t2"))
    assert not answer(sensitive, ShardTask("a", 2, 0, 0, 2, "t2"), store, query)  # K = 2 against its 3
    assert answer(sensitive, ShardTask("a", 2, 0, 0, 3, "t2"), store, query)
    assert _answered(sensitive) == [("a", 1, 0), ("a", 2, 0)]


def test_an_abandoned_request_does_not_stop_lingers(stored: tuple[Engine, Engine]) -> None:
    """A request older than the stale time (its coordinator died before clearing it) is not waited for:
    lingers go on serving their job."""
    _, sensitive = stored
    query = LogisticRegressionQuery()
    store = DatabaseStore(sensitive, "tab")
    _request(sensitive, "dead", 7, "t-dead", age=120)
    _request(sensitive, "a", 1, "t1")
    _request(sensitive, "a", 2, "t2")
    first = ShardTask("a", 1, 0, 0, 2, "t1")
    assert answer(sensitive, first, store, query)
    assert linger(sensitive, first, store, query, seconds=0.2, stale_seconds=30) == 1
    assert _answered(sensitive) == [("a", 1, 0), ("a", 2, 0)]


def test_a_linger_with_nothing_to_do_ends_after_its_time(stored: tuple[Engine, Engine]) -> None:
    _, sensitive = stored
    started = time.monotonic()
    task = ShardTask("j", 1, 0, 0, 2, "t")
    assert linger(sensitive, task, DatabaseStore(sensitive, "tab"), LogisticRegressionQuery(), 0.3) == 0
    assert 0.3 <= time.monotonic() - started < 5


def test_the_coordinators_first_look_waits_for_recent_passes_only(
    stored: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The coordinator's first look waits for 9/10 of the shortest recent wait, but neither the first
    release's (shard workers loading their rows) nor one whose tasks were sent again counts; a wait answered
    at the first look counts halved, so an estimate too long shrinks. On a fake clock: each pass takes
    `seconds[iteration]`, and the coordinator's sleeps are recorded."""
    _, sensitive = stored
    query = LogisticRegressionQuery()
    clock = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr(shards_module.time, "sleep", sleep)
    monkeypatch.setattr(shards_module.time, "monotonic", lambda: clock[0])

    def first_looks(seconds: dict[int, float], lose: int | None = None) -> list[float]:
        """The first sleep of releases 1..len(seconds); `lose`: that release's shard-1 task is lost once."""
        lost: list[ShardTask] = []

        def drop(task: ShardTask) -> bool:
            if task.iteration == lose and task.shard == 1 and not lost:
                lost.append(task)
                return True
            return False

        answered = inline(sensitive, "tab", query, drop)

        def send(task: ShardTask) -> None:
            if task.shard == 0:
                clock[0] += seconds[task.iteration]
            answered(task)

        coordinator = ShardedSums(sensitive, 2, send, resend_seconds=3.0)
        firsts = []
        for iteration in sorted(seconds):
            slept.clear()
            coordinator.clipped_sums(blr_params(), job_id="j", iteration=iteration, attempt=0)
            firsts.append(round(slept[0], 4))
        return firsts

    # A cold first pass of 5 s, then 1 s passes: 2 does not wait 4.5 s; 3 waits 0.9 x 1 s; the waits found
    # answered at the first look count halved, so the estimate stays at or below a pass's 1 s.
    firsts = first_looks({1: 5.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0, 6: 1.0})
    assert firsts[:3] == [0.0, 0.0, 0.9]
    assert all(0.8 <= first <= 0.9 for first in firsts[3:])
    # A pass whose task was lost and sent again (3 s and more) does not count either.
    assert first_looks({1: 1.0, 2: 1.0, 3: 1.0}, lose=2) == [0.0, 0.0, 0.0]


def _forked(target: Callable[[], None]):  # type: ignore[no-untyped-def]
    """`target` in a forked process: a real process to SIGKILL or SIGSTOP (fork: no re-import, ~ms). Fork
    before starting threads that use the engine: a lock one holds would stay held in the child."""
    import multiprocessing

    process = multiprocessing.get_context("fork").Process(target=target, daemon=True)
    process.start()
    return process


def _stopped_within(pid: int, seconds: float) -> bool:
    """Whether process `pid` is stopped (state T in /proc/PID/stat) within `seconds`."""
    give_up = time.monotonic() + seconds
    while time.monotonic() < give_up:
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T":
            return True
        time.sleep(0.01)
    return False


def _sweeping(sensitive: Engine, stale_seconds: float) -> tuple[threading.Thread, threading.Event]:
    """A worker's sweeper (`keep_swept`), every 0.05 s, judging heartbeats stale after `stale_seconds`."""
    stop = threading.Event()
    thread = threading.Thread(target=shards_module.keep_swept, args=(sensitive, 0.05, stale_seconds, stop))
    thread.start()
    return thread, stop


@pytest.mark.slow
@pytest.mark.parametrize("killed", ["waiting", "answered"])
def test_a_killed_coordinators_partial_sums_are_swept_within_the_stale_bound(
    stored: tuple[Engine, Engine], killed: str
) -> None:
    """A coordinator (a real process) is SIGKILLed while it waits for shard 1 with shard 0's sums written
    ("waiting"), or once both shards answered, before it read them ("answered"). While it lived, its
    heartbeat kept its request from the sweeper; once dead, the request and every partial sum are gone
    within the stale bound (2 s here, 30 s in service; 0.5 s, beaten every 0.05 s, had too little slack on a
    busy machine: a live coordinator's request was swept) and a sweep's period."""
    import multiprocessing
    import os
    import signal

    _, sensitive = stored
    query = LogisticRegressionQuery()
    stale = 2.0
    ready = multiprocessing.get_context("fork").Event()

    def coordinate() -> None:
        sensitive.dispose(close=False)  # the parent's connections stay the parent's
        answering = inline(sensitive, "tab", query)

        def send(task: ShardTask) -> None:
            if task.shard == 0 or killed == "answered":
                answering(task)
            if task.shard == 1:
                ready.set()
                if killed == "answered":  # answered: killed before its first look
                    time.sleep(600)

        coordinator = ShardedSums(
            sensitive,
            2,
            send,
            beat_seconds=0.05,
            stale_seconds=stale,
            resend_seconds=600,
            timeout_seconds=600,
        )
        coordinator.clipped_sums(blr_params(), job_id="j", iteration=1, attempt=0)

    process = _forked(coordinate)  # before the sweeper's thread: no lock of it is forked held
    sweeper, stop = _sweeping(sensitive, stale)
    try:
        assert ready.wait(30)
        time.sleep(0.1)
        if killed == "waiting":  # alive and beating: 2 stale bounds later, its request and sum are there
            time.sleep(2 * stale)
            assert _answered(sensitive) == [("j", 1, 0)] and channel_rows(sensitive) == 2
        else:
            assert channel_rows(sensitive) == 3  # the request and both shards' sums
        os.kill(process.pid, signal.SIGKILL)
        process.join(10)
        killed_at = time.monotonic()
        while channel_rows(sensitive) and time.monotonic() - killed_at < 10:
            time.sleep(0.02)
        assert channel_rows(sensitive) == 0
        # Within the stale bound, a sweep's period and the databases' time (a wide margin: 2 shared cores).
        assert time.monotonic() - killed_at < stale + 2.0
    finally:
        stop.set()
        sweeper.join(10)
        if process.is_alive():
            process.kill()
            process.join(10)


def test_a_coordinator_stalled_past_the_stale_bound_fails_its_release_and_leaves_nothing(
    stored: tuple[Engine, Engine],
) -> None:
    """A coordinator that stops beating for longer than the stale bound (here blocked while sending) has its
    request swept as abandoned; when it resumes it fails the release as unanswered (its charge withdrawn:
    nothing computed left the wall, and the stall depends on no value of the rows) and nothing stays."""
    _, sensitive = stored
    query = LogisticRegressionQuery()
    answering = inline(sensitive, "tab", query)

    def send(task: ShardTask) -> None:
        answering(task)
        if task.shard == 1:
            time.sleep(0.8)  # stalled with both answers written

    ledger = InMemoryLedger(delta=1e-5)
    coordinator = ShardedSums(sensitive, 2, send, beat_seconds=0.05, stale_seconds=0.3, timeout_seconds=30)
    gate = Gate(DatabaseStore(sensitive, "tab"), ledger, shards=coordinator)
    sweeper, stop = _sweeping(sensitive, 0.3)
    try:
        with pytest.raises(ShardsUnavailable, match="abandoned"):
            gate.release(query, blr_params(), job_id="j", iteration=1, sigma=1.0, batch_size=N)
    finally:
        stop.set()
        sweeper.join(10)
    assert ledger.charges() == []
    assert channel_rows(sensitive) == 0


@pytest.mark.slow
def test_a_stalled_shards_lease_goes_to_a_standby_which_answers_the_resent_task(
    stored: tuple[Engine, Engine],
) -> None:
    """Shard 1's worker (a real process renewing its lease) is SIGSTOPped with the release's task: its lease
    goes stale, a standby takes it, and the coordinator's resend reaches the standby (the broker queue of
    shard 1 is read by its lessee), which answers: the release completes, once, long before the timeout.
    Lease times scaled down: renewed every 0.05 s, stale after 2 s (5 s and 30 s in service; 0.5 s had too
    little slack for a busy machine, where a renewal through SQLite's lock can lag by more)."""
    import os
    import signal

    from privacy_wall.data.schema import shard_leases
    from privacy_wall.shards import claim_shard, renew_lease

    _, sensitive = stored
    query = LogisticRegressionQuery()
    stale = 2.0
    assert claim_shard(sensitive, 2, "live:0", stale) == 0
    assert claim_shard(sensitive, 2, "stalled:1", stale) == 1

    import multiprocessing

    pause = multiprocessing.get_context("fork").Event()

    def renew() -> None:
        sensitive.dispose(close=False)
        while renew_lease(sensitive, 1, "stalled:1"):
            if pause.is_set():  # stop between renewals: a SIGSTOP inside one would hold SQLite's write lock
                os.kill(os.getpid(), signal.SIGSTOP)
            time.sleep(0.05)

    stalled = _forked(renew)
    standby: list[int | None] = []
    stop = threading.Event()

    def renew_live() -> None:  # shard 0's worker, alive throughout
        while not stop.wait(0.05):
            assert renew_lease(sensitive, 0, "live:0")

    def wait_as_standby() -> None:  # `vips worker --shard auto`'s claim loop
        while not stop.is_set() and (shard := claim_shard(sensitive, 2, "standby:2", stale)) is None:
            time.sleep(0.05)
        standby.append(None if stop.is_set() else shard)

    answering = inline(sensitive, "tab", query)
    sent: list[tuple[int, str]] = []

    def send(task: ShardTask) -> None:  # to the worker that leases the task's shard
        with sensitive.connect() as conn:
            holder = conn.execute(select(shard_leases.c.holder).where(shard_leases.c.shard == task.shard))
            lessee = holder.scalar_one()
        sent.append((task.shard, lessee))
        if lessee != "stalled:1":  # the stalled worker holds its task and never answers
            answering(task)

    claimer = threading.Thread(target=wait_as_standby)
    live = threading.Thread(target=renew_live)
    live.start()
    try:
        claimer.start()
        time.sleep(2 * stale)  # every lease renewed: the standby finds nothing to take
        assert standby == []
        pause.set()
        assert _stopped_within(stalled.pid, 5.0)
        coordinator = ShardedSums(
            sensitive, 2, send, resend_seconds=0.2, timeout_seconds=30, poll_seconds=0.01
        )
        started = time.monotonic()
        parts = coordinator.clipped_sums(blr_params(), job_id="j", iteration=1, attempt=0)
        assert time.monotonic() - started < stale + 5
    finally:
        stop.set()
        claimer.join(10)
        live.join(10)
        stalled.kill()  # SIGKILL ends a stopped process too
        stalled.join(10)
    assert standby == [1]
    assert sent[:2] == [(0, "live:0"), (1, "stalled:1")] and sent[-1] == (1, "standby:2")
    assert [shard for shard, _ in sent].count(0) == 1
    whole = query.clipped_sums(
        DatabaseStore(sensitive, "tab").take(slice(None)), blr_params(), np.random.default_rng()
    )
    np.testing.assert_allclose(parts["s1"], whole["s1"], rtol=1e-12)
    assert channel_rows(sensitive) == 0


def test_a_worker_sweeps_the_channel_as_it_starts(
    stored: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every `vips worker` (job worker or shard worker) sweeps when it is ready (worker.tasks, worker_ready),
    so what a coordinator left while no worker ran goes as the first one starts; with VIPS_SHARDS = 1 that
    one sweep is all (its thread ends)."""
    from control.settings import get_settings
    from privacy_wall.data.settings import get_wall_settings
    from worker import tasks

    _, sensitive = stored
    _dead_release(sensitive, "dead", beat_age=31)
    monkeypatch.setenv("VIPS_SENSITIVE_DATABASE_URL", sensitive.url.render_as_string(hide_password=False))
    monkeypatch.setenv("VIPS_SHARDS", "1")
    get_settings.cache_clear()
    get_wall_settings.cache_clear()
    try:
        before = {thread.ident for thread in threading.enumerate()}
        tasks._start_shard_sweeper()
        (sweeper,) = [thread for thread in threading.enumerate() if thread.ident not in before]
        assert sweeper.name == "shard-sweeper"
        sweeper.join(30)
        assert not sweeper.is_alive()
    finally:
        get_settings.cache_clear()
        get_wall_settings.cache_clear()
    assert channel_rows(sensitive) == 0
