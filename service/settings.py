"""Settings of the API process (and of the clients of its queue). No sensitive-database URL lives here.

Environment (prefix VIPS_): VIPS_HOME (embedded files, default ./var), VIPS_CONTROL_DATABASE_URL,
VIPS_BROKER_URL (Redis in production). Without URLs, everything is embedded under VIPS_HOME: a SQLite
control database and a file-system Celery broker that needs no Redis.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic_settings import BaseSettings, SettingsConfigDict

#: Embedded mode: the worker touches its alive file this often; /readyz wants it fresher than the stale age.
WORKER_ALIVE_SECONDS = 2.0
WORKER_STALE_SECONDS = 10.0

RUN_JOB_TASK = "vips.run_job"
REAP_TASK = "vips.reap"


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VIPS_", extra="ignore")

    home: Path = Path("var")
    control_database_url: str | None = None
    broker_url: str | None = None
    heartbeat_timeout_seconds: float = 60.0
    #: A job still queued this long after submission was never started by a worker: failed and refunded.
    queued_timeout_seconds: float = 300.0
    #: How often the API process (and each worker, and Celery beat) runs the reaper (service.reaper).
    reaper_interval_seconds: float = 10.0
    max_iterations: int = 100_000
    #: Requests pricing a job (calibration, quotes) run the accountant in at most `pricing_slots` threads of
    #: the request pool at once; a request that waits `pricing_wait_seconds` for a slot gets a 503.
    pricing_slots: int = 2
    pricing_wait_seconds: float = 10.0
    #: How often each API process prices the dashboard's spend curves of datasets whose ledger changed
    #: (service.ui.views.warm_spend_curves), so that no page view waits for the accountant; 0: never.
    ui_warm_interval_seconds: float = 5.0
    #: Request bodies above this many bytes are refused (413) before they are parsed.
    max_body_bytes: int = 1 << 20

    @property
    def embedded(self) -> bool:
        return self.broker_url is None

    def worker_alive_path(self) -> Path:
        """Embedded mode: the file the worker touches every WORKER_ALIVE_SECONDS (read by /readyz)."""
        return (self.home / "worker.alive").resolve()

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
            return config
        queue = (self.home / "broker").resolve()
        for folder in ("out", "processed", "control"):
            (queue / folder).mkdir(parents=True, exist_ok=True)
        config["broker_url"] = "filesystem://"
        config["broker_transport_options"] = {
            "data_folder_in": str(queue / "out"),
            "data_folder_out": str(queue / "out"),
            "processed_folder": str(queue / "processed"),
            "control_folder": str(queue / "control"),
            "store_processed": False,
        }
        return config


@lru_cache
def get_settings() -> ServiceSettings:
    return ServiceSettings()
