"""/redoc from fastapi_offline's copy of ReDoc, without the one request that bundle makes to another host.

ReDoc's sidebar draws its vendor's logo from cdn.redoc.ly (unconditionally: no ReDoc option hides it).
The bundle is served here with that URL replaced by an empty data: URL, so the browser never asks another
host; the image fails to decode and ReDoc hides it, as it does when the CDN is unreachable.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html
from fastapi.responses import HTMLResponse, Response

#: Where the rewritten bundle is served (outside the static mount of the other docs assets).
REDOC_JS_PATH = "/redoc-assets/redoc.standalone.js"
#: The logo ReDoc would fetch, and what replaces it (img-src allows data:).
EXTERNAL_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"
NO_LOGO = "data:,"

_BUNDLE = Path(fastapi_offline.__file__).parent / "static" / "redoc.standalone.js"


@lru_cache(maxsize=1)
def redoc_bundle() -> bytes:
    """fastapi_offline's ReDoc bundle with its external logo replaced (read once per process)."""
    text = _BUNDLE.read_text(encoding="utf-8")
    if EXTERNAL_LOGO not in text:  # a ReDoc upgrade moved it: the docs tests name the new request
        return text.encode()
    return text.replace(EXTERNAL_LOGO, NO_LOGO).encode()


def redoc_router(openapi_url: str, static_url: str, title: str) -> APIRouter:
    """GET /redoc (the page) and GET REDOC_JS_PATH (the bundle); `static_url`: where the favicon is."""
    router = APIRouter(include_in_schema=False)

    @router.get("/redoc")
    async def redoc_page(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{title} - ReDoc",
            redoc_js_url=f"{root}{REDOC_JS_PATH}",
            redoc_favicon_url=f"{root}{static_url}/favicon.png",
            with_google_fonts=False,
        )

    @router.get(REDOC_JS_PATH)
    async def redoc_script() -> Response:
        return Response(
            redoc_bundle(),
            media_type="text/javascript",
            headers={"Cache-Control": "public, max-age=3600"},
        )

    return router
