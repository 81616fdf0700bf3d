"""pgo profiles: Dynamo's automatic-dynamic profiles (dynamo/code_state_<key>.pkl)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-28

- pgo_profiles: one row per PGO file name (``code_state_path``, torch/_dynamo/pgo.py), the
  pickle torch wrote stored as a checksummed payload (never unpickled by cachedb), with its
  signature, fingerprint, times (``updated_at`` decides which of two profiles of a key wins;
  ``last_used_at``, indexed, drives eviction) and hit count.

Data-preserving: only adds a table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def create_dynamo_table(name: str, key_length: int) -> None:
    """The table of one of Dynamo's caches (:func:`cachedb.store.tables._dynamo_table`)."""
    op.create_table(
        name,
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=key_length), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("checksum", sa.String(length=64), nullable=False),
        sa.Column("signature", sa.String(length=64), nullable=True),
        sa.Column("fingerprint_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("hit_count", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["fingerprint_id"], ["system_fingerprints.id"],
            name=op.f(f"fk_{name}_fingerprint_id_system_fingerprints"), ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f(f"pk_{name}")),
        sa.UniqueConstraint("key", name=op.f(f"uq_{name}_key")),
    )
    with op.batch_alter_table(name, schema=None) as batch_op:
        batch_op.create_index(batch_op.f(f"ix_{name}_fingerprint_id"), ["fingerprint_id"], unique=False)
        batch_op.create_index(batch_op.f(f"ix_{name}_last_used_at"), ["last_used_at"], unique=False)


def upgrade() -> None:
    create_dynamo_table("pgo_profiles", 512)


def downgrade() -> None:
    op.drop_table("pgo_profiles")
