"""Bounds on pricing (quotes, calibrations, admissions): a pool of accountant slots, so pricing never
takes more than a few of the request threads, and a per-key rate, so no key can keep them all busy."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from control.errors import AccountantBusy
from control.rate_limits import KeyRateLimiter
from control.settings import ServiceSettings

_pricing_slots: dict[int, threading.BoundedSemaphore] = {}
_pricing_rates: dict[tuple[float, int], KeyRateLimiter] = {}
_pricing_lock = threading.Lock()


def take_pricing_request(settings: ServiceSettings, key_id: str) -> None:
    """Count one pricing request of this key against its rate (`pricing_rate_per_key` per second, bursts
    of `pricing_burst_per_key`), or raise RateLimited (429 with Retry-After)."""
    shape = (settings.pricing_rate_per_key, settings.pricing_burst_per_key)
    with _pricing_lock:
        limiter = _pricing_rates.setdefault(shape, KeyRateLimiter(*shape, what="pricing requests"))
    limiter.take(key_id)


@contextmanager
def pricing_slot(settings: ServiceSettings) -> Iterator[None]:
    """Hold one of the process's `settings.pricing_slots` accountant slots (bounded waiting).

    Routes run in the request thread pool; this keeps accountant work (milliseconds with the default
    accountant, seconds with `paper`) from ever taking more than a few of its threads, so reads and
    other submissions go on while quotes are priced.
    """
    with _pricing_lock:
        slots = _pricing_slots.setdefault(
            settings.pricing_slots, threading.BoundedSemaphore(settings.pricing_slots)
        )
    if not slots.acquire(timeout=settings.pricing_wait_seconds):
        raise AccountantBusy(
            "the accountant is busy pricing other jobs; nothing was reserved; try again shortly"
        )
    try:
        yield
    finally:
        slots.release()
