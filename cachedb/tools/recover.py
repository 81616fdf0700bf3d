"""``cachedb recover DAMAGED NEW``: salvage every readable row of a damaged SQLite database.

Two ways to read the damaged file, both read-only:

- ``recover``: SQLite's own recovery, the ``sqlite3`` shell's ``.recover`` (SQLite >= 3.29),
  piped into a scratch database. It reads every page on its own, so rows below a damaged
  interior b-tree page are found too. Used when a ``sqlite3`` shell is on ``PATH``.
- ``scan``: page-tolerant table scans in Python (no shell needed): each table is read in rowid
  order; where a damaged page stops the scan, it goes on from the next rowid the table's
  indexes know of (each probed alone), else from the next rowid found by seeking further and
  further ahead. Rows whose pages cannot be read are counted as lost.

The rows read are copied, column for column and with their ids, into a new database created at
the damaged database's schema revision (then upgraded to the code's head, as any open does).
Payloads are re-verified (zstd frame, size and SHA-256 checksum) and a row whose payload fails
is not copied (``corrupt``); a row whose parent row was lost is copied with the reference set to
NULL where the schema says ``ON DELETE SET NULL`` and is otherwise left out (``orphaned``).
Rows the damaged database's indexes know of but that could not be read are ``lost``; rows
neither a table page nor an index page still shows cannot be counted, so ``lost`` is a floor.
"""

from __future__ import annotations

import functools
import os
import shutil
import sqlite3
import subprocess
import tempfile
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..store.engine import SQLITE_HEADER
from .._errors import CacheDBError, CorruptPayloadError, NotADatabaseError
from ..store.payload import unpack

#: Methods: ``auto`` (``recover`` when a ``sqlite3`` shell is found, else ``scan``).
METHODS = ("auto", "recover", "scan")

_MIN_ROWID = -(1 << 63)
_MAX_ROWID = (1 << 63) - 1


class RecoverError(CacheDBError):
    """Nothing could be recovered (the schema itself is unreadable, the target exists, ...)."""


@dataclass
class TableRecovery:
    """What happened to one table's rows."""

    table: str
    saved: int = 0
    lost: int = 0  # known to exist (a table or index page says so) but unreadable
    corrupt: int = 0  # read, but the payload failed its checksum: not copied
    orphaned: int = 0  # read, but its parent row was lost (or it broke a constraint): not copied
    known: int | None = None  # rows the damaged database's indexes list (None: no index readable)

    def as_row(self) -> dict[str, Any]:
        return {"table": self.table, "saved": self.saved, "lost": self.lost, "corrupt": self.corrupt,
                "orphaned": self.orphaned, "indexed": "" if self.known is None else self.known}


@dataclass
class RecoverReport:
    source: str
    target: str
    method: str
    revision: str | None
    tables: list[TableRecovery] = field(default_factory=list)
    problems: list[dict[str, Any]] = field(default_factory=list)  # cachedb verify on the new database

    @property
    def saved(self) -> int:
        return sum(t.saved for t in self.tables)

    @property
    def not_saved(self) -> int:
        return sum(t.lost + t.corrupt + t.orphaned for t in self.tables)


@functools.lru_cache(maxsize=1)
def sqlite_shell() -> str | None:
    """The ``sqlite3`` shell on ``PATH`` if its ``.recover`` works, else None.

    ``.recover`` needs SQLite >= 3.29 built with the ``sqlite_dbpage`` virtual table; some
    distributions' shells lack it (their ``.recover`` prints no rows), so it is tried once on
    a two-row database.
    """
    exe = shutil.which("sqlite3")
    if exe is None:
        return None
    with tempfile.TemporaryDirectory(prefix=".cachedb-recover-check-") as tmp:
        probe = Path(tmp) / "probe.db"
        con = sqlite3.connect(probe)
        con.execute("CREATE TABLE t (x TEXT)")
        con.execute("INSERT INTO t VALUES ('cachedb-probe-1'), ('cachedb-probe-2')")
        con.commit()
        con.close()
        try:
            out = subprocess.run([exe, str(probe), ".recover"], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            return None
    return exe if "cachedb-probe-2" in out else None


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _connect_ro(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
    con.execute("PRAGMA query_only = ON")
    return con


# --------------------------------------------------------------------------- reading what is readable


def _known_rowids(con: sqlite3.Connection, table: str) -> set[int] | None:
    """Rowids the table's indexes list (read as far as their pages allow)."""
    try:
        indexes = [r[0] for r in con.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?", (table,))]
    except sqlite3.DatabaseError:
        return None
    known: set[int] | None = None
    for index in indexes:
        found: set[int] = set()
        try:
            for (rowid,) in con.execute(f"SELECT rowid FROM {_q(table)} INDEXED BY {_q(index)}"):
                found.add(rowid)
        except sqlite3.DatabaseError:
            if not found:
                continue
        known = found if known is None else known | found
    return known


class _Scanner:
    """Page-tolerant reads of one table: every row whose pages can be read."""

    def __init__(self, con: sqlite3.Connection, table: str, columns: list[str]) -> None:
        self.con = con
        cols = ", ".join(_q(c) for c in columns)
        self._from = f"SELECT rowid, {cols} FROM {_q(table)} WHERE rowid >= ? ORDER BY rowid"
        self._one = f"SELECT rowid, {cols} FROM {_q(table)} WHERE rowid = ?"
        self._next = f"SELECT rowid FROM {_q(table)} WHERE rowid >= ? ORDER BY rowid LIMIT 1"
        self.rows: dict[int, tuple[Any, ...]] = {}
        self.failed: set[int] = set()

    def probe(self, rowid: int) -> bool | None:
        """Read one row: True (read), False (unreadable), None (no such row)."""
        try:
            row = self.con.execute(self._one, (rowid,)).fetchone()
        except sqlite3.DatabaseError:
            self.failed.add(rowid)
            return False
        if row is None:
            return None
        self.rows[rowid] = tuple(row[1:])
        return True

    def _seek_past(self, last: int) -> int | None:
        """A rowid > ``last`` whose row reads, found by seeking ever further ahead: each seek
        that lands in a damaged page doubles the step. Once one lands past the damage, a
        binary search between it and the last seek that failed finds where the damage ends,
        so the rows just after it are not stepped over (a leaf of 16 KiB holds many)."""
        step = 1
        failed: int | None = None  # the furthest position whose seek hit the damage
        while last + step <= _MAX_ROWID:
            position = last + step
            try:
                row = self.con.execute(self._next, (position,)).fetchone()
            except sqlite3.DatabaseError:
                failed = position
                step *= 2
                continue
            if failed is not None:  # the damage ends in (failed, position]: find where
                low, high = failed, position
                while high - low > 1:
                    middle = (low + high) // 2
                    try:
                        found = self.con.execute(self._next, (middle,)).fetchone()
                    except sqlite3.DatabaseError:
                        low = middle
                        continue
                    high, row = middle, found
            if row is None:
                return None  # past the last row
            rowid = int(row[0])
            if self.probe(rowid):
                return rowid
            last, step, failed = rowid, 1, None
        return None

    def scan(self, known: set[int] | None) -> None:
        start, last = _MIN_ROWID, _MIN_ROWID - 1
        pending = deque(sorted(known or ()))
        while True:
            try:
                for row in self.con.execute(self._from, (start,)):
                    last = row[0]
                    self.rows[last] = tuple(row[1:])
                return
            except sqlite3.DatabaseError:
                pass
            # A page after `last` is damaged: go on from the next row that reads.
            nxt = None
            while pending and nxt is None:
                candidate = pending.popleft()
                if candidate > last and candidate not in self.rows and self.probe(candidate):
                    nxt = candidate
            if nxt is None:
                nxt = self._seek_past(max(last, max(self.failed, default=last)))
            if nxt is None or nxt >= _MAX_ROWID:
                return
            start, last = nxt + 1, nxt  # row `nxt` is read (probed): every restart moves on


def _run_shell_recover(shell: str, source: Path, scratch: Path) -> None:
    """``sqlite3 SOURCE .recover | sqlite3 SCRATCH``."""
    with subprocess.Popen([shell, "-readonly", str(source), ".recover"], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL) as dump:
        assert dump.stdout is not None
        load = subprocess.run([shell, str(scratch)], stdin=dump.stdout, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, check=False)
        dump.stdout.close()
    if not scratch.exists() or load.returncode not in (0, 1):
        raise RecoverError(f"{source}: sqlite3 .recover failed: {load.stderr.decode(errors='replace')[-300:]}")


# --------------------------------------------------------------------------- writing the new database


def _source_revision(con: sqlite3.Connection) -> str | None:
    try:
        row = con.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.DatabaseError:
        return None
    return str(row[0]) if row else None


def _create_target(target: Path, revision: str | None) -> None:
    """An empty cachedb database at ``revision`` (the head when unknown)."""
    from alembic import command
    from sqlalchemy import create_engine, event

    from ..store import migrate
    from ..store.engine import PAGE_SIZE, check_sqlite_file

    if revision is not None:
        try:
            migrate._check_known(str(target), revision)
        except CacheDBError:
            revision = None
    check_sqlite_file(target)  # owner-only file and directory, as CacheDB creates them
    engine = create_engine(f"sqlite:///{target}")
    # the page size of every database cachedb creates (PAGE_SIZE), before the first table
    event.listen(engine, "connect", lambda dbapi_conn, _record: dbapi_conn.execute(f"PRAGMA page_size = {PAGE_SIZE}"))
    try:
        with engine.begin() as conn:
            command.upgrade(migrate.alembic_config(conn), revision or "head")
    finally:
        engine.dispose()


def _tables_in_order(con: sqlite3.Connection) -> list[str]:
    """The target's tables, parents before children (foreign keys)."""
    names = [r[0] for r in con.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
        "AND name != 'alembic_version' ORDER BY name")]
    parents = {t: {r[2] for r in con.execute(f"PRAGMA foreign_key_list({_q(t)})")} - {t} for t in names}
    ordered: list[str] = []
    while len(ordered) < len(names):
        ready = [t for t in names if t not in ordered and parents[t] <= set(ordered)]
        ordered += ready or [t for t in names if t not in ordered]  # a cycle: whatever is left
    return ordered


def _payload_columns(columns: list[str], table: str) -> tuple[int, int, int] | None:
    """Indexes of (payload, size_bytes, checksum) in a table whose rows carry a verified payload."""
    if "quarantine" in table or "payload" not in columns or "size_bytes" not in columns:
        return None
    digest = "checksum" if "checksum" in columns else "sha256" if "sha256" in columns else None
    if digest is None:
        return None
    return columns.index("payload"), columns.index("size_bytes"), columns.index(digest)


def recover(
    source: str | os.PathLike[str],
    target: str | os.PathLike[str],
    *,
    method: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    dry_run: bool = False,
) -> RecoverReport:
    """Copy every readable row of the damaged SQLite database ``source`` into a new cachedb
    database ``target`` (which must not exist), then verify it. ``progress(tables done,
    tables)`` after each table. Returns the per-table :class:`RecoverReport`.

    ``dry_run``: the same recovery into a scratch database in a temporary directory, removed
    afterwards: the report says what ``target`` would hold, and ``target`` is not created.

    Raises :class:`RecoverError` when ``target`` exists or nothing can be read, and
    :class:`~cachedb.NotADatabaseError` when ``source`` is not an SQLite file.
    """
    src, dst = Path(source), Path(target)
    if method not in METHODS:
        raise RecoverError(f"unknown method {method!r}: one of {', '.join(METHODS)}")
    try:
        with src.open("rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise RecoverError(f"{src}: cannot read: {exc.strerror or exc}") from exc
    if head != SQLITE_HEADER:  # SQLite (and so .recover) cannot open it either
        raise NotADatabaseError(src, "file header is not 'SQLite format 3'")
    if dst.exists() or dst.is_symlink():
        raise RecoverError(f"{dst}: exists; recover writes a new database (give a path that does not exist)")
    shell = sqlite_shell() if method in ("auto", "recover") else None
    if method == "recover" and shell is None:
        raise RecoverError("method 'recover' needs a sqlite3 shell whose .recover works (SQLite 3.29 or later, "
                           "built with sqlite_dbpage) on PATH; use --method scan")
    if dry_run:
        with tempfile.TemporaryDirectory(prefix=".cachedb-recover-dry-run-") as scratch_dir:
            scratch = Path(scratch_dir) / "new.db"
            report = recover(src, scratch, method=method, progress=progress)
        report.target = str(dst)
        report.problems = [{k: v.replace(str(scratch), str(dst)) if isinstance(v, str) else v for k, v in p.items()}
                           for p in report.problems]
        return report

    with tempfile.TemporaryDirectory(prefix=".cachedb-recover-", dir=dst.parent if dst.parent.is_dir() else None) as tmp:
        damaged = _connect_ro(src)
        try:
            try:
                damaged.execute("SELECT name FROM sqlite_master").fetchall()
                schema_readable = True
            except sqlite3.DatabaseError:
                schema_readable = False
            if shell is not None:
                scratch = Path(tmp) / "recovered.db"
                _run_shell_recover(shell, src, scratch)
                reader = _connect_ro(scratch)
                used = "recover"
            elif schema_readable:
                reader, used = damaged, "scan"
            else:
                raise RecoverError(f"{src}: the schema (page 1) is unreadable and no sqlite3 shell is on PATH "
                                   "for .recover; nothing can be salvaged")
            try:
                revision = _source_revision(reader) or (_source_revision(damaged) if reader is not damaged else None)
                _create_target(dst, revision)
                report = RecoverReport(str(src), str(dst), used, revision)
                _copy(damaged if schema_readable else None, reader, dst, report, progress)
            finally:
                if reader is not damaged:
                    reader.close()
        finally:
            damaged.close()

    from ..db import CacheDB
    from .verify import verify

    with CacheDB(dst) as db:  # upgraded to the head revision as any open does; then re-verified
        report.problems, _ = verify(db, quarantine=True)
    return report


def _copy(damaged: sqlite3.Connection | None, reader: sqlite3.Connection, dst: Path, report: RecoverReport,
          progress: Callable[[int, int], None] | None) -> None:
    out = sqlite3.connect(dst, isolation_level=None)
    try:
        out.execute("PRAGMA foreign_keys = ON")
        tables = _tables_in_order(out)
        have = {r[0] for r in reader.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        saved_keys: dict[tuple[str, str], set[Any]] = {}
        out.execute("BEGIN")
        for n, table in enumerate(tables):
            result = TableRecovery(table)
            report.tables.append(result)
            if table in have:
                _copy_table(damaged, reader, out, table, result, saved_keys)
            if progress:
                progress(n + 1, len(tables))
        out.execute("COMMIT")
    finally:
        out.close()


def _copy_table(damaged: sqlite3.Connection | None, reader: sqlite3.Connection, out: sqlite3.Connection,
                table: str, result: TableRecovery, saved_keys: dict[tuple[str, str], set[Any]]) -> None:
    columns = [r[1] for r in out.execute(f"PRAGMA table_info({_q(table)})")]
    try:
        source_cols = {r[1] for r in reader.execute(f"PRAGMA table_info({_q(table)})")}
    except sqlite3.DatabaseError:
        source_cols = set()
    columns = [c for c in columns if c in source_cols]
    if not columns:
        return
    known = _known_rowids(damaged, table) if damaged is not None else None
    scanner = _Scanner(reader, table, columns)
    scanner.scan(known if reader is damaged else None)
    if reader is damaged and known:
        for rowid in sorted(known - scanner.rows.keys() - scanner.failed):
            scanner.probe(rowid)
    result.known = None if known is None else len(known)
    unread = set(scanner.failed)
    if known is not None:
        unread |= known - scanner.rows.keys()
    result.lost = len(unread)

    fks = [(r[3], r[2], r[4], str(r[6]).upper()) for r in out.execute(f"PRAGMA foreign_key_list({_q(table)})")]
    fks = [(columns.index(col), parent, to, on_delete) for col, parent, to, on_delete in fks if col in columns]
    referenced = {r[4] for r in _referencing(out, table)}
    check = _payload_columns(columns, table)
    insert = f"INSERT INTO {_q(table)} ({', '.join(_q(c) for c in columns)}) VALUES ({', '.join('?' * len(columns))})"
    for rowid in sorted(scanner.rows):
        values = list(scanner.rows[rowid])
        if check is not None:
            p, s, c = check
            try:
                unpack(values[p], int(values[s]), str(values[c]), where=f"{table} row {rowid}", full=True)
            except (CorruptPayloadError, TypeError, ValueError):
                result.corrupt += 1
                continue
        ok = True
        for i, parent, to, on_delete in fks:
            if values[i] is not None and values[i] not in saved_keys.get((parent, to or "id"), set()):
                if on_delete == "SET NULL":
                    values[i] = None
                else:
                    ok = False
        if not ok:
            result.orphaned += 1
            continue
        try:
            out.execute(insert, values)
        except sqlite3.DatabaseError:  # a damaged value breaking a constraint (unique, not null, ...)
            result.orphaned += 1
            continue
        result.saved += 1
        for col in referenced:
            if col in columns:
                saved_keys.setdefault((table, col), set()).add(values[columns.index(col)])


def _referencing(out: sqlite3.Connection, table: str) -> Iterator[tuple[Any, ...]]:
    """Foreign keys of other tables that point at ``table`` (``r[4]`` the referenced column)."""
    for (name,) in out.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
        for r in out.execute(f"PRAGMA foreign_key_list({_q(name)})").fetchall():
            if r[2] == table:
                yield (*r[:4], r[4] or "id")
