"""best configs: no index on configs_hash

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24

Every best-config write (``LocalAutotuneCache.put`` under ``cachedb.installed``: one upsert on
the process's kept connection) updated three b-trees: the table, the unique key index and
``ix_best_configs_configs_hash``. No cachedb query reads by ``configs_hash``: torch asks for a
best config by its key and compares the stored ``configs_hash`` itself
(``AutotuneCache.read_best``, torch/_inductor/runtime/autotune_cache.py), and SQL over the
tuning history scans a table of at most tens of thousands of rows in milliseconds. Without the
index a commit writes one page fewer to the WAL: measured on 2 cores, the bare upsert
transaction 18 -> 13 us, the live put interleaved with file puts 63 -> 57 us. Data-preserving (an index only); the downgrade recreates it.
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_best_configs_configs_hash", table_name="best_configs")


def downgrade() -> None:
    op.create_index("ix_best_configs_configs_hash", "best_configs", ["configs_hash"], unique=False)
