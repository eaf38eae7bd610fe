"""Alembic environment of the control database (budgets, ledger; jobs and keys with the service)."""

from __future__ import annotations

import os

from alembic import context

import control.store.models  # noqa: F401  (registers the service's tables on the shared MetaData)
from privacy_wall.ledger.schema import metadata
from privacy_wall.sqlengine import create_db_engine

config = context.config
url = config.get_main_option("sqlalchemy.url") or os.environ.get("VIPS_CONTROL_DATABASE_URL")
if not url:
    raise RuntimeError("set sqlalchemy.url or VIPS_CONTROL_DATABASE_URL for the control database")

if context.is_offline_mode():
    context.configure(url=url, target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = create_db_engine(url)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=metadata)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()
