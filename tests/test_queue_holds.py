"""Whether the broker still holds a job's task (service.queue.CeleryQueue.holds), on the real brokers: the
embedded file-system broker and Redis. The reaper fails a queued job only when this says False."""

from __future__ import annotations

import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from service.queue import CeleryQueue
from service.settings import ServiceSettings
from tests.e2e import REDIS_URL, require_redis


def test_the_file_broker_holds_a_sent_task_until_it_is_consumed(tmp_path: Path) -> None:
    queue = CeleryQueue(ServiceSettings(home=tmp_path))
    try:
        sent, other = uuid.uuid4().hex, uuid.uuid4().hex
        queue.send_run_job(sent)
        assert queue.holds(sent) is True
        assert queue.holds(other) is False
        for message in (tmp_path / "broker" / "out").iterdir():  # a worker took it
            message.unlink()
        assert queue.holds(sent) is False
    finally:
        queue.close()


def test_redis_holds_a_waiting_task_and_an_unacknowledged_one() -> None:
    require_redis()
    url = urlsplit(REDIS_URL)._replace(path="/13").geturl()  # a database of its own, emptied after
    client = redis.Redis.from_url(url)
    client.flushdb()
    queue = CeleryQueue(ServiceSettings(broker_url=url))
    try:
        waiting, delivered, gone = (uuid.uuid4().hex for _ in range(3))
        queue.send_run_job(waiting)
        assert queue.holds(waiting) is True and queue.holds(gone) is False
        # A worker's delivery that is not acknowledged yet lives in kombu's "unacked" hash.
        message = client.rpop("celery")
        assert message is not None and waiting.encode() in message
        client.hset("unacked", "tag-1", message.replace(waiting.encode(), delivered.encode()))
        assert queue.holds(delivered) is True
        assert queue.holds(waiting) is False  # consumed and acknowledged
    finally:
        queue.close()
        client.flushdb()
        client.close()


def test_an_unreachable_broker_cannot_tell() -> None:
    queue = CeleryQueue(ServiceSettings(broker_url="redis://127.0.0.1:1/0"))
    try:
        assert queue.holds(uuid.uuid4().hex) is None
    finally:
        queue.close()


@pytest.mark.parametrize("countdown", [None, 5.0])
def test_tasks_are_sent_with_the_job_id_as_their_id(tmp_path: Path, countdown: float | None) -> None:
    from service.queue import send_run_job

    queue = CeleryQueue(ServiceSettings(home=tmp_path))
    try:
        job_id = uuid.uuid4().hex
        send_run_job(queue._celery, job_id, countdown)
        (text,) = [path.read_text() for path in (tmp_path / "broker" / "out").iterdir()]
        assert f'"id": "{job_id}"' in text
    finally:
        queue.close()
