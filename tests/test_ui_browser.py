"""The dashboard in a real browser: Debian's Chromium (never downloaded) driven by playwright, against
`vips up` after real jobs (BLR on a private dataset, LDA and the SBN on public ones).

Each role signs in by typing its key and pressing Enter and sees what it may see and nothing more; a
wrong key sees nothing; no request leaves the service's host; the budget form refuses an analyst and a
missing CSRF token; a screenshot of each page is not blank. A missing browser is a failure, never a skip
(`make test` installs Debian's chromium as root, else names it first: tests/prerequisites.py).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.image import imread
from playwright.sync_api import Browser, BrowserContext, FloatRect, Page, Request, sync_playwright

from service.http.client import VipsClient
from service.ui import convergence
from tests.e2e import Service, embedded_service
from tests.servers import may_use
from tests.test_e2e_latent import write_binary_csv
from vips.datasets.digits import load_binary_digits
from vips.datasets.synthetic_lda import generate_corpus, planted_topics
from vips.datasets.wikipedia import write_bag_of_words

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
#: No GPU, no QUIC, no background traffic to Google's services; a fresh profile per launch (playwright).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass
class Site:
    service: Service
    keys: dict[str, str]
    jobs: dict[str, str]
    shots: Path
    requests: list[str] = field(default_factory=list)
    #: requests the page's Content-Security-Policy stopped in the browser: they never left it
    blocked: set[str] = field(default_factory=set)


def _fit(service: Service, key: str, **spec: Any) -> str:
    """A job submitted over HTTP (as `vips fit --wait` submits it) that must succeed; its id."""
    with VipsClient(service.url, key) as api:
        job = api.submit_job(**spec)
        done = api.wait(job["id"], interval=0.2, timeout=300)
    assert done["status"] == "succeeded", done
    return str(job["id"])


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("ui")
    with embedded_service(root / "home") as service:
        service.synthetic_dataset(root, seed=1)  # n=2000, d=5
        truth = planted_topics(4, 40, seed=3)
        corpus = generate_corpus(300, truth, mean_length=40, seed=4).counts
        write_bag_of_words(corpus, [f"w{v:02d}" for v in range(40)], root / "d.docword", root / "v.txt")
        service.ingest("docs", "bow", root / "d.docword", vocab=root / "v.txt", public=True)
        write_binary_csv(root / "digits.csv", load_binary_digits("train")[:400])
        service.ingest("digits", "binary", root / "digits.csv", public=True)
        keys = {
            "admin": service.key("admin"),
            "custodian": service.key("custodian", "synth"),
            "analyst": service.key("analyst"),
            "client": service.key("client", "synth"),
            "other_client": service.key("client", "docs"),
        }
        service.set_budget("synth", 3, keys["custodian"], 1e-5)
        analyst = keys["analyst"]
        jobs = {
            "blr": _fit(service, analyst, dataset="synth", model="blr", iterations=6, epsilon=1.0),
            "lda": _fit(service, analyst, dataset="docs", model="lda", options={"topics": 4, "doc_length": 0},
                        sigma=0.0, iterations=5),
            "sbn": _fit(service, analyst, dataset="digits", model="sbn", options={"hidden": 6}, sigma=0.0,
                        iterations=4),
        }  # fmt: skip
        yield Site(service, keys, jobs, root / "shots")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    may_use("Chromium", "browser")
    assert shutil.which(CHROMIUM), (
        f"no browser at {CHROMIUM}: install Debian's chromium (apt-get install chromium; make test does)"
    )
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def context_for(browser: Browser, site: Site) -> BrowserContext:
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    context.on("request", lambda request: site.requests.append(request.url))
    context.on("requestfailed", lambda request: _blocked(site, request))
    return context


def _blocked(site: Site, request: Request) -> None:
    """Chromium reports a request its page's CSP refused as failed with "csp": it never left."""
    if request.failure in ("csp", "net::ERR_BLOCKED_BY_CSP"):
        site.blocked.add(request.url)


def sign_in(browser: Browser, site: Site, role: str) -> Page:
    """Type the key into the form's api_key input and press Enter, as a person would."""
    page = context_for(browser, site).new_page()
    page.goto(f"{site.service.url}/ui")
    assert page.url.endswith("/ui/signin")  # no session: the sign-in form
    page.fill("input[name=api_key]", site.keys[role])
    page.press("input[name=api_key]", "Enter")
    page.wait_for_url(f"{site.service.url}/ui")
    return page


def not_blank(page: Page, path: Path, full_page: bool = True) -> None:
    """A screenshot with real content: many colours, not one flat field."""
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=full_page)
    pixels = imread(path)[..., :3]
    assert pixels.std() > 0.05, f"{path} looks blank"
    assert len(np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)) > 20, path


def images_loaded(page: Page) -> int:
    """How many <img> on the page decoded to a picture (a broken plot has naturalWidth 0)."""
    widths: list[int] = page.eval_on_selector_all("img", "images => images.map(i => i.naturalWidth)")
    assert all(w > 0 for w in widths), widths
    return len(widths)


def test_the_custodian_sees_the_budget_the_spend_plot_and_the_jobs(browser: Browser, site: Site) -> None:
    page = sign_in(browser, site, "custodian")
    rows = page.locator("table.datasets tbody tr")
    assert rows.count() == 1 and "synth" in rows.first.inner_text()  # its dataset only
    for label in ("spent", "reserved", "remaining", "budget epsilon"):
        assert label in page.locator("table.datasets thead").inner_text()
    not_blank(page, site.shots / "datasets.png")
    page.get_by_role("link", name="synth", exact=True).click()
    page.wait_for_url(f"{site.service.url}/ui/datasets/synth")
    text = page.inner_text("main")
    for label in ("budget epsilon", "spent epsilon", "remaining epsilon"):
        assert label in text
    assert images_loaded(page) == 0 and page.locator("svg.plot.spend").count() == 1  # the spend plot, inline
    assert site.jobs["blr"][:8] in page.inner_text("table.jobs")
    assert page.locator("form.budget-form input[name=epsilon]").count() == 1
    not_blank(page, site.shots / "dataset.png")
    page.context.close()


def test_the_analyst_sees_the_job_and_its_posterior_summary(browser: Browser, site: Site) -> None:
    page = sign_in(browser, site, "analyst")
    assert {"synth", "docs", "digits"} <= set(page.locator("table.datasets tbody td a").all_inner_texts())
    page.goto(f"{site.service.url}/ui/datasets/synth")
    assert page.locator("input[name=epsilon]").count() == 0  # no budget form for an analyst
    page.goto(f"{site.service.url}/ui/jobs/{site.jobs['blr']}")
    text = page.inner_text("main")
    assert "succeeded" in text and "6 of 6 iterations" in text and "epsilon per iteration" in text
    assert page.locator("table.coefficients tbody tr").count() == 5  # x0..x4 with intervals
    assert images_loaded(page) == 2  # convergence and coefficients
    not_blank(page, site.shots / "job-blr.png")
    with page.expect_download() as download:
        page.click("text=Download the posterior document")
    document = json.loads(Path(download.value.path()).read_text())
    assert document["model"] == "blr" and document["job_id"] == site.jobs["blr"]

    page.goto(f"{site.service.url}/ui/jobs/{site.jobs['lda']}")
    assert page.locator("table.topics tbody tr").count() == 4
    assert all(
        len(words.split()) == 10
        for words in page.locator("table.topics tbody td:nth-child(3)").all_inner_texts()
    )
    not_blank(page, site.shots / "job-lda.png")
    page.goto(f"{site.service.url}/ui/jobs/{site.jobs['sbn']}")
    assert images_loaded(page) == 2  # convergence and the hidden units' weights
    not_blank(page, site.shots / "job-sbn.png")
    page.context.close()


def test_a_client_sees_its_dataset_s_jobs_but_not_their_releases(browser: Browser, site: Site) -> None:
    page = sign_in(browser, site, "client")
    assert page.locator("table.datasets tbody td a").all_inner_texts() == ["synth"]
    page.goto(f"{site.service.url}/ui/jobs/{site.jobs['blr']}")
    assert "Posterior" in page.inner_text("main") and "Convergence" not in page.inner_text("main")
    response = page.goto(f"{site.service.url}/ui/jobs/{site.jobs['lda']}")
    assert response is not None and response.status == 404  # another dataset's job
    response = page.goto(f"{site.service.url}/ui/datasets/docs")
    assert response is not None and response.status == 404
    page.context.close()


def test_an_admin_sees_every_dataset_and_may_set_budgets(browser: Browser, site: Site) -> None:
    page = sign_in(browser, site, "admin")
    assert set(page.locator("table.datasets tbody td a").all_inner_texts()) == {"synth", "docs", "digits"}
    page.get_by_role("link", name="digits", exact=True).click()
    page.wait_for_url(f"{site.service.url}/ui/datasets/digits")
    # a public dataset takes no epsilon cap: its form sets the delta alone
    assert page.locator("form.budget-form input[name=epsilon]").count() == 0
    assert page.locator("form.budget-form input[name=delta]").count() == 1
    text = page.inner_text("section.budget")
    assert "takes no epsilon cap" in text
    # public, no cap; its sigma-0 jobs have no finite epsilon: "unbounded" spent, nothing held back
    assert "no cap" in text and "unbounded" in text and "nan" not in text
    page.context.close()


#: The jobs each role's key reads (the analyst submitted all three; the custodian and the client are
#: scoped to synth): what /ui lists for it, newest first.
ROLE_JOBS = {
    "admin": ("sbn", "lda", "blr"),
    "custodian": ("blr",),
    "analyst": ("sbn", "lda", "blr"),
    "client": ("blr",),
}


def screenshot(page: Page, site: Site, name: str) -> None:
    """A screenshot (not blank) into this run's folder, and into $VIPS_UI_SCREENSHOTS when it is set
    (`VIPS_UI_SCREENSHOTS=docs/screenshots pytest tests/test_ui_browser.py` refreshes the docs')."""
    not_blank(page, site.shots / f"{name}.png")
    folder = os.environ.get("VIPS_UI_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)


@pytest.mark.parametrize("role", list(ROLE_JOBS))
def test_each_role_sees_its_jobs_and_opens_them_by_clicking(browser: Browser, site: Site, role: str) -> None:
    page = sign_in(browser, site, role)
    listed = page.locator("table.jobs tbody td:first-child a").all_inner_texts()
    assert listed == [site.jobs[model][:8] for model in ROLE_JOBS[role]]
    screenshot(page, site, f"dashboard-{role}")
    page.get_by_role("link", name=site.jobs["blr"][:8], exact=True).click()
    page.wait_for_url(f"{site.service.url}/ui/jobs/{site.jobs['blr']}")
    text = page.inner_text("main")
    assert "succeeded" in text and "Download the posterior document" in text
    assert ("Convergence" in text) == (role != "client")  # a client reads posteriors, not releases
    images_loaded(page)
    screenshot(page, site, f"dashboard-{role}-job")
    page.go_back()
    page.get_by_role("link", name="synth", exact=True).first.click()  # the dataset page lists them too
    page.wait_for_url(f"{site.service.url}/ui/datasets/synth")
    assert page.locator("table.jobs tbody td:first-child a").all_inner_texts() == [site.jobs["blr"][:8]]
    page.context.close()


def test_the_convergence_plot_renders_with_labelled_axes(browser: Browser, site: Site) -> None:
    page = sign_in(browser, site, "analyst")
    for model in ("blr", "lda", "sbn"):
        page.goto(f"{site.service.url}/ui/jobs/{site.jobs[model]}")
        plot = page.locator("img.convergence")
        width: int = plot.evaluate("image => image.naturalWidth")
        assert width > 0, model
        svg = page.request.get(f"{site.service.url}/ui/jobs/{site.jobs[model]}/convergence.svg").text()
        texts = re.findall(r"<!-- (.*?) -->", svg)  # the texts matplotlib drew as paths
        assert "iteration" in texts and convergence.NATURAL.label in texts, (model, texts)
        assert not any(re.search(r"10\^|\bs\d?\b", t) for t in texts), texts  # plain ticks, no s1/s2
        assert "keeps it from reaching zero" in page.inner_text("figure figcaption")
    page.context.close()


def _box(page: Page, selector: str) -> FloatRect:
    box = page.locator(selector).first.bounding_box()
    assert box is not None, selector
    return box


def _titles(page: Page) -> list[str]:
    """The spend plot's step labels (SVG <title>s: their text, which innerText does not give)."""
    found: list[str] = page.locator("svg.plot.spend g[id^='step-'] > title").evaluate_all(
        "titles => titles.map(title => title.textContent)"
    )
    return found


def _overlap(a: FloatRect, b: FloatRect) -> bool:
    return (
        a["x"] < b["x"] + b["width"]
        and b["x"] < a["x"] + a["width"]
        and a["y"] < b["y"] + b["height"]
        and b["y"] < a["y"] + a["height"]
    )


def test_each_jobs_step_on_the_spend_plot_names_the_job_and_its_key_on_hover(
    browser: Browser, site: Site
) -> None:
    """Issue 37 item 5: the spend plot is in the page (an <img> shows no SVG <title>), its styles survive
    the pages' CSP (presentation attributes), each job's step is a group whose <title> names the job and
    the key for whoever may read the job, the pointer finds it, and the legend is outside the axes."""
    page = sign_in(browser, site, "custodian")
    page.goto(f"{site.service.url}/ui/datasets/synth")
    plot = page.locator("svg.plot.spend")
    titles = _titles(page)
    blr = site.jobs["blr"]
    mine = [title for title in titles if blr[:8] in title]
    assert len(mine) == 1 and "key " in mine[0] and "epsilon +" in mine[0], titles
    step = plot.locator("g[id^='step-']").nth(titles.index(mine[0]))
    step.locator("use").first.hover()  # the job's point on the curve
    assert step.evaluate("group => group.matches(':hover')")
    # matplotlib's colours reached the page (its style attributes would not have: style-src 'self')
    curve_stroke = plot.locator("g#spend path").first.evaluate("p => getComputedStyle(p).stroke")
    assert curve_stroke == "rgb(31, 95, 168)", curve_stroke
    assert not site.blocked
    legend, axes = _box(page, "svg.plot.spend g[id^='legend']"), _box(page, "svg.plot.spend g#patch_2")
    assert not _overlap(legend, axes) and legend["y"] > axes["y"] + axes["height"]
    page.context.close()
    # an analyst who did not submit it sees its share of the spend, not the job nor its key
    site.keys["analyst_elsewhere"] = site.service.key("analyst", "synth")
    page = sign_in(browser, site, "analyst_elsewhere")
    page.goto(f"{site.service.url}/ui/datasets/synth")
    titles = _titles(page)
    assert titles and all(title.startswith("a job of another key: epsilon +") for title in titles), titles
    assert blr[:8] not in page.content()
    page.context.close()
    # a public dataset's sigma-0 job: unbounded from there on, a third legend entry, still under the axes
    page = sign_in(browser, site, "admin")
    page.goto(f"{site.service.url}/ui/datasets/docs")
    assert any("no privacy guarantee" in title for title in _titles(page))
    legend, axes = _box(page, "svg.plot.spend g[id^='legend']"), _box(page, "svg.plot.spend g#patch_2")
    assert not _overlap(legend, axes) and legend["y"] > axes["y"] + axes["height"]
    page.context.close()


def test_the_job_page_shows_elapsed_time_eta_and_a_collapsible_coefficient_table(
    browser: Browser, site: Site
) -> None:
    page = sign_in(browser, site, "analyst")
    page.goto(f"{site.service.url}/ui/jobs/{site.jobs['blr']}")
    assert re.fullmatch(r"\d+:\d\d:\d\d( \(\d+:\d\d:\d\d of it queued\))?", page.inner_text("div.elapsed dd"))
    assert page.locator("div.eta").count() == 0  # an ended job has no time left
    table = page.locator("details.coefficients table.coefficients")
    assert table.locator("tbody tr").count() == 5 and not table.is_visible()  # folded
    page.click("details.coefficients summary")
    assert table.is_visible()
    # a running job: its time left at the rate so far (or why it is not known yet)
    with VipsClient(site.service.url, site.keys["analyst"]) as api:
        job = api.submit_job(dataset="synth", model="blr", iterations=5000, batch_size=10, sigma=200.0)
        deadline = time.monotonic() + 60
        while api.job(job["id"])["iteration"] == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        page.goto(f"{site.service.url}/ui/jobs/{job['id']}")
        eta = page.inner_text("div.eta dd")
        assert re.fullmatch(r"\d+:\d\d:\d\d \(at the rate so far\)", eta), eta
        assert "elapsed" in page.inner_text("dl.figures")
        api.cancel(job["id"])
        assert api.wait(job["id"], interval=0.2, timeout=60)["status"] == "cancelled"
    page.context.close()


def test_a_budget_below_the_spend_warns_on_the_cli_and_turns_the_bar_red(
    browser: Browser, site: Site
) -> None:
    custodian = site.keys["custodian"]
    done = site.service.vips("budget", "set", "synth", "--epsilon", "0.001", "--delta", "1e-5", key=custodian)
    answer = json.loads(done.stdout)
    assert "no job can be admitted" in answer["warning"] and "warning:" in done.stderr
    try:
        page = sign_in(browser, site, "custodian")
        assert page.locator("span.bar.exhausted").count() == 1
        page.goto(f"{site.service.url}/ui/datasets/synth")
        assert "no job can be admitted" in page.inner_text("section.budget")
        colour = page.locator("section.budget .bar .spent").evaluate(
            "e => getComputedStyle(e).backgroundColor"
        )
        assert colour == "rgb(184, 50, 42)"  # --bad, not the spent blue
        screenshot(page, site, "dashboard-budget-exhausted")
        page.context.close()
    finally:
        done = site.service.vips("budget", "set", "synth", "--epsilon", "3", "--delta", "1e-5", key=custodian)
        assert json.loads(done.stdout)["warning"] is None and "warning" not in done.stderr


def test_a_wrong_key_sees_nothing(browser: Browser, site: Site) -> None:
    page = context_for(browser, site).new_page()
    page.goto(f"{site.service.url}/ui/signin")
    page.fill("input[name=api_key]", "vips_0123456789abcdef_not-a-real-key")
    page.press("input[name=api_key]", "Enter")
    page.wait_for_load_state()
    assert "invalid, revoked or expired" in page.inner_text("main")
    not_blank(page, site.shots / "signin-refused.png")
    for path in ("/ui", "/ui/datasets/synth", f"/ui/jobs/{site.jobs['blr']}"):
        page.goto(f"{site.service.url}{path}")
        assert page.url.endswith("/ui/signin")
    assert page.context.cookies() == []
    page.context.close()


class _AttackerPage(BaseHTTPRequestHandler):
    """Another site's page: a form that signs the visitor in to the service with the attacker's key."""

    page = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, *args: Any) -> None:
        pass


def test_another_sites_page_cannot_sign_the_custodian_in_as_someone_else(
    browser: Browser, site: Site
) -> None:
    """Login CSRF: a page on another site (localhost is another site than 127.0.0.1) posts the sign-in
    form with the attacker's key; the service refuses it and the custodian's session stays. (A plain
    context: the attacker's host is meant to be foreign, so test_no_request_left_the_services_host must
    not count it.)"""
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{site.service.url}/ui/signin")
    page.fill("input[name=api_key]", site.keys["custodian"])
    page.press("input[name=api_key]", "Enter")
    page.wait_for_url(f"{site.service.url}/ui")
    (session,) = [c["value"] for c in context.cookies() if c["name"] == "vips_session"]

    attacker = site.keys["other_client"]
    handler = type("Page", (_AttackerPage,), {"page": (
        f'<form method="post" action="{site.service.url}/ui/signin">'
        f'<input name="api_key" value="{html.escape(attacker)}"></form>'
        "<script>document.forms[0].submit()</script>"
    ).encode()})  # fmt: skip
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with page.expect_response(f"{site.service.url}/ui/signin") as refused:
            page.goto(f"http://localhost:{server.server_address[1]}/")
        assert refused.value.status == 403
        page.wait_for_load_state()
        assert "another site" in page.inner_text("main")
    finally:
        server.shutdown()
        server.server_close()
    assert [c["value"] for c in context.cookies() if c["name"] == "vips_session"] == [session]
    page.goto(f"{site.service.url}/ui")
    assert page.locator("table.datasets tbody td a").all_inner_texts() == ["synth"]  # still the custodian
    context.close()


def test_the_budget_form_refuses_an_analyst_and_a_missing_csrf_token(browser: Browser, site: Site) -> None:
    form = f"{site.service.url}/ui/datasets/synth/budget"
    analyst = sign_in(browser, site, "analyst")
    token = analyst.get_attribute("input[name=csrf_token]", "value")
    response = analyst.request.post(form, form={"epsilon": "9", "delta": "1e-5", "csrf_token": token or ""})
    assert response.status == 403 and "only the custodian" in response.text()
    analyst.context.close()

    custodian = sign_in(browser, site, "custodian")
    response = custodian.request.post(form, form={"epsilon": "9", "delta": "1e-5"})
    assert response.status == 403 and "CSRF" in response.text()
    custodian.goto(f"{site.service.url}/ui/datasets/synth")
    custodian.fill("input[name=epsilon]", "4")
    custodian.click("text=Set the budget")
    custodian.wait_for_url(f"{site.service.url}/ui/datasets/synth")
    assert "4" in custodian.inner_text("dl.figures div:first-child dd")
    custodian.context.close()


@pytest.mark.parametrize(("page", "shows"), [("/docs", "/v1/jobs"), ("/redoc", "/v1/jobs")])
def test_the_api_docs_render_offline(browser: Browser, site: Site, page: str, shows: str) -> None:
    """Swagger UI and ReDoc draw the API from the service's own assets (nothing from a CDN)."""
    tab = context_for(browser, site).new_page()
    tab.goto(f"{site.service.url}{page}")
    tab.get_by_text(shows).first.wait_for(timeout=30_000)
    not_blank(tab, site.shots / f"{page.strip('/')}.png", full_page=False)  # ReDoc's page is very tall
    tab.context.close()


def test_no_request_left_the_services_host(site: Site) -> None:
    """Runs last in this module: every page above loaded only from the service (or inline data)."""
    assert len(site.requests) > 20
    own = (site.service.url + "/", "data:", f"blob:{site.service.url}/")  # blob: ReDoc's search worker
    foreign = [url for url in site.requests if not url.startswith(own) and url not in site.blocked]
    assert foreign == []
    # not even an attempt refused by the docs' policy (ReDoc's sidebar logo is served without its URL)
    assert site.blocked == set()
