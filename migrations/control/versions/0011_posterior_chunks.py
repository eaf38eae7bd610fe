"""posterior_chunks: a posterior's JSON text stored in chunks, so that a download streams one at a time

Adds `posterior_chunks` (job_id, seq, text) and `posteriors.stored_bytes` (the text's length), moves every
stored document's text into chunks of CHUNK_BYTES, one posterior at a time, then drops
`posteriors.document`. The text is kept byte for byte as the database held it. Downgrade joins the chunks
back into the JSON column.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28 04:00:00
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

#: As control.store.posteriors.CHUNK_BYTES when this revision was written.
CHUNK_BYTES = 1 << 20

_posteriors = sa.table(
    "posteriors",
    sa.column("job_id", sa.String(32)),
    sa.column("document", sa.JSON()),
    sa.column("stored_bytes", sa.BigInteger()),
)
_chunks = sa.table(
    "posterior_chunks",
    sa.column("job_id", sa.String(32)),
    sa.column("seq", sa.Integer()),
    sa.column("text", sa.LargeBinary()),
)


def _job_ids(conn: sa.Connection) -> list[str]:
    return list(conn.execute(sa.select(_posteriors.c.job_id).order_by(_posteriors.c.job_id)).scalars())


def upgrade() -> None:
    conn = op.get_bind()
    with op.batch_alter_table("posteriors") as batch:
        batch.add_column(sa.Column("stored_bytes", sa.BigInteger(), nullable=True))
    op.create_table(
        "posterior_chunks",
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("text", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "seq"),
    )
    if conn.dialect.name == "postgresql":  # json is kept as its text
        stored: sa.ColumnElement[bytes] = sa.func.convert_to(sa.cast(_posteriors.c.document, sa.Text), "UTF8")
    else:
        stored = sa.cast(_posteriors.c.document, sa.LargeBinary)
    for job_id in _job_ids(conn):
        text = bytes(conn.execute(sa.select(stored).where(_posteriors.c.job_id == job_id)).scalar_one())
        for seq, start in enumerate(range(0, len(text), CHUNK_BYTES)):
            piece = text[start : start + CHUNK_BYTES]
            conn.execute(sa.insert(_chunks).values(job_id=job_id, seq=seq, text=piece))
        conn.execute(
            sa.update(_posteriors).where(_posteriors.c.job_id == job_id).values(stored_bytes=len(text))
        )
    with op.batch_alter_table("posteriors") as batch:
        batch.alter_column("stored_bytes", existing_type=sa.BigInteger(), nullable=False)
        batch.drop_column("document")


def downgrade() -> None:
    conn = op.get_bind()
    with op.batch_alter_table("posteriors") as batch:
        batch.add_column(sa.Column("document", sa.JSON(), nullable=True))
    for job_id in _job_ids(conn):
        pieces = conn.execute(
            sa.select(_chunks.c.text).where(_chunks.c.job_id == job_id).order_by(_chunks.c.seq)
        ).scalars()
        document = json.loads(b"".join(bytes(piece) for piece in pieces))
        conn.execute(sa.update(_posteriors).where(_posteriors.c.job_id == job_id).values(document=document))
    op.drop_table("posterior_chunks")
    with op.batch_alter_table("posteriors") as batch:
        batch.alter_column("document", existing_type=sa.JSON(), nullable=False)
        batch.drop_column("stored_bytes")
