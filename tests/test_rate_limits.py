"""Per-key token buckets (service.rate_limits): bursts, refill, per-key isolation, Retry-After."""

from __future__ import annotations

import pytest

from service import rate_limits
from service.errors import RateLimited
from service.rate_limits import KeyRateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_key_gets_its_burst_then_waits_for_the_refill(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(rate_limits.time, "monotonic", clock)
    limiter = KeyRateLimiter(rate=0.5, burst=3, what="quotes")
    for _ in range(3):
        limiter.take("a")
    with pytest.raises(RateLimited) as refused:
        limiter.take("a")
    assert refused.value.status_code == 429 and refused.value.retry_after == 2  # one token per 2 s
    assert refused.value.headers == {"Retry-After": "2"} and "quotes" in refused.value.detail
    limiter.take("b")  # another key has its own bucket
    clock.now += 1.9
    with pytest.raises(RateLimited):
        limiter.take("a")
    clock.now += 0.2
    limiter.take("a")  # 2.1 s later: one token back
    clock.now += 100
    for _ in range(3):  # refilled to the burst, never beyond
        limiter.take("a")
    with pytest.raises(RateLimited):
        limiter.take("a")


def test_idle_keys_are_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(rate_limits.time, "monotonic", clock)
    limiter = KeyRateLimiter(rate=10.0, burst=1, what="quotes")
    for n in range(2000):
        limiter.take(f"key{n}")
        clock.now += 0.01
    assert len(limiter._buckets) < 1100


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 1), (1.0, 0), (-1.0, 5)])
def test_a_limit_that_admits_nothing_is_refused(rate: float, burst: int) -> None:
    with pytest.raises(ValueError):
        KeyRateLimiter(rate, burst, "quotes")
