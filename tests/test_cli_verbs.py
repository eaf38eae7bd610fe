"""The client verbs for what the API does (issue 13.2): `vips jobs`, `vips ledger`, `vips fit --dry-run`,
the 409 line, `vips --version`, job ids by unique prefix. Each drives `main([...])` in process against
the app (TestClient over a migrated SQLite database, as tests/test_cli_submission.py does)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import pytest

import service.routes.submission
from service.http.client import VipsClient
from tests.dbservers import fresh_database
from tests.test_api import BATCH, PRIVATE_BUDGET, Api, charge, make_api
from vips.cli import main

FIT = ["fit", "--dataset", "priv", "--model", "blr", "--iterations", "5", "--batch-size", str(BATCH)]


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with fresh_database("sqlite", tmp_path, "control") as url:
        yield from make_api(url, tmp_path)


def use(api: Api, monkeypatch: pytest.MonkeyPatch, who: str = "analyst") -> None:
    """Point the CLI's VipsClient at the app with the key `who` (the CLI's close() leaves it open)."""
    client = api.client
    monkeypatch.setattr(client, "close", lambda: None)
    key = api.keys[who]
    monkeypatch.setattr(
        VipsClient, "from_env", classmethod(lambda cls, env=None: cls("http://testserver", key, http=client))
    )


def lines(out: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines()]


def submitted(api: Api, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    assert main([*FIT, "--sigma", "2", *extra]) == 0
    return capsys.readouterr().out.strip()


# ---- vips jobs -----------------------------------------------------------------------------------------


def test_jobs_prints_one_line_per_visible_job_with_filters(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use(api, monkeypatch)
    first, second, third = (submitted(api, capsys) for _ in range(3))
    assert main(["cancel", first]) == 0
    capsys.readouterr()
    assert main(["jobs"]) == 0
    assert {job["id"] for job in lines(capsys.readouterr().out)} == {first, second, third}
    assert main(["jobs", "--status", "cancelled"]) == 0
    assert [job["id"] for job in lines(capsys.readouterr().out)] == [first]
    assert main(["jobs", "--limit", "2"]) == 0
    assert len(lines(capsys.readouterr().out)) == 2
    assert main(["jobs", "--dataset", "other"]) == 0
    assert capsys.readouterr().out == ""
    use(api, monkeypatch, "analyst2")  # another analyst sees none of them
    assert main(["jobs"]) == 0
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["jobs", "--status", "done"], "invalid choice"),
        (["jobs", "--limit", "1001"], "must be <= 1000"),
        (["jobs", "--dataset", "no such"], "--dataset"),
    ],
)
def test_jobs_refuses_bad_arguments_before_any_request(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("vips: error:") and message in err


# ---- vips ledger ---------------------------------------------------------------------------------------


def test_ledger_summary_and_entries_pages(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use(api, monkeypatch)
    job_id = submitted(api, capsys)
    for iteration in (1, 2, 3):
        charge(api.engine, job_id, iteration)
    use(api, monkeypatch, "cust")
    assert main(["ledger", "priv"]) == 0
    summary = lines(capsys.readouterr().out)
    assert len(summary) == 1 and summary[0]["dataset"] == "priv"
    jobs = summary[0]["jobs"]
    assert isinstance(jobs, list) and [(j["job_id"], j["iterations_charged"]) for j in jobs] == [(job_id, 3)]

    assert main(["ledger", "priv", "--entries", "--limit", "2"]) == 0
    page = lines(capsys.readouterr().out)[0]
    assert [e["iteration"] for e in page["entries"]] == [1, 2] and page["next_cursor"]  # type: ignore[union-attr]
    assert main(["ledger", "priv", "--entries", "--limit", "2", "--cursor", str(page["next_cursor"])]) == 0
    rest = lines(capsys.readouterr().out)[0]
    assert [e["iteration"] for e in rest["entries"]] == [3] and rest["next_cursor"] is None  # type: ignore[union-attr]
    assert main(["ledger", "priv", "--entries", "--all", "--limit", "1"]) == 0
    whole = lines(capsys.readouterr().out)[0]
    assert [e["iteration"] for e in whole["entries"]] == [1, 2, 3]  # type: ignore[union-attr]
    assert "next_cursor" not in whole


def test_ledger_and_budget_show_say_why_the_epsilons_do_not_add_up(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 55: per-job epsilons (each job's releases alone) add up to more than the dataset's spend (all
    of them composed); `vips ledger` says why in one line, and `budget show` that the largest next job can
    exceed what is left."""
    use(api, monkeypatch)
    jobs = [submitted(api, capsys), submitted(api, capsys)]
    for job_id in jobs:
        for iteration in (1, 2, 3):
            charge(api.engine, job_id, iteration)
    use(api, monkeypatch, "cust")
    assert main(["ledger", "priv"]) == 0
    captured = capsys.readouterr()
    rows = lines(captured.out)[0]["jobs"]
    total = sum(row["epsilon_spent"] for row in rows)  # type: ignore[union-attr]
    spent = api.call("GET", "/v1/datasets/priv", "cust").json()["budget"]["epsilon_spent"]
    assert len(rows) == 2 and total > spent  # type: ignore[arg-type]
    assert "the 2 jobs' epsilons add up to" in captured.err and "compose, not add" in captured.err
    assert main(["ledger", "priv", "--by-key"]) == 0  # one key: nothing to add up
    assert "add up" not in capsys.readouterr().err
    assert main(["budget", "show", "priv"]) == 0
    err = capsys.readouterr().err
    assert "left of" in err and "Spends compose rather than add up" in err and "largest_epsilon" in err


def test_ledger_usage_and_role_errors(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ledger", "priv", "--all"]) == 2
    assert "add --entries" in capsys.readouterr().err
    assert main(["ledger", "priv", "--entries", "--all", "--cursor", "3"]) == 2
    assert "not allowed with" in capsys.readouterr().err
    use(api, monkeypatch, "analyst")  # the ledger is the custodian's
    assert main(["ledger", "priv"]) == 1
    assert capsys.readouterr().err.startswith("vips: error: 403")


# ---- vips fit --dry-run and the 409 line -----------------------------------------------------------


def test_dry_run_quotes_the_largest_epsilon_that_fits_and_reserves_nothing(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use(api, monkeypatch)
    submitted(api, capsys)  # something is reserved already
    assert main([*FIT, "--epsilon", "0.5", "--dry-run"]) == 0
    quote = lines(capsys.readouterr().out)[0]
    assert quote["admissible"] is True and quote["epsilon_budget"] == PRIVATE_BUDGET
    assert set(quote) >= {"epsilon_job", "epsilon_spent", "epsilon_reserved", "epsilon_remaining"}
    largest = quote["largest_epsilon"]
    assert isinstance(largest, float) and 0.5 < largest < PRIVATE_BUDGET
    assert len(api.queue.sent) == 1  # the dry run queued nothing

    # Slightly more than the largest epsilon is refused, with what is left and what would fit.
    assert main([*FIT, "--epsilon", f"{largest * 1.01!r}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("vips: error: 409: dataset priv:")
    assert f"epsilon remaining {quote['epsilon_remaining']:.4g}" in err
    assert f"could have at most epsilon {largest:.4g}" in err
    # Exactly the largest epsilon is admitted, and then (almost) nothing is left.
    assert main([*FIT, "--epsilon", repr(largest)]) == 0
    assert len(api.queue.sent) == 2
    capsys.readouterr()
    assert main([*FIT, "--epsilon", "0.5", "--dry-run"]) == 0
    after = lines(capsys.readouterr().out)[0]
    assert after["admissible"] is False and after["epsilon_remaining"] < 0.01  # type: ignore[operator]


def test_dry_run_without_a_cap_has_no_largest_epsilon(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use(api, monkeypatch)
    pub = ["fit", "--dataset", "pub", "--model", "blr", "--iterations", "3", "--sigma", "0", "--dry-run"]
    assert main(pub) == 0
    quote = lines(capsys.readouterr().out)[0]
    assert quote["largest_epsilon"] is None and quote["epsilon_budget"] is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--wait"], "--wait is for a submission"),
        (["-o", "p.json"], "-o is for a submission"),
        (["--local", "--kind", "tabular", "--input", "x.csv"], "--dry-run quotes a server job"),
    ],
)
def test_dry_run_usage_errors(extra: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*FIT, "--sigma", "2", "--dry-run", *extra]) == 2
    assert message in capsys.readouterr().err


# ---- vips --version -------------------------------------------------------------------------------


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"vips {metadata.version('vips-service')}"


# ---- job ids by unique prefix ----------------------------------------------------------------------


def test_job_ids_resolve_by_a_unique_prefix_of_eight_or_more_characters(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = iter(uuid.UUID(h) for h in ("abcdef12" + "0" * 24, "abcdef12" + "1" * 24, "abcdef13" + "0" * 24))
    monkeypatch.setattr(service.routes.submission, "uuid", SimpleNamespace(uuid4=lambda: next(ids)))
    use(api, monkeypatch)
    first, second, third = (submitted(api, capsys) for _ in range(3))
    assert third.startswith("abcdef13")

    assert main(["job", "abcdef13"]) == 0  # unique
    assert lines(capsys.readouterr().out)[0]["id"] == third
    assert main(["job", "abcdef120"]) == 0
    assert lines(capsys.readouterr().out)[0]["id"] == first
    assert main(["cancel", "abcdef13"]) == 0
    assert lines(capsys.readouterr().out)[0]["status"] == "cancelled"
    releases = api.call("GET", "/v1/jobs/abcdef13/releases", "analyst")
    assert releases.status_code == 200 and releases.json() == []

    assert main(["job", "abcdef12"]) == 1  # ambiguous: a 409 naming the candidates
    err = capsys.readouterr().err
    assert err.startswith("vips: error: 409:") and "ambiguous" in err and first in err and second in err
    assert main(["job", "abcdef1"]) == 1  # too short
    assert "404" in (err := capsys.readouterr().err) and "at least 8 characters" in err
    assert main(["job", "abcdef1_"]) == 1  # `_` is a character here, not a LIKE wildcard
    assert "404" in capsys.readouterr().err
    use(api, monkeypatch, "analyst2")  # a prefix resolves only among the jobs the key may read
    assert main(["job", "abcdef13"]) == 1
    assert "404" in capsys.readouterr().err
    use(api, monkeypatch, "cust2")  # the custodian of another dataset
    assert main(["job", "abcdef13"]) == 1
    assert "404" in capsys.readouterr().err
    for who in ("admin", "cust"):  # the admin, and the custodian of priv, see every job of priv
        use(api, monkeypatch, who)
        assert main(["job", "abcdef13"]) == 0
        assert lines(capsys.readouterr().out)[0]["id"] == third
