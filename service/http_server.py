"""The HTTP server's limits on what one connection may hold, and for how long (`vips serve`, `vips up`).

uvicorn bounds the size of a request head (h11's incomplete-event buffer) and idle keep-alive time, but
not the time a client may take to send its request: a client dripping one byte every few seconds holds a
connection (and its buffer) for ever. `LimitedH11Protocol` adds, per connection:

- a head deadline: the request line and headers complete within `header_timeout_seconds` of the
  connection opening, or of the first byte of the next request on a kept-alive connection;
- a body deadline: the body complete within `body_timeout_seconds` of the head;
- a cap: beyond `max_connections` open connections per server process, a new one is closed at once.

A connection past a deadline is closed (no response: the client never finished asking). The limits are
read from ServiceSettings once per process, so `--workers` processes share them through the environment.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from service.settings import ServiceSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_seconds: float
    body_timeout_seconds: float
    max_connections: int


@lru_cache
def connection_limits() -> ConnectionLimits:
    """This process's limits: VIPS_HEADER_TIMEOUT_SECONDS, VIPS_BODY_TIMEOUT_SECONDS, VIPS_MAX_CONNECTIONS."""
    settings = ServiceSettings()
    return ConnectionLimits(
        settings.header_timeout_seconds, settings.body_timeout_seconds, settings.max_connections
    )


def uvicorn_options(settings: ServiceSettings) -> dict[str, Any]:
    """The keyword arguments that put these limits on `uvicorn.run`."""
    return {
        "http": LimitedH11Protocol,
        "h11_max_incomplete_event_size": settings.max_header_bytes,
        "timeout_keep_alive": settings.keep_alive_seconds,
    }


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a head deadline, a body deadline and a per-process connection cap."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._limits = connection_limits()
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_for: str | None = None  # "head" or "body" while a deadline runs

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self._limits.max_connections:
            log.warning(
                "closing a new connection: %d are open (VIPS_MAX_CONNECTIONS)", len(self.connections) - 1
            )
            transport.close()
            return
        self._start("head", self._limits.header_timeout_seconds)

    def data_received(self, data: bytes) -> None:
        if self._waiting_for is None and self.conn.their_state is h11.IDLE:
            self._start("head", self._limits.header_timeout_seconds)  # the next request on a kept-alive one
        super().data_received(data)
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            if self._waiting_for != "body":
                self._start("body", self._limits.body_timeout_seconds)
        elif state is not h11.IDLE:  # the whole request is in (or the connection is ending)
            self._stop()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop()
        super().connection_lost(exc)

    def _start(self, part: str, seconds: float) -> None:
        self._stop()
        self._waiting_for = part
        self._deadline = self.loop.call_later(seconds, self._expired)

    def _stop(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline, self._waiting_for = None, None

    def _expired(self) -> None:
        part, self._deadline, self._waiting_for = self._waiting_for, None, None
        if not self.transport.is_closing():
            log.info("closing a connection whose request %s did not arrive in time", part)
            self.transport.close()
