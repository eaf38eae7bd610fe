"""VIPS_ACCOUNTANT, read with pydantic-settings (its own module: loaded only when the deployment's
accountant is asked for, not by a fit that names its accountant)."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict

from privacy_wall.accounting.names import DEFAULT_ACCOUNTANT


class AccountingSettings(BaseSettings):
    """VIPS_ACCOUNTANT: the accountant that prices every dataset of a deployment (default filter, the only one
    proven to hold the cap under fully adaptive composition)."""

    model_config = SettingsConfigDict(env_prefix="VIPS_", extra="ignore")

    accountant: str = DEFAULT_ACCOUNTANT
