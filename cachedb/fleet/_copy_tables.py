"""The tables a copy or merge moves, in copy order and as it reads them, and the marker table
an unfinished ``copy`` leaves in DST."""

from __future__ import annotations

from sqlalchemy import Boolean, Column, DateTime, MetaData, String, Table

from ..store.tables import AUTOTUNE_TIMINGS, metadata

#: Tables in copy order (parents before children).
TABLES = (
    "system_fingerprints",
    "kernel_blobs",
    "kernel_artifacts",
    "guarded_entries",
    "key_factors",
    "entry_factors",
    "autotune_timings",
    "autotune_choices",
    "local_cache_values",
    "best_configs",
    "cutlass_op_lists",
    "cutlass_ops",
    "quarantined_entries",
    "pgo_profiles",
    "dynamo_packages",
    "precompile_refusals",
)

#: The table an unfinished ``copy`` leaves in DST: one row naming SRC (dropped at the end).
MARKER_TABLE = "cachedb_copy_in_progress"

#: ``autotune_timings`` is read flat: the view of revision 0004, or the table of 0001-0003.
_T = {name: metadata.tables.get(name, AUTOTUNE_TIMINGS) for name in TABLES}
#: The timestamp columns of each table.
_DATETIMES = {name: tuple(c.name for c in t.c if isinstance(c.type, DateTime)) for name, t in _T.items()}
#: The boolean columns of each table (SQLite hands back 0/1).
_BOOLEANS = {name: tuple(c.name for c in t.c if isinstance(c.type, Boolean)) for name, t in _T.items()}
_MARKER = Table(
    MARKER_TABLE,
    MetaData(),
    Column("source", String(1024), nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
)
