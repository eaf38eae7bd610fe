"""Per-key request rates: a token bucket per API key, in this API process.

A key may make `burst` requests at once and `rate` per second after that; a request beyond it is refused
with the seconds until a token is back (the 429's Retry-After). Each API process keeps its own buckets, so
a deployment of P processes admits at most P times the rate; the budget never depends on it (every
admission is checked against the ledger), only the accountant's CPU does.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

from control.errors import RateLimited


@dataclass
class _Bucket:
    tokens: float
    updated: float


class KeyRateLimiter:
    """Token buckets by key id: `burst` tokens, refilled at `rate` per second; idle keys are forgotten."""

    def __init__(self, rate: float, burst: int, what: str) -> None:
        if not (rate > 0 and burst >= 1):
            raise ValueError("a rate limit needs rate > 0 and burst >= 1")
        self._rate, self._burst, self._what = rate, float(burst), what
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def take(self, key_id: str) -> None:
        """Spend one token of this key, or raise RateLimited saying when to retry."""
        now = time.monotonic()
        with self._lock:
            bucket = self._buckets.get(key_id) or _Bucket(self._burst, now)
            bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.updated) * self._rate)
            bucket.updated = now
            self._buckets[key_id] = bucket
            if bucket.tokens >= 1.0:
                bucket.tokens -= 1.0
                self._forget_full(now)
                return
            wait = math.ceil((1.0 - bucket.tokens) / self._rate)
        raise RateLimited(
            f"too many {self._what} from this key: at most {self._burst:g} at once and {self._rate:g} per "
            f"second; retry in {wait} s",
            retry_after=wait,
        )

    def _forget_full(self, now: float) -> None:
        """Drop buckets that have refilled (their keys are idle): memory stays bounded by active keys."""
        if len(self._buckets) < 1024:
            return
        refill = self._burst / self._rate
        self._buckets = {k: b for k, b in self._buckets.items() if now - b.updated < refill}


class KeyInFlight:
    """At most `limit` requests of one key at once in this process: one key's many threads cannot take
    every request thread and core while other keys wait (a fair share per key, beside the rate limit that
    bounds how many it makes per second). A request beyond it is refused with Retry-After 1."""

    def __init__(self, limit: int, what: str) -> None:
        if limit < 1:
            raise ValueError("an in-flight limit needs limit >= 1")
        self._limit, self._what = limit, what
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def enter(self, key_id: str) -> None:
        """Count one more request of this key in flight, or raise RateLimited; pair with leave()."""
        with self._lock:
            held = self._held.get(key_id, 0)
            if held < self._limit:
                self._held[key_id] = held + 1
                return
        raise RateLimited(
            f"too many {self._what} from this key at once: at most {self._limit} in flight; retry in 1 s",
            retry_after=1,
        )

    def leave(self, key_id: str) -> None:
        with self._lock:
            held = self._held.get(key_id, 0) - 1
            if held > 0:
                self._held[key_id] = held
            else:
                self._held.pop(key_id, None)

    def in_flight(self, key_id: str) -> int:
        with self._lock:
            return self._held.get(key_id, 0)
