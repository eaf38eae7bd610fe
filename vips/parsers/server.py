"""`vips up`, `serve`, `worker`, `beat` and `migrate` (handlers: vips.commands.server)."""

from __future__ import annotations

from vips.parsers.base import (
    Subparsers,
    positive_int,
    shard,
)


def add_server(commands: Subparsers) -> None:
    for name, helptext, handler in (
        (
            "up",
            "embedded all-in-one: API + one worker, SQLite and a file broker under $VIPS_HOME",
            "server:run_up",
        ),
        ("serve", "the API (configured by environment; embedded files without URLs)", "server:run_serve"),
    ):
        parser = commands.add_parser(name, help=helptext, description=helptext)
        parser.add_argument(
            "--host",
            default="127.0.0.1",
            help="the address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: every interface)",
        )
        parser.add_argument(
            "--port", type=positive_int, default=8000, help="the TCP port to listen on (default 8000)"
        )
        parser.set_defaults(handler=handler)
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="API processes (about one per core serves most reads)",
    )
    helptext = (
        "a Celery worker that runs jobs through the privacy wall (configured by environment: the database "
        "URLs and VIPS_BROKER_URL; without them, the embedded files under $VIPS_HOME)"
    )
    parser = commands.add_parser("worker", help=helptext, description=helptext)
    parser.add_argument(
        "--concurrency",
        type=positive_int,
        default=None,
        help="jobs run at once, each in its own process (default VIPS_WORKER_CONCURRENCY, 2: one key's long "
        "job never holds every slot, as a key runs at most VIPS_MAX_RUNNING_PER_KEY jobs at once)",
    )
    parser.add_argument(
        "--shard",
        type=shard,
        default=None,
        metavar="K|auto",
        help="serve shard K of VIPS_SHARDS only (its part of every full pass, its rows kept in memory) "
        "instead of running jobs; auto: the lowest shard no live worker serves (waits for one to free up), "
        "so `docker compose up --scale shard-worker=K` needs no numbering",
    )
    parser.set_defaults(handler="server:run_worker")
    helptext = (
        "Celery beat: queues the periodic reaper, which fails and refunds jobs no worker runs (production; "
        "`vips up` and the API run the reaper themselves)"
    )
    parser = commands.add_parser("beat", help=helptext, description=helptext)
    parser.set_defaults(handler="server:run_beat")
    helptext = "bring a database to its latest Alembic migration (run before serve and worker)"
    parser = commands.add_parser("migrate", help=helptext, description=helptext)
    parser.add_argument(
        "database",
        choices=("control", "sensitive", "all"),
        help="control (keys, jobs, budgets, the ledger), sensitive (the rows behind the wall) or all",
    )
    parser.set_defaults(handler="server:run_migrate")
