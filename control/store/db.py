"""The control database as the API process sees it: an engine built from the settings by a factory.

The API assumes a migrated database (`vips serve` and `vips up` run the migrations before starting).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, text

from control.settings import ServiceSettings
from privacy_wall.sqlengine import create_db_engine


def create_control_engine(settings: ServiceSettings, **kwargs: Any) -> Engine:
    """A new engine on the control database (SQLite files get immediate transactions; see sqlengine)."""
    return create_db_engine(settings.control_url(), **kwargs)


def ping(engine: Engine) -> None:
    """Raise if the control database cannot answer SELECT 1."""
    with engine.connect() as conn:
        conn.execute(text("SELECT 1")).scalar_one()
