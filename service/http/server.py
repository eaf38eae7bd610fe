"""The HTTP server's limits on what one connection, and one client address, may hold, and for how long
(`vips serve`, `vips up`), so that no proxy is needed to survive a connection flood.

uvicorn bounds the size of a request head (h11's incomplete-event buffer) and idle keep-alive time, but
not the time a client may take to send its request, nor how many connections one client holds: a client
dripping one byte every few seconds holds a connection (and its buffer) for ever, and a few hundred of
them hold every slot. `LimitedH11Protocol` adds:

- a head deadline: the request line and headers complete within `header_timeout_seconds` of the
  connection opening, or of the first byte of the next request on a kept-alive connection;
- a body deadline: the body complete within `body_timeout_seconds` of the head;
- per client address (an IPv4 address, or an IPv6 /64: one host's share of addresses), caps on its
  half-open connections (open, their first request head not yet complete: `max_half_open_per_address`)
  and on its open connections (`max_connections_per_address`; not for the trusted proxies of
  VIPS_TRUSTED_PROXIES, which carry many clients each): a new connection over either cap is closed at
  once, and only that client's new connections are;
- a cap of `max_connections` open connections per server process, shared fairly between addresses: a new
  connection beyond it takes the place of an idle one (no request in progress: half-open, or kept alive
  between requests) of the address holding the most, if that address holds at least two more than the
  newcomer's (max-min fairness, so many addresses each under its own caps cannot fill the process and
  starve the rest; trusted proxies' connections are never taken); otherwise the new one is closed.

A connection past a deadline is closed (no response: the client never finished asking). Closed
connections are logged as one summary line per `REFUSAL_LOG_SECONDS` (how many, why, the busiest
address), never a line each. The limits are read from ServiceSettings once per process, so `--workers`
processes share them through the environment (each process counts its own connections).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from control.settings import Network, ServiceSettings
from service.http.proxies import trusted

log = logging.getLogger(__name__)

#: Connections closed by these limits are logged at most once per this many seconds (a summary line).
REFUSAL_LOG_SECONDS = 10.0


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_seconds: float
    body_timeout_seconds: float
    max_connections: int
    max_connections_per_address: int = 64
    max_half_open_per_address: int = 16
    exempt: tuple[Network, ...] = ()  # peers without a per-address cap on open connections


@lru_cache
def connection_limits() -> ConnectionLimits:
    """This process's limits: VIPS_HEADER_TIMEOUT_SECONDS, VIPS_BODY_TIMEOUT_SECONDS, VIPS_MAX_CONNECTIONS,
    VIPS_MAX_CONNECTIONS_PER_ADDRESS, VIPS_MAX_HALF_OPEN_PER_ADDRESS (VIPS_TRUSTED_PROXIES exempt from the
    per-address cap on open connections)."""
    settings = ServiceSettings()
    return ConnectionLimits(
        settings.header_timeout_seconds,
        settings.body_timeout_seconds,
        settings.max_connections,
        settings.max_connections_per_address,
        settings.max_half_open_per_address,
        settings.trusted_networks(),
    )


def uvicorn_options(settings: ServiceSettings) -> dict[str, Any]:
    """The keyword arguments that put these limits on `uvicorn.run`."""
    return {
        "http": LimitedH11Protocol,
        "h11_max_incomplete_event_size": settings.max_header_bytes,
        "timeout_keep_alive": settings.keep_alive_seconds,
        "backlog": settings.backlog,
    }


def client_address(host: str | None) -> str | None:
    """The address a connection's caps count under: the IPv4 address (also of an IPv4-mapped IPv6 one),
    or the /64 network of an IPv6 address (a host gets a /64 to choose from); None for no address."""
    if not host:
        return None
    try:
        address = ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


@dataclass
class _Peers:
    """One server's open and half-open connections by client address."""

    open: Counter[str] = field(default_factory=Counter)
    half_open: Counter[str] = field(default_factory=Counter)
    #: The open connections of each address that the fair share may take (not trusted proxies').
    members: dict[str, set[LimitedH11Protocol]] = field(default_factory=dict)

    def drop(self, counter: Counter[str], address: str) -> None:
        counter[address] -= 1
        if counter[address] <= 0:
            del counter[address]

    def idle_connection_of_the_most(self, address: str | None) -> LimitedH11Protocol | None:
        """An idle connection of the address holding the most connections (trusted proxies aside) if it
        holds at least two more than `address`, else None."""
        mine = self.open[address] if address is not None else 0
        ranked = sorted(self.members, key=lambda a: len(self.members[a]), reverse=True)
        for hog in ranked:
            if len(self.members[hog]) <= mine + 1:
                return None
            idle = next((c for c in self.members[hog] if c.idle()), None)
            if idle is not None:
                return idle
        return None


_peers: weakref.WeakKeyDictionary[ServerState, _Peers] = weakref.WeakKeyDictionary()


class RefusalLog:
    """Counts connections closed by the limits; logs the first at once, then at most one summary line per
    `interval` seconds (how many, why, the address that had most), so a flood writes a few lines."""

    def __init__(self, interval: float = REFUSAL_LOG_SECONDS) -> None:
        self.interval = interval
        self._reasons: Counter[str] = Counter()
        self._addresses: Counter[str] = Counter()
        self._quiet_until = 0.0
        self._flush: asyncio.TimerHandle | None = None

    def note(self, loop: asyncio.AbstractEventLoop, reason: str, address: str | None) -> None:
        now = time.monotonic()
        if now >= self._quiet_until and self._flush is None:
            log.warning("closing a connection from %s: %s", address or "an unknown address", reason)
            self._quiet_until = now + self.interval
            return
        self._reasons[reason] += 1
        self._addresses[address or "unknown"] += 1
        if self._flush is None:
            self._flush = loop.call_at(loop.time() + max(0.0, self._quiet_until - now), self._summary, loop)

    def _summary(self, loop: asyncio.AbstractEventLoop) -> None:
        self._flush = None
        total = sum(self._reasons.values())
        if not total:
            return
        reasons = "; ".join(f"{n} {reason}" for reason, n in self._reasons.most_common())
        address, most = self._addresses.most_common(1)[0]
        log.warning(
            "closed %d more connections in the last %.0f s (%s); most from %s (%d)",
            total,
            self.interval,
            reasons,
            address,
            most,
        )
        self._reasons.clear()
        self._addresses.clear()
        self._quiet_until = time.monotonic() + self.interval
        self._flush = loop.call_later(self.interval, self._summary, loop)  # ends when a window is quiet


_refusals = RefusalLog()


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with head and body deadlines, per-address caps on open and half-open
    connections, and a per-process connection cap."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._limits = connection_limits()
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_for: str | None = None  # "head" or "body" while a deadline runs
        self._address: str | None = None  # set while this connection is counted under its address
        self._half_open = False  # counted as half-open: its first request head is not complete

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        address = client_address(self.client[0] if self.client else None)
        peers = _peers.setdefault(self.server_state, _Peers())
        reason = self._refusal(peers, address)
        # A fair share of a full process, for a newcomer its own address's caps would serve.
        if (
            reason is not None
            and reason.endswith("(VIPS_MAX_CONNECTIONS)")
            and (self._refusal(peers, address, at_capacity=False) is None)
        ):
            taken = peers.idle_connection_of_the_most(address)
            if taken is not None:  # the newcomer gets the hog's idle slot
                _refusals.note(
                    self.loop, "the process was full and this address held the most", taken._address
                )
                taken.transport.close()
                reason = None  # its own caps serve it (checked above), and it has the slot
        if reason is not None:
            self.connections.discard(self)  # never counted: the cap is of the connections served
            transport.close()
            _refusals.note(self.loop, reason, address)
            return
        if address is not None:
            self._address, self._half_open = address, True
            peers.open[address] += 1
            peers.half_open[address] += 1
            if not trusted(self.client[0] if self.client else None, self._limits.exempt):
                peers.members.setdefault(address, set()).add(self)
        self._start("head", self._limits.header_timeout_seconds)

    def idle(self) -> bool:
        """No request in progress: the client has not sent a whole request head (half-open, or kept alive
        between requests) and no response is being sent."""
        return (
            self.conn.their_state is h11.IDLE
            and self.conn.our_state is h11.IDLE
            and not self.transport.is_closing()
        )

    def _refusal(self, peers: _Peers, address: str | None, *, at_capacity: bool = True) -> str | None:
        """Why a new connection from `address` is closed at once, or None to serve it (`at_capacity`
        False: the process's cap was just made room under)."""
        limits = self._limits
        if at_capacity and len(self.connections) > limits.max_connections:
            return f"{len(self.connections) - 1} connections are open (VIPS_MAX_CONNECTIONS)"
        if address is None:
            return None
        if peers.half_open[address] >= limits.max_half_open_per_address:
            return (
                f"it has {peers.half_open[address]} connections without a complete request "
                "(VIPS_MAX_HALF_OPEN_PER_ADDRESS)"
            )
        if peers.open[address] >= limits.max_connections_per_address and not trusted(
            self.client[0] if self.client else None, limits.exempt
        ):
            return f"it has {peers.open[address]} open connections (VIPS_MAX_CONNECTIONS_PER_ADDRESS)"
        return None

    def data_received(self, data: bytes) -> None:
        if self._waiting_for is None and self.conn.their_state is h11.IDLE:
            self._start("head", self._limits.header_timeout_seconds)  # the next request on a kept-alive one
        super().data_received(data)
        state = self.conn.their_state
        if state is not h11.IDLE:
            self._head_done()
        if state is h11.SEND_BODY:
            if self._waiting_for != "body":
                self._start("body", self._limits.body_timeout_seconds)
        elif state is not h11.IDLE:  # the whole request is in (or the connection is ending)
            self._stop()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop()
        self._head_done()
        if self._address is not None:
            peers = _peers.get(self.server_state)
            if peers is not None:
                peers.drop(peers.open, self._address)
                members = peers.members.get(self._address)
                if members is not None:
                    members.discard(self)
                    if not members:
                        del peers.members[self._address]
            self._address = None
        super().connection_lost(exc)

    def _head_done(self) -> None:
        """The first request head is in (or the connection ended): no longer half-open."""
        if self._half_open and self._address is not None:
            self._half_open = False
            peers = _peers.get(self.server_state)
            if peers is not None:
                peers.drop(peers.half_open, self._address)

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
            _refusals.note(self.loop, f"its request {part} did not arrive in time", self._address)
            self.transport.close()
