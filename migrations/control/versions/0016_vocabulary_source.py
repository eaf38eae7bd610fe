"""Bag-of-words datasets from before vocabulary sources were recorded say so (issue 52, item 10).

Ingest now records where a new bag-of-words dataset's vocabulary comes from (its schema's
`vocabulary_source`: a public construction, the custodian's confirmation, or a public dataset;
privacy_wall.data.ingest.vocabulary_source). Earlier datasets get NOT_RECORDED, so that every
bag-of-words schema names its vocabulary's source and the older ones show that nobody checked it.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07 14:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

#: The source recorded for a vocabulary ingested before sources were.
NOT_RECORDED = "not recorded: ingested before the service checked vocabularies"

datasets = sa.table(
    "datasets", sa.column("name", sa.String), sa.column("kind", sa.String), sa.column("schema", sa.JSON)
)


def _bag_of_words(conn: sa.Connection) -> list[tuple[str, dict[str, object]]]:
    """(name, schema) of every bag-of-words dataset."""
    query = sa.select(datasets.c.name, datasets.c.schema).where(datasets.c.kind == "bow")
    return [(name, dict(schema)) for name, schema in conn.execute(query).all()]


def upgrade() -> None:
    conn = op.get_bind()
    for name, schema in _bag_of_words(conn):
        if "vocabulary_source" not in schema:
            stamped = {**schema, "vocabulary_source": NOT_RECORDED}
            conn.execute(sa.update(datasets).where(datasets.c.name == name).values(schema=stamped))


def downgrade() -> None:
    conn = op.get_bind()
    for name, schema in _bag_of_words(conn):
        if schema.get("vocabulary_source") == NOT_RECORDED:
            rest = {key: value for key, value in schema.items() if key != "vocabulary_source"}
            conn.execute(sa.update(datasets).where(datasets.c.name == name).values(schema=rest))
