"""What `make test` needs from the machine, checked before anything is installed or run (standard library
only: it runs under the system's python3, before .venv exists).

Needed: Python 3.11+ with venv, a C compiler (the exact sampler's extension), PostgreSQL on 127.0.0.1:5432
(trust authentication), Redis on 127.0.0.1:6379, Debian's chromium (the browser tests drive it), and under
CI (CI set) Docker Compose (tests/test_deployment.py; elsewhere that test says it skipped). A server
that is installed but down is started, and as root a missing package is installed with apt-get, as a fresh
CI machine needs; whatever is still missing is named in one message, with the command that provides it,
and the exit status is 1.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

#: Where tests/test_ui_browser.py finds the browser.
CHROMIUM = Path("/usr/bin/chromium")
#: Seconds a started server is given to accept connections.
START_SECONDS = 20.0


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def _run(*argv: str) -> bool:
    """Run a setup command quietly; whether it succeeded."""
    try:
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _apt_install(*packages: str) -> bool:
    """As root on Debian, install `packages`; False when this machine cannot."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return False
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    update = subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=env, check=False)
    install = subprocess.run(
        ["apt-get", "install", "-y", "-qq", *packages], capture_output=True, env=env, check=False
    )
    return update.returncode == 0 and install.returncode == 0


def _wait_for(port: int) -> bool:
    give_up = time.monotonic() + START_SECONDS
    while time.monotonic() < give_up:
        if _listening(port):
            return True
        time.sleep(0.5)
    return False


def _start_postgresql() -> None:
    clusters = Path("/etc/postgresql")
    if shutil.which("pg_ctlcluster") and clusters.is_dir():
        for version in sorted(p.name for p in clusters.iterdir()):
            _run("pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "start")


def _start_redis() -> None:
    if shutil.which("redis-server"):
        home = Path("/var/lib/redis") if os.access("/var/lib/redis", os.W_OK) else Path("/tmp")
        logs = Path("/var/log/redis") if os.access("/var/log/redis", os.W_OK) else Path("/tmp")
        _run(
            "redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", "6379",
            "--save", "", "--appendonly", "no", "--dir", str(home), "--logfile", str(logs / "ci.log"),
        )  # fmt: skip


def _server(port: int, start: Callable[[], None]) -> bool:
    if _listening(port):
        return True
    start()
    return _wait_for(port)


def _compiler() -> bool:
    return bool(shutil.which("cc") or shutil.which("gcc"))


def _chromium() -> bool:
    return CHROMIUM.exists()


def _compose_if_ci() -> bool:
    return not os.environ.get("CI") or _compose()


#: What a Debian package provides: (is it here, the package, what to say when it is not).
PACKAGED: tuple[tuple[Callable[[], bool], str, str], ...] = (
    (_compiler, "build-essential", "a C compiler (Debian: apt-get install build-essential)"),
    (
        _chromium,
        "chromium",
        f"Debian's chromium at {CHROMIUM}, for the browser tests (apt-get install chromium)",
    ),
    (
        _compose_if_ci,
        "docker-compose",
        "Docker Compose, which tests/test_deployment.py needs under CI (apt-get install docker-compose)",
    ),
)


def missing() -> list[str]:
    """Each prerequisite this machine lacks, with what provides it. Missing packages are installed in one
    apt-get run (as root on Debian) before they are named."""
    lacking: list[str] = []
    if sys.version_info < (3, 11):  # noqa: UP036 (this runs under the system python, before .venv)
        lacking.append(f"Python 3.11+ (this is {sys.version.split()[0]}): set PYTHON=python3.11 for make")
    if importlib.util.find_spec("ensurepip") is None:
        lacking.append("Python's venv module with pip (Debian: apt-get install python3-venv)")
    absent = [(present, package, message) for present, package, message in PACKAGED if not present()]
    if absent:
        _apt_install(*(package for _, package, _ in absent))
    lacking += [message for present, _, message in absent if not present()]
    if not _server(5432, _start_postgresql):
        lacking.append(
            "PostgreSQL on 127.0.0.1:5432 accepting the postgres user without a password (Debian: apt-get "
            "install postgresql, then `host all all 127.0.0.1/32 trust` in pg_hba.conf and "
            "`pg_ctlcluster <version> main start`)"
        )
    if not _server(6379, _start_redis):
        lacking.append(
            "Redis on 127.0.0.1:6379 (Debian: apt-get install redis-server; `redis-server` starts it)"
        )
    return lacking


def _compose() -> bool:
    """Whether `docker compose` or Debian's `docker-compose` runs (no engine needed to resolve a file)."""
    return bool(shutil.which("docker-compose")) or (
        bool(shutil.which("docker")) and _run("docker", "compose", "version")
    )


def main() -> int:
    lacking = missing()
    if lacking:
        lines = "\n".join(f"  - {item}" for item in lacking)
        print(f"make test: this machine lacks what the tests need:\n{lines}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
