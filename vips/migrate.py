"""Bring a database to the head of its Alembic history (control or sensitive).

The histories ship inside the installed package (migrations/control, migrations/sensitive), so this works
from a wheel as well as from a checkout; alembic.ini at the top of the checkout is for the alembic CLI.
"""

from __future__ import annotations

from importlib.resources import files
from typing import Literal

from alembic import command
from alembic.config import Config

History = Literal["control", "sensitive"]


def alembic_config(history: History, url: str) -> Config:
    """An Alembic configuration of `history` for the database at `url`."""
    config = Config()
    config.set_main_option("script_location", str(files("migrations") / history))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(history: History, url: str) -> None:
    """Apply every migration of `history` to the database at `url`."""
    command.upgrade(alembic_config(history, url), "head")
