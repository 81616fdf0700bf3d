"""kernel artifacts: Triton's cache and C++ kernel libraries, content-addressed

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23

- kernel_blobs: the bytes of kernel files, one zstd frame per distinct SHA-256;
- kernel_artifacts: (kind, host key, key, file name) → blob, with sizes, fingerprint,
  last use (indexed, for eviction) and hit count;
- view ``kernels``: one row per kernel key (files, bytes, stored bytes, blobs shared with
  other keys, hits, last use).

Data-preserving: only adds tables and a view.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

VIEWS: dict[str, str] = {
    # One row per kernel key. shared_files: files of this key whose blob another key also uses.
    "kernels": """
SELECT a.kind AS kind,
       a.host_key AS host_key,
       a.key AS key,
       MAX(CASE WHEN substr(a.name, 1, 7) = '__grp__' THEN substr(a.name, 8) ELSE NULL END) AS metadata_file,
       COUNT(*) AS files,
       SUM(a.size_bytes) AS size_bytes,
       SUM(b.stored_bytes) AS stored_bytes,
       SUM(CASE WHEN (SELECT COUNT(*) FROM kernel_artifacts o
                      WHERE o.blob_id = a.blob_id AND o.key <> a.key) > 0 THEN 1 ELSE 0 END) AS shared_files,
       SUM(a.hit_count) AS hit_count,
       MIN(a.created_at) AS created_at,
       MAX(a.last_used_at) AS last_used_at,
       MAX(a.fingerprint_id) AS fingerprint_id
FROM kernel_artifacts a JOIN kernel_blobs b ON b.id = a.blob_id
GROUP BY a.kind, a.host_key, a.key
""",
}


def upgrade() -> None:
    op.create_table(
        "kernel_blobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("stored_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_kernel_blobs")),
        sa.UniqueConstraint("sha256", name=op.f("uq_kernel_blobs_sha256")),
    )
    op.create_table(
        "kernel_artifacts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("host_key", sa.String(length=64), nullable=False),
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("blob_id", sa.Integer(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("fingerprint_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("hit_count", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["blob_id"], ["kernel_blobs.id"], name=op.f("fk_kernel_artifacts_blob_id_kernel_blobs"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["fingerprint_id"], ["system_fingerprints.id"],
            name=op.f("fk_kernel_artifacts_fingerprint_id_system_fingerprints"), ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_kernel_artifacts")),
        sa.UniqueConstraint("kind", "host_key", "key", "name", name="uq_kernel_artifacts_kind_host_key_key_name"),
    )
    with op.batch_alter_table("kernel_artifacts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_kernel_artifacts_blob_id"), ["blob_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_kernel_artifacts_fingerprint_id"), ["fingerprint_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_kernel_artifacts_last_used_at"), ["last_used_at"], unique=False)
    for name, sql in VIEWS.items():
        op.execute(f"CREATE VIEW {name} AS {sql.strip()}")


def downgrade() -> None:
    for name in reversed(list(VIEWS)):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    op.drop_table("kernel_artifacts")
    op.drop_table("kernel_blobs")
