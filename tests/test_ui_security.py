"""The dashboard's defences beyond its pages (issue 21, item 6), through the app in process: state-changing
/ui requests from another site are refused (login CSRF included), forwarded headers are believed only
from VIPS_TRUSTED_PROXIES, and a key holds a bounded number of sessions."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from sqlalchemy import func, select

from control.jobs.queue import RecordingQueue
from control.settings import ServiceSettings, parse_networks
from control.store.keys import Principal
from control.store.models import ui_sessions
from privacy_wall.ledger import database as ledger_db
from service.app import create_app
from service.http.proxies import trusted
from service.ui.sessions import COOKIE, find_session, open_session
from tests.dbservers import fresh_database
from tests.test_api import Api, make_api

EVIL = "https://evil.example"
OWN = "http://testserver"  # TestClient's base URL: the service's own origin here


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with fresh_database("sqlite", tmp_path, "control") as url:
        yield from make_api(url, tmp_path)


def sign_in(client: TestClient, key: str, **headers: str) -> None:
    r = client.post("/ui/signin", data={"api_key": key}, headers=headers, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui", r.text


def listed(client: TestClient) -> list[str]:
    return re.findall(r'<a href="/ui/datasets/([^"]+)">', client.get("/ui").text)


def csrf(client: TestClient, path: str = "/ui") -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', client.get(path).text)
    assert match is not None
    return match.group(1)


# ---- cross-site requests -------------------------------------------------------------------------------


def test_a_cross_site_sign_in_is_refused_and_keeps_the_session(api: Api) -> None:
    """Login CSRF: another site's page posting its own key must not replace the custodian's session."""
    sign_in(api.client, api.keys["cust"], origin=OWN, **{"sec-fetch-site": "same-origin"})
    before = api.client.cookies[COOKIE]
    mine = listed(api.client)
    assert "priv" in mine
    attacks = [
        {"origin": EVIL},
        {"origin": EVIL, "sec-fetch-site": "cross-site"},
        {"sec-fetch-site": "cross-site"},
        {"sec-fetch-site": "same-site"},  # a sibling subdomain is another origin too
        {"origin": "null"},  # a sandboxed frame or a privacy-stripped sender
        {"referer": f"{EVIL}/login-csrf.html"},
        {"origin": "https://testserver"},  # same host, another scheme
        {"origin": "http://testserver:8080"},  # same host, another port
        {"origin": "not a url"},
    ]
    for headers in attacks:
        r = api.client.post(
            "/ui/signin", data={"api_key": api.keys["cust2"]}, headers=headers, follow_redirects=False
        )
        assert r.status_code == 403, (headers, r.status_code)
        assert "set-cookie" not in r.headers, headers
        assert "another site" in r.text or "not sent from this site" in r.text
        assert api.client.cookies[COOKIE] == before
    assert listed(api.client) == mine  # still the custodian's session
    with api.engine.connect() as conn:  # and no session was opened for the attacker's key
        opened = conn.execute(
            select(func.count()).select_from(ui_sessions).where(ui_sessions.c.key_id == api.ids["cust2"])
        ).scalar_one()
    assert opened == 0


def test_the_sites_own_forms_and_non_browser_clients_sign_in(api: Api) -> None:
    for headers in (
        {"origin": OWN, "sec-fetch-site": "same-origin"},  # a browser on the sign-in page
        {"origin": "HTTP://TestServer:80"},  # the same origin, spelled otherwise
        {"referer": f"{OWN}/ui/signin"},  # an older browser: no Origin, a same-origin Referer
        {"sec-fetch-site": "none"},  # the user's own action (typed, bookmarked)
        {},  # no browser at all (curl, a script): no page could have forged it
    ):
        api.client.cookies.clear()
        sign_in(api.client, api.keys["cust"], **headers)
        assert "priv" in listed(api.client)


def test_every_state_changing_form_refuses_another_site(api: Api) -> None:
    sign_in(api.client, api.keys["cust"])
    token = csrf(api.client, "/ui/datasets/priv")
    form = {"epsilon": "7", "delta": "1e-5", "csrf_token": token}
    for headers in ({"origin": EVIL}, {"sec-fetch-site": "cross-site"}):
        r = api.client.post("/ui/datasets/priv/budget", data=form, headers=headers)
        assert r.status_code == 403
        r = api.client.post("/ui/signout", data={"csrf_token": token}, headers=headers)
        assert r.status_code == 403
    assert ledger_db.budget_status(api.engine, "priv").epsilon_budget != 7.0
    assert api.client.get("/ui", follow_redirects=False).status_code == 200  # still signed in
    r = api.client.post(
        "/ui/datasets/priv/budget", data=form, headers={"origin": OWN}, follow_redirects=False
    )
    assert r.status_code == 303 and ledger_db.budget_status(api.engine, "priv").epsilon_budget == 7.0


def test_pages_send_no_referrer_to_other_hosts_but_let_forms_carry_their_origin(api: Api) -> None:
    page = api.client.get("/ui/signin")
    assert page.headers["referrer-policy"] == "same-origin"  # "no-referrer" would make Origin null


# ---- trusted proxies -----------------------------------------------------------------------------------


def _client(api: Api, peer: str, settings: ServiceSettings | None = None) -> TestClient:
    app = (
        api.client.app
        if settings is None
        else create_app(settings, queue=RecordingQueue(), engine=api.engine)
    )
    return TestClient(app, client=(peer, 40000))


def _cookie(client: TestClient, key: str, **headers: str) -> str:
    r = client.post("/ui/signin", data={"api_key": key}, headers=headers, follow_redirects=False)
    assert r.status_code == 303, r.text
    cookie: str = r.headers["set-cookie"]
    return cookie


def test_the_secure_flag_follows_x_forwarded_proto_only_from_a_trusted_proxy(
    api: Api, tmp_path: Path
) -> None:
    https = {"x-forwarded-proto": "https", "x-forwarded-for": "203.0.113.9"}
    for peer in ("127.0.0.1", "::1"):  # the default: loopback
        assert "Secure" in _cookie(_client(api, peer), api.keys["cust"], **https), peer
    for peer in ("10.1.2.3", "192.0.2.7", "testclient"):
        assert "Secure" not in _cookie(_client(api, peer), api.keys["cust"], **https), peer
    assert "Secure" not in _cookie(_client(api, "127.0.0.1"), api.keys["cust"])  # no header: as it came

    proxies = ServiceSettings(home=tmp_path, trusted_proxies="10.0.0.0/8, 2001:db8::/32")
    assert "Secure" in _cookie(_client(api, "10.1.2.3", proxies), api.keys["cust"], **https)
    assert "Secure" in _cookie(_client(api, "2001:db8::5", proxies), api.keys["cust"], **https)
    assert "Secure" not in _cookie(_client(api, "127.0.0.1", proxies), api.keys["cust"], **https)
    assert "Secure" not in _cookie(_client(api, "192.0.2.7", proxies), api.keys["cust"], **https)


def test_behind_a_trusted_proxy_the_https_origin_is_the_sites_own(api: Api) -> None:
    """The browser saw https://testserver; the proxy forwarded it over http and said so."""
    proxied = _client(api, "127.0.0.1")
    forwarded = {"x-forwarded-proto": "https", "origin": "https://testserver"}
    assert "Secure" in _cookie(proxied, api.keys["cust"], **forwarded)
    # the same claim from an untrusted peer is not believed: its https Origin is not this site's
    direct = _client(api, "192.0.2.7")
    r = direct.post(
        "/ui/signin", data={"api_key": api.keys["cust"]}, headers=forwarded, follow_redirects=False
    )
    assert r.status_code == 403 and "VIPS_TRUSTED_PROXIES" in r.text


def test_trusted_proxies_parse_addresses_and_networks() -> None:
    networks = parse_networks(" 127.0.0.1 , ::1,10.0.0.0/8,192.168.1.7/24,")
    assert trusted("127.0.0.1", networks) and trusted("::1", networks) and trusted("[::1]", networks)
    assert trusted("::ffff:127.0.0.1", networks)  # an IPv4 peer on a dual-stack socket
    assert trusted("10.255.0.1", networks) and trusted("192.168.1.200", networks)
    assert not trusted("127.0.0.2", networks) and not trusted("11.0.0.1", networks)
    assert not trusted("localhost", networks) and not trusted(None, networks) and not trusted("", networks)
    assert parse_networks("") == ()
    with pytest.raises(ValidationError, match="not an IP address or CIDR network"):
        ServiceSettings(trusted_proxies="127.0.0.1,proxy.internal")


# ---- bounded sessions ----------------------------------------------------------------------------------


def _sessions(api: Api, key: str) -> int:
    with api.engine.connect() as conn:
        count: int = conn.execute(
            select(func.count()).select_from(ui_sessions).where(ui_sessions.c.key_id == api.ids[key])
        ).scalar_one()
    return count


def test_a_key_keeps_at_most_max_sessions_and_signing_in_closes_the_oldest(api: Api) -> None:
    principal = Principal(api.ids["cust"], "custodian", "priv")
    tokens = [open_session(api.engine, principal, timedelta(hours=1), max_sessions=3)[0] for _ in range(5)]
    assert _sessions(api, "cust") == 3
    assert [find_session(api.engine, t) is not None for t in tokens] == [False, False, True, True, True]
    other = Principal(api.ids["cust2"], "custodian", "other")
    open_session(api.engine, other, timedelta(hours=1), max_sessions=1)
    assert _sessions(api, "cust") == 3  # another key's sign-in closes none of this key's


@pytest.mark.slow
def test_signing_in_through_the_app_honours_vips_max_sessions_per_key(api: Api, tmp_path: Path) -> None:
    assert ServiceSettings().max_sessions_per_key == 10
    with pytest.raises(ValidationError):
        ServiceSettings(max_sessions_per_key=0)
    settings = ServiceSettings(home=tmp_path, max_sessions_per_key=2)
    app = create_app(settings, queue=RecordingQueue(), engine=api.engine)
    browsers = [TestClient(app) for _ in range(3)]
    for browser in browsers:
        sign_in(browser, api.keys["cust"])
    assert _sessions(api, "cust") == 2
    first = browsers[0].get("/ui", follow_redirects=False)
    assert first.status_code == 303 and first.headers["location"] == "/ui/signin"  # the oldest: closed
    assert all("priv" in listed(b) for b in browsers[1:])
    for _ in range(20):  # the default cap, through the shared fixture's app
        sign_in(api.client, api.keys["cust2"])
    assert _sessions(api, "cust2") == 10
