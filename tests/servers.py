"""Which servers a test may use: `make test-fast` (VIPS_TEST_NO_SERVERS=1) runs only tests marked for none
(postgres, redis, browser: pyproject.toml's markers), and a test that reaches a server without its marker
fails there, naming the marker, so the fast selection cannot silently start needing one."""

from __future__ import annotations

import os

import pytest

#: Set by `make test-fast`: no PostgreSQL, Redis or Chromium may be used.
NO_SERVERS = "VIPS_TEST_NO_SERVERS"


def may_use(server: str, marker: str) -> None:
    """Fail the calling test in a no-server run: it uses `server` without the `marker` mark."""
    if os.environ.get(NO_SERVERS) == "1":
        pytest.fail(f"this test uses {server}: mark it @pytest.mark.{marker} (make test-fast runs none such)")
