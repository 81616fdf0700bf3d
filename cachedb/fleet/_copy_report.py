"""What a copy or merge reports: per-table counts, the run's summary, and its progress."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ._copy_tables import TABLES


@dataclass
class TableCopy:
    """What one table's rows did. ``bytes`` counts the values of the rows written (bytes of
    payloads, characters of text, 8 per number or timestamp)."""

    table: str
    read: int = 0  # rows read from the sources
    added: int = 0  # rows inserted into DST
    replaced: int = 0  # DST rows overwritten by a newer SRC row (best configs, LocalCache values)
    skipped: int = 0  # already in DST (natural key), or older than DST's row
    bytes: int = 0

    def as_row(self) -> dict[str, Any]:
        return {"table": self.table, "read": self.read, "added": self.added, "replaced": self.replaced,
                "skipped": self.skipped, "bytes": self.bytes}


#: Columns of :meth:`TableCopy.as_row`.
COLUMNS = ("table", "read", "added", "replaced", "skipped", "bytes")


@dataclass
class CopyReport:
    """The outcome of :func:`cachedb.fleet.copy.copy_database` /
    :func:`cachedb.fleet.copy.merge_databases`."""

    mode: Literal["copy", "merge"]
    sources: list[str]
    target: str
    #: Schema revision of each source as read (older ones are read as is).
    source_revisions: dict[str, str | None] = field(default_factory=dict)
    #: True when ``copy`` continued an interrupted copy of the same source.
    resumed: bool = False
    tables: dict[str, TableCopy] = field(default_factory=lambda: {t: TableCopy(t) for t in TABLES})
    seconds: float = 0.0
    #: With ``repack``: guarded entries written re-encoded (not those the target had), and those
    #: read as stored because their payload failed its checks (``cachedb verify`` names them).
    repacked: int = 0
    not_repacked: int = 0
    #: True for a dry run: the counts are what the run would write; nothing was written.
    dry_run: bool = False

    @property
    def rows_written(self) -> int:
        return sum(t.added + t.replaced for t in self.tables.values())

    @property
    def bytes_written(self) -> int:
        return sum(t.bytes for t in self.tables.values())

    def rows(self) -> list[dict[str, Any]]:
        return [t.as_row() for t in self.tables.values()]


@dataclass(frozen=True)
class CopyProgress:
    """Passed to the progress callback after every committed batch. Rows and bytes are those
    read from the sources so far (all sources of a merge together); ``bytes_total`` is an
    estimate taken before the run (SQL ``length()`` of the text and binary columns)."""

    source: str
    table: str
    rows_done: int
    rows_total: int
    bytes_done: int
    bytes_total: int


ProgressCallback = Callable[[CopyProgress], None]
