"""Server-side verbs: `vips serve`, `vips worker`, `vips up` (embedded all-in-one), `vips migrate`.

`vips up` is the embedded default: SQLite files and a file-system Celery broker under $VIPS_HOME (no
Redis, no PostgreSQL), the API in this process and one real Celery worker as a child process.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

from privacy_wall.settings import WallSettings
from service.settings import ServiceSettings
from vips.errors import RuntimeFailure
from vips.migrate import upgrade


def migrate_all(home: Path | None = None) -> None:
    """Bring both databases of this configuration to their Alembic heads."""
    wall = WallSettings() if home is None else WallSettings(home=home)
    wall.home.mkdir(parents=True, exist_ok=True)
    upgrade("control", wall.control_url())
    upgrade("sensitive", wall.sensitive_url())


def run_migrate(args: argparse.Namespace) -> int:
    wall = WallSettings()
    wall.home.mkdir(parents=True, exist_ok=True)
    if args.database in ("control", "all"):
        upgrade("control", wall.control_url())
    if args.database in ("sensitive", "all"):
        upgrade("sensitive", wall.sensitive_url())
    print(f"vips: {args.database} database(s) at the latest migration", file=sys.stderr)
    return 0


def _serve(settings: ServiceSettings, host: str, port: int, workers: int = 1) -> None:
    """uvicorn on the app; several worker processes build their apps from the same environment."""
    import uvicorn

    from service.app import create_app

    if workers == 1:
        uvicorn.run(create_app(settings), host=host, port=port, log_level="warning")
        return
    uvicorn.run(
        "service.app:create_app", factory=True, host=host, port=port, workers=workers, log_level="warning"
    )


def run_serve(args: argparse.Namespace) -> int:
    settings = ServiceSettings()
    if settings.control_database_url is None:
        settings.home.mkdir(parents=True, exist_ok=True)
        upgrade("control", settings.control_url())
    _serve(settings, args.host, args.port, args.workers)
    return 0


def worker_argv(concurrency: int) -> list[str]:
    pool = (
        ["--pool", "solo"] if concurrency == 1 else ["--pool", "threads", "--concurrency", str(concurrency)]
    )
    return ["worker", "--loglevel", "WARNING", "--without-gossip", "--without-mingle", *pool]


def run_worker(args: argparse.Namespace) -> int:
    from worker.celery_app import app

    app.worker_main(worker_argv(args.concurrency))
    return 0


def run_beat(args: argparse.Namespace) -> int:
    """Celery beat with the schedule of service.settings.celery_config (the reaper); state in VIPS_HOME."""
    from worker.celery_app import app

    settings = ServiceSettings()
    settings.home.mkdir(parents=True, exist_ok=True)
    schedule = settings.home.resolve() / "celerybeat-schedule"
    app.start(["beat", "--loglevel", "WARNING", "--schedule", str(schedule)])
    return 0


def run_up(args: argparse.Namespace) -> int:
    settings = ServiceSettings()
    if settings.broker_url or settings.control_database_url:
        raise RuntimeFailure("vips up is the embedded mode: unset VIPS_BROKER_URL and the database URLs")
    home = settings.home.resolve()
    migrate_all(home)
    env = {**os.environ, "VIPS_HOME": str(home)}
    with (home / "worker.log").open("ab") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "vips.cli", "worker"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def stop(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    print(
        f"vips: serving on http://{args.host}:{args.port} (embedded: files under {home}, "
        f"worker log {home / 'worker.log'})",
        file=sys.stderr,
    )
    try:
        _serve(ServiceSettings(home=home), args.host, args.port)
    except KeyboardInterrupt:
        pass
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    return 0
