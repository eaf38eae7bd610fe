"""The embedded broker (control.jobs.file_broker): kombu's file-system transport, whose messages appear whole.

kombu's own creates a message's file empty and then writes it; a consumer listing the folder in between
took the empty file and the worker died on it ("Unrecoverable error: JSONDecodeError"), losing the message
(issue 34.7). Here: two processes put 1,500 messages through the embedded configuration while three
others take them, and every message arrives exactly once with no error (through kombu's own transport,
10-15% of them were lost, each with a JSONDecodeError in a consumer); a consumer never sees a message
before it is written whole; a message another consumer took first, or a file that does not decode, is
passed over."""

from __future__ import annotations

import json
import multiprocessing
import os
import queue as queues
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from kombu import Connection

from control.jobs import file_broker
from control.jobs.queue import CeleryQueue
from control.settings import FILE_BROKER_TRANSPORT, ServiceSettings

STRESS_QUEUE = "vips.stress"
#: More consumers than producers: the queue is near empty, so consumers list the folder while files appear.
PRODUCERS, CONSUMERS, MESSAGES = 2, 3, 750  # MESSAGES per producer
DEADLINE_SECONDS = 60.0


def connect(config: dict[str, Any]) -> Connection:
    """A broker connection as the API and the worker open it: a Celery app configured with `config`."""
    app = Celery("vips-stress", set_as_current=False)
    app.conf.update(config)
    return app.connection_for_write()


def produce(
    config: dict[str, Any], producer: int, messages: int, ready: Any, start: Any, report: Any
) -> None:
    """Put `messages` messages on STRESS_QUEUE; report the errors."""
    errors: list[str] = []
    try:
        with connect(config) as conn:
            stress = conn.SimpleQueue(STRESS_QUEUE)
            ready.put(producer)
            start.wait()
            for n in range(messages):
                try:
                    stress.put({"id": f"{producer}-{n}", "padding": "x" * 200})
                except Exception as exc:
                    errors.append(repr(exc))
    except Exception as exc:
        errors.append(repr(exc))
    report.put(("producer", producer, [], errors))


def consume(config: dict[str, Any], consumer: int, ready: Any, start: Any, done: Any, report: Any) -> None:
    """Take messages from STRESS_QUEUE until it is empty after every producer finished; report the ids
    taken and the errors."""
    taken: list[str] = []
    errors: list[str] = []
    try:
        with connect(config) as conn:
            stress = conn.SimpleQueue(STRESS_QUEUE)
            ready.put(consumer)
            start.wait()
            deadline = time.monotonic() + DEADLINE_SECONDS
            while time.monotonic() < deadline and len(errors) < 100:
                finished = done.is_set()  # before the get: an empty queue after it is the end
                try:
                    message = stress.get_nowait()
                except stress.Empty:
                    if finished:
                        break
                    time.sleep(0.0005)
                    continue
                except Exception as exc:  # kombu's own: JSONDecodeError on a file not written yet
                    errors.append(repr(exc))
                    continue
                taken.append(message.payload["id"])
                message.ack()
            else:
                errors.append("stopped before the queue was empty")
    except Exception as exc:
        errors.append(repr(exc))
    report.put(("consumer", consumer, taken, errors))


def stress(
    config: dict[str, Any], producers: int = PRODUCERS, consumers: int = CONSUMERS, messages: int = MESSAGES
) -> tuple[Counter[str], list[str]]:
    """`producers` processes put `messages` messages each through `config`'s broker while `consumers`
    processes take them; how many times each message was taken, and every error any of them met."""
    # Forked from one process that imported this module once (a fresh interpreter per process, "spawn",
    # costs seconds of imports on busy cores; "fork" would copy this process's threads' locks).
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    ready, report = context.Queue(), context.Queue()
    start, done = context.Event(), context.Event()
    taking = [
        context.Process(target=consume, args=(config, n, ready, start, done, report))
        for n in range(consumers)
    ]
    putting = [
        context.Process(target=produce, args=(config, n, messages, ready, start, report))
        for n in range(producers)
    ]
    taken: Counter[str] = Counter()
    errors: list[str] = []
    try:
        for process in taking + putting:
            process.start()
        for _ in taking + putting:
            ready.get(timeout=DEADLINE_SECONDS)  # every one connected: all start at once
        start.set()
        reports = [report.get(timeout=DEADLINE_SECONDS) for _ in putting]
        done.set()
        reports += [report.get(timeout=DEADLINE_SECONDS) for _ in taking]
        for role, n, ids, met in reports:
            taken.update(ids)
            errors += [f"{role} {n}: {error}" for error in met]
    finally:
        start.set()
        done.set()
        for process in taking + putting:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join()
    return taken, errors


def test_every_message_is_taken_exactly_once_by_many_consumers_of_many_producers(tmp_path: Path) -> None:
    config = ServiceSettings(home=tmp_path).celery_config()
    assert config["broker_transport"] == FILE_BROKER_TRANSPORT
    taken, errors = stress(config)
    assert errors == []
    sent = {f"{producer}-{n}" for producer in range(PRODUCERS) for n in range(MESSAGES)}
    assert set(taken) == sent, f"{len(sent - set(taken))} lost, {len(set(taken) - sent)} unknown"
    assert [key for key, times in taken.items() if times > 1] == []
    broker = tmp_path / "broker"
    assert [
        path.name for folder in ("out", "processed", "staging") for path in (broker / folder).iterdir()
    ] == []


@pytest.fixture
def channels(tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    """A producer's and a consumer's channel on the embedded broker under tmp_path."""
    config = ServiceSettings(home=tmp_path).celery_config()
    with connect(config) as producer, connect(config) as consumer:
        assert isinstance(producer.transport, file_broker.Transport)
        yield producer.default_channel, consumer.default_channel


def test_a_message_is_not_in_the_queue_until_it_is_written_whole(
    channels: tuple[Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At each step of a put (its file created empty, then written), a consumer finds nothing to take;
    kombu's own put creates the file in the queue folder and a consumer took it empty there."""
    producer, consumer = channels
    seen: list[str] = []

    def look(step: str) -> None:
        with pytest.raises(queues.Empty):
            consumer._get(STRESS_QUEUE)
        seen.append(step)

    real_mkstemp, real_rename = file_broker.tempfile.mkstemp, file_broker.os.rename

    def mkstemp(**kwargs: Any) -> tuple[int, str]:
        created = real_mkstemp(**kwargs)
        look("created")
        return created

    def rename(source: str, target: str) -> None:
        if Path(source).parent == tmp_path / "broker" / "staging":  # the put's, not a consumer's
            assert os.path.getsize(source) > 0
            look("written")
        real_rename(source, target)

    monkeypatch.setattr(file_broker.tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(file_broker.os, "rename", rename)
    producer._put(STRESS_QUEUE, {"body": "whole"})
    monkeypatch.undo()
    assert seen == ["created", "written"]
    assert consumer._get(STRESS_QUEUE) == {"body": "whole"}
    with pytest.raises(queues.Empty):
        consumer._get(STRESS_QUEUE)


def test_a_message_another_consumer_took_first_is_passed_over(
    channels: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    producer, consumer = channels
    producer._put(STRESS_QUEUE, {"n": 1})
    producer._put(STRESS_QUEUE, {"n": 2})
    real_listdir = file_broker.os.listdir

    def listdir(folder: str) -> list[str]:
        names = real_listdir(folder)
        monkeypatch.undo()  # once: the other consumer takes the first message after this one listed it
        assert producer._get(STRESS_QUEUE) == {"n": 1}
        return names

    monkeypatch.setattr(file_broker.os, "listdir", listdir)
    assert consumer._get(STRESS_QUEUE) == {"n": 2}
    with pytest.raises(queues.Empty):
        consumer._get(STRESS_QUEUE)


def test_a_file_that_does_not_decode_is_set_aside_and_the_next_message_taken(
    channels: tuple[Any, Any], tmp_path: Path
) -> None:
    """What kombu's own writer can leave (an empty file) costs that message, not the worker."""
    producer, consumer = channels
    out, processed = tmp_path / "broker" / "out", tmp_path / "broker" / "processed"
    (out / f"0-empty.{STRESS_QUEUE}.msg").touch()  # first in name order
    producer._put(STRESS_QUEUE, {"n": 1})
    assert consumer._get(STRESS_QUEUE) == {"n": 1}
    assert [path.name for path in processed.iterdir()] == [f"0-empty.{STRESS_QUEUE}.msg.unreadable"]
    assert list(out.iterdir()) == []


def test_messages_are_taken_in_the_order_they_were_put(channels: tuple[Any, Any]) -> None:
    producer, consumer = channels
    for n in range(5):
        producer._put(STRESS_QUEUE, {"n": n})
    assert [consumer._get(STRESS_QUEUE)["n"] for _ in range(5)] == list(range(5))


def test_the_first_exchange_table_appears_whole_and_later_bindings_are_added(
    channels: tuple[Any, Any], tmp_path: Path
) -> None:
    producer, consumer = channels
    producer._queue_bind("vips.x", "a", "", "qa")
    consumer._queue_bind("vips.x", "b", "", "qb")
    producer._queue_bind("vips.x", "a", "", "qa")  # already bound
    table = json.loads((tmp_path / "broker" / "control" / "vips.x.exchange").read_text())
    assert sorted(map(tuple, table)) == [("a", "", "qa"), ("b", "", "qb")]
    assert [path.name for path in (tmp_path / "broker" / "control").iterdir()] == ["vips.x.exchange"]


def test_the_api_reads_the_queue_and_checks_the_folders_it_writes_through(tmp_path: Path) -> None:
    api = CeleryQueue(ServiceSettings(home=tmp_path))
    try:
        api.check()
        api.send_run_job("job-1")
        assert api.holds({"job-1", "job-2"}) == {"job-1"}
        (tmp_path / "broker" / "staging").rmdir()
        with pytest.raises(RuntimeError, match="staging"):
            api.check()
    finally:
        api.close()
