"""precompile refusals: functions torch could not package for caching precompile

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-29

- precompile_refusals: one row per function and system torch could not build a precompiled
  package for (keyed as ``dynamo_packages`` is: the source id and the system tag), the payload
  cachedb's JSON (what failed, the function's code identity) stored as a checksummed payload,
  with its signatures, fingerprint, times and hit count: the columns of ``dynamo_packages``
  (revisions 0007 and 0009).

Data-preserving: only adds a table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    name = "precompile_refusals"
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
        sa.Column("ed25519_signature", sa.Text(), nullable=True),
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
    op.drop_table("precompile_refusals")
