"""Alembic environment of the sensitive database (the rows). Run only where the wall runs."""

from __future__ import annotations

import os

from alembic import context

from privacy_wall.data.schema import metadata
from privacy_wall.sqlengine import create_db_engine

config = context.config
url = config.get_main_option("sqlalchemy.url") or os.environ.get("VIPS_SENSITIVE_DATABASE_URL")
if not url:
    raise RuntimeError("set sqlalchemy.url or VIPS_SENSITIVE_DATABASE_URL for the sensitive database")

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
