"""key factors and the miss log: what torch hashed into each entry's key, and recent misses

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02

- key_factors: one row per distinct factor of the keys torch computed (name, the first 16
  characters of torch's hash of it, a short readable value), shared by every key that hashed
  it (an FX graph key has ~600 factors, most of them the same Inductor config in every key).
- entry_factors: per entry key (kind, key), the JSON array of its key_factors ids. For FX
  graph entries the factors are the debug lines of ``compiled_fx_graph_hash``
  (torch/_inductor/codecache.py).
- cache_misses: the newest ``CACHEDB_MISS_LOG`` lookups that missed (kind, key, outcome,
  reason, the key_factors ids wanted, when): what ``cachedb misses`` explains.

Data-preserving: only adds three tables.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "key_factors",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("factor", sa.String(length=200), nullable=False),
        sa.Column("hash", sa.String(length=16), nullable=False),
        sa.Column("value", sa.String(length=200), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_key_factors")),
        sa.UniqueConstraint("factor", "hash", name=op.f("uq_key_factors_factor")),
    )
    op.create_table(
        "entry_factors",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("factor_ids", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_entry_factors")),
        sa.UniqueConstraint("kind", "key", name=op.f("uq_entry_factors_kind")),
    )
    op.create_table(
        "cache_misses",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=300), nullable=False),
        sa.Column("factor_ids", sa.Text(), nullable=False),
        sa.Column("missed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cache_misses")),
    )


def downgrade() -> None:
    op.drop_table("cache_misses")
    op.drop_table("entry_factors")
    op.drop_table("key_factors")
