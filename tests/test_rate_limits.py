"""Per-key token buckets (control.rate_limits): bursts, refill, per-key isolation, Retry-After; and the
API's read limit per key built on them (service.http.auth.read_slot), and the in-flight share per key."""

from __future__ import annotations

from pathlib import Path

import pytest

from control import rate_limits
from control.errors import RateLimited
from control.rate_limits import KeyRateLimiter
from control.settings import ServiceSettings
from tests.dbservers import fresh_database
from tests.test_api import Api, make_api


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


def test_a_key_over_its_read_rate_gets_429_while_another_keys_reads_go_on(tmp_path: Path) -> None:
    """Reads (GET) of the API count against their key's bucket (VIPS_READ_RATE_PER_KEY, bursts of
    VIPS_READ_BURST_PER_KEY): past its burst a custodian reading its ledger gets 429 with Retry-After,
    the other custodian's and an analyst's reads are still answered, and writes are not counted."""
    with fresh_database("sqlite", tmp_path, "control") as url:
        for api in make_api(url, tmp_path, read_rate_per_key=0.01, read_burst_per_key=5):
            for _ in range(5):
                assert api.call("GET", "/v1/datasets/priv/ledger", "cust").status_code == 200
            refused = api.call("GET", "/v1/datasets/priv/ledger", "cust")
            assert refused.status_code == 429, refused.text
            assert int(refused.headers["Retry-After"]) >= 1
            assert "reads" in refused.json()["detail"]
            assert api.call("GET", "/v1/datasets/cust", "cust").status_code == 429  # any read of that key
            for _ in range(5):
                assert api.call("GET", "/v1/datasets/other/ledger", "cust2").status_code == 200
                assert api.call("GET", "/v1/datasets", "analyst").status_code == 200
            # A write of the limited key is not a read: its budget can still be set.
            update = {"epsilon": 5.0, "delta": 1e-6}
            assert api.call("PUT", "/v1/datasets/priv/budget", "cust", json=update).status_code == 200


def test_the_default_read_limit_is_far_above_a_dashboard_or_a_polling_client() -> None:
    settings = ServiceSettings()
    assert settings.read_rate_per_key >= 10 and settings.read_burst_per_key >= 100


class SteppedTime:
    """A stand-in for the `time` module of the limiter and the client: sleep advances monotonic (unless
    `frozen`) and is recorded."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []
        self.frozen = False

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        if not self.frozen:
            self.now += seconds


def test_the_client_waits_out_a_429_as_its_retry_after_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 52 item 8: a read refused with 429 is sent again after the answer's Retry-After (the notebook
    Client and the CLI share this transport), so a key's burst slows its reads instead of failing them;
    past READ_RETRIES the 429 is raised, naming the read limit. Writes are not retried."""
    from service.http import client as http_client
    from service.http.client import READ_RETRIES, ApiError, VipsClient

    clock = SteppedTime()
    monkeypatch.setattr(rate_limits, "time", clock)
    monkeypatch.setattr(http_client, "time", clock)
    with fresh_database("sqlite", tmp_path, "control") as url:
        for api in make_api(url, tmp_path, read_rate_per_key=0.5, read_burst_per_key=2):
            client = VipsClient("http://testserver", api.keys["cust"], http=api.client)
            for _ in range(4):
                assert "priv" in [d["name"] for d in client.datasets()]
            assert clock.slept == [2.0, 2.0]  # a token every 2 s: the 3rd and 4th reads waited one each
            clock.frozen, clock.slept = True, []
            with pytest.raises(ApiError) as refused:
                client.datasets()
            assert refused.value.status_code == 429 and "reads" in refused.value.detail
            assert clock.slept == [2.0] * READ_RETRIES


def test_waiting_clients_poll_once_a_second() -> None:
    """The read limit's sizing assumes `vips wait` and Client.wait poll once a second."""
    import inspect

    from service.http.client import POLL_SECONDS, VipsClient
    from vips.client import Client

    assert POLL_SECONDS == 1.0
    for wait in (VipsClient.wait, Client.wait):
        assert inspect.signature(wait).parameters["interval"].default == POLL_SECONDS


def test_a_key_holds_at_most_its_in_flight_reads_and_each_leaves_its_slot() -> None:
    limiter = rate_limits.KeyInFlight(2, "reads")
    limiter.enter("a")
    limiter.enter("a")
    with pytest.raises(RateLimited) as refused:
        limiter.enter("a")
    assert refused.value.retry_after == 1 and "at most 2 in flight" in refused.value.detail
    limiter.enter("b")  # another key has its own share
    limiter.leave("a")
    limiter.enter("a")
    assert limiter.in_flight("a") == 2 and limiter.in_flight("b") == 1
    for key in ("a", "a", "b"):
        limiter.leave(key)
    assert limiter.in_flight("a") == limiter.in_flight("b") == 0
    with pytest.raises(ValueError):
        rate_limits.KeyInFlight(0, "reads")


def test_a_key_with_its_reads_in_flight_gets_429_while_another_keys_reads_go_on(tmp_path: Path) -> None:
    """VIPS_READS_IN_FLIGHT_PER_KEY: while two of a custodian's reads (API or dashboard) are being
    answered, its third is refused with Retry-After 1 and another key's reads are answered; once they
    end, its reads are answered again (the slot is left on every path)."""
    import threading
    from unittest import mock

    from control.budgets import datasets as budget_datasets
    from service.routes import datasets as dataset_routes

    release = threading.Event()
    entered = threading.Semaphore(0)
    real = budget_datasets.budget_or_none

    def slow(engine: object, name: str) -> object:
        if name == "priv":
            entered.release()
            assert release.wait(timeout=600)
        return real(engine, name)  # type: ignore[arg-type]

    with fresh_database("sqlite", tmp_path, "control") as url:
        for api in make_api(url, tmp_path, reads_in_flight_per_key=2):
            answers: list[int] = []

            def read(api: Api = api, answers: list[int] = answers) -> None:
                answers.append(api.call("GET", "/v1/datasets/priv", "cust").status_code)

            with mock.patch.object(dataset_routes, "budget_or_none", slow):
                held = [threading.Thread(target=read) for _ in range(2)]
                for thread in held:
                    thread.start()
                for _ in held:
                    assert entered.acquire(timeout=600)
                refused = api.call("GET", "/v1/datasets/cust", "cust")
                assert refused.status_code == 429 and refused.headers["Retry-After"] == "1", refused.text
                assert "at once" in refused.json()["detail"]
                assert api.call("GET", "/v1/datasets/other", "cust2").status_code == 200
                release.set()
                for thread in held:
                    thread.join(timeout=600)
                assert answers == [200, 200]
            assert api.call("GET", "/v1/datasets/priv", "cust").status_code == 200
            for _ in range(3):  # errors leave their slot too
                assert api.call("GET", "/v1/datasets/nope", "cust").status_code == 404
            assert api.call("GET", "/v1/datasets/priv", "cust").status_code == 200
