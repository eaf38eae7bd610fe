"""Writing results: one JSON line on stdout, files replaced atomically."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from vips.errors import RuntimeFailure


def finite_or_none(value: float) -> float | None:
    """JSON has no infinity: an infinite epsilon is printed as null next to "epsilon_is_infinite": true."""
    return value if math.isfinite(value) else None


def print_json(payload: dict[str, Any]) -> None:
    """One JSON line on stdout; NaN or infinity in the payload is a bug, not output."""
    sys.stdout.write(json.dumps(payload, allow_nan=False) + "\n")
    sys.stdout.flush()


def write_text_atomically(path: Path, text: str) -> None:
    """Write to a temporary file next to `path`, then rename it over `path`. The file is created anew, so
    its mode is the process's umask's (a stale temporary file's mode is not kept)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.unlink(missing_ok=True)
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise RuntimeFailure(f"cannot write {path}: {exc.strerror}") from None


def check_writable(path: Path) -> None:
    """Refuse an output path whose directory cannot take it, before any privacy is spent on the result."""
    directory = path.parent
    if not directory.is_dir():
        raise RuntimeFailure(f"cannot write {path}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK):
        raise RuntimeFailure(f"cannot write {path}: directory {directory} is not writable")
