"""A newcomer's rough edges (issue 37): each test is one thing a new user hit, in the order the issue
lists them."""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from privacy_wall.accounting.events import SubsampledGaussianEvent
from privacy_wall.data.settings import WallSettings
from privacy_wall.data.store import BoundViolation
from privacy_wall.ledger import database as ledger_db
from privacy_wall.ledger.base import BudgetExceeded, Charge
from privacy_wall.ledger.refusals import refusal_detail
from service.http.client import VipsClient
from tests.dbservers import fresh_database
from tests.test_api import finish, make_api
from tests.test_cli_small import _point_the_cli_at
from tests.test_ui import sign_in
from vips.cli import build_parser, main
from vips.commands import remote
from vips.commands.server import require_private_store
from vips.demo import make_home


@pytest.mark.slow
def test_a_reader_that_stops_early_ends_the_cli_quietly() -> None:
    """`vips jobs | head -1`: the pipe closes before the CLI writes; it used to end with "internal error
    (BrokenPipeError)" and exit 1. Now it exits as cat does (128 + SIGPIPE) and says nothing."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written
    argv = ["privacy", "epsilon", "--sigma", "1", "--batch-size", "100", "--population", "1000"]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "vips.cli", *argv, "--iterations", "10", "--delta", "1e-5"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (128 + signal.SIGPIPE, "")


def test_make_run_leaves_var_private_so_the_readmes_vips_up_accepts_it(tmp_path: Path) -> None:
    """`make run` created ./var at 0755 (only var/demo was 0700), so the README's next step, `vips up` with
    VIPS_HOME=$PWD/var, refused the store ("open to group or others")."""
    previous = os.umask(0o022)  # a user's usual umask
    try:
        make_home(tmp_path / "var" / "demo")
    finally:
        os.umask(previous)
    for folder in (tmp_path / "var", tmp_path / "var" / "demo"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    require_private_store(WallSettings(home=tmp_path / "var"), ("control", "sensitive"))  # vips up's check


def test_the_spend_chart_of_a_public_dataset_after_a_sigma_zero_job_is_drawn(tmp_path: Path) -> None:
    """/ui/datasets/pub/epsilon.svg answered 500 ("Axis limits cannot be NaN or Inf") once a sigma = 0 job
    had run on the public dataset: its spend is unbounded. Now the chart shades that span."""
    with fresh_database("sqlite", tmp_path) as url:
        for api in make_api(url, tmp_path):
            job = api.submit(dataset="pub", sigma=0.0, batch_size=200, iterations=1)
            assert job.status_code == 202, job.text
            event = SubsampledGaussianEvent(0.0, 200, 200)
            ledger_db.commit_charge(api.engine, Charge("pub", job.json()["id"], 1, event))
            finish(api.engine, job.json()["id"])
            sign_in(api, "admin")
            chart = api.client.get("/ui/datasets/pub/epsilon.svg")
            assert chart.status_code == 200, chart.text[:300]
            assert "unbounded" in chart.text and chart.text.lstrip().startswith("<?xml")


def test_a_public_dataset_takes_no_cap_so_its_sigma_zero_jobs_are_never_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sigma-0 job on a public dataset was refused once a budget was set ("this would bring it to inf").
    Public data needs no privacy and its sigma-0 jobs spend an unbounded epsilon, so a public dataset takes
    no cap: PUT budget (the dashboard's form calls it) and a key's quota refuse one with 422 naming why;
    its delta alone may be set (epsilon null), and sigma-0 jobs stay admitted (docs/design.md)."""
    with fresh_database("sqlite", tmp_path) as url:
        for api in make_api(url, tmp_path):
            capped = api.call("PUT", "/v1/datasets/pub/budget", "admin", json={"epsilon": 1.0, "delta": 1e-5})
            assert capped.status_code == 422, capped.text
            assert "dataset pub is public: it takes no epsilon cap" in capped.text
            quota = api.call(
                "PUT", f"/v1/datasets/pub/quotas/{api.ids['analyst']}", "admin", json={"epsilon": 1}
            )
            assert quota.status_code == 422 and "is public" in quota.text, quota.text
            uncapped = api.call(
                "PUT", "/v1/datasets/pub/budget", "admin", json={"epsilon": None, "delta": 1e-6}
            )
            assert uncapped.status_code == 200 and uncapped.json()["epsilon"] is None, uncapped.text
            job = api.submit(dataset="pub", sigma=0.0, batch_size=200, iterations=1)
            assert job.status_code == 202, job.text
            ledger_db.commit_charge(
                api.engine, Charge("pub", job.json()["id"], 1, SubsampledGaussianEvent(0, 200, 200))
            )
            again = api.submit(dataset="pub", sigma=0.0, batch_size=200, iterations=1)
            assert again.status_code == 202, again.text
            _point_the_cli_at(api, api.keys["admin"], monkeypatch)  # the CLI says the same, exit 2
            err = _run(capsys, ["budget", "set", "pub", "--epsilon", "1", "--delta", "1e-5"])
            assert "dataset pub is public: it takes no epsilon cap" in err, err
            assert main(["budget", "set", "pub", "--delta", "1e-6"]) == 0  # its delta alone (as charged)
            assert json.loads(capsys.readouterr().out)["epsilon"] is None
            err = _run(capsys, ["budget", "set", "priv", "--delta", "1e-5"])
            assert "dataset priv is private: it needs an epsilon cap" in err, err


class _Jobs(VipsClient):
    """A client whose job answers are scripted: `vips wait`'s bar reads nothing else."""

    def __init__(self, polls: list[dict[str, Any]], running: list[dict[str, Any]]) -> None:
        super().__init__("http://testserver", "k", http=httpx.Client())
        self.polls, self.running = polls, running

    def job(self, job_id: str) -> dict[str, Any]:
        return self.polls.pop(0) if len(self.polls) > 1 else self.polls[0]

    def jobs(self, **query: Any) -> list[dict[str, Any]]:
        assert query.get("status") == "running"
        return self.running


def _job(job_id: str, status: str, iteration: int, started: float | None, **more: Any) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "id": job_id,
        "status": status,
        "iteration": iteration,
        "iterations": 10,
        "key_name": "ana",
        "epsilon_spent": None,
        "created_at": (now - timedelta(seconds=300)).isoformat(),
        "started_at": None if started is None else (now - timedelta(seconds=started)).isoformat(),
        **more,
    }


def test_vips_wait_keeps_the_jobs_clock_after_ctrl_c(capsys: pytest.CaptureFixture[str]) -> None:
    """`vips wait` after Ctrl-C restarted the bar's clock at 0:00:00 (ETA unknown): the clock now runs from
    the job's started_at, so a job that started 90 s ago shows 0:01:30 when it is reattached."""
    api = _Jobs([_job("a" * 32, "running", 5, 90), _job("a" * 32, "succeeded", 10, 90.5)], [])
    remote._wait_with_progress(api, api.job("a" * 32), None)
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("job aaaaaaaa succeeded 10/10") and line.endswith(("0:01:30", "0:01:31")), line


@pytest.mark.slow
def test_a_queued_job_says_what_it_waits_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job queued behind the same key's job showed only "queued" for 52 s: the bar now says which job
    it waits behind, with that job's time left as the floor of its ETA, or that it waits for a worker."""
    shown: list[tuple[str, float | None]] = []

    @contextmanager
    def recording(label: str, total: int, status: str = "running") -> Iterator[Any]:
        def update(done: int, epsilon: float | None, status: str, **clock: Any) -> None:
            shown.append((status, clock.get("eta")))

        yield update

    monkeypatch.setattr(remote, "fit_progress", recording)
    ahead = _job("b" * 32, "running", 2, 20)  # 10 s an iteration: 80 s left
    mine = _job("c" * 32, "queued", 0, None)
    api = _Jobs([mine, _job("c" * 32, "cancelled", 0, None)], [ahead])
    remote._wait_with_progress(api, mine, None)
    status, eta = shown[0]
    assert status == "queued: behind your job bbbbbbbb" and eta is not None and 79 < eta <= 81, shown
    api = _Jobs([mine, _job("c" * 32, "cancelled", 0, None)], [])
    shown.clear()
    remote._wait_with_progress(api, mine, None)
    assert shown[0] == ("queued: waiting for a free worker", None)


def test_a_data_norm_that_clips_most_rows_says_what_to_do() -> None:
    """make_pipeline(StandardScaler(), VIPSLogisticRegression(epsilon=1, data_norm=5)) on Adult clipped
    29,478 of 32,561 rows and scored below the majority class; the warning only counted them. It now says
    what share that is, what bound standardised rows need (from the number of columns, a public fact,
    never from the rows) and where the README explains the alternative (PublicBoundsScaler)."""
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from vips import VIPSLogisticRegression
    from vips.preprocessing import DataNormWarning

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 36)) * 3 + 1
    y = (x[:, 0] > 1).astype(int)
    pipeline = make_pipeline(StandardScaler(), VIPSLogisticRegression(epsilon=1, data_norm=5, iterations=2))
    with pytest.warns(DataNormWarning) as caught:
        pipeline.fit(x, y)
    (message,) = {str(w.message) for w in caught if issubclass(w.category, DataNormWarning)}
    assert message.startswith(" of 400 rows had an L2 norm above data_norm=5", message.index(" "))
    for advice in (
        "% of the rows",
        "sqrt(d) = 6 for these d = 36 columns",
        "18 = 3 sqrt(d)",
        "PublicBoundsScaler",
    ):
        assert advice in message, (advice, message)
    assert "never computed from them" in message and "Unbounded rows" in message


# ---- messages (issue 37, "Messages") ---------------------------------------------------------------------


def _run(capsys: pytest.CaptureFixture[str], argv: list[str], code: int = 2) -> str:
    assert main(argv) == code, capsys.readouterr()
    return " ".join(capsys.readouterr().err.split())


def test_a_refusal_explains_why_the_largest_job_exceeds_what_remains() -> None:
    """ "epsilon remaining 0.1005; a job of this schedule could have at most epsilon 0.3866" read as a
    contradiction: the detail now says that spends compose rather than add up."""
    refused = BudgetExceeded("dataset d: over", spent=0.8995, requested=1.2, budget=1.0)
    detail = refusal_detail(refused, 0.3866)
    assert "epsilon remaining 0.1005; a job of this schedule could have at most epsilon 0.3866" in detail
    assert "more than what remains because spends compose rather than add up" in detail
    assert "compose" not in refusal_detail(refused, 0.05)  # no contradiction to explain


def test_jobs_of_an_unknown_dataset_name_it_with_a_suggestion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`vips jobs --dataset adlt` printed nothing and exited 0; a 404 of a dataset suggests close names
    among those the key may see (fit, budget show, jobs)."""
    with fresh_database("sqlite", tmp_path) as url:
        for api in make_api(url, tmp_path):
            _point_the_cli_at(api, api.keys["analyst"], monkeypatch)
            err = _run(capsys, ["jobs", "--dataset", "prv"])
            assert "dataset prv not found (did you mean 'priv'?)" in err, err
            assert "did you mean 'priv'" in _run(capsys, ["budget", "show", "prvi"], code=1)
            quote = ["fit", "--dataset", "nobudgte", "--model", "blr", "--sigma", "1", "--dry-run"]
            assert "did you mean 'nobudget'" in _run(capsys, quote, code=1)
            assert main(["jobs", "--dataset", "priv"]) == 0  # known, no jobs: nothing, exit 0
            forbidden = api.call(
                "PUT", "/v1/datasets/priv/budget", "analyst", json={"epsilon": 1, "delta": 1e-5}
            )
            assert "role one of custodian, admin;" in forbidden.text or "role one of admin, custodian;" in (
                forbidden.text
            ), forbidden.text


def test_a_mistyped_choice_label_column_or_bound_gets_a_suggestion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--model bl, --label lable, --text-column txt and a bounds file's typo: each names the close name."""
    err = _run(capsys, ["fit", "--local", "--model", "bl", "--sigma", "1"])
    assert "invalid choice: 'bl'" in err and "(did you mean 'blr'?)" in err
    # another tool's name for a model names ours, not the closest spelling (logreg is not linreg; issue 55)
    for name in ("logreg", "LogisticRegression", "logistic_regression"):
        err = _run(capsys, ["fit", "--local", "--model", name, "--sigma", "1"])
        assert (
            "(logistic regression is 'blr')" in err
            and "linreg" not in err.split("(choose from")[1].split(")")[1]
        )
    assert "(linear regression is 'linreg')" in _run(
        capsys, ["fit", "--local", "--model", "ols", "--sigma", "1"]
    )
    data = tmp_path / "d.csv"
    data.write_text("age,hours,label\n0.1,0.2,1\n0.3,0.1,0\n")
    err = _run(
        capsys,
        [
            "fit",
            "--local",
            "--kind",
            "tabular",
            "--input",
            str(data),
            "--label",
            "lable",
            "--model",
            "blr",
            "--sigma",
            "1",
            "--iterations",
            "1",
            "--batch-size",
            "2",
        ],
    )
    assert "no label column 'lable' (did you mean 'label'?)" in err, err
    assert "--label names the label column" in err
    notes = tmp_path / "notes.csv"
    notes.write_text("id,text\n1,a secret note\n")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("secret\nnote\n")
    out = str(tmp_path / "notes")
    argv = ["data", "prepare-text", "--vocab", str(vocab), "--input-csv", str(notes), "-o", out]
    err = _run(capsys, [*argv, "--text-column", "txt"])
    assert "no column 'txt' (did you mean 'text'?)" in err and "secret" not in err, err
    bounds = tmp_path / "bounds.csv"
    bounds.write_text("column,lower,upper\nage,0,1\nhuors,0,1\n")
    err = _run(
        capsys, ["scale", "--input", str(data), "--bounds", str(bounds), "-o", str(tmp_path / "s.csv")]
    )
    assert "has no bounds for column(s) hours (did you mean 'huors'?)" in err, err
    assert f"its bounds for huors name no column of {data}" in err, err


def test_counts_read_as_english() -> None:
    """ "1 documents have" (prepare-text's summary)."""
    from vips.commands.prepare_text import _documents_have

    assert (_documents_have(1), _documents_have(2)) == ("1 document has", "2 documents have")


def test_an_unreachable_service_names_vips_url_and_its_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("VIPS_URL", raising=False)
    monkeypatch.setenv("VIPS_API_KEY", "vips_x_y")
    monkeypatch.setattr("service.http.client.DEFAULT_URL", "http://127.0.0.1:9")
    monkeypatch.setattr("vips.commands.remote.DEFAULT_URL", "http://127.0.0.1:9")
    err = _run(capsys, ["jobs"], code=1)
    assert "VIPS_URL is not set, so the default http://127.0.0.1:9" in err and "vips up" in err, err
    monkeypatch.setenv("VIPS_URL", "http://127.0.0.1:9")
    assert "the address is VIPS_URL's" in _run(capsys, ["jobs"], code=1)


def test_rows_above_norm_one_point_to_data_norm() -> None:
    """The estimator's BoundViolation (rows above norm 1, no data_norm) said how many rows but not what to
    do: it now points to data_norm and PublicBoundsScaler, still naming no value."""
    from vips import VIPSLogisticRegression

    x = np.random.default_rng(0).normal(size=(50, 4)) * 2
    with pytest.raises(BoundViolation) as refused:
        VIPSLogisticRegression(epsilon=1, iterations=1).fit(x, (x[:, 0] > 0).astype(int))
    message = str(refused.value)
    assert "rows in all" in message and "data_norm=B" in message and "PublicBoundsScaler" in message


def test_every_verb_and_option_has_help_text() -> None:
    """worker, beat, migrate, JOB, --model, --algorithm, budget set --epsilon/--delta had none."""

    def missing(parser: argparse.ArgumentParser, path: str) -> list[str]:
        found: list[str] = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {choice.dest: choice.help for choice in action._choices_actions}
                for name, sub in action.choices.items():
                    found += [] if helps.get(name) else [f"{path} {name}"]
                    found += missing(sub, f"{path} {name}")
            elif not isinstance(action, argparse._HelpAction) and not action.help:
                found.append(f"{path} {'/'.join(action.option_strings) or action.metavar or action.dest}")
        return found

    assert missing(build_parser(), "vips") == []


def test_the_dev_install_has_pandas_so_the_dataframe_checks_run() -> None:
    """scikit-learn's DataFrame estimator checks were skipped ("pandas is not installed"): the dev extra
    did not name pandas. tests/test_estimator_sklearn.py now also fails on a skipped check."""
    import tomllib

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    dev = project["project"]["optional-dependencies"]["dev"]
    assert any(requirement.split(">")[0].split("=")[0].strip() == "pandas" for requirement in dev), dev


def test_a_budget_inside_stratified_cross_validation_is_warned_about() -> None:
    """cross_val_score(..., cv=3) with a PrivacyBudget used stratified folds without a word, though the
    README says to split by index: the fit now warns, and cv=KFold(3) stays quiet."""
    import warnings

    from sklearn.model_selection import KFold, cross_val_score

    from vips import PrivacyBudget, VIPSLogisticRegression
    from vips.estimators import StratifiedFoldsWarning

    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 3)) / 2
    x /= np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))
    y = (x[:, 0] > 0).astype(int)

    def model() -> VIPSLogisticRegression:
        return VIPSLogisticRegression(epsilon=0.2, iterations=2, budget=PrivacyBudget(epsilon=10.0))

    with pytest.warns(StratifiedFoldsWarning, match=r"StratifiedKFold.*cv=KFold\(k\)"):
        cross_val_score(model(), x, y, cv=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", StratifiedFoldsWarning)
        cross_val_score(model(), x, y, cv=KFold(3))
        cross_val_score(VIPSLogisticRegression(epsilon=0.2, iterations=2), x, y, cv=3)  # no budget


def test_hypothesis_leaves_no_garbage_collection_callback_behind() -> None:
    """A stray KeyboardInterrupt traceback from hypothesis's gc_callback appeared in `make test`: the
    callback stayed in gc.callbacks after any property test, where a late SIGINT landed. conftest keeps
    it out."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=3, deadline=None, database=None)
    @given(st.integers())
    def a_property(number: int) -> None:
        assert number == number

    a_property()
    assert [hook for hook in gc.callbacks if "hypothesis" in getattr(hook, "__module__", "")] == []


# ---- what I have left (issue 37, item 3) ------------------------------------------------------------------


def test_budget_show_and_fit_wait_tell_an_analyst_both_what_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`vips budget show` and the end of `fit --wait` named only the dataset's remaining epsilon; an analyst
    with a quota now sees the quota's too, and the end of a job the largest next job of its schedule that
    fits both (the dry-run quote's largest_epsilon, which composes rather than subtracts)."""
    with fresh_database("sqlite", tmp_path) as url:
        for api in make_api(url, tmp_path):
            quota = api.call(
                "PUT", f"/v1/datasets/priv/quotas/{api.ids['analyst']}", "admin", json={"epsilon": 2.0}
            )
            assert quota.status_code == 200, quota.text
            _point_the_cli_at(api, api.keys["analyst"], monkeypatch)
            assert main(["budget", "show", "priv"]) == 0
            captured = capsys.readouterr()
            shown = json.loads(captured.out)
            assert shown["key_quota"]["epsilon"] == 2.0 and shown["key_quota"]["epsilon_remaining"] == 2.0
            err = " ".join(captured.err.split())
            assert "dataset priv has epsilon" in err and "your key's quota has epsilon 2 left of 2" in err
            assert "--dry-run" in err and "largest_epsilon" in err

            job = api.submit().json()
            finish(api.engine, job["id"])
            analyst = VipsClient("http://testserver", api.keys["analyst"], http=api.client)
            line = remote.budget_left(analyst, analyst.job(job["id"]))
            assert "dataset priv has epsilon" in line and "your key's quota has epsilon 2 left of 2" in line
            largest = re.search(
                r"the largest next job of this schedule that fits both: epsilon ([\d.]+)", line
            )
            assert largest is not None, line
            quote = api.submit(dry_run=True).json()
            assert float(largest.group(1)) == pytest.approx(quote["largest_epsilon"], rel=1e-2)


def test_a_mistyped_column_of_predict_input_is_paired_with_its_typo() -> None:
    """predict / evaluate / the estimators name missing and unexpected columns; a close pair is a typo."""
    from vips.columns import ColumnMismatch, column_order

    with pytest.raises(
        ColumnMismatch, match=r"missing 'hours' \(did you mean 'huors'\?\); unexpected 'huors'"
    ):
        column_order(["age", "huors"], ["age", "hours"])
