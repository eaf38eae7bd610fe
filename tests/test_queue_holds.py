"""Whether the broker still holds a job's task (control.jobs.queue.CeleryQueue.holds), on the real brokers:
the embedded file-system broker and Redis. The reaper fails a quiet queued job only when the set this returns
(one read of the broker per reaper pass) leaves it out; None (unreadable) fails none."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import cast

import pytest
import redis

from control.jobs.queue import CeleryQueue
from control.settings import ServiceSettings
from tests.e2e import private_redis_url, require_redis


def test_the_file_broker_holds_a_sent_task_until_it_is_consumed(tmp_path: Path) -> None:
    queue = CeleryQueue(ServiceSettings(home=tmp_path))
    try:
        sent, also_sent, other = uuid.uuid4().hex, uuid.uuid4().hex, uuid.uuid4().hex
        queue.send_run_job(sent)
        queue.send_run_job(also_sent)
        assert queue.holds({sent, also_sent, other}) == {sent, also_sent}  # one read for all three
        assert queue.holds({other}) == set()
        assert queue.holds(set()) == set()
        for message in (tmp_path / "broker" / "out").iterdir():  # a worker took them
            message.unlink()
        assert queue.holds({sent, also_sent}) == set()
    finally:
        queue.close()


@pytest.mark.redis
def test_redis_holds_a_waiting_task_and_an_unacknowledged_one() -> None:
    require_redis()
    url = private_redis_url()  # a database of its own, emptied after
    client = redis.Redis.from_url(url)
    client.flushdb()
    queue = CeleryQueue(ServiceSettings(broker_url=url))
    try:
        waiting, delivered, gone = (uuid.uuid4().hex for _ in range(3))
        queue.send_run_job(waiting)
        assert queue.holds({waiting, gone}) == {waiting}
        # A worker's delivery that is not acknowledged yet lives in kombu's "unacked" hash.
        message = cast(bytes | None, client.rpop("celery"))  # redis-py's sync client returns bytes
        assert message is not None and waiting.encode() in message
        client.hset("unacked", "tag-1", message.replace(waiting.encode(), delivered.encode()).decode())
        # delivered is held, unacknowledged; waiting was consumed and acknowledged
        assert queue.holds({delivered, waiting}) == {delivered}
    finally:
        queue.close()
        client.flushdb()
        client.close()


def test_an_unreachable_broker_cannot_tell() -> None:
    queue = CeleryQueue(ServiceSettings(broker_url="redis://127.0.0.1:1/0"))
    try:
        assert queue.holds({uuid.uuid4().hex}) is None
    finally:
        queue.close()


@pytest.mark.parametrize("countdown", [None, 5.0])
def test_tasks_are_sent_with_the_job_id_as_their_id(tmp_path: Path, countdown: float | None) -> None:
    from control.jobs.queue import send_run_job

    queue = CeleryQueue(ServiceSettings(home=tmp_path))
    try:
        job_id = uuid.uuid4().hex
        send_run_job(queue._celery, job_id, countdown)
        (text,) = [path.read_text() for path in (tmp_path / "broker" / "out").iterdir()]
        assert f'"id": "{job_id}"' in text
    finally:
        queue.close()
