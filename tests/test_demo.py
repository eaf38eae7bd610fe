"""`make run` (vips.demo): the README's first command runs the main job end to end on the embedded default,
from a fresh checkout under the usual umask 022, and says why when `vips up` cannot start."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from vips import demo


@pytest.fixture
def usual_umask() -> Iterator[None]:
    """The umask of a login shell (022), whatever the test runner's."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.mark.slow
def test_the_demo_runs_end_to_end_under_the_usual_umask(tmp_path: Path, usual_umask: None) -> None:
    """Its store is made private (vips up refuses one others can read); the job fits, the posterior predicts
    Adult's test split far above chance, and the overspending job is refused."""
    summary = demo.run(tmp_path / "var" / "demo", iterations=3)
    assert summary["second_job"] == "refused with 409"
    assert (
        summary["test_auc"] > 0.75
    )  # non-private VIPS-BLR reaches ~0.90; eps 0.9 at T = 3 stays far above 0.5
    assert 0 < summary["epsilon_spent"] <= 0.9 + 1e-9
    assert (tmp_path / "var" / "demo").stat().st_mode & 0o077 == 0


def test_a_vips_up_that_exits_is_explained_by_its_log(tmp_path: Path) -> None:
    log = tmp_path / "up.log"
    log.write_text("starting\nvips: error: VIPS_HOME /x is open to group or others (mode 0755)\n")
    exited = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    exited.wait()
    with pytest.raises(SystemExit) as stopped:
        demo.wait_ready("http://127.0.0.1:9", exited, log)
    message = str(stopped.value)
    assert "vips up exited with 1" in message and "is open to group or others" in message
