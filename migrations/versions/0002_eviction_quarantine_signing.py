"""eviction, quarantine and signing

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21

- guarded_entries.last_used_at becomes NOT NULL (backfilled from created_at) and indexed:
  ``cachedb prune`` evicts the least recently used entries first;
- guarded_entries.signature and best_configs.signature: HMAC-SHA256 under the team's key;
- quarantined_entries: payloads that failed their checksum or signature, kept for inspection;
- indexes on the document position of timings and LocalCache values (constant-time appends).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("UPDATE guarded_entries SET last_used_at = created_at WHERE last_used_at IS NULL")
    with op.batch_alter_table("guarded_entries", schema=None) as batch_op:
        batch_op.alter_column("last_used_at", existing_type=sa.DateTime(timezone=True), nullable=False)
        batch_op.add_column(sa.Column("signature", sa.String(length=64), nullable=True))
        batch_op.create_index(batch_op.f("ix_guarded_entries_last_used_at"), ["last_used_at"], unique=False)
    with op.batch_alter_table("best_configs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("signature", sa.String(length=64), nullable=True))
    op.create_index(op.f("ix_autotune_timings_position"), "autotune_timings", ["position"], unique=False)
    op.create_index(op.f("ix_local_cache_values_position"), "local_cache_values", ["position"], unique=False)
    op.create_table(
        "quarantined_entries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("variant", sa.String(length=64), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("checksum", sa.String(length=64), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("quarantined_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_quarantined_entries")),
    )


def downgrade() -> None:
    op.drop_table("quarantined_entries")
    op.drop_index(op.f("ix_local_cache_values_position"), table_name="local_cache_values")
    op.drop_index(op.f("ix_autotune_timings_position"), table_name="autotune_timings")
    with op.batch_alter_table("best_configs", schema=None) as batch_op:
        batch_op.drop_column("signature")
    with op.batch_alter_table("guarded_entries", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_guarded_entries_last_used_at"))
        batch_op.drop_column("signature")
        batch_op.alter_column("last_used_at", existing_type=sa.DateTime(timezone=True), nullable=True)
