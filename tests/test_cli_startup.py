"""Start-up cost of the CLI (issue 13.3): the parser, --help and --version load no numerics, no web or
database stack and nothing of the worker; client verbs add only the HTTP client. Checked on the modules a
fresh interpreter has loaded, not on time (timings belong in bench/)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

#: Top-level packages whose import costs tenths of a second: none belongs in `vips --help`.
HEAVY = {"numpy", "scipy", "sklearn", "autodp", "dp_accounting", "pydantic", "sqlalchemy", "fastapi"}
HEAVY |= {"celery", "httpx", "rich", "worker", "alembic", "uvicorn"}


def loaded_after(code: str) -> set[str]:
    """Top-level packages loaded by a fresh interpreter after running `code`."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return set(json.loads(result.stdout.splitlines()[-1]))


@pytest.mark.parametrize(
    "argv", [["--help"], ["--version"], ["fit", "--help"], ["jobs", "--help"], ["wait", "--help"]]
)
def test_help_and_version_load_nothing_heavy(argv: list[str]) -> None:
    loaded = loaded_after(f"from vips.cli import main\nassert main({argv!r}) == 0")
    assert not loaded & HEAVY, sorted(loaded & HEAVY)


def test_a_usage_error_loads_nothing_heavy() -> None:
    loaded = loaded_after("from vips.cli import main\nassert main(['fit', '--model', 'nope']) == 2")
    assert not loaded & HEAVY, sorted(loaded & HEAVY)


def test_client_verbs_load_only_the_http_client() -> None:
    # httpx brings rich (its own CLI's dependency), which the --wait bar uses too.
    loaded = loaded_after("import vips.commands.remote")
    assert "httpx" in loaded
    assert not loaded & (HEAVY - {"httpx", "rich"}), sorted(loaded & HEAVY)


def test_every_verb_resolves_to_a_handler() -> None:
    """The handlers are named by string: each name must import and be callable."""
    from vips.cli import _handler, build_parser

    targets: set[str] = set()

    def walk(parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    if "handler" in child._defaults:
                        targets.add(child._defaults["handler"])
                    walk(child)

    walk(build_parser())
    assert len(targets) >= 20
    for target in targets:
        assert callable(_handler(target)), target
