"""`make test` on a fresh machine (issue 37, item 1): what the tests need is checked first, started or
installed where it can be, and whatever is missing is named in one message before anything runs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import prerequisites

ROOT = Path(__file__).resolve().parents[1]


def test_make_test_checks_the_machine_before_anything_else() -> None:
    makefile = (ROOT / "Makefile").read_text()
    test_rule = re.search(r"^test: (.*)$", makefile, re.M)
    assert test_rule is not None and test_rule.group(1).split()[0] == "prerequisites"
    assert re.search(r"^prerequisites:\n\t@\$\(PYTHON\) tests/prerequisites.py$", makefile, re.M)
    assert "exec make test" in (ROOT / ".ci" / "run").read_text()  # CI takes the user's path


def test_a_machine_with_everything_passes() -> None:
    # This machine runs the suite, so it has what the tests need: the check is silent and exits 0.
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests/prerequisites.py")], capture_output=True, text=True
    )
    assert (done.returncode, done.stderr) == (0, "")


def test_everything_missing_is_named_in_one_message(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A user's machine, not root: nothing listens, nothing can be started or installed.
    monkeypatch.setattr(prerequisites, "_listening", lambda port: False)
    monkeypatch.setattr(prerequisites, "START_SECONDS", 0.0)
    monkeypatch.setattr(prerequisites, "_start_postgresql", lambda: None)
    monkeypatch.setattr(prerequisites, "_start_redis", lambda: None)
    monkeypatch.setattr(prerequisites, "_apt_install", lambda *packages: False)
    monkeypatch.setattr(prerequisites, "CHROMIUM", tmp_path / "no-chromium")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv("CI", "true")
    assert prerequisites.main() == 1
    message = capsys.readouterr().err
    assert message.startswith("make test: this machine lacks what the tests need:")
    for needed in (
        "C compiler",
        "PostgreSQL on 127.0.0.1:5432",
        "Redis on 127.0.0.1:6379",
        "chromium",
        "Compose",
    ):
        assert needed in message, needed
    assert message.count("apt-get install") == 5  # each with the command that provides it
