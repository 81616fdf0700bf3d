"""public-key signatures: ed25519_signature columns and row_origins

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28

Every table whose rows carry code or steer code generation gains ``ed25519_signature`` (TEXT,
nullable): a writer's Ed25519 signature of the row, ``<key id>:<base64>``
(:mod:`cachedb.store.signing`, :mod:`cachedb.fleet.trust`). The HMAC ``signature`` columns stay.
``row_origins`` records, in a machine's local file, which rows crossed into it from another
database and under which trusted key.

The view ``autotune_timings`` shows the timings' signatures (its SQL is revision 0004's plus
``t.ed25519_signature``), so ``cachedb copy`` carries them; the tuning-history views that read
it are dropped and created again unchanged. Adding a nullable column rewrites no row on
SQLite or PostgreSQL. Data-preserving; the downgrade drops the columns and the table, and
restores revision 0004's view.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

#: The tables that gain ``ed25519_signature``.
SIGNED = (
    "guarded_entries",
    "kernel_artifacts",
    "best_configs",
    "pgo_profiles",
    "dynamo_packages",
    "cutlass_op_lists",
    "autotune_run_timings",
    "local_cache_values",
)


#: ``autotune_timings`` of this revision: revision 0004's with the timing's signature.
TIMINGS_VIEW = """
SELECT t.id AS id, k.fingerprint_id AS fingerprint_id, k.op AS op, k.inputs AS inputs,
       k.hint_override AS hint_override, k.precision AS precision, t.choice_hash AS choice_hash,
       t.timing_ms AS timing_ms, t.position AS position, r.recorded_at AS recorded_at,
       t.ed25519_signature AS ed25519_signature
FROM autotune_run_timings t
JOIN autotune_runs r ON r.id = t.run_id
JOIN autotune_keys k ON k.id = r.key_id
"""


def _revision_0004() -> ModuleType:
    """Revision 0004's module, for its frozen view SQL (``TIMINGS_VIEW``, ``HISTORY_VIEWS``)."""
    path = Path(__file__).with_name("0004_compact_timings.py")
    spec = importlib.util.spec_from_file_location("cachedb_migration_0004", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _recreate_views(timings_sql: str) -> None:
    views = _revision_0004()
    for name in reversed(list(views.HISTORY_VIEWS)):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    op.execute("DROP VIEW IF EXISTS autotune_timings")
    op.execute(f"CREATE VIEW autotune_timings AS {timings_sql.strip()}")
    for name, sql in views.HISTORY_VIEWS.items():
        op.execute(f"CREATE VIEW {name} AS {sql.strip()}")


def upgrade() -> None:
    for table in SIGNED:
        op.add_column(table, sa.Column("ed25519_signature", sa.Text(), nullable=True))
    _recreate_views(TIMINGS_VIEW)
    op.create_table(
        "row_origins",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("table_name", sa.String(length=32), nullable=False),
        sa.Column("row_key", sa.Text(), nullable=False),
        sa.Column("origin", sa.String(length=64), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_row_origins")),
        sa.UniqueConstraint("table_name", "row_key", name=op.f("uq_row_origins_table_name_row_key")),
    )
    op.create_index(op.f("ix_row_origins_origin"), "row_origins", ["origin"])


def downgrade() -> None:
    op.drop_index(op.f("ix_row_origins_origin"), table_name="row_origins")
    op.drop_table("row_origins")
    _recreate_views(_revision_0004().TIMINGS_VIEW)
    for table in SIGNED:
        op.drop_column(table, "ed25519_signature")  # SQLite >= 3.35: in place, no rebuild
