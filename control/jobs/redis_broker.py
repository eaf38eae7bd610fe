"""The production broker: kombu's Redis transport, surviving the loss of Redis while a job runs.

With kombu 5.7 and Celery 5.7, a worker that loses Redis while it holds an unacknowledged message (a
running job: run_job acknowledges late) exits for good ("Unrecoverable error: AttributeError: 'NoneType'
object has no attribute 'hostname'"): Celery's consumer first collects the broken connection, which
detaches the transport from its kombu Connection (`transport.client = None`), then closes that
connection; closing its channel restores the unacknowledged messages (kombu's QoS.restore_unacked_once),
which needs a new Redis client, whose parameters are read from `transport.client`: the AttributeError,
which no one catches, because it is not one of the transport's connection errors.

Here a channel whose transport was detached raises the connection error it is (Redis is unreachable, and
the connection is being discarded), which Celery's close ignores: the worker reconnects with its
broker_connection_retry policy. The unacknowledged messages stay in Redis's `unacked` set, from which
kombu restores them after the visibility timeout (if Redis kept them); their jobs' rows say what happened
to them (a job that ended is not run again; control.jobs.reaper fails a job whose worker went quiet).

Celery uses it through `broker_transport` (control.settings.REDIS_BROKER_TRANSPORT, in celery_config);
the URL stays `redis://...`."""

from __future__ import annotations

from typing import Any

import redis.exceptions
from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    def _connparams(self, asynchronous: bool = False) -> Any:
        if self.connection.client is None:  # the transport was detached from its closed connection
            raise redis.exceptions.ConnectionError("the connection to the broker was closed")
        return super()._connparams(asynchronous=asynchronous)  # type: ignore[no-untyped-call]


class Transport(kombu_redis.Transport):
    Channel = Channel
