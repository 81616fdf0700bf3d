"""dynamo packages: precompiled Dynamo packages (dynamo/<source id>/entry)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-28

- dynamo_packages: one row per compiled function's source id (``CompilePackage.source_id_from_fn``,
  torch/_dynamo/package.py), the pickled ``PrecompileCacheEntry`` torch wrote stored as a
  checksummed payload (never unpickled by cachedb), with its signature, fingerprint, times
  (``updated_at`` decides which of two packages of a key wins; ``last_used_at``, indexed,
  drives eviction) and hit count: the same columns as ``pgo_profiles`` (revision 0006).

Data-preserving: only adds a table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    name = "dynamo_packages"
    op.create_table(
        name,
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=128), nullable=False),
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


def downgrade() -> None:
    op.drop_table("dynamo_packages")
