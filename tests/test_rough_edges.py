"""A newcomer's rough edges (issue 37): each test is one thing a new user hit, in the order the issue
lists them."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

from privacy_wall import ledger_db
from privacy_wall.accounting import SubsampledGaussianEvent
from privacy_wall.ledger import Charge
from privacy_wall.settings import WallSettings
from tests.dbservers import fresh_database
from tests.test_api import finish, make_api
from tests.test_ui import sign_in
from vips.commands.server import require_private_store
from vips.demo import make_home


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
