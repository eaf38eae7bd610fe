"""Server-side verbs: `vips serve`, `vips worker`, `vips up` (embedded all-in-one), `vips migrate`.

`vips up` is the embedded default: SQLite files and a file-system Celery broker under $VIPS_HOME (no
Redis, no PostgreSQL), the API in this process and one real Celery worker as a child process.
"""

from __future__ import annotations

import argparse
import atexit
import os
import resource
import shlex
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from types import FrameType

from sqlalchemy import Engine

from control.settings import (
    JOB_PROCESS_BASE_MB,
    MIN_JOB_MEMORY_MB,
    SHARD_WORKER_ENV,
    ServiceSettings,
    machine_memory_mb,
    shard_queue,
)
from control.store.db import create_control_engine
from control.store.keys import create_key, list_keys
from privacy_wall.data.settings import WallSettings
from vips.errors import RuntimeFailure, UsageError
from vips.listen import bind_listener
from vips.migrate import History, upgrade
from vips.store_lock import lock_store
from vips.supervisor import WorkerSupervisor, end_when_orphaned

#: The files of an embedded (SQLite) database: the database itself and its journals, when present.
_SQLITE_SUFFIXES = ("", "-wal", "-shm", "-journal")


def _refuse_if_shared(path: Path, what: str, fix: str) -> None:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise RuntimeFailure(
            f"{what} {path} is open to group or others (mode {mode:04o}); the store must be private to "
            f"its owner: run `chmod {fix} {shlex.quote(str(path))}` and try again"
        )


def require_private_store(wall: WallSettings, databases: Iterable[History]) -> None:
    """Refuse (RuntimeFailure) a store other local users could read or write: VIPS_HOME must be 0700
    and each embedded database file of `databases` (with its -wal, -shm or -journal file) 0600, where they
    exist. Databases given by URL (PostgreSQL) have no file here; when all of them do, VIPS_HOME holds
    nothing of theirs and is not checked. What the server-side verbs create comes out private under the
    umask 077 they run with (vips.cli)."""
    urls = {"control": wall.control_database_url, "sensitive": wall.sensitive_database_url}
    embedded = [database for database in databases if urls[database] is None]
    home = wall.home.resolve()
    if not embedded or not home.exists():
        return
    _refuse_if_shared(home, "VIPS_HOME", "700")
    for database in embedded:
        for suffix in _SQLITE_SUFFIXES:
            path = home / f"{database}.db{suffix}"
            if path.exists():
                _refuse_if_shared(path, "the database file", "600")


def _private_home(wall: WallSettings, databases: tuple[History, ...]) -> Path:
    """VIPS_HOME, checked (require_private_store) and created 0700 if it does not exist yet."""
    require_private_store(wall, databases)
    home = wall.home.resolve()
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    return home


def migrate(databases: tuple[History, ...], home: Path | None = None) -> None:
    """Bring `databases` of this configuration to their Alembic heads, creating embedded ones."""
    wall = WallSettings() if home is None else WallSettings(home=home)
    _private_home(wall, databases)
    for database in databases:
        upgrade(database, wall.sensitive_url() if database == "sensitive" else wall.control_url())


def migrate_all(home: Path | None = None) -> None:
    """Bring both databases of this configuration to their Alembic heads."""
    migrate(("control", "sensitive"), home)


def open_store(databases: tuple[History, ...] = ("control", "sensitive")) -> WallSettings:
    """The configured store. An embedded database (a SQLite file under VIPS_HOME) must exist already and
    is brought to its latest migration; only `vips up` and `vips migrate` create one, so that a command
    run in the wrong directory never starts a second, empty store. Databases given by URL are
    production's, migrated as a deployment step (`vips migrate`)."""
    wall = WallSettings()
    require_private_store(wall, databases)
    urls: dict[History, str | None] = {
        "control": wall.control_database_url,
        "sensitive": wall.sensitive_database_url,
    }
    for database in databases:
        if urls[database] is not None:
            continue
        path = wall.home.resolve() / f"{database}.db"
        if not path.is_file():
            where = "VIPS_HOME" if "VIPS_HOME" in os.environ else "VIPS_HOME is unset, so ./var"
            raise RuntimeFailure(
                f"no VIPS store here: {path} does not exist ({where}); point VIPS_HOME at the store "
                "`vips up` printed, or create one with `vips up` or `vips migrate all`"
            )
        upgrade(database, wall.sensitive_url() if database == "sensitive" else wall.control_url())
    return wall


def run_migrate(args: argparse.Namespace) -> int:
    migrate(("control", "sensitive") if args.database == "all" else (args.database,))
    print(f"vips: {args.database} database(s) at the latest migration", file=sys.stderr)
    return 0


def _serve(
    settings: ServiceSettings, host: str, port: int, workers: int = 1, listener: socket.socket | None = None
) -> None:
    """uvicorn on the app; several worker processes build their apps from the same environment. With
    `listener` (one process), uvicorn serves on that already bound socket."""
    import uvicorn

    from service.app import create_app
    from service.http.server import uvicorn_options

    # forwarded headers are read by the app, from VIPS_TRUSTED_PROXIES only (service.http.proxies)
    limits = {**uvicorn_options(settings), "proxy_headers": False}
    if listener is not None:
        config = uvicorn.Config(create_app(settings), host=host, port=port, log_level="warning", **limits)
        server = uvicorn.Server(config)
        server.run(sockets=[listener])
        if not server.started:  # as uvicorn.run: a failed start is a failure, not a clean stop
            raise RuntimeFailure("the API did not start (see above)")
        return
    if workers == 1:
        uvicorn.run(create_app(settings), host=host, port=port, log_level="warning", **limits)
        return
    uvicorn.run(
        "service.app:create_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level="warning",
        **limits,
    )


def run_serve(args: argparse.Namespace) -> int:
    settings = ServiceSettings()
    open_store(("control",))
    _serve(settings, args.host, args.port, args.workers)
    return 0


def worker_argv(concurrency: int, replace_above_kib: int | None = None) -> list[str]:
    """Celery's prefork pool: `concurrency` job processes, each running one job at a time, so a job that
    outgrows the address-space limit (inherited by every job process) fails alone and its neighbour runs
    on; a job process whose peak resident memory exceeded `replace_above_kib` is replaced by a fresh one
    after that job (what a job's leftovers hold goes back to the machine), without restarting the worker."""
    pool = ["--pool", "prefork", "--concurrency", str(concurrency)]
    if replace_above_kib is not None:
        pool += ["--max-memory-per-child", str(replace_above_kib)]
    return ["worker", "--loglevel", "WARNING", "--without-gossip", "--without-mingle", *pool]


def limit_address_space(limit: int | None) -> None:
    """Cap this process's address space (RLIMIT_AS, soft limit; never above the hard one), inherited by
    each job process it forks: past it an allocation raises MemoryError in the job that asked, which fails
    that job alone and refunds its rest."""
    if limit is None:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(
        resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard)
    )


def run_worker(args: argparse.Namespace) -> int:
    require_private_store(WallSettings(), ("control", "sensitive"))
    settings = ServiceSettings()
    shard: int | None = _claimed_shard(settings) if args.shard == "auto" else args.shard
    if shard is not None and not shard < settings.shards:
        raise UsageError(
            f"--shard {shard}: VIPS_SHARDS is {settings.shards}, so shards are 0..{settings.shards - 1}"
        )
    if shard is not None:
        os.environ[SHARD_WORKER_ENV] = str(shard)  # before the tasks module reads it (worker_ready)
    from worker.celery_app import app

    concurrency = args.concurrency if args.concurrency is not None else settings.worker_concurrency
    limit = settings.worker_memory_bytes()
    if limit is not None and concurrency * limit > machine_memory_mb() * (1 << 20):
        print(
            f"vips: warning: {concurrency} job processes of up to {limit >> 20} MiB each could use more than "
            f"this machine's {machine_memory_mb():.0f} MiB; lower VIPS_MAX_JOB_MEMORY_MB or --concurrency",
            file=sys.stderr,
        )
    limit_address_space(limit)
    end_when_orphaned()
    argv = worker_argv(concurrency, settings.job_process_replace_kib())
    if shard is not None:  # one process: its shard's rows decoded once, one release at a time
        argv = [*worker_argv(1, settings.job_process_replace_kib()), "--queues", shard_queue(shard)]
    app.worker_main(argv)
    return 0


#: A shard worker renews its lease this often; a lease not renewed for LEASE_STALE_SECONDS is free.
LEASE_RENEW_SECONDS = 5.0
LEASE_STALE_SECONDS = 30.0


def _claimed_shard(settings: ServiceSettings) -> int:
    """`--shard auto`: lease the lowest shard no live worker serves (waiting while all are served), renew
    the lease from a daemon thread for as long as this process lives, and return the shard."""
    if settings.shards < 2:
        raise UsageError("--shard auto: VIPS_SHARDS is 1, so there are no shards to serve")
    from privacy_wall.shards import claim_shard, release_lease, renew_lease
    from privacy_wall.sqlengine import create_db_engine

    engine = create_db_engine(WallSettings().sensitive_url())
    holder = f"{socket.gethostname()}:{os.getpid()}"
    announced = False
    while (shard := claim_shard(engine, settings.shards, holder, LEASE_STALE_SECONDS)) is None:
        if not announced:
            print(
                f"vips: all {settings.shards} shards are served; waiting for one to free up", file=sys.stderr
            )
            announced = True
        time.sleep(LEASE_RENEW_SECONDS)

    def renew() -> None:
        while True:
            time.sleep(LEASE_RENEW_SECONDS)
            try:
                if not renew_lease(engine, shard, holder):
                    # It went stale (this host stalled) and another took it: end, so that one worker serves
                    # the shard; a supervisor or Compose restarts this one, which claims again.
                    print(f"vips: another worker took shard {shard}'s lease; stopping", file=sys.stderr)
                    os.kill(os.getpid(), signal.SIGTERM)
                    return
            except Exception as exc:  # the database is away: the lease goes stale, another may take it
                print(f"vips: could not renew shard {shard}'s lease ({type(exc).__name__})", file=sys.stderr)

    threading.Thread(target=renew, name="shard-lease", daemon=True).start()
    atexit.register(release_lease, engine, shard, holder)
    print(f"vips: serving shard {shard} of {settings.shards}", file=sys.stderr)
    return shard


def run_beat(args: argparse.Namespace) -> int:
    """Celery beat with the schedule of control.settings.celery_config (the reaper); state in VIPS_HOME."""
    from worker.celery_app import app

    settings = ServiceSettings()
    settings.home.mkdir(parents=True, exist_ok=True)
    schedule = settings.home.resolve() / "celerybeat-schedule"
    app.start(["beat", "--loglevel", "WARNING", "--schedule", str(schedule)])
    return 0


def _first_admin_key(control: Engine) -> str | None:
    """On a store's first start (no key at all), an admin key to begin with; later starts make none."""
    if list_keys(control):
        return None
    return create_key(control, "admin")[1]


def _welcome(url: str, home: Path, admin_key: str | None) -> str:
    """What `vips up` prints: where it serves, where its store is, and the lines that point the CLI of
    another shell at it (with the admin key, shown once, on the first start)."""
    lines = [
        f"vips: serving on {url} (API docs {url}/docs); store {home}, worker log {home / 'worker.log'}",
        "vips: to use it from another shell:",
        f"  export VIPS_HOME={shlex.quote(str(home))}",
        f"  export VIPS_URL={url}",
    ]
    if admin_key is not None:
        lines.append(f"  export VIPS_API_KEY={admin_key}   # an admin key: shown this once")
    lines.append(
        "vips: then `vips admin create-key --role custodian --dataset NAME` (and analyst, client) "
        "makes each role's key; Ctrl-C stops the service"
    )
    return "\n".join(lines)


def run_up(args: argparse.Namespace) -> int:
    """The embedded mode. Its boundary, as far as one user's machine allows: only the worker process
    (and the migration, a child process) opens sensitive.db; VIPS_HOME is 0700 and every file in it
    0600, so other local users cannot read the rows. The API and the worker still run as the same
    user, so they are not separated from each other the way production's networks separate them.
    A VIPS_HOME or database file open to others is refused (require_private_store), never chmod-ed.
    A store already served by another `vips up` is refused (vips.store_lock), and a port in use before
    anything is printed or started (vips.listen)."""
    settings = ServiceSettings()
    if settings.broker_url or settings.control_database_url:
        raise RuntimeFailure("vips up is the embedded mode: unset VIPS_BROKER_URL and the database URLs")
    home = _private_home(WallSettings(home=settings.home), ("control", "sensitive"))
    url = f"http://{args.host}:{args.port}"
    lock = lock_store(home, url)  # before anything touches the store: one `vips up` per VIPS_HOME
    try:
        listener = bind_listener(args.host, args.port)  # before anything is printed or started
    except RuntimeFailure:
        lock.release()
        raise
    try:
        return _run_embedded(args, home, url, listener)
    finally:
        listener.close()
        lock.release()


def embedded_memory_caps(settings: ServiceSettings) -> dict[str, str]:
    """The environment that keeps `vips up`'s job processes (the worker's and one per shard worker) within
    this machine's memory together: if their address-space caps would sum past it, a warning and each
    capped at an equal share (VIPS_WORKER_MEMORY_MB), the largest admitted job lowered to fit it (in
    `settings` too, which the API admits by); nothing when they fit or when caps are off (0)."""
    limit = settings.worker_memory_bytes()
    processes = settings.job_processes
    machine = machine_memory_mb()
    if limit is None or processes * limit <= machine * (1 << 20):
        return {}
    share = int(machine // processes)
    print(
        f"vips: warning: {processes} job processes ({settings.worker_concurrency} of the worker"
        + (f", {settings.shards} shard workers" if processes > settings.worker_concurrency else "")
        + f") of up to {limit >> 20} MiB each would pass this machine's {machine:.0f} MiB: each is capped "
        f"at {share} MiB (set VIPS_WORKER_MEMORY_MB, VIPS_MAX_JOB_MEMORY_MB or fewer processes to choose)",
        file=sys.stderr,
    )
    largest_job = max(share - JOB_PROCESS_BASE_MB - settings.worker_cache_mb, MIN_JOB_MEMORY_MB)
    settings.max_job_memory_mb = min(settings.max_job_memory_mb, largest_job)
    return {"VIPS_WORKER_MEMORY_MB": str(share), "VIPS_MAX_JOB_MEMORY_MB": f"{settings.max_job_memory_mb:g}"}


def _run_embedded(args: argparse.Namespace, home: Path, url: str, listener: socket.socket) -> int:
    """`vips up` once it holds its store's lock and its port: migrate, start the worker, serve."""
    env = {**os.environ, "VIPS_HOME": str(home)}
    migrated = subprocess.run([sys.executable, "-m", "vips.cli", "migrate", "all"], env=env, check=False)
    if migrated.returncode != 0:
        raise RuntimeFailure("the migration of the embedded databases failed (see above)")
    embedded = ServiceSettings(home=home)
    control = create_control_engine(embedded)
    embedded.worker_alive_path().unlink(missing_ok=True)  # a previous run's
    from control.jobs.queue import CeleryQueue
    from control.jobs.reaper import requeue_interrupted_jobs

    queue = CeleryQueue(embedded)
    try:
        resumed = requeue_interrupted_jobs(control, queue)  # before the worker: none of them is held
    finally:
        queue.close()
    env.update(embedded_memory_caps(embedded))
    stall = embedded.worker_stall_seconds
    worker = WorkerSupervisor(env, home / "worker.log", control, embedded.worker_alive_path(), None, stall)
    shard_workers = [
        WorkerSupervisor(
            env, home / f"shard-{shard}.log", control, embedded.worker_alive_path(shard), shard, stall
        )
        for shard in range(embedded.shards if embedded.shards > 1 else 0)
    ]

    def stop(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    print(_welcome(url, home, _first_admin_key(control)), file=sys.stderr)
    if resumed:
        print(f"vips: resuming {len(resumed)} job(s) the last run left unfinished", file=sys.stderr)
    try:
        _serve(embedded, args.host, args.port, listener=listener)
    except KeyboardInterrupt:
        pass
    finally:
        for supervised in [worker, *shard_workers]:
            supervised.stop()
        control.dispose()
    return 0
