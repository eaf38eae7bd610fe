"""Sharded full passes inside the wall (issue 26): one release's clipped sums computed by K shard workers.

A dataset's blocks are split into K runs of whole blocks (`db_store.shard_blocks`); shard k's worker keeps
its rows decoded for as long as its cache holds them. For a full pass the coordinator (the job's process,
in the gate) writes the release's public parameters to `shard_requests`, sends each shard a task naming the
release (job, iteration, attempt: public ids, the only thing that crosses the broker), and waits for the K
rows of `shard_sums`; each shard worker computes the query's clipped sums over its rows and writes them
there. The coordinator adds them in shard order and the gate noises the total as it would the unsharded
sum: both are the sum over the population of the same per-record clipped contributions (the query
protocol's contract, as for `queries.base.chunked_sums`), equal up to floating-point order, so the
sensitivity, the one charge and the one noise draw per iteration do not change with K. A uniform
minibatch of data too large for the job's process to hold goes the same way: the coordinator samples the
ids (as the gate always does) and writes them with the request; each shard sums the sampled rows in its
range.

The partial sums are un-noised aggregates of sensitive rows. They exist only in the shard worker's memory,
the sensitive database (this channel) and the coordinator's memory: never in a broker message, a Celery
result, a log line or the control database, and the API has no URL for the sensitive database. In the
channel they live no longer than their release: the coordinator removes its request and the answers when
the release ends (answered, failed or timed out), and, should it die or stall first, the request's
heartbeat (refreshed every COORDINATOR_BEAT_SECONDS while it waits) stops, and the next sweep removes the
request and its sums once the heartbeat is COORDINATOR_STALE_SECONDS old: every worker inside the wall
(the job worker, each shard worker) sweeps at its start and every SWEEP_SECONDS (`keep_swept`), and every
coordinator before its release. While any worker lives, a dead coordinator's sums are gone within
COORDINATOR_STALE_SECONDS + SWEEP_SECONDS; with none alive, nothing reads them, and the first worker to
start removes them.

A shard task is idempotent (the first answer of a (release, shard) stays), so a shard whose task was lost
with its worker is asked again: the coordinator re-sends the tasks of unanswered shards every
`resend_seconds`, and the release waits (it was charged once, before any of this; a replaced worker's
answer is the same release's, never a new charge).

A job's releases follow each other within milliseconds (noise, M-step, storing), so after answering one a
shard worker lingers (`linger`): it answers the same job's next request as soon as the request is written,
instead of when the broker delivers its task (tens of milliseconds on the embedded file broker; that task
then finds the release answered and does nothing). It stops once no request of the job comes within the
linger time, or as soon as another job's request waits, which its own task then serves in queue order.
"""

from __future__ import annotations

import io
import logging
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import (
    ColumnElement,
    Connection,
    DateTime,
    Engine,
    Table,
    delete,
    exists,
    func,
    insert,
    literal,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from privacy_wall.data.dataset_cache import rows_of
from privacy_wall.data.db_store import DatabaseStore
from privacy_wall.data.schema import shard_leases, shard_requests, shard_sums
from privacy_wall.noise.csprng import private_generator
from privacy_wall.queries.base import Query
from privacy_wall.sqlengine import reading, transaction

log = logging.getLogger(__name__)

Array = NDArray[np.float64]


@dataclass(frozen=True)
class ShardTask:
    """What one shard's task carries through the broker: public ids only."""

    job_id: str
    iteration: int
    attempt: int
    shard: int
    shards: int
    token: str  # the request's random nonce: an answer counts only for the request it was computed for


#: The coordinator's longest pause between two looks at the shards' answers.
MAX_POLL_SECONDS = 0.01
#: A lingering shard's first and longest pause between two looks for its job's next request.
LINGER_POLL_SECONDS = 0.001
LINGER_MAX_POLL_SECONDS = 0.01
#: The longest one task lingers (then the job's queued task takes over): a warm shutdown or a lost lease
#: never waits for a whole job, and a broker delivery every 10 s costs a job nothing it would notice.
LINGER_MAX_SECONDS = 10.0
#: A waiting coordinator refreshes its request's heartbeat this often; a request whose heartbeat is older
#: than COORDINATOR_STALE_SECONDS lost its coordinator (no live one goes that long without a beat: six
#: beats) and is removed with its partial sums by the next sweep, which every worker inside the wall runs
#: every SWEEP_SECONDS: a dead coordinator's sums are gone within 35 s.
COORDINATOR_BEAT_SECONDS = 5.0
COORDINATOR_STALE_SECONDS = 30.0
SWEEP_SECONDS = 5.0

#: Held by each sweep of `keep_swept` and by every fork of the process: a job process forked by a worker
#: whose thread sweeps never starts inside a sweep (SQLite keeps its file locks' bookkeeping per process,
#: so a child forked while its parent's sweep held the database's lock would find it held for good).
_SWEEPING = threading.Lock()
os.register_at_fork(
    before=_SWEEPING.acquire, after_in_parent=_SWEEPING.release, after_in_child=_SWEEPING.release
)


class ShardFailed(RuntimeError):
    """A shard worker could not compute its sums (its log says why; the message here names no value)."""


class ShardsUnavailable(RuntimeError):
    """Shards did not answer within the coordinator's timeout."""


def encode(arrays: dict[str, Array]) -> bytes:
    """Arrays as one .npz document (no pickle)."""
    out = io.BytesIO()
    np.savez(out, allow_pickle=False, **arrays)
    return out.getvalue()


def decode(blob: bytes) -> dict[str, Array]:
    with np.load(io.BytesIO(blob), allow_pickle=False) as document:
        return {name: document[name] for name in document.files}


def _encode_rows(rows: NDArray[np.int64]) -> bytes:
    return np.ascontiguousarray(rows, dtype="<i8").tobytes()


def _decode_rows(blob: bytes) -> NDArray[np.int64]:
    return np.frombuffer(blob, dtype="<i8").astype(np.int64)


def _now() -> datetime:
    return datetime.now(UTC)


class ShardedSums:
    """The coordinator: a full pass's clipped sums, added from K shard workers through the sensitive
    database (`engine`); `send` puts one shard's task on its queue."""

    def __init__(
        self,
        engine: Engine,
        shards: int,
        send: Callable[[ShardTask], None],
        *,
        poll_seconds: float = 0.005,
        resend_seconds: float = 30.0,
        timeout_seconds: float = 300.0,
        beat_seconds: float = COORDINATOR_BEAT_SECONDS,
        stale_seconds: float = COORDINATOR_STALE_SECONDS,
    ) -> None:
        if shards < 2:
            raise ValueError("sharded sums need at least 2 shards")
        if not 0 < beat_seconds < stale_seconds:
            raise ValueError("the coordinator's heartbeat must come more often than it goes stale")
        self.engine = engine
        self.shards = shards
        self._send = send
        self._poll = poll_seconds
        self._resend = resend_seconds
        self._timeout = timeout_seconds
        self._beat = beat_seconds
        self._stale = stale_seconds
        self._waits: deque[float] = deque(maxlen=3)  # seconds the last releases waited for their answers
        self._asked = False  # whether a release was answered yet

    def clipped_sums(
        self,
        params: dict[str, Array],
        *,
        job_id: str,
        iteration: int,
        attempt: int,
        rows: NDArray[np.int64] | None = None,
    ) -> dict[str, Array]:
        """The sum over every shard of its clipped sums for the release (job_id, iteration, attempt): over
        every row, or over the sampled row ids `rows` (each shard sums those in its range)."""
        token = secrets.token_hex(16)
        tasks = [
            ShardTask(job_id, iteration, attempt, shard, self.shards, token) for shard in range(self.shards)
        ]
        self._clear(tasks[0])
        self._purge_abandoned()
        clock = _clock(self.engine)
        with transaction(self.engine) as conn:
            conn.execute(
                insert(shard_requests).values(
                    job_id=job_id,
                    iteration=iteration,
                    attempt=attempt,
                    token=token,
                    shards=self.shards,
                    params=encode(params),
                    rows=None if rows is None else _encode_rows(rows),
                    created_at=_now(),
                    heartbeat_at=clock,
                )
            )
        try:
            answers = self._gather(tasks)
        finally:
            self._clear(tasks[0])
        total: dict[str, Array] = {}
        for shard in range(self.shards):  # a fixed order: the same floating-point sum on every run
            for name, value in answers[shard].items():
                total[name] = total[name] + value if name in total else np.array(value, dtype=np.float64)
        return total

    def _gather(self, tasks: list[ShardTask]) -> dict[int, dict[str, Array]]:
        """Wait for every shard's row, polling every poll_seconds at first and backing off to
        MAX_POLL_SECONDS (a long pass is not read 200 times a second); send lost tasks again. The first
        look waits for 9/10 of the shortest of the last three releases' waits: a job's passes take about as
        long as each other, so the looks come where the answers do, and the shards' cores are not taken by
        looks before (the shortest, so that one slow release, e.g. a re-sent task's, does not delay the
        next). Refreshes the request's heartbeat every beat_seconds meanwhile (`_heartbeat`)."""
        started = sent = beaten = time.monotonic()
        pause = self._poll
        for task in tasks:
            self._send(task)
        slept = 0.9 * min(self._waits) if self._waits else 0.0
        first_look = True
        answers: dict[int, dict[str, Array]] = {}
        query = select(shard_sums.c.shard, shard_sums.c.sums, shard_sums.c.failed).where(
            *_release(shard_sums, tasks[0]), shard_sums.c.shard < self.shards
        )
        with self.engine.connect() as conn:
            rest = slept
            while True:  # the first look's wait, in pieces no longer than a beat
                time.sleep(min(rest, self._beat))
                rest -= self._beat
                beaten = self._heartbeat(conn, tasks[0], beaten)
                if rest <= 0:
                    break
            while True:
                with reading(conn) as reads:
                    found = reads.execute(query.where(shard_sums.c.shard.not_in(list(answers)))).all()
                for shard, blob, failed in found:
                    if failed:
                        raise ShardFailed(f"shard {shard} of {self.shards} failed to compute its sums")
                    answers[int(shard)] = decode(blob)
                if len(answers) == self.shards:
                    waited = time.monotonic() - started
                    # Answers already there at the first look may have come much sooner: guess lower, so
                    # that an estimate too long (a cold cache's first pass) shrinks instead of keeping itself.
                    # Not the first release (shard workers may have had to load their rows), nor one whose
                    # tasks were sent again (a lost worker's wait says nothing of the next pass).
                    if self._asked and sent == started:
                        self._waits.append(waited / 2 if first_look and slept else waited)
                    self._asked = True
                    return answers
                first_look = False
                now = time.monotonic()
                if now - started > self._timeout:
                    missing = sorted(set(range(self.shards)) - set(answers))
                    raise ShardsUnavailable(f"shards {missing} did not answer within {self._timeout:g} s")
                if now - sent > self._resend:  # a task lost with its worker: ask the shard again
                    for task in tasks:
                        if task.shard not in answers:
                            self._send(task)
                    sent = now
                beaten = self._heartbeat(conn, tasks[0], beaten)
                time.sleep(pause)
                pause = min(pause * 1.25, max(self._poll, MAX_POLL_SECONDS))

    def _clear(self, task: ShardTask) -> None:
        """Remove the release's request, then its answers: a shard writing an answer holds the request's
        row (`_write`), so an answer either commits before the request is deleted (and is deleted with the
        answers, by a later statement) or finds no request and is not written."""
        with transaction(self.engine) as conn:
            for table in (shard_requests, shard_sums):
                conn.execute(delete(table).where(*_release(table, task)))

    def _heartbeat(self, conn: Connection, task: ShardTask, beaten: float) -> float:
        """Refresh the request's heartbeat if the last one (at `beaten`, monotonic) is beat_seconds old;
        returns when the heartbeat was last refreshed. A request no longer there was swept as abandoned
        (this coordinator stalled past the stale time): its answers are gone and no more can come, so the
        release fails as one whose shards did not answer (no value of the rows decided that)."""
        now = time.monotonic()
        if now - beaten < self._beat:
            return beaten
        with transaction(conn):
            refreshed = conn.execute(
                update(shard_requests).where(*_asked(task)).values(heartbeat_at=_clock(conn))
            )
        if refreshed.rowcount != 1:
            raise ShardsUnavailable(
                f"the release's request was removed as abandoned: this coordinator stalled for over "
                f"{self._stale:g} s"
            )
        return now

    def _purge_abandoned(self) -> None:
        """Sweep before a release (`purge_abandoned`); a sweep that fails is left to the workers' next."""
        try:
            purge_abandoned(self.engine, self._stale)
        except Exception as exc:
            log.warning("could not sweep the shard channel before a release (%s)", type(exc).__name__)


def _clock(bind: Engine | Connection, ago: float = 0.0) -> ColumnElement[datetime]:
    """The time `ago` seconds before now by the clock heartbeats are written and judged by: the PostgreSQL
    server's, one clock for every host (a host whose clock runs ahead never takes a live coordinator for a
    dead one); SQLite's database is one machine's, so that machine's."""
    if bind.dialect.name == "postgresql":
        return func.now() - timedelta(seconds=ago) if ago else func.now()
    return literal(_now() - timedelta(seconds=ago), DateTime(timezone=True))


def purge_abandoned(engine: Engine, stale_seconds: float = COORDINATOR_STALE_SECONDS) -> int:
    """Remove the requests whose coordinator's heartbeat is older than `stale_seconds` (it died or stalled),
    then every partial sum whose request is gone, in one transaction: the requests first, as
    `ShardedSums._clear` does, so that no answer is written after (`_write` holds its request's row). A read
    first finds whether anything is to go, so an idle channel costs no write. Returns the requests removed."""
    stale = shard_requests.c.heartbeat_at < _clock(engine, stale_seconds)
    orphaned = ~exists().where(
        shard_requests.c.job_id == shard_sums.c.job_id,
        shard_requests.c.iteration == shard_sums.c.iteration,
        shard_requests.c.attempt == shard_sums.c.attempt,
    )
    with reading(engine) as conn:
        found = (
            conn.execute(select(shard_requests.c.job_id).where(stale).limit(1)).first()
            or conn.execute(select(shard_sums.c.job_id).where(orphaned).limit(1)).first()
        )
    if found is None:
        return 0
    with transaction(engine) as conn:
        removed = conn.execute(delete(shard_requests).where(stale)).rowcount
        conn.execute(delete(shard_sums).where(orphaned))
    if removed:
        log.warning("removed %d abandoned shard request(s) and their partial sums", removed)
    return int(removed)


def keep_swept(
    engine: Engine,
    every_seconds: float | None = SWEEP_SECONDS,
    stale_seconds: float = COORDINATOR_STALE_SECONDS,
    stop: threading.Event | None = None,
) -> None:
    """Sweep the channel (`purge_abandoned`) now and then every `every_seconds` (None: once) until `stop` is
    set: a worker's daemon thread, for as long as it lives. A sweep that fails (the database away) is logged
    by its error's type and tried again at the next. In a process that forks, give it an engine of its own
    without a pool (NullPool): then between sweeps it holds no connection a child could inherit, and no
    fork happens during one (`_SWEEPING`)."""
    stop = stop or threading.Event()
    while True:
        try:
            with _SWEEPING:
                purge_abandoned(engine, stale_seconds)
        except Exception as exc:
            log.warning("could not sweep the shard channel (%s)", type(exc).__name__)
        if every_seconds is None or stop.wait(every_seconds):
            return


def _release(table: Table, task: ShardTask) -> list[ColumnElement[bool]]:
    """The conditions selecting the rows of `task`'s release in a channel table."""
    return [
        table.c.job_id == task.job_id,
        table.c.iteration == task.iteration,
        table.c.attempt == task.attempt,
    ]


def pending(engine: Engine, task: ShardTask) -> bool:
    """Whether `task`'s request still waits for this shard's answer (a task whose release a lingering worker
    answered, or whose release ended, has nothing to do: two quick reads tell)."""
    with reading(engine) as conn:
        asked = conn.execute(select(shard_requests.c.token).where(*_asked(task))).first()
        return asked is not None and not _has_answered(conn, task)


def _asked(task: ShardTask) -> list[ColumnElement[bool]]:
    """The conditions selecting `task`'s own request: its release, its token, and its K (a shard answers
    only as shard k of the coordinator's K, so it never sums a row range that coordinator did not ask for)."""
    return [
        *_release(shard_requests, task),
        shard_requests.c.token == task.token,
        shard_requests.c.shards == task.shards,
    ]


def _has_answered(conn: Connection, task: ShardTask) -> bool:
    """Whether shard `task.shard` has written its row for `task`'s release."""
    done = select(shard_sums.c.shard).where(*_release(shard_sums, task), shard_sums.c.shard == task.shard)
    return conn.execute(done).first() is not None


def answer(engine: Engine, task: ShardTask, store: DatabaseStore, query: Query) -> bool:
    """A shard worker's part: shard `task.shard`'s clipped sums for the release, written to `shard_sums`.
    False when there is nothing to do (already answered, or the request is gone: the coordinator gave up).
    A failure is recorded as such (no value, no message) and re-raised for the worker's log."""
    with reading(engine) as conn:
        if _has_answered(conn, task):
            return False
        request = conn.execute(
            select(shard_requests.c.params, shard_requests.c.rows).where(*_asked(task))
        ).one_or_none()
    if request is None:
        return False
    row = {
        "job_id": task.job_id,
        "iteration": task.iteration,
        "attempt": task.attempt,
        "shard": task.shard,
        "created_at": _now(),
    }
    try:
        params = decode(request.params)
        first, stop = store.shard_rows(task.shard, task.shards)
        local = None
        if request.rows is not None:  # a minibatch: the sampled ids in this shard's range
            ids = _decode_rows(request.rows)
            local = ids[(ids >= first) & (ids < stop)] - first
        if first == stop or (local is not None and local.size == 0):
            sums: dict[str, Array] = {}
        else:
            batch = store.shard(task.shard, task.shards)
            if local is not None:
                batch = rows_of(batch, local)
            sums = query.clipped_sums(batch, params, private_generator())
        values = {**row, "sums": encode(sums), "failed": False}
    except Exception:
        _write(engine, task, {**row, "sums": None, "failed": True})
        raise
    return _write(engine, task, values)


def linger(
    engine: Engine,
    task: ShardTask,
    store: DatabaseStore,
    query: Query,
    seconds: float,
    *,
    stale_seconds: float = 30.0,
) -> int:
    """After answering `task`, answer its job's next requests (of the same K) as they are written, until
    none comes for `seconds`, another job's request waits (the oldest request this shard has not answered
    is not this job's next one; requests older than `stale_seconds`, whose coordinator died or whose tasks
    are being sent again, are not waited for), or LINGER_MAX_SECONDS have passed (the job's next task,
    queued meanwhile, starts a new linger; a warm shutdown waits no longer than that). Looks every
    LINGER_POLL_SECONDS, backing off to LINGER_MAX_POLL_SECONDS. Returns how many releases it answered."""
    answered = 0
    started = time.monotonic()
    deadline = started + seconds
    pause = LINGER_POLL_SECONDS
    while time.monotonic() < min(deadline, started + LINGER_MAX_SECONDS):
        oldest = _oldest_unanswered(engine, task.shard, _now() - timedelta(seconds=stale_seconds))
        if oldest is None:
            time.sleep(pause)
            pause = min(pause * 1.25, LINGER_MAX_POLL_SECONDS)
            continue
        job_id, iteration, attempt, token, shards = oldest
        if (
            job_id != task.job_id
            or shards != task.shards
            or (iteration, attempt) <= (task.iteration, task.attempt)
        ):
            return answered  # another job's (or another K's) request waits: back to the queue's order
        task = ShardTask(job_id, iteration, attempt, task.shard, task.shards, token)
        answered += answer(engine, task, store, query)
        deadline = time.monotonic() + seconds
        pause = LINGER_POLL_SECONDS
    return answered


def _oldest_unanswered(engine: Engine, shard: int, since: datetime) -> tuple[str, int, int, str, int] | None:
    """(job, iteration, attempt, token, K) of the oldest request written since `since` that shard `shard`
    has not answered."""
    answered = exists().where(
        shard_sums.c.job_id == shard_requests.c.job_id,
        shard_sums.c.iteration == shard_requests.c.iteration,
        shard_sums.c.attempt == shard_requests.c.attempt,
        shard_sums.c.shard == shard,
    )
    with reading(engine) as conn:
        row = conn.execute(
            select(
                shard_requests.c.job_id,
                shard_requests.c.iteration,
                shard_requests.c.attempt,
                shard_requests.c.token,
                shard_requests.c.shards,
            )
            .where(~answered, shard_requests.c.created_at >= since)
            .order_by(shard_requests.c.created_at, shard_requests.c.iteration, shard_requests.c.attempt)
            .limit(1)
        ).first()
    return None if row is None else (str(row[0]), int(row[1]), int(row[2]), str(row[3]), int(row[4]))


def _write(engine: Engine, task: ShardTask, values: dict[str, object]) -> bool:
    """Insert one shard's row while its request (the same token) still exists, holding the request's row
    until the insert commits (FOR UPDATE; SQLite serialises writers anyway), so no answer outlives its
    request (`ShardedSums._clear`). False when the request is gone or the shard answered meanwhile (a
    duplicate task: the first answer stays)."""
    try:
        with transaction(engine) as conn:
            held = conn.execute(select(shard_requests.c.token).where(*_asked(task)).with_for_update()).first()
            if held is None:
                return False
            conn.execute(insert(shard_sums).values(**values))
    except IntegrityError:
        return False
    return True


def claim_shard(engine: Engine, shards: int, holder: str, stale_seconds: float) -> int | None:
    """The lowest shard of 0..shards-1 that no live worker serves, now leased to `holder`, or None. A
    lease not renewed for `stale_seconds` is free (its worker died); taking it is a compare-and-set on
    its renewal time, and a free shard is taken by inserting its row, so two claimants never get one
    shard."""
    now = _now()
    for shard in range(shards):
        try:
            with transaction(engine) as conn:
                conn.execute(insert(shard_leases).values(shard=shard, holder=holder, renewed_at=now))
            return shard
        except IntegrityError:
            pass
        with transaction(engine) as conn:
            lease = conn.execute(select(shard_leases).where(shard_leases.c.shard == shard)).one_or_none()
            if lease is None:
                continue
            renewed = lease.renewed_at if lease.renewed_at.tzinfo else lease.renewed_at.replace(tzinfo=UTC)
            if renewed > now - timedelta(seconds=stale_seconds):
                continue
            taken = conn.execute(
                update(shard_leases)
                .where(shard_leases.c.shard == shard, shard_leases.c.renewed_at == lease.renewed_at)
                .values(holder=holder, renewed_at=now)
            )
            if taken.rowcount == 1:
                return shard
    return None


def renew_lease(engine: Engine, shard: int, holder: str) -> bool:
    """Renew `holder`'s lease of `shard`; False if another worker holds it now (it took a stale lease)."""
    with transaction(engine) as conn:
        renewed = conn.execute(
            update(shard_leases)
            .where(shard_leases.c.shard == shard, shard_leases.c.holder == holder)
            .values(renewed_at=_now())
        )
    return renewed.rowcount == 1


def release_lease(engine: Engine, shard: int, holder: str) -> None:
    with transaction(engine) as conn:
        conn.execute(
            delete(shard_leases).where(shard_leases.c.shard == shard, shard_leases.c.holder == holder)
        )
