"""Background work of the API process: an action repeated in a daemon thread."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


def run_every(interval: float, action: Callable[[], object], name: str) -> threading.Event:
    """Run `action` every `interval` seconds in a daemon thread until the returned event is set; a pass
    that fails (a transient database error) is logged and the next one runs as planned."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            try:
                action()
            except Exception:
                log.exception("%s pass failed", name)

    threading.Thread(target=loop, name=name, daemon=True).start()
    return stop
