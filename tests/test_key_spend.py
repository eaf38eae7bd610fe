"""Per-key spend (issue 23, item 2): `GET /v1/datasets/{name}/ledger/keys` and `vips ledger D --by-key`
report per key its name, jobs, iterations charged and its own releases composed by the accountant at the
dataset's delta, equal to an independent composition of that key's charge events; the role matrix
(custodian and admin: every key; an analyst: its own row only; a client: 403)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from sqlalchemy import select

from control.budgets.key_spend import KeySpend, key_spend
from control.store.models import jobs
from privacy_wall.accounting.accountants import PrivacyCost, configured_accountant
from privacy_wall.accounting.events import SubsampledGaussianEvent, event_from_dict
from privacy_wall.ledger import database as ledger_db
from privacy_wall.ledger.base import Charge
from privacy_wall.ledger.schema import charges, reservations
from tests.dbservers import fresh_database
from tests.test_api import DELTA, Api, N, finish, make_api
from tests.test_cli_verbs import lines, use
from tests.test_key_names import named_analyst
from vips.cli import main


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with fresh_database("sqlite", tmp_path, "control") as url:
        yield from make_api(url, tmp_path)


def charge_job(api: Api, job_id: str, iterations: range, attempt: int = 0) -> None:
    """Charge these iterations of a job with the job's own event, as its worker would."""
    with api.engine.connect() as conn:
        job = conn.execute(select(jobs).where(jobs.c.id == job_id)).one()
    event = SubsampledGaussianEvent(job.sigma, job.batch_size, N)
    for t in iterations:
        ledger_db.commit_charge(api.engine, Charge(job.dataset, job_id, t, event, attempt))


def independent(api: Api, key_id: str, *, with_reservations: bool = False) -> float:
    """The key's charge events on priv (and the rest of its open reservations) composed by the accountant
    directly: one cost per stored event, added, priced at the dataset's delta."""
    accountant = configured_accountant()
    total = PrivacyCost.zero()
    with api.engine.connect() as conn:
        mine = select(jobs.c.id).where(jobs.c.owner == key_id, jobs.c.dataset == "priv")
        for (event,) in conn.execute(select(charges.c.event).where(charges.c.job_id.in_(mine))):
            total = total + accountant.cost(event_from_dict(event))
        if with_reservations:
            rows = conn.execute(
                select(reservations).where(reservations.c.job_id.in_(mine), reservations.c.open.is_(True))
            )
            for row in rows:
                total = total + accountant.cost(event_from_dict(row.event)).scaled(
                    row.iterations - row.committed
                )
    return total.epsilon(DELTA)


def two_analysts(api: Api) -> tuple[str, str]:
    """alice: two finished jobs of different schedules (one iteration charged twice: a retried attempt)
    and one open job; bob: one finished job; the unnamed fixture analyst: nothing on priv."""
    alice, bob = named_analyst(api, "alice"), named_analyst(api, "bob", who="bob")
    first = api.submit("alice", iterations=4, sigma=2.0).json()["id"]
    charge_job(api, first, range(1, 5))
    charge_job(api, first, range(4, 5), attempt=1)
    finish(api.engine, first)
    second = api.submit("alice", iterations=3, sigma=1.5, batch_size=50).json()["id"]
    charge_job(api, second, range(1, 4))
    finish(api.engine, second)
    running = api.submit("alice", iterations=6, sigma=3.0).json()["id"]
    charge_job(api, running, range(1, 3))
    theirs = api.submit("bob", iterations=5, sigma=2.5).json()["id"]
    charge_job(api, theirs, range(1, 6))
    finish(api.engine, theirs)
    return alice, bob


def test_per_key_spend_is_the_composition_of_that_keys_own_charges(api: Api) -> None:
    alice, bob = two_analysts(api)
    r = api.call("GET", "/v1/datasets/priv/ledger/keys", "cust")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["dataset"] == "priv" and body["delta"] == DELTA
    rows = {row["key_id"]: row for row in body["keys"]}
    assert list(rows) == [alice, bob]  # in order of each key's first job; keys without jobs are left out
    assert (rows[alice]["key_name"], rows[alice]["jobs"], rows[alice]["iterations_charged"]) == (
        "alice",
        3,
        9,
    )
    assert (rows[bob]["key_name"], rows[bob]["jobs"], rows[bob]["iterations_charged"]) == ("bob", 1, 5)
    for key_id in (alice, bob):
        # Composed in another order: each composition adds its own FFT rounding bound (~1e-9 relative).
        assert rows[key_id]["epsilon_spent"] == pytest.approx(independent(api, key_id), rel=1e-6)
        assert rows[key_id]["epsilon_reserved"] == pytest.approx(
            independent(api, key_id, with_reservations=True), rel=1e-6
        )
        assert rows[key_id]["quota_epsilon"] is None
    assert rows[alice]["epsilon_reserved"] > rows[alice]["epsilon_spent"]  # its open job's rest
    assert rows[bob]["epsilon_reserved"] == rows[bob]["epsilon_spent"]
    # A composition, not a sum: below the sum of alice's jobs' own epsilons (ledger/jobs).
    per_job = api.call("GET", "/v1/datasets/priv/ledger/jobs", "cust").json()["jobs"]
    assert rows[alice]["epsilon_spent"] < sum(j["epsilon_spent"] for j in per_job if j["key_name"] == "alice")
    # The function the dashboard calls answers the same.
    direct = {row.key_id: row for row in key_spend(api.engine, "priv", DELTA)}
    assert direct[alice].epsilon_spent == pytest.approx(rows[alice]["epsilon_spent"], rel=1e-12)
    assert direct[bob].key_name == "bob"


def test_the_totals_are_read_once_per_ledger_state_and_follow_every_change(api: Api) -> None:
    """key_spend sums the keys' jobs once per state of the dataset's charges, reservations and jobs (a
    dashboard with 10,000 jobs must not re-read them per view): a repeated read sums nothing, and an
    admission without a charge, a charge, a refund and a new quota each show at once."""
    from unittest import mock

    from control.budgets import key_spend as spend_module

    alice, _ = two_analysts(api)

    def row() -> KeySpend:
        return next(r for r in key_spend(api.engine, "priv", DELTA) if r.key_id == alice)

    def reserved_now() -> float:
        return independent(api, alice, with_reservations=True)

    before = row()
    real = spend_module._key_totals
    with mock.patch.object(spend_module, "_key_totals", side_effect=real) as summed:
        assert row() == before
        assert summed.call_count == 0
        admitted = api.submit("alice", iterations=5, sigma=2.0).json()["id"]  # reserved, not charged
        after_admission = row()
        assert after_admission.jobs == before.jobs + 1 and summed.call_count == 1
        assert after_admission.epsilon_reserved == pytest.approx(reserved_now(), rel=1e-6)
        assert after_admission.epsilon_reserved > before.epsilon_reserved
        charge_job(api, admitted, range(1, 2))
        charged = row()
        assert charged.epsilon_spent > before.epsilon_spent and charged.iterations_charged == 10
        finish(api.engine, admitted)  # refunds the rest: the reservation closes
        refunded = row()
        assert refunded.epsilon_reserved < charged.epsilon_reserved
        assert refunded.epsilon_reserved == pytest.approx(reserved_now(), rel=1e-6)
        assert summed.call_count == 3
        quota = api.call("PUT", f"/v1/datasets/priv/quotas/{alice}", "cust", json={"epsilon": 9.0})
        assert quota.status_code == 200, quota.text
        assert row().quota == 9.0 and summed.call_count == 3  # quotas are read each time


def test_the_role_matrix_of_the_ledger_by_key(api: Api) -> None:
    alice, bob = two_analysts(api)
    path = "/v1/datasets/priv/ledger/keys"
    for who in ("cust", "admin"):
        r = api.call("GET", path, who)
        assert r.status_code == 200 and {k["key_id"] for k in r.json()["keys"]} == {alice, bob}, who
    # An analyst sees its own row only: never another key's id, name or spend.
    r = api.call("GET", path, "alice")
    assert r.status_code == 200, r.text
    (own,) = r.json()["keys"]
    assert own["key_id"] == alice and own["key_name"] == "alice"
    assert bob not in r.text and "bob" not in r.text
    # An analyst without a job there gets its own (empty) row, nothing of the others.
    r = api.call("GET", path, "analyst")
    assert r.status_code == 200
    assert [(k["key_id"], k["jobs"], k["epsilon_spent"]) for k in r.json()["keys"]] == [
        (api.ids["analyst"], 0, 0.0)
    ]
    assert alice not in r.text and "alice" not in r.text
    # Clients read no ledger (as for every ledger route); another dataset's custodian sees nothing.
    assert api.call("GET", path, "client").status_code == 403
    assert api.call("GET", path, "cust2").status_code == 404
    assert api.call("GET", path).status_code == 401
    # An analyst scoped to another dataset: as if priv did not exist.
    r = api.call("POST", "/v1/keys", "admin", json={"role": "analyst", "dataset": "other", "name": "carol"})
    api.keys["carol"] = r.json()["key"]
    r = api.call("GET", path, "carol")
    assert r.status_code == 404 and "alice" not in r.text
    assert api.call("GET", "/v1/datasets/nope/ledger/keys", "admin").status_code == 404
    # No budget yet: no delta, no rows.
    r = api.call("GET", "/v1/datasets/nobudget/ledger/keys", "cust")
    assert r.status_code == 200 and r.json() == {"dataset": "nobudget", "delta": None, "keys": []}


def test_vips_ledger_by_key(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    alice, bob = two_analysts(api)
    use(api, monkeypatch, "cust")
    assert main(["ledger", "priv", "--by-key"]) == 0
    (summary,) = lines(capsys.readouterr().out)
    rows = {k["key_id"]: k for k in cast(list[dict[str, Any]], summary["keys"])}
    assert [(rows[k]["key_name"], rows[k]["jobs"]) for k in (alice, bob)] == [("alice", 3), ("bob", 1)]
    assert rows[bob]["epsilon_spent"] == pytest.approx(independent(api, bob), rel=1e-9)
    use(api, monkeypatch, "alice")
    assert main(["ledger", "priv", "--by-key"]) == 0
    (summary,) = lines(capsys.readouterr().out)
    assert [k["key_name"] for k in cast(list[dict[str, Any]], summary["keys"])] == ["alice"]
    assert main(["ledger", "priv", "--by-key", "--entries"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_the_custodians_dataset_page_shows_the_spend_by_key_and_no_analyst_sees_it(api: Api) -> None:
    from tests.test_ui import sign_in

    alice, bob = two_analysts(api)
    rows = {row.key_id: row for row in key_spend(api.engine, "priv", DELTA)}
    sign_in(api, "cust")
    page = api.client.get("/ui/datasets/priv").text
    table = page[
        page.index('class="spend-by-key"') : page.index("</section>", page.index('class="spend-by-key"'))
    ]
    for key_id, name in ((alice, "alice"), (bob, "bob")):
        row = table[table.index(key_id) :].split("</tr>")[0]
        assert f'<span class="key-name">{name}</span> <code>{key_id}' in table  # the name next to the key
        spent, reserved = rows[key_id].epsilon_spent, rows[key_id].epsilon_reserved
        assert f'<td class="num">{spent:.4g}</td>' in row and f'<td class="num">{reserved:.4g}</td>' in row
    for who in ("alice", "analyst"):
        sign_in(api, who)
        page = api.client.get("/ui/datasets/priv").text
        assert "spend-by-key" not in page and bob not in page
