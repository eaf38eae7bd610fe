"""Bring a database to the head of its Alembic history (control or sensitive)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from alembic import command
from alembic.config import Config

ALEMBIC_INI = Path(__file__).resolve().parent.parent / "alembic.ini"

History = Literal["control", "sensitive"]


def upgrade(history: History, url: str) -> None:
    """Apply every migration of `history` to the database at `url`."""
    config = Config(str(ALEMBIC_INI), ini_section=history)
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    command.upgrade(config, "head")
