"""The API's listening socket, bound before `vips up` prints or starts anything, then handed to uvicorn (so
no other process can take the port in between)."""

from __future__ import annotations

import errno
import socket

from vips.errors import RuntimeFailure


def bind_listener(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port as uvicorn binds one (SO_REUSEADDR; IPv6 when the host has a colon),
    or RuntimeFailure saying why it cannot be (the port in use, an address not of this machine)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        reason = f"port {port} is in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise RuntimeFailure(
            f"cannot listen on {host}:{port}: {reason}; choose another with --port (or stop what uses it)"
        ) from None
    except BaseException:
        sock.close()
        raise
    return sock
