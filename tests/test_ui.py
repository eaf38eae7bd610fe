"""The dashboard (/ui) through the app in process: sign-in and its cookie, sessions that end with their
key, the scope of each role (the same as over /v1), CSRF on every form, the budget form's checks, and
the spend curve against the ledger. tests/test_ui_browser.py drives the same pages in Chromium."""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from control.planning import coverage
from control.store.keys import Principal, revoke_key
from privacy_wall.ledger import database as ledger_db
from service.ui import spend_curve as spend_curves
from service.ui.sessions import COOKIE, find_session, open_session
from service.ui.spend_curve import spend_curve
from tests.dbservers import fresh_database
from tests.test_api import Api, charge, finish, make_api

ROLES = ("admin", "cust", "cust2", "analyst", "client", "client_other")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with fresh_database("sqlite", tmp_path, "control") as url:
        yield from make_api(url, tmp_path)


def sign_in(api: Api, who: str) -> None:
    api.client.cookies.clear()
    r = api.client.post("/ui/signin", data={"api_key": api.keys[who]}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui", r.text


def csrf(api: Api, path: str = "/ui") -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', api.client.get(path).text)
    assert match is not None
    return match.group(1)


#: A VIPS-BLR posterior of the fixture's three features, widened along its last step (as its kind is).
POSTERIOR = {"model": "blr", "algorithm": "vips", "mean": [1.0, -2.0, 0.5],
             "covariance": [[0.25, 0, 0], [0, 1.0, 0], [0, 0, 0.01]],
             "variational_parameters": {"last_step": [0.1, 0.0, 0.0]}}  # fmt: skip


def finished_job(api: Api, iterations: int = 3, document: dict[str, Any] = POSTERIOR, **spec: Any) -> str:
    job_id: str = api.submit(iterations=iterations, **spec).json()["id"]
    for t in range(1, iterations + 1):
        charge(api.engine, job_id, t)
    finish(api.engine, job_id, document)
    return job_id


def test_sign_in_sets_a_strict_http_only_cookie_that_expires(api: Api) -> None:
    r = api.client.post("/ui/signin", data={"api_key": api.keys["cust"]}, follow_redirects=False)
    assert r.status_code == 303
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=")
    for attribute in ("HttpOnly", "SameSite=strict", "Path=/ui", "Max-Age=28800"):
        assert attribute in cookie, cookie
    assert api.keys["cust"] not in cookie  # the cookie is a random token, never the key
    page = api.client.get("/ui")
    assert page.status_code == 200 and "Datasets" in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]


@pytest.mark.parametrize("key", ["", "vips_0123456789abcdef_wrong", "not a key"])
def test_a_wrong_key_sees_nothing(api: Api, key: str) -> None:
    r = api.client.post("/ui/signin", data={"api_key": key}, follow_redirects=False)
    assert r.status_code == 401 and "invalid, revoked or expired" in r.text
    assert COOKIE not in r.headers.get("set-cookie", "")
    for path in ("/ui", "/ui/datasets/priv", "/ui/datasets/priv/epsilon.svg"):
        r = api.client.get(path, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/ui/signin"


def test_a_session_ends_with_its_expiry_and_with_its_key(api: Api) -> None:
    principal = Principal(api.ids["cust"], "custodian", "priv")
    token, _ = open_session(api.engine, principal, timedelta(seconds=-1))
    assert find_session(api.engine, token) is None
    token, _ = open_session(api.engine, principal, timedelta(hours=1))
    assert find_session(api.engine, token) is not None
    revoke_key(api.engine, api.ids["cust"])
    assert find_session(api.engine, token) is None


@pytest.mark.parametrize("who", ROLES)
def test_each_role_sees_the_datasets_it_sees_over_http(api: Api, who: str) -> None:
    over_http = [d["name"] for d in api.call("GET", "/v1/datasets", who).json()]
    sign_in(api, who)
    page = api.client.get("/ui").text
    listed = re.findall(r'<a href="/ui/datasets/([^"]+)">', page)
    assert listed == over_http
    for name in ("priv", "other", "pub", "nobudget", "docs"):
        r = api.client.get(f"/ui/datasets/{name}")
        assert r.status_code == (200 if name in over_http else 404), (who, name)


def test_a_revoked_keys_holder_is_told_so_at_sign_in(api: Api) -> None:
    """Issue 55: the key's holder (its whole secret) learns that it was revoked; a tampered copy does not."""
    assert revoke_key(api.engine, api.ids["analyst"])
    key = api.keys["analyst"]
    r = api.client.post("/ui/signin", data={"api_key": key}, follow_redirects=False)
    assert r.status_code == 401 and "That key was revoked: ask an admin" in r.text
    tampered = key[:-1] + ("A" if key[-1] != "A" else "B")
    r = api.client.post("/ui/signin", data={"api_key": tampered}, follow_redirects=False)
    assert r.status_code == 401 and "invalid, revoked or expired" in r.text and "was revoked" not in r.text


def test_the_dataset_page_states_the_budget_and_lists_the_jobs_for_its_custodian(api: Api) -> None:
    job_id = finished_job(api)
    status = ledger_db.budget_status(api.engine, "priv")
    sign_in(api, "cust")
    page = api.client.get("/ui/datasets/priv").text
    for label in ("budget epsilon", "spent epsilon", "reserved epsilon", "remaining epsilon"):
        assert f"<dt>{label}</dt>" in page
    assert (
        f"<dd>{status.epsilon_spent:.4g}</dd>" in page and f"<dd>{status.epsilon_remaining:.4g}</dd>" in page
    )
    assert f'href="/ui/jobs/{job_id}"' in page and api.ids["analyst"] in page  # the submitting key's id
    assert 'name="epsilon"' in page
    svg = api.client.get("/ui/datasets/priv/epsilon.svg")
    assert svg.status_code == 200 and svg.headers["content-type"] == "image/svg+xml"
    assert b"<svg" in svg.content
    # nothing it loads: links only within itself (#id) or inline (data:); the namespaces are names
    assert not re.findall(rb'(?:href|src)="(?!#|data:)', svg.content)
    # an analyst sees the dataset, its budget and its own jobs, and no budget form; another analyst no job
    sign_in(api, "analyst")
    page = api.client.get("/ui/datasets/priv").text
    assert (
        "remaining epsilon" in page and 'name="epsilon"' not in page and f'href="/ui/jobs/{job_id}"' in page
    )
    sign_in(api, "analyst2")
    page = api.client.get("/ui/datasets/priv").text
    assert "remaining epsilon" in page and job_id not in page


def test_the_spend_curve_is_the_ledgers_composition_job_by_job(api: Api) -> None:
    first, second = finished_job(api, 3), finished_job(api, 2)
    curve = spend_curve(api.engine, "priv", 1e-5)
    assert curve.job_ids == [first, second]
    status = ledger_db.budget_status(api.engine, "priv")
    assert curve.cumulative[-1] == pytest.approx(status.epsilon_spent, rel=1e-9)
    alone = api.call("GET", f"/v1/jobs/{first}", "analyst").json()["epsilon_spent"]
    assert curve.cumulative[0] == pytest.approx(alone, rel=1e-9)
    assert curve.cumulative[0] < curve.cumulative[1] < 2 * curve.cumulative[0]  # composition, not a sum
    assert spend_curve(api.engine, "priv", 1e-5) is curve  # cached until the ledger changes
    finished_job(api, 1)
    assert len(spend_curve(api.engine, "priv", 1e-5).job_ids) == 3


def test_the_budget_form_checks_like_the_api(api: Api) -> None:
    sign_in(api, "cust")
    token = csrf(api, "/ui/datasets/priv")
    form = "/ui/datasets/priv/budget"
    assert api.client.post(form, data={"epsilon": "4", "delta": "1e-5"}).status_code == 403  # no token
    r = api.client.post(form, data={"epsilon": "4", "delta": "1e-5", "csrf_token": "x" + token})
    assert r.status_code == 403
    for epsilon, words in (("abc", "epsilon: abc is not a number"), ("-1", "epsilon"), ("nan", "epsilon")):
        r = api.client.post(form, data={"epsilon": epsilon, "delta": "1e-5", "csrf_token": token})
        assert r.status_code == 422 and "The budget was not changed" in r.text and words in r.text, r.text
    r = api.client.post(
        form, data={"epsilon": "4", "delta": "1e-5", "csrf_token": token}, follow_redirects=False
    )
    assert r.status_code == 303
    assert ledger_db.budget_status(api.engine, "priv").epsilon_budget == 4.0
    finished_job(api)
    r = api.client.post(form, data={"epsilon": "4", "delta": "1e-6", "csrf_token": token})
    assert r.status_code == 409  # delta is fixed once anything was charged, as over /v1
    # another custodian's dataset does not exist for this key; an analyst may not set budgets
    r = api.client.post(
        "/ui/datasets/other/budget", data={"epsilon": "4", "delta": "1e-5", "csrf_token": token}
    )
    assert r.status_code == 404
    sign_in(api, "analyst")
    token = csrf(api)
    r = api.client.post(form, data={"epsilon": "9", "delta": "1e-5", "csrf_token": token})
    assert r.status_code == 403 and "only the custodian" in r.text
    assert ledger_db.budget_status(api.engine, "priv").epsilon_budget == 4.0


def test_the_budget_form_of_a_public_dataset_sets_its_delta_only(api: Api) -> None:
    """A public dataset takes no epsilon cap (PUT budget answers 422): its form asks for delta alone."""
    sign_in(api, "admin")
    page = api.client.get("/ui/datasets/pub").text
    assert "takes no epsilon cap" in page and 'name="epsilon"' not in page
    token = csrf(api, "/ui/datasets/pub")
    form = "/ui/datasets/pub/budget"
    r = api.client.post(form, data={"delta": "1e-6", "csrf_token": token}, follow_redirects=False)
    assert r.status_code == 303, r.text
    status = ledger_db.budget_status(api.engine, "pub")
    assert status.epsilon_budget is None and status.delta == 1e-6
    r = api.client.post(form, data={"epsilon": "4", "delta": "1e-6", "csrf_token": token})
    assert r.status_code == 422 and "it takes no epsilon cap" in r.text, r.text
    token = csrf(api, "/ui/datasets/priv")  # a private dataset still needs its cap
    r = api.client.post("/ui/datasets/priv/budget", data={"delta": "1e-6", "csrf_token": token})
    assert r.status_code == 422 and "The budget was not changed" in r.text, r.text


def test_the_job_page_shows_progress_epsilon_and_the_posterior(api: Api) -> None:
    job_id = finished_job(api)
    sign_in(api, "analyst")
    page = api.client.get(f"/ui/jobs/{job_id}").text
    assert "succeeded" in page and "epsilon per iteration" in page and "epsilon spent" in page
    # beside the filter's price the budget charges, the job's own PLD price, labelled as such and lower
    job = api.call("GET", f"/v1/jobs/{job_id}", "analyst").json()
    alone = re.search(r"the job alone, by PLD</dt><dd>([0-9.e+-]+)</dd>", page)
    assert alone is not None, page
    assert 0 < float(alone.group(1)) < job["epsilon_job"]
    # how often such intervals held the truth in tests, one line under the table (control.planning.coverage)
    _, tested, _ = coverage.TESTED[("blr", "vips")].band(math.inf)  # sigma given: the largest scale's line
    assert f"nominal 90% intervals of blr by vips covered {tested} of the true weights" in page
    # coefficients named by the dataset's features, with 95% intervals: mean +- 1.96 sd
    assert '<td>b</td><td class="num">-2.0000</td><td class="num">[-3.9600, -0.0400]</td>' in page
    document = api.client.get(f"/ui/jobs/{job_id}/posterior.json")
    assert document.status_code == 200 and document.json()["mean"] == [1.0, -2.0, 0.5]
    assert "attachment" in document.headers["content-disposition"]
    # a client of another dataset does not see it
    sign_in(api, "client_other")
    assert api.client.get(f"/ui/jobs/{job_id}").status_code == 404
    assert api.client.get(f"/ui/jobs/{job_id}/posterior.json").status_code == 404


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_a_posterior_above_the_pages_limit_is_offered_not_loaded(dialect: str, tmp_path: Path) -> None:
    """Issue 34: a 277 MB LDA posterior took its dashboard page 8.6 s (parsed whole to summarise it). Above
    ui_posterior_max_mb the page and the plot never load it (job_posterior would raise here): the page
    offers the download, whose bytes are the stored document."""
    from unittest.mock import patch

    with fresh_database(dialect, tmp_path, "control") as url:
        for api in make_api(url, tmp_path, ui_posterior_max_mb=100 / (1 << 20)):  # 100 bytes
            job_id = finished_job(api)
            sign_in(api, "analyst")
            with patch("service.ui.routes.job_posterior", side_effect=AssertionError("loaded")):
                page = api.client.get(f"/ui/jobs/{job_id}")
                plot = api.client.get(f"/ui/jobs/{job_id}/posterior.svg")
            assert page.status_code == 200
            assert "This page summarises posteriors of up to 100 B" in page.text
            assert "95% credible interval" not in page.text
            assert plot.status_code == 404
            document = api.client.get(f"/ui/jobs/{job_id}/posterior.json")
            assert document.status_code == 200 and document.json()["mean"] == [1.0, -2.0, 0.5]


def test_sign_out_needs_the_token_and_ends_the_session(api: Api) -> None:
    sign_in(api, "cust")
    token = csrf(api)
    assert api.client.post("/ui/signout", data={}).status_code == 403
    assert api.client.get("/ui").status_code == 200
    r = api.client.post("/ui/signout", data={"csrf_token": token}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/signin"
    assert api.client.get("/ui", follow_redirects=False).status_code == 303


def test_the_warmer_prices_the_curves_of_changed_ledgers_ahead_of_any_view(api: Api) -> None:
    from privacy_wall.sqlengine import reading
    from service.ui import views

    finished_job(api)
    views.clear_caches()
    views.warm_spend_curves(api.engine)
    with reading(api.engine) as conn:
        state = spend_curves.ledger_state(conn, "priv", 1e-5)
    warmed = spend_curves._curves.get(state)
    assert warmed is not None and len(warmed.job_ids) == 1
    assert spend_curve(api.engine, "priv", 1e-5) is warmed


def test_a_small_jobs_page_names_the_coverage_tested_at_its_scale(api: Api) -> None:
    """Issue 51: below epsilon x N x sqrt(10 / d) = 2,000 VIPS-BLR's intervals covered far less than at
    epsilon 0.3-3; a job there (epsilon 0.5, N 1,000, d 3: 913) gets that band's line, with its caution."""
    from control.planning.schedules import job_scale

    assert job_scale("blr", "vips", 1000, 0.5, {}, 3) < 2_000
    job_id = finished_job(api, 1, epsilon=0.5, sigma=None, batch_size=None)
    sign_in(api, "analyst")
    page = api.client.get(f"/ui/jobs/{job_id}").text
    _, small, caution = coverage.TESTED[("blr", "vips")].band(913.0)
    _, large, _ = coverage.TESTED[("blr", "vips")].band(math.inf)
    assert small != large and f"covered {small} of the true weights given only epsilon" in page, page
    assert caution in html.unescape(page)
    # a posterior stored before the widening (no last_step) is not what the lines measured: no line
    unwidened = {name: value for name, value in POSTERIOR.items() if name != "variational_parameters"}
    older = finished_job(api, 1, unwidened, epsilon=0.5, sigma=None, batch_size=None)
    assert "interval-note" not in api.client.get(f"/ui/jobs/{older}").text


def test_the_interval_note_names_the_tested_coverage_and_nothing_for_untested_models() -> None:
    from control.planning.coverage import TESTED, interval_note

    assert interval_note("linreg", "vips", True) == (
        "Tested on data of known weights (docs/calibration.md), nominal 90% intervals of linreg by vips "
        "covered 86-93% of the true weights given only epsilon, at epsilon 0.3-3."
    )
    assert "covered 95-99%" in str(interval_note("linreg", "vips", True, scale=1_000.0))
    at_zero = TESTED[("blr", "vips")].at_zero
    note = str(interval_note("blr", "vips", False))
    assert note.endswith(f"covered {at_zero} of the true weights at sigma 0.")
    # DP-SEP's noise-aware mode (the default) and the paper's (noise_aware 0) have their own lines.
    small = str(interval_note("blr", "dpsep", True, {"clip": 0.3}, 1_500.0))
    assert "held 80-92% of weights of the prior's size (sd 1)" in small
    assert small.endswith("held-out log loss).")
    assert str(interval_note("blr", "dpsep", True, {"clip": 0.3}, 3_000.0)).endswith("3,000-30,000).")
    paper = str(interval_note("blr", "dpsep", True, {"noise_aware": 0, "clip": 0.25}))
    assert "(the paper's mode, noise_aware=0) covered 18-56%" in paper and paper.endswith("far too narrow).")
    assert str(interval_note("linreg", "dpsep", True, {"noise_aware": 0})).endswith(
        "so its intervals are wide."
    )
    assert "covered 87-93%" in str(interval_note("linreg", "dpsep", True, {"clip": 0.7}))
    # a paper mode no test measured gets no line (not the noise-aware mode's)
    assert interval_note("blr", "vips", True, {"noise_aware": 0}) is None
    assert interval_note("blr", "dpvi", True, {"noise_aware": 0}) is None
    assert interval_note("lda", "vips", True) is None and interval_note("sbn", "vips", False) is None
    # every (model, algorithm) with coefficients has a line, so no coefficient table goes without one
    from control.planning.schedules import RULES

    assert {key for key in RULES if key[0] in ("blr", "linreg")} == set(TESTED)


def test_an_lda_page_says_when_its_topics_are_the_private_word_frequencies() -> None:
    """Issue 55: topics that are all one word distribution (the fallback) get one line above the table
    that names it, and distinct topics none."""
    from service.ui.routes import templates
    from service.ui.views import summarize

    def lda(lam: list[list[float]]) -> dict[str, Any]:
        order = [{"word_ids": [0, 1, 2], "probabilities": [0.5, 0.3, 0.2]} for _ in lam]
        return {"model": "lda", "lambda": lam, "vocabulary": ["a", "b", "c"], "topics": order}

    block = templates.env.from_string(
        (Path(__file__).parents[1] / "service/ui/templates/job.html")
        .read_text()
        .split("{% elif summary.topics %}")[1]
        .split("<table")[0]
    )
    fallback = block.render(summary=summarize(lda([[5.0, 3.0, 2.0], [10.0, 6.0, 4.0]]), {}))
    assert 'id="lda-fallback"' in fallback and "All 2 topics are one word distribution" in fallback
    assert "lda-fallback" not in block.render(summary=summarize(lda([[5.0, 3.0, 2.0], [1.0, 1.0, 8.0]]), {}))


def test_an_sbn_summary_counts_active_units_and_the_page_names_the_fallback() -> None:
    """Issue 51: a fit whose hidden units are all off is its private pixel frequencies alone; the job page
    says so, and otherwise how many units are active."""
    from service.ui.routes import templates
    from service.ui.views import summarize

    off = {"model": "sbn", "W": [[0.0, 0.0, 0.0]] * 4, "b": [0.0] * 3, "c": [0.1] * 4}
    one = {**off, "W": [[0.0, 0.5, 0.0], [0.0, 0.0, 0.0], [0.0, -0.2, 0.0], [0.0, 0.0, 0.0]]}
    assert summarize(off, {}).active_units == 0 and summarize(one, {}).active_units == 1
    block = templates.env.from_string(
        (Path(__file__).parents[1] / "service/ui/templates/job.html")
        .read_text()
        .split('{% elif summary.model == "sbn" %}')[1]
        .split("{% if summary.square_pixels %}")[0]
    )
    assert "private pixel frequencies alone" in block.render(summary=summarize(off, {}))
    assert "1 of 3 hidden units are active" in block.render(summary=summarize(one, {}))
