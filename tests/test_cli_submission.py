"""`vips fit` against a server never charges unseen (issue 11.2): it sends an Idempotency-Key, resends a
timed-out submission with it, prints the job id at once, says how to recover after Ctrl-C, and
`--wait --timeout` stops waiting with a non-zero exit while the job goes on."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from control.store.models import jobs
from service.http.client import VipsClient
from tests.dbservers import fresh_database
from tests.test_api import Api, make_api
from vips.cli import main
from vips.commands.fit import parse_options

FIT = ["fit", "--dataset", "priv", "--model", "blr", "--iterations", "5", "--batch-size", "100"]


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with fresh_database("sqlite", tmp_path, "control") as url:
        yield from make_api(url, tmp_path)


class Flaky:
    """Stands between the CLI and the app: `fail(request)` may raise instead of passing it on, before
    (the request is lost) or after (the answer is lost) the app handled it."""

    def __init__(self, api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
        self.api = api
        self.posts: list[httpx.Request] = []
        self.lose_answers = 0
        self.interrupt = False
        client = api.client
        real = client.request

        def request(method: str, url: Any, **kwargs: Any) -> httpx.Response:
            if method == "POST" and str(url).endswith("/v1/jobs"):
                if self.interrupt:
                    raise KeyboardInterrupt
                response = real(method, url, **kwargs)
                self.posts.append(response.request)
                if self.lose_answers:
                    self.lose_answers -= 1
                    raise httpx.ReadTimeout("timed out", request=response.request)
                return response
            return real(method, url, **kwargs)

        monkeypatch.setattr(client, "request", request)
        monkeypatch.setattr(client, "close", lambda: None)  # each CLI run closes its client
        key = api.keys["analyst"]
        monkeypatch.setattr(
            VipsClient,
            "from_env",
            classmethod(lambda cls, env=None: cls("http://testserver", key, http=client)),
        )

    def job_count(self) -> int:
        with self.api.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(jobs)).scalar_one())


def test_a_timed_out_submission_is_resent_with_the_same_key_and_is_one_job(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    flaky = Flaky(api, monkeypatch)
    flaky.lose_answers = 2  # the server acts on each attempt but its answers are lost
    assert main([*FIT, "--sigma", "2"]) == 0
    out, err = capsys.readouterr()
    assert err.count("resending with the same idempotency key") == 2
    keys = {request.headers["Idempotency-Key"] for request in flaky.posts}
    assert len(flaky.posts) == 3 and len(keys) == 1
    assert flaky.job_count() == 1 and out.strip() == api.queue.sent[0]


def test_ctrl_c_during_submission_says_how_to_recover_without_a_second_job(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    flaky = Flaky(api, monkeypatch)
    flaky.interrupt = True
    assert main([*FIT, "--sigma", "2", "--idempotency-key", "mine-1"]) == 130
    assert "--idempotency-key mine-1" in capsys.readouterr().err
    flaky.interrupt = False
    assert main([*FIT, "--sigma", "2", "--idempotency-key", "mine-1"]) == 0
    first = capsys.readouterr().out.strip()
    assert main([*FIT, "--sigma", "2", "--idempotency-key", "mine-1"]) == 0  # again: the same job
    assert capsys.readouterr().out.strip() == first and flaky.job_count() == 1


@pytest.mark.slow
def test_wait_timeout_stops_waiting_and_the_job_goes_on(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    Flaky(api, monkeypatch)  # no worker: the job stays queued
    assert main([*FIT, "--sigma", "2", "--wait", "--timeout", "0.3"]) == 124
    err = capsys.readouterr().err
    job_id = api.queue.sent[0]
    assert job_id in err and f"vips job {job_id}" in err and f"vips cancel {job_id}" in err
    assert main(["job", job_id]) == 0
    assert '"status": "queued"' in capsys.readouterr().out
    assert main(["cancel", job_id]) == 0
    assert '"status": "cancelled"' in capsys.readouterr().out  # a queued job is cancelled at once


def test_timeout_without_wait_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*FIT, "--sigma", "2", "--timeout", "5"]) == 2
    assert "--timeout is for --wait" in capsys.readouterr().err


def test_an_unreachable_server_is_not_a_timeout(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VIPS_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("VIPS_API_KEY", "vips_x")
    assert main([*FIT, "--sigma", "2"]) == 1
    err = capsys.readouterr().err
    assert "cannot reach the VIPS service" in err and "did not answer" not in err


def test_the_printed_idempotency_key_gets_the_same_job_back(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 24.2: the automatic key is printed with the job id, so a rerun after Ctrl-C can reuse it."""
    flaky = Flaky(api, monkeypatch)
    assert main([*FIT, "--sigma", "2"]) == 0
    out, err = capsys.readouterr()
    job_id, key = out.strip(), flaky.posts[0].headers["Idempotency-Key"]
    assert f"job {job_id} submitted with idempotency key {key}" in err and f"vips wait {job_id}" in err
    assert main([*FIT, "--sigma", "2", "--idempotency-key", key]) == 0
    assert capsys.readouterr().out.strip() == job_id and flaky.job_count() == 1


@pytest.mark.slow
def test_wait_reattaches_and_ends_as_fit_wait_does(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    Flaky(api, monkeypatch)  # no worker: the job stays queued
    assert main([*FIT, "--sigma", "2"]) == 0
    job_id = capsys.readouterr().out.strip()
    assert main(["wait", job_id[:8], "--timeout", "0.3"]) == 124
    err = capsys.readouterr().err
    assert f"vips wait {job_id}" in err and f"vips cancel {job_id}" in err
    assert main(["wait", job_id, "-o", str(tmp_path / "missing" / "p.json")]) == 1
    assert "directory" in capsys.readouterr().err  # refused before waiting
    assert main(["cancel", job_id]) == 0
    capsys.readouterr()
    assert main(["wait", job_id]) == 1  # as fit --wait: the finished job, non-zero unless it succeeded
    out, _ = capsys.readouterr()
    assert json.loads(out)["status"] == "cancelled"
    assert main(["wait", "0123456789abcdef"]) == 1
    assert capsys.readouterr().err.startswith("vips: error: ")


def test_whole_number_options_are_echoed_as_integers(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 24.8: `topics: 50`, not 50.0, in the job the service echoes and in `fit --local`'s line."""
    assert parse_options(["topics=50", "alpha=0.5", "doc_length=100.0"], "lda") == {
        "topics": 50,
        "alpha": 0.5,
        "doc_length": 100,
    }
    assert type(parse_options(["topics=50"], "lda")["topics"]) is int
    Flaky(api, monkeypatch)
    assert main([*FIT, "--sigma", "2", "--option", "noise_aware=1", "--option", "tau0=2"]) == 0
    job_id = capsys.readouterr().out.strip()
    assert main(["job", job_id]) == 0
    echoed = capsys.readouterr().out
    assert '"noise_aware": 1,' in echoed or '"noise_aware": 1}' in echoed
    assert json.loads(echoed)["options"] == {"noise_aware": 1, "tau0": 2.0}
