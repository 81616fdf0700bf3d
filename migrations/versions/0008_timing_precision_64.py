"""autotune key precision: VARCHAR(16) -> VARCHAR(64)

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-28

``autotune_keys.precision`` holds the third level of Inductor's timings document,
``cache[op][inputs][precision]``. torch up to 2.14 writes a float32 matmul precision there
(``"highest"``, ``"high"``, ``"medium"``); torch 2.15 writes the backends' precisions, such as
``"cuda:ieee,mkldnn:ieee"`` or ``"cuda:none,mkldnn:none"`` (21 characters), which PostgreSQL
refused under ``VARCHAR(16)`` (``StringDataRightTruncation``).

- PostgreSQL: the timing views read the column, so they are dropped, the column's type is
  widened in place (no row is rewritten), and the views are created again with the SQL of
  revision 0004, unchanged.
- SQLite does not enforce a declared length; the declaration in ``sqlite_schema`` is changed
  (SQLite's documented writable-schema procedure for a change that leaves the stored rows as
  they are: both declarations have TEXT affinity), so the schema equals the models. A table
  rebuild would run ``ON DELETE CASCADE`` into the timings under ``PRAGMA foreign_keys``.

Data-preserving. The downgrade narrows the declaration back, and refuses on PostgreSQL when a
stored precision is longer than 16 characters.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def _revision_0004() -> ModuleType:
    """Revision 0004's module, for its frozen view SQL (``TIMINGS_VIEW``, ``HISTORY_VIEWS``)."""
    path = Path(__file__).with_name("0004_compact_timings.py")
    spec = importlib.util.spec_from_file_location("cachedb_migration_0004", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _set_length(length: int) -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        views = _revision_0004()
        for name in reversed(list(views.HISTORY_VIEWS)):
            op.execute(f"DROP VIEW IF EXISTS {name}")
        op.execute("DROP VIEW IF EXISTS autotune_timings")
        op.alter_column("autotune_keys", "precision", type_=sa.String(length=length), existing_nullable=False)
        op.execute(f"CREATE VIEW autotune_timings AS {views.TIMINGS_VIEW.strip()}")
        for name, sql in views.HISTORY_VIEWS.items():
            op.execute(f"CREATE VIEW {name} AS {sql.strip()}")
        return
    old = 16 if length == 64 else 64
    version = bind.exec_driver_sql("PRAGMA schema_version").scalar_one()
    bind.exec_driver_sql("PRAGMA writable_schema = ON")
    try:
        bind.exec_driver_sql(
            "UPDATE sqlite_master SET sql = replace(sql, 'precision VARCHAR(%d) NOT NULL', "
            "'precision VARCHAR(%d) NOT NULL') WHERE type = 'table' AND name = 'autotune_keys'" % (old, length)
        )
        bind.exec_driver_sql(f"PRAGMA schema_version = {int(version) + 1}")
    finally:
        bind.exec_driver_sql("PRAGMA writable_schema = OFF")


def upgrade() -> None:
    _set_length(64)


def downgrade() -> None:
    bind = op.get_bind()
    longest = bind.execute(sa.text("SELECT MAX(LENGTH(precision)) FROM autotune_keys")).scalar()
    if bind.dialect.name == "postgresql" and longest is not None and longest > 16:
        raise RuntimeError(
            f"autotune_keys.precision holds a value of {longest} characters; "
            "revision 0007 stores at most 16 on PostgreSQL"
        )
    _set_length(16)
