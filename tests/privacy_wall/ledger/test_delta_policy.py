"""The delta policy (issue 34.4; docs/design.md section 3): a private dataset's budget has delta < 1/N.

Refused, with the numbers and what to choose: at budget set (ledger_db, PUT budget, `vips budget set`),
at ingest and append when the dataset has a budget (nothing written; also when the budget appears while
the file is being written), and at admission for a budget from before the rule. Public datasets are
exempt. The calculators (`vips privacy`, `vips fit --local`) price the delta and warn.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, update

import privacy_wall.data.ingest as ingest_module
from control.store.models import jobs
from privacy_wall.data.ingest import IngestError, ingest
from privacy_wall.data.schema import blocks, stored_datasets
from privacy_wall.ledger import database as ledger_db
from privacy_wall.ledger.delta_policy import (
    DeltaTooLarge,
    delta_problem,
    largest_population,
    suggested_delta,
    within_bound,
)
from privacy_wall.ledger.schema import budgets, reservations
from tests.dbservers import fresh_database
from tests.privacy_wall.data.test_ingest_store import tabular_data, write_tabular
from tests.privacy_wall.data.test_ingest_streaming import catalogued, stored
from tests.test_api import Api, add_dataset, make_api
from tests.test_cli_verbs import use
from tests.test_ui import csrf, sign_in
from vips.cli import main

# ---- the rule ------------------------------------------------------------------------------------------


def test_the_bound_is_strict_and_agrees_at_the_edge() -> None:
    assert within_bound(1e-5, 99_999) and not within_bound(1e-5, 100_000)
    assert not within_bound(0.001, 1000) and within_bound(0.001, 999)
    for delta in (0.3, 0.02, 1e-3, 1 / 3, 1e-5, 3.3e-7):
        n = largest_population(delta)
        assert within_bound(delta, n) and not within_bound(delta, n + 1), delta
    assert largest_population(0.5) == 1  # N = 1 only


@pytest.mark.parametrize(("population", "suggested"), [(1, 0.1), (1000, 1e-4), (1001, 1e-5), (32_561, 1e-6)])
def test_the_suggestion_is_a_power_of_ten_at_most_a_tenth_of_1_over_n(
    population: int, suggested: float
) -> None:
    assert suggested_delta(population) == suggested
    assert suggested_delta(population) * population <= 0.1 + 1e-12


def test_the_message_states_the_numbers_and_what_to_choose() -> None:
    assert delta_problem(1e-3, 500) is None
    problem = delta_problem(0.002, 500)
    assert problem is not None
    assert problem.startswith("delta 0.002 is not below 1/N = 1/500 = 0.002")
    assert "delta << 1/N" in problem and "e.g. 0.0001" in problem


# ---- budget set ----------------------------------------------------------------------------------------


def test_set_budget_refuses_a_private_datasets_delta_at_or_above_1_over_n(
    engines: tuple[Engine, Engine],
) -> None:
    control, _ = engines
    add_dataset(control, "priv", population=1000)
    add_dataset(control, "pub", population=1000, public=True)
    with pytest.raises(DeltaTooLarge, match=r"dataset priv: delta 0.001 is not below 1/N = 1/1000 = 0.001"):
        ledger_db.set_budget(control, "priv", 1.0, 1e-3)
    with pytest.raises(ledger_db.UnknownDataset):  # nothing was written
        ledger_db.budget_status(control, "priv")
    assert ledger_db.set_budget(control, "priv", 1.0, 9.99e-4).delta == 9.99e-4  # below 1/N
    with pytest.raises(DeltaTooLarge):  # changing an existing budget: the same rule
        ledger_db.set_budget(control, "priv", 2.0, 1e-3)
    assert ledger_db.budget_status(control, "priv").epsilon_budget == 1.0
    assert ledger_db.set_budget(control, "pub", None, 0.5).delta == 0.5  # public: exempt
    assert ledger_db.set_budget(control, "later", 1.0, 0.5).delta == 0.5  # not ingested yet: ingest checks


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with fresh_database("sqlite", tmp_path, "control") as url:
        yield from make_api(url, tmp_path)


def test_put_budget_is_422_naming_delta_with_the_numbers(api: Api) -> None:
    before = api.call("GET", "/v1/datasets/priv", "cust").json()["budget"]
    r = api.call("PUT", "/v1/datasets/priv/budget", "cust", json={"epsilon": 1.0, "delta": 0.002})
    assert r.status_code == 422, r.text
    (error,) = r.json()["detail"]
    assert error["loc"] == ["body", "delta"]
    assert error["msg"].startswith("dataset priv: delta 0.002 is not below 1/N = 1/1000 = 0.001")
    assert "delta << 1/N" in error["msg"] and "e.g. 0.0001" in error["msg"]
    assert api.call("GET", "/v1/datasets/priv", "cust").json()["budget"] == before  # unchanged
    ok = api.call("PUT", "/v1/datasets/priv/budget", "cust", json={"epsilon": 1.0, "delta": 1e-4})
    assert ok.status_code == 200 and ok.json()["delta"] == 1e-4
    # a public dataset (N = 200) keeps any delta in (0, 1)
    r = api.call("PUT", "/v1/datasets/pub/budget", "admin", json={"epsilon": None, "delta": 0.01})
    assert r.status_code == 200 and r.json()["delta"] == 0.01


def test_vips_budget_set_is_a_usage_error_with_the_numbers(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use(api, monkeypatch, "cust")
    assert main(["budget", "set", "priv", "--epsilon", "1", "--delta", "1e-3"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("vips: error: 422: delta: dataset priv: delta 0.001 is not below 1/N = 1/1000")
    assert len(err.strip().splitlines()) == 1
    assert main(["budget", "set", "priv", "--epsilon", "1", "--delta", "1e-4"]) == 0
    assert json.loads(capsys.readouterr().out)["delta"] == 1e-4


def test_the_dashboards_budget_form_says_the_same(api: Api) -> None:
    sign_in(api, "cust")
    form = {"epsilon": "1", "delta": "0.002", "csrf_token": csrf(api, "/ui/datasets/priv")}
    r = api.client.post("/ui/datasets/priv/budget", data=form)
    assert r.status_code == 422
    assert "dataset priv: delta 0.002 is not below 1/N = 1/1000 = 0.001" in r.text
    assert ledger_db.budget_status(api.engine, "priv").delta == 1e-5


# ---- budgets from before the rule ----------------------------------------------------------------------


def _old_budget(engine: Engine, name: str, delta: float) -> None:
    """A budget written before the rule existed: straight into the table, as a migration left it."""
    with engine.begin() as conn:
        conn.execute(update(budgets).where(budgets.c.dataset == name).values(delta=delta))


def test_a_budget_from_before_the_rule_stays_but_admits_no_job(api: Api) -> None:
    _old_budget(api.engine, "priv", 1e-3)  # N = 1000
    for dry_run in (True, False):
        r = api.submit(dry_run=dry_run)
        assert r.status_code == 409, r.text
        detail = r.json()["detail"]
        assert detail.startswith("dataset priv: its budget's delta 0.001 is not below 1/N = 1/1000 = 0.001")
        assert "vips budget set priv --epsilon E --delta 0.0001" in detail
    with api.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(jobs)).scalar_one() == 0
        assert conn.execute(select(func.count()).select_from(reservations)).scalar_one() == 0
    budget = api.call("GET", "/v1/datasets/priv", "cust").json()["budget"]
    assert budget["delta"] == 1e-3  # it stays, readable as it was
    # nothing is charged: the custodian can lower delta, and jobs are admitted again
    ok = api.call("PUT", "/v1/datasets/priv/budget", "cust", json={"epsilon": 3.0, "delta": 1e-5})
    assert ok.status_code == 200
    assert api.submit().status_code == 202


def test_a_public_datasets_delta_is_not_bounded(api: Api) -> None:
    assert api.submit(dataset="pub", sigma=0, batch_size=20, dry_run=True).status_code == 200
    _old_budget(api.engine, "pub", 0.5)  # N = 200
    assert api.submit(dataset="pub", sigma=1.0, batch_size=20).status_code == 202


# ---- ingest and append ---------------------------------------------------------------------------------


def _nothing_stored(control: Engine, sensitive: Engine, name: str) -> bool:
    with sensitive.connect() as conn:
        rows = conn.execute(select(func.count()).select_from(blocks).where(blocks.c.dataset == name))
        stored = conn.execute(select(stored_datasets.c.name).where(stored_datasets.c.name == name)).first()
        return rows.scalar_one() == 0 and stored is None and not ingest_module._catalogued(control, name)


def _population(control: Engine, sensitive: Engine, name: str) -> tuple[int, int, int]:
    """(catalogue, stored, rows in blocks) of a dataset."""
    population, rows = stored(sensitive, name)
    catalogue = catalogued(control, name)
    assert catalogue is not None
    return catalogue, population, len(rows)


@pytest.fixture
def written(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every (first row, rows) the ingest writes to the sensitive database."""
    calls: list[tuple[int, int]] = []
    original = ingest_module.write_blocks

    def recording(conn: Any, name: str, kind: str, first_row: int, chunk: Any) -> None:
        calls.append((first_row, chunk.size))
        original(conn, name, kind, first_row, chunk)

    monkeypatch.setattr(ingest_module, "write_blocks", recording)
    return calls


def test_an_ingest_its_budget_would_break_is_refused_writing_nothing_past_the_bound(
    engines: tuple[Engine, Engine], tmp_path: Path, written: list[tuple[int, int]]
) -> None:
    control, sensitive = engines
    x, y = tabular_data(500)
    path = write_tabular(tmp_path / "t.csv", x, y)
    ledger_db.set_budget(control, "t", 1.0, 0.004)  # set before the first ingest: at most 249 rows
    with pytest.raises(IngestError) as refused:
        ingest(control=control, sensitive=sensitive, name="t", kind="tabular", path=path, label="label",
               block_bytes=2_000)  # fmt: skip
    message = str(refused.value)
    assert "its budget's delta 0.004 is not below 1/N = 1/500 = 0.002" in message  # the file's N, counted
    assert "nothing was stored" in message and "--delta 0.0001" in message
    assert written and max(first + rows for first, rows in written) <= 249  # no block past the bound
    assert _nothing_stored(control, sensitive, "t")
    # a public dataset is exempt; a delta below 1/N lets the same file in
    ingest(
        control=control, sensitive=sensitive, name="p", kind="tabular", path=path, label="label", public=True
    )
    ledger_db.set_budget(control, "t", 1.0, 0.0019)
    assert ingest(control=control, sensitive=sensitive, name="t", kind="tabular", path=path,
                  label="label").population == 500  # fmt: skip


def test_an_append_its_budget_would_break_is_refused_leaving_the_dataset_as_it_was(
    engines: tuple[Engine, Engine], tmp_path: Path
) -> None:
    control, sensitive = engines
    x, y = tabular_data(60)
    first, second = (
        write_tabular(tmp_path / "a.csv", x[:30], y[:30]),
        write_tabular(tmp_path / "b.csv", x[30:], y[30:]),
    )
    ingest(control=control, sensitive=sensitive, name="t", kind="tabular", path=first, label="label")
    ledger_db.set_budget(control, "t", 1.0, 0.02)  # N = 30 now; at most 49
    with pytest.raises(IngestError, match=r"delta 0.02 is not below 1/N = 1/60 = 0.0167"):
        ingest(control=control, sensitive=sensitive, name="t", kind="tabular", path=second, label="label",
               append=True)  # fmt: skip
    assert _population(control, sensitive, "t") == (30, 30, 30)
    part = write_tabular(tmp_path / "c.csv", x[30:45], y[30:45])
    meta = ingest(control=control, sensitive=sensitive, name="t", kind="tabular", path=part, label="label",
                  append=True)  # fmt: skip
    assert meta.population == 45 == _population(control, sensitive, "t")[0]


def test_a_budget_set_while_the_rows_are_written_is_checked_at_the_commit_point(
    engines: tuple[Engine, Engine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bound is read before the rows are written and again when the catalogue is: a budget that
    appears in between (set before the dataset is catalogued, so its own check passes) still refuses."""
    control, sensitive = engines
    x, y = tabular_data(500)
    path = write_tabular(tmp_path / "t.csv", x, y)
    original = ingest_module._write_chunks

    def budget_meanwhile(*args: Any, **kwargs: Any) -> int:
        ledger_db.set_budget(control, "t", 1.0, 0.01)
        return original(*args, **kwargs)

    monkeypatch.setattr(ingest_module, "_write_chunks", budget_meanwhile)
    with pytest.raises(IngestError, match=r"delta 0.01 is not below 1/N = 1/500 = 0.002"):
        ingest(control=control, sensitive=sensitive, name="t", kind="tabular", path=path, label="label")
    assert _nothing_stored(control, sensitive, "t")


# ---- the calculators warn ------------------------------------------------------------------------------


def test_the_planner_prices_any_delta_and_warns_when_it_is_not_below_1_over_n(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The issue's example: at delta 1e-3 and N = 100,000, epsilon 0.01 is met with almost no noise by the
    job's own tight price (`pld`; the budget's filter, whose Renyi part does not amplify delta, needs 6.5)."""
    schedule = ["--batch-size", "10", "--population", "100000", "--iterations", "1"]
    assert (
        main(["privacy", "sigma", "--epsilon", "0.01", *schedule, "--delta", "1e-3", "--accountant", "pld"])
        == 0
    )
    out, err = capsys.readouterr()
    quote = json.loads(out)
    assert quote["sigma"] < 0.05
    assert quote["warning"].startswith("delta 0.001 is not below 1/N = 1/100000 = 1e-05")
    assert "budget with this delta is refused" in quote["warning"]
    assert err == f"vips: warning: {quote['warning']}\n"
    assert main(["privacy", "epsilon", "--sigma", "1", *schedule, "--delta", "1e-6"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["warning"] is None and err == ""


def test_a_local_fit_warns_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    x, y = tabular_data(200, 3)
    path = write_tabular(tmp_path / "own.csv", x, y)
    local = [
        "fit",
        "--local",
        "--kind",
        "tabular",
        "--input",
        str(path),
        "--model",
        "blr",
        "--iterations",
        "1",
    ]
    assert main([*local, "--sigma", "2", "--delta", "0.01"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert result["warning"].startswith("delta 0.01 is not below 1/N = 1/200 = 0.005")
    assert f"vips: warning: {result['warning']}" in err
    assert math.isfinite(result["epsilon"])  # priced all the same
    assert main([*local, "--sigma", "2", "--delta", "1e-5"]) == 0
    assert json.loads(capsys.readouterr().out)["warning"] is None


def test_jobs_cannot_choose_their_own_delta(api: Api) -> None:
    r = api.submit(delta=0.5)
    assert r.status_code == 422 and ["body", "delta"] in [e["loc"] for e in r.json()["detail"]]
    job = api.call("GET", f"/v1/jobs/{api.submit().json()['id']}", "analyst").json()
    assert job["delta"] == ledger_db.budget_status(api.engine, "priv").delta
