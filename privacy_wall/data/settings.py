"""Settings of the privacy wall: the only settings class that holds the sensitive database's URL.

Environment: VIPS_SENSITIVE_DATABASE_URL (PostgreSQL in production), VIPS_CONTROL_DATABASE_URL (the
ledger), VIPS_HOME (embedded SQLite files when the URLs are absent).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict


class WallSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VIPS_", extra="ignore")

    home: Path = Path("var")
    sensitive_database_url: str | None = None
    control_database_url: str | None = None

    def sensitive_url(self) -> str:
        return self.sensitive_database_url or f"sqlite:///{(self.home / 'sensitive.db').resolve()}"

    def control_url(self) -> str:
        return self.control_database_url or f"sqlite:///{(self.home / 'control.db').resolve()}"


@lru_cache
def get_wall_settings() -> WallSettings:
    return WallSettings()
