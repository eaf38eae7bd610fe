"""Bounded requests: header-size (431) and body-size (413) caps and short 422s, plus a 500 that keeps
the connection open.

`BodyLimit` reads a request body (with or without Content-Length, e.g. chunked) up to the configured
limit before the app sees it, and answers 413 with a JSON detail as soon as the body is larger.
`validation_errors` is the 422 body: each error's loc, msg and type, with at most a short excerpt of the
rejected input, so a large request never comes back multiplied. `ErrorBoundary` turns an unexpected
exception into a JSON 500 without re-raising it (Starlette's ServerErrorMiddleware re-raises, which makes
the server drop the keep-alive connection).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

#: How much of a rejected input a 422 may quote, and how many errors it lists at most.
INPUT_EXCERPT = 100
MAX_ERRORS = 20
_LOC_PART = 100


async def _send_json(send: Send, status: int, body: dict[str, Any]) -> None:
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


class HeaderLimit:
    """Answer 431 to a request whose header fields add up to more than `max_bytes` (names and values).

    The server's h11 parser already refuses a head it cannot complete within that many bytes
    (service.http.server), but one that arrives whole in a single read is parsed whatever its size."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            size = sum(len(name) + len(value) for name, value in scope.get("headers", ()))
            if size > self.max_bytes:
                detail = f"the request's header fields are larger than the limit of {self.max_bytes} bytes"
                await _send_json(send, 431, {"detail": detail})
                return
        await self.app(scope, receive, send)


class BodyLimit:
    """Answer 413 to request bodies above `max_bytes`; the app gets the buffered body (at most max_bytes)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _too_large(self, send: Send) -> None:
        await _send_json(
            send, 413, {"detail": f"the request body is larger than the limit of {self.max_bytes} bytes"}
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0  # the server validates the header; the count below still holds
                if declared > self.max_bytes:
                    await self._too_large(send)
                    return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            body: bytes = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await self._too_large(send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class ErrorBoundary:
    """An unexpected exception becomes a JSON 500 (logged with its traceback) and is not re-raised."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:
            log.error("unexpected error", exc_info=exc)
            if started:
                raise
            await _send_json(send, 500, {"detail": "internal error (see the server log)"})


def _excerpt(value: Any) -> Any:
    """A short, JSON-safe stand-in for a rejected input (JSON has no NaN or infinity)."""
    if value is None or isinstance(value, bool | int):
        return value if not isinstance(value, int) or abs(value) < 10**18 else f"{str(value)[:20]}..."
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        return value if len(value) <= INPUT_EXCERPT else value[:INPUT_EXCERPT] + "..."
    # Objects and arrays are not quoted: the loc says where they are.
    return None


def _short(part: Any) -> Any:
    if isinstance(part, str) and len(part) > _LOC_PART:
        return part[:_LOC_PART] + "..."
    return part if isinstance(part, str | int) else str(part)[:_LOC_PART]


def validation_errors(errors: Sequence[Any]) -> list[dict[str, Any]]:
    """The 422 detail: loc, msg and type of the first MAX_ERRORS errors, each input cut to an excerpt."""
    detail: list[dict[str, Any]] = []
    for error in list(errors)[:MAX_ERRORS]:
        item: dict[str, Any] = {
            "type": str(error.get("type", "value_error")),
            "loc": [_short(part) for part in error.get("loc", ())],
            "msg": str(error.get("msg", ""))[: 4 * INPUT_EXCERPT],
        }
        excerpt = _excerpt(error.get("input"))
        if excerpt is not None:
            item["input"] = excerpt
        detail.append(item)
    if len(errors) > MAX_ERRORS:
        detail.append(
            {"type": "too_many_errors", "loc": [], "msg": f"{len(errors) - MAX_ERRORS} more errors not shown"}
        )
    return detail
