"""Settings of the API process (and of the clients of its queue). No sensitive-database URL lives here.

Environment (prefix VIPS_): VIPS_HOME (embedded files, default ./var), VIPS_CONTROL_DATABASE_URL,
VIPS_BROKER_URL (Redis in production). Without URLs, everything is embedded under VIPS_HOME: a SQLite
control database and a file-system Celery broker that needs no Redis.
"""

from __future__ import annotations

import ipaddress
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

#: A trusted proxy's network (VIPS_TRUSTED_PROXIES; service.http.proxies).
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(text: str) -> tuple[Network, ...]:
    """A comma-separated list of addresses and CIDR networks ("127.0.0.1,::1,10.0.0.0/8"); ValueError
    names an entry that is neither. An address is the network of that one address."""
    networks = []
    for item in text.split(","):
        entry = item.strip()
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(f"{entry!r} is not an IP address or CIDR network") from None
    return tuple(networks)


#: Embedded mode: the worker touches its alive file this often; /readyz wants it fresher than the stale age.
WORKER_ALIVE_SECONDS = 2.0
WORKER_STALE_SECONDS = 10.0

#: Embedded mode: Celery's broker_transport, kombu's file-system transport whose messages appear whole.
FILE_BROKER_TRANSPORT = "control.jobs.file_broker:Transport"
#: Production: Celery's broker_transport for a redis:// broker, kombu's Redis transport with a fix that
#: keeps a worker alive through a Redis outage while it runs a job (control.jobs.redis_broker).
REDIS_BROKER_TRANSPORT = "control.jobs.redis_broker:Transport"

RUN_JOB_TASK = "vips.run_job"
REAP_TASK = "vips.reap"
SHARD_TASK = "vips.shard_sums"
#: Set in a shard worker's process (`vips worker --shard K`): it serves shard K's queue only, and leaves the
#: reaper and the alive file to the job worker.
SHARD_WORKER_ENV = "VIPS_SHARD_WORKER"


def shard_queue(shard: int) -> str:
    """The broker queue of shard `shard`'s worker."""
    return f"vips.shard.{shard}"


#: What a job process holds before any job (MiB): the interpreter, numpy, scipy and the drivers (an idle
#: job process maps about 670 MB and keeps about 170 MB resident).
JOB_PROCESS_BASE_MB = 1024


#: The share of this machine's memory a worker's job processes may use together by default (the rest:
#: the API, the databases, shard workers and the system).
JOB_PROCESSES_SHARE = 0.8
#: The smallest default job memory (MiB), however little the machine has.
MIN_JOB_MEMORY_MB = 512.0


@lru_cache
def machine_memory_mb() -> float:
    """This machine's physical memory in MiB (read once); 8192 where the OS does not say."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 8192.0
    return total / (1 << 20) if total > 0 else 8192.0


def default_job_memory_mb(concurrency: int = 2, cache_mb: float = 1024.0) -> float:
    """The largest job (MiB) whose job process, `concurrency` of them at once, fits JOB_PROCESSES_SHARE of
    this machine: share x memory / concurrency - the process's start - its dataset cache (at least
    MIN_JOB_MEMORY_MB). 24 GiB, 2 processes, 1 GiB cache: 7,782 MiB a job, 9,830 MiB a process."""
    per_process = JOB_PROCESSES_SHARE * machine_memory_mb() / max(concurrency, 1)
    return max(per_process - JOB_PROCESS_BASE_MB - cache_mb, MIN_JOB_MEMORY_MB)


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VIPS_", extra="ignore")

    home: Path = Path("var")
    control_database_url: str | None = None
    broker_url: str | None = None
    heartbeat_timeout_seconds: float = 60.0
    #: A job queued this long after submission (or after a worker last deferred it) whose task the broker
    #: no longer holds was lost: failed and refunded. One whose task waits in the broker is never reaped.
    queued_timeout_seconds: float = 300.0
    #: How often the API process (and each worker, and Celery beat) runs the reaper (control.jobs.reaper).
    reaper_interval_seconds: float = 10.0
    max_iterations: int = 100_000
    #: Resource limits (control.planning.resources): a job whose estimated worker memory, size of one stored
    #: release, or total stored bytes (releases and posterior) exceed them is refused with a 422 at
    #: submission. Memory defaults to what lets worker_concurrency job processes, each with its start, its
    #: dataset cache and one such job, fit 80% of this machine's memory together (default_job_memory_mb).
    max_job_memory_mb: float = Field(default=0.0, ge=0)  # 0: that default, filled in below
    max_release_mb: float = Field(default=64.0, gt=0)
    max_job_stored_mb: float = Field(default=1024.0, gt=0)
    #: What one key's jobs may store in the control database together (control.jobs.storage): queued and
    #: running jobs at their estimates, ended ones at what they stored; a job that would pass it is refused
    #: (409) until the key deletes finished jobs' outputs.
    max_key_stored_mb: float = Field(default=2048.0, gt=0)
    #: The dashboard summarises and plots posteriors of at most this many MiB (a page never parses a larger
    #: one: LDA with 1,000 topics stores ~280 MB, ~8 s to parse); larger ones are offered as downloads.
    ui_posterior_max_mb: float = Field(default=16.0, gt=0)
    #: GET /v1/jobs/{id}/releases answers in pages of at most this many MiB of stored releases (at least one
    #: release each), its Link header naming the next page.
    releases_page_mb: float = Field(default=8.0, gt=0)
    #: The hard limit on each of a worker's job processes (its address space, RLIMIT_AS, in MiB; a job
    #: process runs one job at a time): an estimate that was wrong fails the job that outgrows it
    #: (MemoryError: failed, the unspent rest refunded), not its neighbours nor the worker. Default: the
    #: process's start (1 GiB), its dataset cache (worker_cache_mb) and one job of max_job_memory_mb, at
    #: most twice this machine's memory; 0: no limit.
    worker_memory_mb: float | None = Field(default=None, ge=0)
    #: Each job process of a worker keeps decoded datasets between iterations and jobs
    #: (privacy_wall.data.dataset_cache), at most this many MiB of arrays (a worker of worker_concurrency job
    #: processes may hold that many times it); a dataset larger than it is read from the database on every
    #: full pass.
    worker_cache_mb: float = Field(default=1024.0, ge=0)
    #: Requests pricing a job (calibration, quotes) run the accountant in at most `pricing_slots` threads of
    #: the request pool at once; a request that waits `pricing_wait_seconds` for a slot gets a 503.
    pricing_slots: int = 2
    pricing_wait_seconds: float = 10.0
    #: How often each API process prices the dashboard's spend curves of datasets whose ledger changed
    #: (service.ui.views.warm_spend_curves), so that no page view waits for the accountant; 0: never.
    ui_warm_interval_seconds: float = 5.0
    #: Request bodies above this many bytes are refused (413) before they are parsed.
    max_body_bytes: int = 1 << 20
    #: Peers (comma-separated addresses and CIDR networks) whose X-Forwarded-Proto and X-Forwarded-For
    #: are believed (service.http.proxies): the reverse proxies in front of the API. Default: loopback only.
    trusted_proxies: str = "127.0.0.1,::1"
    #: A key keeps at most this many dashboard sessions; signing in once more closes its oldest.
    max_sessions_per_key: int = Field(default=10, ge=1)
    #: Fair queues (docs/design.md section 3): a key may have at most max_queued_per_key jobs queued
    #: (429 above it) and max_running_per_key running; a worker defers a job of a key at its running limit
    #: for defer_seconds and takes another key's. A job running longer than max_job_seconds is stopped
    #: (failed, its unspent budget refunded). Pricing requests (quotes, calibrations) of one key are
    #: limited to pricing_rate_per_key per second, bursts of pricing_burst_per_key (429 above it).
    max_queued_per_key: int = 20
    max_running_per_key: int = 1
    defer_seconds: float = 2.0
    max_job_seconds: float = 86_400.0
    pricing_rate_per_key: float = 5.0
    pricing_burst_per_key: int = 20
    #: Reads (GET and HEAD of the API and the dashboard) of one key are limited to read_rate_per_key per
    #: second, bursts of read_burst_per_key (429 with Retry-After above it; service.http.auth), so one key's
    #: scripts cannot slow every other key's reads. Generous by default: a dashboard page with its plots
    #: is a handful of reads, `vips wait` and Client.wait poll once a second, and a notebook listing
    #: jobs then reading each is a burst of one per job; 20 per second (burst 200) is 20 times what any
    #: of them needs, while one key's threads at ~150 reads per second each stay capped at 20.
    read_rate_per_key: float = Field(default=20.0, gt=0)
    read_burst_per_key: int = Field(default=200, ge=1)
    #: ... and to this many at once (429 with Retry-After 1 above it): a fair share of the request threads
    #: and cores, so that one key's many threads viewing its heaviest page cannot make every other key
    #: wait. A browser shows a page in one request (its plots are inline) and the CLI and the Client read
    #: one at a time; 4 leaves room for a few tabs and scripts of one key.
    reads_in_flight_per_key: int = Field(default=4, ge=1)
    #: Jobs one `vips worker` runs at once (job processes) unless --concurrency says otherwise; above
    #: max_running_per_key, so one key's long job never holds every slot.
    worker_concurrency: int = 2
    #: Embedded mode: a worker whose alive file (worker_alive_path) is this many seconds old has stalled
    #: (stopped, hung) and `vips up` replaces it, as a full-mode shard's lease goes stale after 30 s.
    worker_stall_seconds: float = Field(default=30.0, gt=0)
    #: Full passes split over this many shard workers (`vips worker --shard K`, privacy_wall.shards); 1:
    #: each job computes its own passes. Embedded `vips up` starts that many shard workers.
    shards: int = Field(default=1, ge=1, le=64)
    #: A shard that has not answered a release within shard_resend_seconds is asked again (its task may
    #: have been lost with its worker); past shard_timeout_seconds the release fails (its charge withdrawn
    #: for tabular data). 300 s, with the 30 s resend in mind: a shard worker that dies or stalls (SIGSTOP,
    #: a frozen host) stops renewing its lease; a standby takes it within 35 s (free after 30 s, claimed
    #: every 5 s) and starts in seconds, and the next resend reaches it by ~70 s (~100 s if the stalled
    #: worker had taken one first), leaving over 3 minutes to read its rows cold and sum them (~0.5 s per
    #: 10^6 rows of PostgreSQL blocks). Raise it where one shard's pass, or the other jobs' releases queued
    #: before a job's on a shard, take minutes.
    shard_resend_seconds: float = Field(default=30.0, gt=0)
    shard_timeout_seconds: float = Field(default=300.0, gt=0)
    #: After answering a release, a shard worker answers its job's next releases as they come, directly
    #: from the sensitive database, until none comes for this long (privacy_wall.shards.linger); 0: never.
    shard_linger_seconds: float = Field(default=1.0, ge=0, le=10)
    #: Per connection (service.http.server): a request head above max_header_bytes is refused (400); the
    #: head must arrive within header_timeout_seconds, the body within body_timeout_seconds of it, else
    #: the connection is closed; idle kept-alive connections close after keep_alive_seconds; a server
    #: process closes new connections beyond max_connections. Per client address (an IPv6 /64 counts as
    #: one): a new connection is closed at once while that address has max_half_open_per_address
    #: connections whose first request head is not complete, or max_connections_per_address open (the
    #: trusted proxies are exempt from the latter: they carry many clients). A browser opens at most ~6
    #: connections to a host and sends its request at once; a flood from one address holds at most 16
    #: half-open slots, each for at most header_timeout_seconds, and the other clients keep the rest.
    #: backlog: the listening socket's accept queue (the kernel caps it at net.core.somaxconn).
    max_header_bytes: int = 16 * 1024
    header_timeout_seconds: float = 6.0
    body_timeout_seconds: float = 30.0
    keep_alive_seconds: float = 5.0
    max_connections: int = 256
    max_connections_per_address: int = Field(default=64, ge=1)
    max_half_open_per_address: int = Field(default=16, ge=1)
    backlog: int = Field(default=2048, ge=1)

    @model_validator(mode="after")
    def _default_job_memory(self) -> ServiceSettings:
        if not self.max_job_memory_mb:
            self.max_job_memory_mb = default_job_memory_mb(self.job_processes, self.worker_cache_mb)
        return self

    @property
    def job_processes(self) -> int:
        """The processes that may each run a job's passes on this machine: the worker's job processes, and
        in the embedded mode also `vips up`'s shard workers (one each; full mode's run elsewhere)."""
        return self.worker_concurrency + (self.shards if self.embedded and self.shards > 1 else 0)

    @field_validator("trusted_proxies")
    @classmethod
    def _valid_networks(cls, value: str) -> str:
        parse_networks(value)  # a typo fails at startup, not as a silently untrusted proxy
        return value

    def worker_memory_bytes(self) -> int | None:
        """Each job process's address-space limit in bytes (worker_memory_mb), None for none."""
        if self.worker_memory_mb is not None:
            return int(self.worker_memory_mb * (1 << 20)) if self.worker_memory_mb > 0 else None
        mb = JOB_PROCESS_BASE_MB + self.worker_cache_mb + self.max_job_memory_mb
        return int(min(mb, 2 * machine_memory_mb()) * (1 << 20))

    def job_process_replace_kib(self) -> int:
        """A job process whose peak resident memory passed its start and its dataset cache (KiB; Celery's
        --max-memory-per-child, measured as the peak without psutil) is replaced by a fresh one after that
        job: whatever a big job left behind (freed but kept by the allocator) goes back to the machine."""
        return int((JOB_PROCESS_BASE_MB + self.worker_cache_mb) * 1024)

    @property
    def embedded(self) -> bool:
        return self.broker_url is None

    def trusted_networks(self) -> tuple[Network, ...]:
        return parse_networks(self.trusted_proxies)

    def worker_alive_path(self, shard: int | None = None) -> Path:
        """Embedded mode: the file the job worker (or shard worker `shard`) touches every
        WORKER_ALIVE_SECONDS, read by /readyz and by `vips up`'s supervisor (a stalled worker is replaced)."""
        return (self.home / ("worker.alive" if shard is None else f"shard-{shard}.alive")).resolve()

    def control_url(self) -> str:
        return self.control_database_url or f"sqlite:///{(self.home / 'control.db').resolve()}"

    def celery_config(self) -> dict[str, Any]:
        """Broker settings shared by the API (which only sends) and the worker (which consumes)."""
        config: dict[str, Any] = {
            "task_ignore_result": True,
            "task_acks_late": True,
            "task_reject_on_worker_lost": True,
            "worker_prefetch_multiplier": 1,
            "broker_connection_retry_on_startup": True,
            # `celery beat` (docker-compose's beat service) queues the reaper; any worker runs it.
            "beat_schedule": {
                "reap": {"task": REAP_TASK, "schedule": self.reaper_interval_seconds * 3},
            },
        }
        if self.broker_url is not None:
            config["broker_url"] = self.broker_url
            if self.broker_url.startswith("redis://"):
                config["broker_transport"] = REDIS_BROKER_TRANSPORT
            return config
        queue = (self.home / "broker").resolve()
        for folder in ("out", "processed", "staging", "control"):
            (queue / folder).mkdir(parents=True, exist_ok=True)
        config["broker_url"] = "filesystem://"
        # kombu's file-system transport, whose messages appear in "out" whole (control.jobs.file_broker):
        # kombu's own lets a consumer take a message's file before its writer wrote it.
        config["broker_transport"] = FILE_BROKER_TRANSPORT
        config["broker_transport_options"] = {
            "data_folder_in": str(queue / "out"),
            "data_folder_out": str(queue / "out"),
            "processed_folder": str(queue / "processed"),  # a consumer takes a message by renaming it here
            "staging_folder": str(queue / "staging"),  # a message is written here, then renamed into "out"
            "control_folder": str(queue / "control"),
            "store_processed": False,
            # Consumers look for new messages this often (kombu's default, 1 s, would add up to a second
            # to every shard task of every sharded iteration). Measured idle cost per worker process:
            # 0.6% of a core at 0.05 s, 1.7% at 0.01 s.
            "polling_interval": 0.02,
        }
        return config


@lru_cache
def get_settings() -> ServiceSettings:
    return ServiceSettings()
