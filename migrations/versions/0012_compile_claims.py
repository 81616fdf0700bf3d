"""compile claims and waits: one compile per graph across processes and machines

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02

- compile_claims: a lease per entry being compiled (kind, key), held by one process of the
  fleet (``holder``: host, pid and a random part; ``host``, ``pid``), renewed by its heartbeat
  (``beat_at``); a lease whose ``beat_at`` is older than a few seconds is free to take. Used
  on a shared (remote) database; the processes of one machine coordinate through the local
  file's sidecar instead (cachedb/live/_singleflight.py).
- compile_waits: one row per compile a process did not run because it waited for another
  process's entry (kind, key, seconds waited, on whom, outcome, when): what ``cachedb stats``
  counts as compiles avoided.

Data-preserving: only adds two tables.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "compile_claims",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("holder", sa.String(length=128), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("beat_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_compile_claims")),
        sa.UniqueConstraint("kind", "key", name=op.f("uq_compile_claims_kind")),
    )
    op.create_table(
        "compile_waits",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("waited_on", sa.String(length=300), nullable=False),
        sa.Column("waited_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_compile_waits")),
    )
    with op.batch_alter_table("compile_waits", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_compile_waits_kind"), ["kind"], unique=False)


def downgrade() -> None:
    op.drop_table("compile_waits")
    op.drop_table("compile_claims")
