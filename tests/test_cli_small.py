"""The small things of issue 24.8 in the CLI: `budget show` without the schema unless asked, help texts that
say what `up --host/--port` and `data ingest`'s formats are."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.http.client import VipsClient
from tests.dbservers import fresh_database
from tests.test_api import Api, make_api
from vips.cli import main


def _point_the_cli_at(api: Api, key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's client talks to the in-process app with `key`."""
    client = api.client
    monkeypatch.setattr(client, "close", lambda: None)  # each CLI run closes its client
    monkeypatch.setattr(
        VipsClient, "from_env", classmethod(lambda cls, env=None: cls("http://testserver", key, http=client))
    )


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    """The API in process, the CLI's client pointed at it with the custodian key of dataset priv."""
    with fresh_database("sqlite", tmp_path, "control") as url:
        for api in make_api(url, tmp_path):
            _point_the_cli_at(api, api.keys["cust"], monkeypatch)
            yield api


def test_budget_show_leaves_the_schema_out_unless_asked(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["budget", "show", "priv"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["name"] == "priv" and "budget" in shown and "schema" not in shown
    assert main(["budget", "show", "priv", "--schema"]) == 0
    assert "schema" in json.loads(capsys.readouterr().out)


def _help(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main([*argv, "--help"]) == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines


def test_up_says_what_host_and_port_are(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(capsys, ["up"])
    assert "the address to listen on" in text and "the TCP port to listen on (default 8000)" in text


def test_ingest_help_describes_every_file_format(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(capsys, ["data", "ingest"])
    for words in ("numeric CSV with a header line", "0/1 labels", "norm <= 1", "target in [-1, 1]"):
        assert words in text, words
    assert "CSV of 0/1 columns" in text and "UCI docword" in text and "one word per line" in text
