"""Forwarded headers, trusted only from the configured reverse proxies (VIPS_TRUSTED_PROXIES).

A TLS-terminating proxy in front of the API tells it the scheme the browser used (X-Forwarded-Proto) and
who the browser is (X-Forwarded-For). Anyone can send those headers, so `ForwardedHeaders` believes them
only when the connection's peer is an address in one of the trusted networks (default: loopback), and
otherwise leaves the request as it arrived. The dashboard's session cookie is Secure exactly when the
request's scheme is https (service.ui.routes), and its same-origin check compares against that scheme.

`vips serve` turns uvicorn's own proxy-header handling off (vips.commands.server), so this is the one
place forwarded headers are read.
"""

from __future__ import annotations

import ipaddress

from starlette.types import ASGIApp, Receive, Scope, Send

from control.settings import Network

_SCHEMES = {"http": ("http", "ws"), "https": ("https", "wss"), "ws": ("http", "ws"), "wss": ("https", "wss")}


def trusted(host: str | None, networks: tuple[Network, ...]) -> bool:
    """Whether host (an address as the server reports it) is in one of the networks. Anything that is
    not an address (a Unix socket's path, a test client's name) is not trusted."""
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    candidates: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = [address]
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        candidates.append(address.ipv4_mapped)  # ::ffff:127.0.0.1 on a dual-stack socket
    return any(a in network for a in candidates for network in networks if a.version == network.version)


def _forwarded_client(values: list[str], networks: tuple[Network, ...]) -> str | None:
    """The client X-Forwarded-For names: the rightmost hop that is not itself a trusted proxy (the hops
    left of it were written by whoever the untrusted hop was)."""
    hops = [hop.strip() for value in values for hop in value.split(",") if hop.strip()]
    for hop in reversed(hops):
        if not trusted(hop, networks):
            return hop
    return hops[0] if hops else None


class ForwardedHeaders:
    """Take the scheme and the client from X-Forwarded-Proto and X-Forwarded-For when, and only when,
    the peer is a trusted proxy (a pure ASGI middleware)."""

    def __init__(self, app: ASGIApp, networks: tuple[Network, ...]) -> None:
        self.app = app
        self.networks = networks

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            peer = scope.get("client")
            if peer and trusted(peer[0], self.networks):
                self._apply(scope)
        await self.app(scope, receive, send)

    def _apply(self, scope: Scope) -> None:
        proto: str | None = None
        forwarded_for: list[str] = []
        for name, value in scope.get("headers", ()):
            if name == b"x-forwarded-proto":
                proto = value.decode("latin-1")
            elif name == b"x-forwarded-for":
                forwarded_for.append(value.decode("latin-1"))
        if proto is not None:
            # the rightmost value is the one the trusted proxy itself saw
            schemes = _SCHEMES.get(proto.split(",")[-1].strip().lower())
            if schemes is not None:
                scope["scheme"] = schemes[1] if scope["type"] == "websocket" else schemes[0]
        client = _forwarded_client(forwarded_for, self.networks)
        if client:
            scope["client"] = (client, 0)
