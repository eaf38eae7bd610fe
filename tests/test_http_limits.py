"""The server's per-connection limits (service.http.server) on a real `vips serve` process: slow heads
and bodies are cut at their deadlines, oversized heads refused, connections beyond the cap closed, and
ordinary requests (kept alive) unaffected."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from control.settings import ServiceSettings
from tests.e2e import _clean_env, _stop, free_port, migrate_store, start_vips

pytestmark = pytest.mark.slow

HEADER_TIMEOUT = 1.5
BODY_TIMEOUT = 2.0
MAX_CONNECTIONS = 6
#: Deadlines run on the server's event loop; a busy 2-core machine (two test processes, each with its
#: services) may be late by this much.
SLACK = 3.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    home = tmp_path_factory.mktemp("limits")
    env = {
        **_clean_env(),
        "VIPS_HOME": str(home),
        "VIPS_HEADER_TIMEOUT_SECONDS": str(HEADER_TIMEOUT),
        "VIPS_BODY_TIMEOUT_SECONDS": str(BODY_TIMEOUT),
        "VIPS_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
    }
    migrate_store(env)
    port = free_port()
    process = start_vips(["serve", "--port", str(port)], env, home / "serve.log")
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError((home / "serve.log").read_text()[-3000:])
        time.sleep(0.2)
    try:
        yield "127.0.0.1", port
    finally:
        _stop({"serve": process})


def seconds_until_closed(sock: socket.socket, drip: bytes, every: float, limit: float) -> float:
    """Send `drip` one byte per `every` seconds until the server closes the connection; the seconds taken
    (or `limit` if it never did)."""
    start = time.monotonic()
    sock.settimeout(every)
    position = 0
    while time.monotonic() - start < limit:
        try:
            if position < len(drip):
                sock.send(drip[position : position + 1])
                position += 1
            if sock.recv(4096) == b"":
                return time.monotonic() - start
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return time.monotonic() - start
    return limit


def test_a_head_sent_one_byte_at_a_time_is_cut_at_the_header_deadline(server: tuple[str, int]) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 200 + b"\r\n\r\n"
    with socket.create_connection(server) as sock:
        elapsed = seconds_until_closed(sock, head, every=0.3, limit=20)
    assert HEADER_TIMEOUT - 0.2 <= elapsed <= HEADER_TIMEOUT + SLACK


def test_a_silent_connection_is_cut_at_the_header_deadline(server: tuple[str, int]) -> None:
    with socket.create_connection(server) as sock:
        elapsed = seconds_until_closed(sock, b"", every=0.3, limit=20)
    assert HEADER_TIMEOUT - 0.2 <= elapsed <= HEADER_TIMEOUT + SLACK


def test_a_body_sent_one_byte_at_a_time_is_cut_at_the_body_deadline(server: tuple[str, int]) -> None:
    """The head arrives at once; the body (read in full before any route runs) never completes in time."""
    head = (
        b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n"
    )
    with socket.create_connection(server) as sock:
        sock.sendall(head)
        elapsed = seconds_until_closed(sock, b"{" + b" " * 498 + b"}", every=0.3, limit=20)
    assert BODY_TIMEOUT - 0.2 <= elapsed <= BODY_TIMEOUT + SLACK


def test_an_oversized_head_is_refused(server: tuple[str, int]) -> None:
    host, port = server
    big = "a" * (ServiceSettings().max_header_bytes + 1024)
    response = httpx.get(f"http://{host}:{port}/healthz", headers={"X-Big": big}, timeout=10)
    assert response.status_code in (400, 431)
    assert (
        httpx.get(f"http://{host}:{port}/healthz", headers={"X-Small": "a" * 4000}, timeout=10).status_code
        == 200
    )


def test_connections_beyond_the_cap_are_closed_and_the_server_recovers(server: tuple[str, int]) -> None:
    held = [socket.create_connection(server) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.3)  # all accepted
        with socket.create_connection(server) as extra:
            extra.settimeout(5)
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                answer = extra.recv(4096)
            except ConnectionResetError:
                answer = b""
            assert answer == b""  # closed without an answer
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.3)
    host, port = server
    assert httpx.get(f"http://{host}:{port}/healthz", timeout=10).status_code == 200


def test_kept_alive_requests_work_and_are_not_cut(server: tuple[str, int]) -> None:
    """Requests on one kept-alive connection spaced within the keep-alive time all succeed, even when
    the connection as a whole lives longer than the header deadline."""
    host, port = server
    with httpx.Client(base_url=f"http://{host}:{port}") as client:
        for _ in range(4):
            assert client.get("/healthz").status_code == 200
            time.sleep(HEADER_TIMEOUT / 2)


def test_the_defaults_cut_a_slow_head_within_thirty_seconds() -> None:
    """Issue 21's bound (one header byte per 4 s closed within 30 s) holds for the shipped defaults, and
    an idle kept-alive connection closes before a slow head could be cut."""
    defaults = ServiceSettings.model_construct()
    assert defaults.header_timeout_seconds <= 30
    assert defaults.keep_alive_seconds < defaults.header_timeout_seconds
