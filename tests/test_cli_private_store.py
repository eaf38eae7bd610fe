"""The server-side verbs keep the store private to its owner (issue 21.5): they run under umask 077, so
what they create comes out 0700 / 0600, and they refuse a VIPS_HOME or an SQLite file of the store that
group or others could read or write, naming the path, its mode and the chmod that fixes it. Client-side
verbs keep the user's umask for the files they write for the user."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from privacy_wall.data.schema import blocks
from privacy_wall.sqlengine import create_db_engine
from tests.dbservers import fresh_database
from vips.cli import main

URLS = ("VIPS_CONTROL_DATABASE_URL", "VIPS_SENSITIVE_DATABASE_URL", "VIPS_BROKER_URL")
GOOD = "a,b,label\n0.1,0.2,1\n0.3,0.4,0\n"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def snapshot(home: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry of the store: its mode, size and modification time."""
    return {
        str(p.relative_to(home)): (p.stat().st_mode, p.stat().st_size, p.stat().st_mtime_ns)
        for p in home.rglob("*")
    }


def stored_rows(home: Path) -> int:
    engine = create_db_engine(f"sqlite:///{home / 'sensitive.db'}")
    try:
        with engine.connect() as conn:
            return int(conn.execute(select(func.coalesce(func.sum(blocks.c.row_count), 0))).scalar_one())
    finally:
        engine.dispose()


def refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run a verb that must be refused: exit 1, one line `vips: error: ...`, nothing on stdout."""
    capsys.readouterr()
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("vips: error: ") and len(err.strip().splitlines()) == 1, err
    return err


@pytest.fixture
def store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Iterator[Path]:
    """A store made by `vips migrate all` in-process under umask 022: private all the same."""
    home = tmp_path / "home"
    monkeypatch.setenv("VIPS_HOME", str(home))
    for name in URLS:
        monkeypatch.delenv(name, raising=False)
    previous = os.umask(0o022)
    try:
        assert main(["migrate", "all"]) == 0
        assert os.umask(0o022) == 0o022  # the verb's umask 077 was restored after it
    finally:
        os.umask(previous)
    capsys.readouterr()
    assert mode(home) == 0o700
    assert all(mode(p) == 0o600 for p in home.iterdir()), snapshot(home)
    yield home.resolve()


def ingest_argv(tmp_path: Path) -> list[str]:
    data = tmp_path / "d.csv"
    data.write_text(GOOD)
    return ["data", "ingest", "d", "--kind", "tabular", "--input", str(data)]


@pytest.mark.slow
def test_migrate_under_umask_022_makes_a_private_store(tmp_path: Path) -> None:
    """`(umask 022; vips migrate all)` on a fresh VIPS_HOME: the folders 0700, every file 0600."""
    home = tmp_path / "new" / "home"
    env = {name: value for name, value in os.environ.items() if not name.startswith("VIPS_")}
    done = subprocess.run(
        ["sh", "-c", 'umask 022 && exec "$0" -m vips.cli migrate all', sys.executable],
        env={**env, "VIPS_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    entries = list(home.rglob("*"))
    assert {"control.db", "sensitive.db"} <= {p.name for p in entries}
    assert mode(home) == mode(home.parent) == 0o700
    for path in entries:
        assert mode(path) == (0o700 if path.is_dir() else 0o600), path


def test_ingest_into_a_home_open_to_others_is_refused_and_writes_nothing(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ingest_argv(tmp_path)
    store.chmod(0o755)
    before = snapshot(store)
    err = refused(capsys, argv)
    assert f"VIPS_HOME {store} is open to group or others (mode 0755)" in err
    assert f"run `chmod 700 {store}`" in err
    assert snapshot(store) == before
    store.chmod(0o700)  # the fix the message names
    assert stored_rows(store) == 0
    assert main(argv) == 0
    assert stored_rows(store) == 2


@pytest.mark.parametrize("database", ["sensitive.db", "control.db"])
def test_ingest_into_a_database_file_open_to_others_is_refused_and_writes_nothing(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], database: str
) -> None:
    argv = ingest_argv(tmp_path)
    path = store / database
    path.chmod(0o644)
    before = snapshot(store)
    err = refused(capsys, argv)
    assert f"the database file {path} is open to group or others (mode 0644)" in err
    assert f"run `chmod 600 {path}`" in err
    assert snapshot(store) == before
    path.chmod(0o600)
    assert stored_rows(store) == 0
    assert main(argv) == 0
    assert stored_rows(store) == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["migrate", "all"],
        ["migrate", "control"],
        ["admin", "create-key", "--role", "admin"],
        ["admin", "list-keys"],
        ["serve", "--port", "9"],
        ["worker"],
        ["up", "--port", "9"],
    ],
)
def test_every_server_side_verb_refuses_a_store_open_to_others(
    store: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    store.chmod(0o750)
    before = snapshot(store)
    err = refused(capsys, argv)
    assert f"VIPS_HOME {store} is open to group or others (mode 0750)" in err
    assert snapshot(store) == before
    store.chmod(0o700)
    (store / "control.db-wal").touch()
    (store / "control.db-wal").chmod(0o604)
    err = refused(capsys, argv)
    assert f"run `chmod 600 {store / 'control.db-wal'}`" in err


@pytest.mark.postgres
def test_databases_given_by_url_have_no_file_to_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Production's PostgreSQL databases: a VIPS_HOME open to others holds nothing of theirs."""
    home = tmp_path / "shared"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    monkeypatch.setenv("VIPS_HOME", str(home))
    monkeypatch.delenv("VIPS_BROKER_URL", raising=False)
    with (
        fresh_database("postgresql", tmp_path) as control,
        fresh_database("postgresql", tmp_path) as sensitive,
    ):
        monkeypatch.setenv("VIPS_CONTROL_DATABASE_URL", control)
        monkeypatch.setenv("VIPS_SENSITIVE_DATABASE_URL", sensitive)
        assert main(["migrate", "all"]) == 0
        assert main(["admin", "list-keys"]) == 0
    capsys.readouterr()
    assert list(home.iterdir()) == []


def test_vips_scale_writes_the_scaled_rows_private_under_umask_022(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The scaled rows are the custodian's sensitive data (issue 34.11): 0600, like `data prepare-text`'s
    files, also over an existing 0644 file and a stale temporary file of a killed run."""
    (tmp_path / "raw.csv").write_text(GOOD)
    (tmp_path / "bounds.csv").write_text("column,lower,upper\na,0,1\nb,0,1\n")
    out = tmp_path / "scaled.csv"
    argv = ["scale", "--input", str(tmp_path / "raw.csv"), "--bounds", str(tmp_path / "bounds.csv")]
    previous = os.umask(0o022)
    try:
        assert main([*argv, "-o", str(out)]) == 0
        assert mode(out) == 0o600
        out.chmod(0o644)
        stale = tmp_path / "scaled.csv.tmp"
        stale.write_text("left by a killed run\n")
        assert mode(stale) == 0o644
        assert main([*argv, "-o", str(out)]) == 0
        assert os.umask(0o022) == 0o022  # the verb's umask 077 was restored after it
    finally:
        os.umask(previous)
    capsys.readouterr()
    assert mode(out) == 0o600 and not stale.exists()
    assert out.read_text().splitlines()[0] == "intercept,a,b,label"


def test_client_side_verbs_keep_the_users_umask(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What they write for the user (here a local fit's posterior, from a file of public data)."""
    (tmp_path / "public.csv").write_text(GOOD)
    out = tmp_path / "posterior.json"
    fit = ["fit", "--local", "--kind", "tabular", "--input", str(tmp_path / "public.csv"), "--model", "blr"]
    previous = os.umask(0o022)
    try:
        assert main([*fit, "--iterations", "1", "--sigma", "0", "-o", str(out)]) == 0
    finally:
        os.umask(previous)
    capsys.readouterr()
    assert mode(out) == 0o644
