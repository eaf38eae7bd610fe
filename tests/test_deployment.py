"""The deployment files: docker-compose.yml as Compose itself resolves it (no engine needed), the
Dockerfile's inputs, and the trust boundary they encode (docs/design.md section 1).

Compose is run as `docker compose config` or Debian's `docker-compose config`; under CI (CI=true) one of
them must exist (.ci/run installs Debian's docker-compose), elsewhere the test says plainly it skipped.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from vips.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
SENSITIVE_DB = "sensitive-db"
#: docker-compose.yml has no default for these (`${VAR:?message}`): the checks set their own.
PASSWORDS = {
    "VIPS_CONTROL_DB_PASSWORD": "compose-check-control-secret",
    "VIPS_SENSITIVE_DB_PASSWORD": "compose-check-sensitive-secret",
}


def compose_command() -> list[str] | None:
    """A Compose CLI that can resolve a file without an engine, or None."""
    docker = shutil.which("docker")
    if docker is not None:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True)
        if probe.returncode == 0:
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy is not None else None


def compose_config(
    tmp_path: Path, variables: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`config` of docker-compose.yml with exactly `variables` set: no VIPS_ variable of this process's
    environment and no .env of the checkout (an empty --env-file stands in for it)."""
    command = compose_command()
    if command is None:
        if os.environ.get("CI") == "true":
            pytest.fail(
                "no Compose CLI under CI; make test (tests/prerequisites.py) installs Debian's docker-compose"
            )
        pytest.skip("SKIPPED: no `docker compose` or `docker-compose` to resolve docker-compose.yml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIPS_")}
    env.update(variables or {})
    no_dotenv = tmp_path / "empty.env"
    no_dotenv.touch()
    return subprocess.run(
        [*command, "-f", str(ROOT / "docker-compose.yml"), "--env-file", str(no_dotenv), "config"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
    )


@pytest.fixture(scope="module")
def compose(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """docker-compose.yml as resolved by Compose (anchors and merges applied, the passwords set)."""
    done = compose_config(tmp_path_factory.mktemp("compose"), PASSWORDS)
    assert done.returncode == 0, f"Compose rejects docker-compose.yml:\n{done.stderr}"
    resolved: dict[str, Any] = yaml.safe_load(done.stdout)
    return resolved


def networks(service: dict[str, Any]) -> set[str]:
    return set(service.get("networks") or {})


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def command_argv(service: dict[str, Any]) -> list[str]:
    command = service.get("command")
    return shlex.split(command) if isinstance(command, str) else list(command)


def test_compose_has_every_role(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {
        "api",
        "worker",
        "shard-worker",
        "beat",
        "redis",
        "control-db",
        SENSITIVE_DB,
        "migrate",
    }
    assert "--appendonly" in compose["services"]["redis"]["command"]  # queued tasks survive a restart


def test_the_api_cannot_reach_the_sensitive_database(compose: dict[str, Any]) -> None:
    services = compose["services"]
    api, sensitive = services["api"], services[SENSITIVE_DB]
    assert networks(api) and networks(sensitive)
    assert not networks(api) & networks(sensitive), "the api shares a network with the sensitive database"
    secrets = {environment(sensitive)["POSTGRES_PASSWORD"], environment(sensitive)["POSTGRES_USER"]}
    for name, value in environment(api).items():
        assert "SENSITIVE" not in name.upper(), f"the api is given {name}"
        assert SENSITIVE_DB not in value, f"the api's {name} names the sensitive database"
        assert not any(secret in value for secret in secrets), f"the api's {name} carries its credentials"
    # The sensitive network is internal and only the wall's processes join it.
    assert compose["networks"]["sensitive"].get("internal") is True
    members = {name for name, service in services.items() if networks(service) & networks(sensitive)}
    assert members == {SENSITIVE_DB, "worker", "shard-worker", "migrate"}


def test_the_database_passwords_come_from_the_environment(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert environment(services["control-db"])["POSTGRES_PASSWORD"] == PASSWORDS["VIPS_CONTROL_DB_PASSWORD"]
    assert environment(services[SENSITIVE_DB])["POSTGRES_PASSWORD"] == PASSWORDS["VIPS_SENSITIVE_DB_PASSWORD"]
    assert (
        f":{PASSWORDS['VIPS_SENSITIVE_DB_PASSWORD']}@"
        in environment(services["worker"])["VIPS_SENSITIVE_DATABASE_URL"]
    )
    assert (
        f":{PASSWORDS['VIPS_CONTROL_DB_PASSWORD']}@"
        in environment(services["api"])["VIPS_CONTROL_DATABASE_URL"]
    )


@pytest.mark.parametrize("missing", sorted(PASSWORDS))
def test_compose_refuses_to_run_without_a_database_password(tmp_path: Path, missing: str) -> None:
    """No fallback password: without the variable, Compose stops and names it."""
    done = compose_config(tmp_path, {k: v for k, v in PASSWORDS.items() if k != missing})
    assert done.returncode != 0, f"Compose resolved docker-compose.yml without {missing}"
    assert missing in done.stderr, done.stderr
    assert "vips-control" not in done.stdout and "vips-sensitive" not in done.stdout


def test_only_the_api_publishes_a_port(compose: dict[str, Any]) -> None:
    published = {name for name, service in compose["services"].items() if service.get("ports")}
    assert published == {"api"}


def test_every_vips_role_runs_a_real_cli_verb_with_its_urls(compose: dict[str, Any]) -> None:
    services = compose["services"]
    parser = build_parser()
    for name in ("api", "worker", "shard-worker", "migrate"):
        service = services[name]
        assert service["image"] == services["api"]["image"]
        argv = command_argv(service)
        parser.parse_args(argv)  # raises on a verb or option the CLI does not have
        env = environment(service)
        assert env["VIPS_CONTROL_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert "VIPS_SENSITIVE_DATABASE_URL" in environment(services["worker"])
    assert "VIPS_SENSITIVE_DATABASE_URL" in environment(services["migrate"])
    assert (
        environment(services["worker"])["VIPS_BROKER_URL"] == environment(services["api"])["VIPS_BROKER_URL"]
    )
    beat = services["beat"]  # queues the reaper: needs the broker only, no database URL at all
    parser.parse_args(command_argv(beat))
    assert set(environment(beat)) == {"VIPS_BROKER_URL"} and networks(beat) == {"control"}
    assert command_argv(services["migrate"]) == ["migrate", "all"]
    # Shard workers: started only with `--profile shards`, each leasing a free shard, with the worker's K.
    shard = services["shard-worker"]
    assert shard.get("profiles") == ["shards"] and command_argv(shard) == ["worker", "--shard", "auto"]
    assert environment(shard)["VIPS_SHARDS"] == environment(services["worker"])["VIPS_SHARDS"] == "1"
    assert environment(shard)["VIPS_BROKER_URL"] == environment(services["worker"])["VIPS_BROKER_URL"]
    assert "VIPS_SENSITIVE_DATABASE_URL" in environment(shard)


def test_the_dockerfile_copies_what_exists_and_runs_the_console_script() -> None:
    text = (ROOT / "Dockerfile").read_text()
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0] != "COPY" or any(p.startswith("--from") for p in parts):
            continue
        for source in parts[1:-1]:
            assert (ROOT / source).exists(), f"the Dockerfile copies {source}, which is not in the repository"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert re.search(r'^ENTRYPOINT \["vips"\]$', text, re.MULTILINE)
    assert "vips" in project["project"]["scripts"]


@pytest.mark.slow
def test_the_wheel_ships_every_migration(tmp_path: Path) -> None:
    """The image installs a wheel: every file Alembic needs and the compiled sampler are in it, and building
    it warns of nothing (no deprecated license table, no package left out of the configuration)."""
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "Warning" not in built.stdout + built.stderr, built.stdout + built.stderr
    (wheel,) = tmp_path.glob("vips_service-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    needed = [
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "migrations").rglob("*")
        if path.is_file() and path.suffix in (".py", ".mako") and "__pycache__" not in path.parts
    ]
    assert len(needed) >= 10
    for relative in needed:
        assert relative in shipped, f"{relative} is not shipped"
    # The compiled sampler ships built, without its generated C source.
    assert any(n.startswith("privacy_wall/noise/_discrete_gaussian.") and n.endswith(".so") for n in shipped)
    assert "privacy_wall/noise/_discrete_gaussian.c" not in shipped
