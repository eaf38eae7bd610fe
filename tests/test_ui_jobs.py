"""The dashboard's jobs for every role, its convergence signal and a budget below its spend (issue 23),
through the app in process: each role's jobs on /ui and on a dataset page are exactly those of GET
/v1/jobs, newest first and paginated; an analyst never sees another key's job or name; the convergence
plot is a replay of the releases with labelled axes and plain ticks; a cap at or below the spend is
accepted with a warning and shown as such. tests/test_ui_browser.py clicks through the same pages."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import insert

from control.store.keys import create_key
from control.store.models import jobs
from privacy_wall.ledger import database as ledger_db
from service.ui import convergence, views
from service.ui.views import JOBS_PER_PAGE
from tests.dbservers import fresh_database
from tests.test_api import Api, charge, finish, make_api, store_release
from tests.test_ui import csrf, sign_in

ROLES = ("admin", "cust", "cust2", "analyst", "alice", "bob", "client", "client_other")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with fresh_database("sqlite", tmp_path, "control") as url:
        for made in make_api(url, tmp_path):
            for name in ("alice", "bob"):
                made.ids[name], made.keys[name] = create_key(
                    made.engine, "analyst", all_datasets=True, name=name
                )
            yield made


def job_links(page: str) -> list[str]:
    """The job ids a page links to, in page order."""
    return re.findall(r'<a href="/ui/jobs/([0-9a-f]{32})">', page)


def test_each_role_sees_the_jobs_it_reads_over_http_and_no_other_keys_name(api: Api) -> None:
    alice = [api.submit("alice").json()["id"] for _ in range(2)]
    bob = api.submit("bob").json()["id"]
    other = api.submit("alice", dataset="other").json()["id"]
    for who in ROLES:
        sign_in(api, who)
        everywhere = [j["id"] for j in api.call("GET", "/v1/jobs", who).json()]
        assert job_links(api.client.get("/ui").text) == everywhere, who
        if api.client.get("/ui/datasets/priv").status_code == 200:
            on_priv = [j["id"] for j in api.call("GET", "/v1/jobs?dataset=priv", who).json()]
            assert job_links(api.client.get("/ui/datasets/priv").text) == on_priv, who
        for job_id in everywhere:  # each listed job opens
            assert api.client.get(f"/ui/jobs/{job_id}").status_code == 200
    sign_in(api, "alice")
    page = api.client.get("/ui").text + api.client.get("/ui/datasets/priv").text
    assert job_links(api.client.get("/ui").text) == [other, *alice[::-1]]  # newest first
    assert bob not in page and "bob" not in page and api.ids["bob"] not in page
    assert api.client.get(f"/ui/jobs/{bob}").status_code == 404
    sign_in(api, "cust")  # the custodian sees both names next to the jobs, with the keys' ids
    page = api.client.get("/ui/datasets/priv").text
    assert set(job_links(page)) == {*alice, bob} and "alice" in page and "bob" in page
    assert api.ids["bob"] in page and other not in page
    sign_in(api, "client_other")
    assert job_links(api.client.get("/ui").text) == [other]


def add_job(api: Api, who: str, minutes: int) -> str:
    """A finished job of `who` on priv, submitted `minutes` after a fixed moment (the API's rate limits
    keep a test from submitting dozens at once)."""
    job_id = f"{minutes:08x}" + "ab" * 12
    created = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=minutes)
    with api.engine.begin() as conn:
        conn.execute(
            insert(jobs).values(
                id=job_id, dataset="priv", owner=api.ids[who], model="blr", algorithm="vips", options={},
                iterations=1, batch_size=10, sigma=1.0, epsilon_target=None, epsilon_job=None, delta=1e-5,
                status="succeeded", iteration=1, cancel_requested=False, created_at=created,
                started_at=created, finished_at=created,
            )
        )  # fmt: skip
    return job_id


def test_jobs_are_paginated_newest_first_on_both_pages(api: Api) -> None:
    submitted = [add_job(api, "alice", minutes) for minutes in range(JOBS_PER_PAGE + 3)]
    newest = submitted[::-1]
    sign_in(api, "alice")
    for base in ("/ui", "/ui/datasets/priv"):
        first = api.client.get(base).text
        assert job_links(first) == newest[:JOBS_PER_PAGE]
        assert f'href="{base}?page=1">older jobs' in first and "newer jobs" not in first
        second = api.client.get(f"{base}?page=1").text
        assert job_links(second) == newest[JOBS_PER_PAGE:]
        assert f'href="{base}?page=0">newer jobs' in second and "older jobs" not in second
        assert "No older jobs" in api.client.get(f"{base}?page=2").text
        assert api.client.get(f"{base}?page=-1").status_code == 422


def test_the_job_page_links_to_the_posterior_for_every_reader(api: Api) -> None:
    job_id = api.submit("alice", iterations=1).json()["id"]
    charge(api.engine, job_id, 1)
    finish(api.engine, job_id, {"model": "blr", "algorithm": "vips", "mean": [0.0, 1.0, 2.0],
                                "covariance": np.eye(3).tolist()})  # fmt: skip
    for who in ("alice", "cust", "admin", "client"):
        sign_in(api, who)
        page = api.client.get(f"/ui/jobs/{job_id}").text
        assert f'href="/ui/jobs/{job_id}/posterior.json"' in page, who
        assert api.client.get(f"/ui/jobs/{job_id}/posterior.json").json()["mean"] == [0.0, 1.0, 2.0]


#: Long jobs whose price stays within the fixture's budget (the releases below are stored, not computed).
LIGHT_SIGMA = 20.0


def _blr_releases(api: Api, job_id: str, iterations: int, noise: float, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    s1, s2 = np.array([0.1, -0.2, 0.05]), np.eye(3) * 0.2
    for t in range(1, iterations + 1):
        statistics = {"s1": s1 + rng.normal(0, noise, 3), "s2": s2 + rng.normal(0, noise, (3, 3))}
        store_release(api.engine, job_id, t, statistics, {"s1": noise, "s2": noise})


def test_the_convergence_signal_replays_the_releases_and_falls(api: Api) -> None:
    job_id = api.submit("alice", iterations=60, sigma=LIGHT_SIGMA).json()["id"]
    _blr_releases(api, job_id, 40, noise=0.01)
    from service.routes.job_reads import get_job

    job = get_job(api.engine, job_id)
    assert job is not None
    shown = convergence.curve(api.engine, job, 1000)
    assert shown.iterations == tuple(range(2, 41)) and shown.last == 40
    # rho_t = 1/t: the update is (s_t - mean of s_1..s_(t-1)) / t, so it falls, but the noise keeps it above 0
    assert np.mean(shown.values[-10:]) < np.mean(shown.values[:5]) / 5 and min(shown.values) > 0
    # the same replay by hand: nu_t is the running mean of N s_t
    blocks = []
    rng = np.random.default_rng(0)
    for _ in range(40):
        blocks.append(np.concatenate([np.array([0.1, -0.2, 0.05]) + rng.normal(0, 0.01, 3),
                                      (np.eye(3) * 0.2 + rng.normal(0, 0.01, (3, 3))).ravel()]))  # fmt: skip
    means = np.cumsum(blocks, axis=0) / np.arange(1, 41)[:, None]
    expected = 100 * np.linalg.norm(np.diff(means, axis=0), axis=1) / np.linalg.norm(means[1:], axis=1)
    assert np.allclose(shown.values, expected, rtol=1e-9)
    # a new release extends the cached trace; nothing is recomputed from the start
    _blr_releases_from(api, job_id, 41, 45)
    longer = convergence.curve(api.engine, job, 1000)
    assert longer.iterations[:39] == shown.iterations and longer.values[:39] == shown.values
    assert longer.last == 45


def _blr_releases_from(api: Api, job_id: str, first: int, last: int) -> None:
    for t in range(first, last + 1):
        store_release(api.engine, job_id, t, {"s1": np.full(3, 0.1), "s2": np.eye(3) * 0.2}, {"s1": 0.0})


def test_the_convergence_plot_has_words_on_its_axes_and_plain_ticks(api: Api) -> None:
    job_id = api.submit("alice", iterations=60, sigma=LIGHT_SIGMA).json()["id"]
    _blr_releases(api, job_id, 30, noise=0.01)
    views.clear_caches()
    sign_in(api, "alice")
    page = api.client.get(f"/ui/jobs/{job_id}").text
    assert convergence.NATURAL.caption in html.unescape(page) and "keeps it from reaching zero" in page
    svg = api.client.get(f"/ui/jobs/{job_id}/convergence.svg")
    assert svg.status_code == 200 and svg.headers["content-type"] == "image/svg+xml"
    texts = re.findall(r"<!-- (.*?) -->", svg.text)  # matplotlib names each text it draws as paths
    assert "iteration" in texts and convergence.NATURAL.label in texts
    ticks = [t for t in texts if re.fullmatch(r"[0-9.,]+%?", t)]
    assert len(ticks) >= 4 and not any("10^" in t or "e" in t or "x" in t for t in texts if t in ticks)
    assert all(not re.search(r"\bs\d?\b", t) for t in texts)  # no s1, s2 or s legend
    # cached by (job, iterations released): the same bytes until a new release
    assert api.client.get(f"/ui/jobs/{job_id}/convergence.svg").content == svg.content
    _blr_releases_from(api, job_id, 31, 31)
    assert api.client.get(f"/ui/jobs/{job_id}/convergence.svg").content != svg.content
    # a client reads the posterior but not the releases: no plot for it
    sign_in(api, "client")
    assert api.client.get(f"/ui/jobs/{job_id}/convergence.svg").status_code == 404


def test_a_running_job_page_reloads_at_the_plots_pace(api: Api) -> None:
    from service.ui.routes import RUNNING_REFRESH_SECONDS

    job_id = api.submit("alice").json()["id"]
    sign_in(api, "alice")
    page = api.client.get(f"/ui/jobs/{job_id}").text
    assert f'<meta http-equiv="refresh" content="{RUNNING_REFRESH_SECONDS}">' in page
    assert RUNNING_REFRESH_SECONDS >= 5


def test_a_budget_below_the_spend_is_accepted_with_a_warning_and_shown_red(api: Api) -> None:
    job_id = api.submit("alice", iterations=2).json()["id"]
    charge(api.engine, job_id, 1)
    charge(api.engine, job_id, 2)
    finish(api.engine, job_id)
    spent = ledger_db.budget_status(api.engine, "priv").epsilon_spent
    r = api.call("PUT", "/v1/datasets/priv/budget", "cust", json={"epsilon": spent * 2, "delta": 1e-5})
    assert r.status_code == 200 and r.json()["warning"] is None
    sign_in(api, "cust")
    assert "exhausted" not in api.client.get("/ui/datasets/priv").text
    r = api.call("PUT", "/v1/datasets/priv/budget", "cust", json={"epsilon": spent / 2, "delta": 1e-5})
    assert r.status_code == 200
    body = r.json()
    assert body["epsilon"] == spent / 2 and body["epsilon_remaining"] == 0
    assert "no job can be admitted" in body["warning"] and "priv" in body["warning"]
    for path in ("/ui", "/ui/datasets/priv"):
        page = api.client.get(path).text
        assert 'class="bar exhausted"' in page and "no job can be admitted" in page, path
    assert api.submit("alice", iterations=1).status_code == 409  # and indeed none is
    # the form answers the same way and the page says it
    token = csrf(api, "/ui/datasets/priv")
    r = api.client.post("/ui/datasets/priv/budget", data={"epsilon": str(spent / 3), "delta": "1e-05",
                                                          "csrf_token": token})  # fmt: skip
    assert r.status_code == 200 and "no job can be admitted" in r.text


def test_reserved_is_spent_plus_in_flight_on_the_page_as_over_http(api: Api) -> None:
    running = api.submit("alice", iterations=5).json()["id"]
    charge(api.engine, running, 1)
    budget = api.call("GET", "/v1/datasets/priv", "cust").json()["budget"]
    assert budget["epsilon_reserved"] > budget["epsilon_spent"] > 0
    sign_in(api, "cust")
    page = api.client.get("/ui/datasets/priv").text
    assert f"<dt>reserved epsilon</dt><dd>{budget['epsilon_reserved']:.4g}</dd>" in page
    assert f"<dt>spent epsilon</dt><dd>{budget['epsilon_spent']:.4g}</dd>" in page
    in_flight = budget["epsilon_reserved"] - budget["epsilon_spent"]
    assert f"<dt>in flight epsilon</dt><dd>{in_flight:.4g}</dd>" in page
    assert "less than the sum" not in api.client.get("/ui").text  # the footnote that was not always true
    schema = api.client.get("/openapi.json").json()["components"]["schemas"]["BudgetPublic"]
    assert "spent plus in flight" in schema["properties"]["epsilon_reserved"]["description"]


def test_the_dpvi_signal_is_the_workers_own_adagrad_replayed(api: Api) -> None:
    """The service's replay of DPVI's steps (it may not import the worker) against the worker's model."""
    from service.routes.job_reads import get_job
    from vips.models.blr.dpvi import DpviLogisticRegression

    job_id = api.submit("alice", iterations=50, sigma=LIGHT_SIGMA).json()["id"]
    with api.engine.begin() as conn:
        conn.execute(jobs.update().where(jobs.c.id == job_id).values(
            algorithm="dpvi", options={"learning_rate": 0.3, "prior_variance": 2.0}))  # fmt: skip
    rng = np.random.default_rng(5)
    gradients = [rng.normal(0, 1e-3, 6) + np.r_[1e-3, -2e-3, 0, 0, 0, 0] for _ in range(30)]
    for t, g in enumerate(gradients, start=1):
        store_release(api.engine, job_id, t, {"gradient": g}, {"gradient": 1e-3})
    job = get_job(api.engine, job_id)
    assert job is not None
    shown = convergence.curve(api.engine, job, 1000)
    model = DpviLogisticRegression(prior_variance=2.0, learning_rate=0.3)
    state, expected = model.initial_state(3), []
    for g in gradients:
        after = model.m_step(state, {"gradient": g}, 1000, 1.0)
        expected.append(float(np.sqrt(np.mean(((after.mean - state.mean) / np.exp(after.log_std)) ** 2))))
        state = after
    assert shown.signal is convergence.DPVI and shown.iterations == tuple(range(1, 31))
    assert np.allclose(shown.values, expected, rtol=1e-12)
    assert np.mean(shown.values[-5:]) < np.mean(shown.values[:5])  # AdaGrad's steps shrink
