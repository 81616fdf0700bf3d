"""Database-to-database copy and merge (``cachedb copy SRC DST``, ``cachedb merge SRC... --into DST``).

Any location to any other: an SQLite file or a SQLAlchemy URL (PostgreSQL) on either side.
Every table's rows go over, source table by table in id order, in batches of at most
``batch_rows`` rows or ``batch_bytes`` bytes, **one DST transaction per batch**. Ids are not
copied: DST assigns its own and every foreign key is remapped through the parent's natural
key (fingerprints by ``fingerprint_key``, kernel blobs by ``sha256``, CUTLASS op lists by
``request_key``). Payloads (zstd frames) and signatures are copied as stored: nothing is
re-signed, so a signed database still verifies under its key afterwards. FX graph /
AOTAutograd payloads are re-encoded in the form this version writes to DST
(:func:`cachedb.store.payload.repacked_guarded`: on SQLite entries under 1 MiB stored as they are,
larger ones compressed; on PostgreSQL all compressed) between an SQLite file and PostgreSQL,
whose forms differ, and between two of a kind with ``repack``: each is verified first, keeps
its content and SHA-256, and so its signature; one that fails its checks is copied as stored
and counted.

Rows move through the database drivers (:mod:`cachedb.store.bulk`: SQLite's cursor or a
PostgreSQL server-side binary cursor in; a binary ``COPY ... FROM STDIN`` or sqlite3's
``executemany`` out) with the values SQLAlchemy would have stored, and a reader thread reads
the next batch while the current one is written where that overlaps (a PostgreSQL DST, or a
PostgreSQL SRC). ``merge`` finds what DST holds with one indexed query per 500 keys of a
batch. An SQLite DST's WAL is checkpointed once, at the end, not every few batches.

Natural keys decide what DST already holds, so an interrupted run (any exception, Ctrl-C, a
crash) keeps the batches it committed and a re-run continues where it stopped:

==========================  ====================================================  ==========================
table                       natural key                                           when DST already has it
==========================  ====================================================  ==========================
``system_fingerprints``     ``fingerprint_key``                                   DST's row is kept (unified)
``kernel_blobs``            ``sha256``                                            DST's row is kept
``kernel_artifacts``        ``(kind, host_key, key, name)``                       DST's row is kept
``guarded_entries``         ``(kind, key, variant)`` (variant = payload's hash)   DST's row is kept
``autotune_timings``        ``(fingerprint key, op, inputs, hint_override,        never the same row: every
                            precision, choice_hash, recorded_at)``                benchmark is history, kept
``local_cache_values``      ``(fingerprint key, key_path)``                       the newer ``updated_at`` wins
``best_configs``            ``key``                                               the newer ``updated_at`` wins
``cutlass_op_lists``        ``request_key`` (with its ``cutlass_ops``)            DST's list is kept
``quarantined_entries``     ``(kind, key, variant, checksum, quarantined_at)``    DST's row is kept
``pgo_profiles``            ``key``                                               the newer ``updated_at`` wins
``dynamo_packages``         ``key`` (the compiled function's source id)           the newer ``updated_at`` wins
==========================  ====================================================  ==========================

Best configs (and LocalCache values, and Dynamo's caches) cannot keep both rows, their
key being unique: the one with the newer ``updated_at`` is stored and served, the older one is
dropped (a tie keeps DST's); the summary counts replaced DST rows as ``replaced`` and dropped
SRC rows as ``skipped``. A CUTLASS request key names the generator's inputs, so two lists under
one key are the same list; DST's stays.

Timings and LocalCache values share a document position (the order Inductor's JSON document
is written back in). ``copy`` keeps the positions; ``merge`` shifts the positions of the rows
it adds past DST's last one, so DST's documents keep their order and SRC's entries follow.

``copy`` needs an empty or absent DST (created at the code's head revision). While it runs,
DST holds a marker table (:data:`MARKER_TABLE`, naming SRC) so that a re-run recognises an
interrupted copy of the same SRC and continues; the marker is dropped when the copy completes.
``merge`` unions into any DST (created if absent) and is idempotent: merging twice adds nothing.

Sources are never modified: an SQLite SRC is opened read-only (``mode=ro``), PostgreSQL in a
``READ ONLY`` ``REPEATABLE READ`` transaction; either way the whole run reads one snapshot.
A SRC at an older schema revision (0001, 0002) is **read as is**, not upgraded: tables it
lacks count as empty, and columns it lacks get what the migration would give them
(``guarded_entries.last_used_at`` = ``created_at``, ``signature`` = NULL). An SQLite SRC is
checked with ``PRAGMA quick_check`` before anything is written; a damaged one is refused
(:class:`DamagedSourceError`, pointing at ``cachedb recover``).

With ``require_signed``, every FX graph / AOTAutograd entry, best config and row of Dynamo's
caches of every SRC must carry a signature that verifies under the signer's key
(``CACHEDB_HMAC_KEY``) before anything is written; otherwise :class:`UnsignedInputError`.
Timings, LocalCache values, CUTLASS lists and kernel files are not signed by cachedb (kernel
blobs are content-addressed by SHA-256).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import operator
import os
import queue
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from sqlalchemy import (
    Boolean,
    Column,
    Connection,
    DateTime,
    Engine,
    MetaData,
    String,
    Table,
    create_engine,
    event,
    func,
    insert,
    inspect,
    LargeBinary,
    select,
    update,
)
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from ..store import migrate
from ..store.bulk import bulk_insert, parse_timestamp, stream
from ..store.bulk import matching as _matching
from ..store.bulk import utc as _utc
from ..store.engine import SQLITE_HEADER, WRITE_OPTION, create_cachedb_engine, sqlite_path, to_url
from .._errors import CacheDBError, CopyError, CorruptPayloadError, DatabaseOpenError
from ..store.payload import repacked_guarded
from ..store.signing import Signer
from ..db import CacheDB
from ..store.tables import AUTOTUNE_TIMINGS, DYNAMO_TABLES, NATURAL_KEY_COLUMNS, NEWEST_WINS_COMPARED, metadata
from ..repositories import timings as timings_repo

log = logging.getLogger("cachedb")

#: Tables in copy order (parents before children).
TABLES = (
    "system_fingerprints",
    "kernel_blobs",
    "kernel_artifacts",
    "guarded_entries",
    "autotune_timings",
    "local_cache_values",
    "best_configs",
    "cutlass_op_lists",
    "cutlass_ops",
    "quarantined_entries",
    "pgo_profiles",
    "dynamo_packages",
)

#: The table an unfinished ``copy`` leaves in DST: one row naming SRC (dropped at the end).
MARKER_TABLE = "cachedb_copy_in_progress"

#: Keys of a batch looked up in DST per query (merge).
_KEYS_PER_QUERY = 500

#: SQLite's default ``wal_autocheckpoint`` (pages), restored after each batch.
_SQLITE_AUTOCHECKPOINT = 1000

#: Default batch bounds: rows, and bytes of row values (payloads included).
DEFAULT_BATCH_ROWS = 20000
DEFAULT_BATCH_BYTES = 16 << 20

#: ``autotune_timings`` is read flat: the view of revision 0004, or the table of 0001-0003.
_T = {name: metadata.tables.get(name, AUTOTUNE_TIMINGS) for name in TABLES}
#: The timestamp columns of each table.
_DATETIMES = {name: tuple(c.name for c in t.c if isinstance(c.type, DateTime)) for name, t in _T.items()}
#: The boolean columns of each table (SQLite hands back 0/1).
_BOOLEANS = {name: tuple(c.name for c in t.c if isinstance(c.type, Boolean)) for name, t in _T.items()}
_UTC = dt.timezone.utc
_MARKER = Table(
    MARKER_TABLE,
    MetaData(),
    Column("source", String(1024), nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
)


class DamagedSourceError(CopyError):
    """An SQLite source fails SQLite's own checks (damaged pages, not a database)."""


class UnsignedInputError(CopyError):
    """``require_signed``: a source holds unsigned or foreign-signed entries."""


class TargetNotEmptyError(CopyError):
    """``copy`` was pointed at a DST that holds rows (and no unfinished copy of this SRC)."""


# --------------------------------------------------------------------------- reports


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
    """The outcome of :func:`copy_database` / :func:`merge_databases`."""

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


# --------------------------------------------------------------------------- values


_END = object()


def _prefetched(items: Iterator[Any], depth: int = 2) -> Iterator[Any]:
    """``items``, produced by a reader thread at most ``depth`` ahead of the consumer. An
    exception of the reader is raised in the consumer; a consumer that stops early (an
    exception, Ctrl-C) stops the reader and closes ``items`` before this generator ends."""
    q: queue.Queue[tuple[Any, BaseException | None]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any, exc: BaseException | None = None) -> bool:
        while not stop.is_set():
            try:
                q.put((item, exc), timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for item in items:
                if not put(item):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            put(_END, exc)
            return
        put(_END)

    reader = threading.Thread(target=work, name="cachedb-copy-reader", daemon=True)
    reader.start()
    try:
        while True:
            item, exc = q.get()
            if item is _END:
                if exc is not None:
                    raise exc
                return
            yield item
    finally:
        stop.set()
        reader.join()
        close = getattr(items, "close", None)
        if close is not None:
            close()


# --------------------------------------------------------------------------- the source


def _readonly_sqlite_engine(path: Path, timeout_s: float) -> Engine:
    """An engine that can only read ``path`` (``mode=ro``, ``query_only``), with an explicit
    ``BEGIN`` so that a transaction is one snapshot."""
    uri = f"{path.resolve().as_uri()}?mode=ro"

    def connect() -> sqlite3.Connection:
        con = sqlite3.connect(uri, uri=True, timeout=timeout_s, check_same_thread=False)
        con.isolation_level = None
        con.execute("PRAGMA query_only = ON")
        return con

    engine = create_engine("sqlite://", creator=connect, poolclass=NullPool)

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conn.connection.driver_connection.execute("BEGIN")

    return engine


def _damaged(where: str, detail: str, target: str | None) -> DamagedSourceError:
    nothing = f"nothing was written to {target}; " if target else ""
    return DamagedSourceError(
        f"{where}: the database is damaged ({detail}); {nothing}`cachedb recover {where} SAVED.db` "
        f"salvages the readable rows, then copy or merge SAVED.db"
    )


class _Source:
    """One source database, read-only, with its revision and the columns it has."""

    def __init__(self, location: CacheDB | str | os.PathLike[str], *, timeout_s: float, target: str | None) -> None:
        self.owned = not isinstance(location, CacheDB)
        self.path: Path | None
        if isinstance(location, CacheDB):
            self.engine = location.engine
            self.where = location.where
            self.path = location.path
        else:
            try:
                url = to_url(location)
                self.path = sqlite_path(url)
            except (ValueError, SQLAlchemyError) as exc:
                raise DatabaseOpenError(f"{location}: not a usable database location or URL: {exc}") from exc
            self.where = str(self.path) if self.path is not None else url.render_as_string(hide_password=True)
            if self.path is not None:
                self._check_file(self.path)
                self.engine = _readonly_sqlite_engine(self.path, timeout_s)
            else:
                try:
                    self.engine = create_cachedb_engine(url, busy_timeout_s=timeout_s)
                except (SQLAlchemyError, ImportError, ValueError) as exc:
                    raise DatabaseOpenError(f"{self.where}: cannot open: {exc}") from exc
        self.sqlite = self.engine.dialect.name == "sqlite"
        try:
            insp = inspect(self.engine)
            names = set(insp.get_table_names())
            if "alembic_version" not in names:
                raise CopyError(f"no cachedb database at {self.where}: it has no cachedb schema")
            with self.engine.connect() as conn:
                self.revision: str | None = migrate._stamped_revision(conn) or migrate.current_revision(conn)
                conn.rollback()
            if self.revision is None:
                raise CopyError(f"no cachedb database at {self.where}: it has no cachedb schema")
            migrate._check_known(self.where, self.revision)
            names |= set(insp.get_view_names())  # autotune_timings, since revision 0004
            self.columns = {t: {c["name"] for c in insp.get_columns(t)} for t in TABLES if t in names}
        except DBAPIError as exc:
            self.close()
            raise self._wrap(exc, target) from exc
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _check_file(path: Path) -> None:
        try:
            if path.is_dir():
                raise DatabaseOpenError(f"{path}: is a directory, not a database file")
            with path.open("rb") as f:
                head = f.read(len(SQLITE_HEADER))
        except FileNotFoundError:
            raise CopyError(f"no database at {path}") from None
        except OSError as exc:
            raise DatabaseOpenError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        if head != SQLITE_HEADER:
            raise CopyError(f"{path}: not an SQLite database (file header is not 'SQLite format 3')")

    def _wrap(self, exc: BaseException, target: str | None) -> CacheDBError:
        orig = getattr(exc, "orig", None) or exc
        message = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
        low = message.lower()
        if self.sqlite and ("malformed" in low or "corrupt" in low or "not a database" in low or "disk image" in low):
            return _damaged(self.where, message, target)
        return CopyError(f"{self.where}: cannot read the source: {type(orig).__name__}: {message}")

    def check_integrity(self, target: str | None) -> None:
        """SQLite: ``PRAGMA quick_check`` (reads every page). Raises :class:`DamagedSourceError`."""
        if not self.sqlite:
            return
        try:
            with self.engine.connect() as conn:
                lines = [row[0] for row in conn.exec_driver_sql("PRAGMA quick_check")]
                conn.rollback()
        except DBAPIError as exc:
            raise self._wrap(exc, target) from exc
        if lines != ["ok"]:
            extra = f" and {len(lines) - 1} more problem(s)" if len(lines) > 1 else ""
            raise _damaged(self.where, f"quick_check: {lines[0]}{extra}", target)

    @contextmanager
    def snapshot(self, target: str | None) -> Iterator[Connection]:
        """One read-only transaction for the whole run."""
        try:
            conn = self.engine.connect()
        except DBAPIError as exc:
            raise self._wrap(exc, target) from exc
        try:
            if not self.sqlite:
                conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin() as txn:
                if not self.sqlite:
                    conn.exec_driver_sql("SET TRANSACTION READ ONLY")
                try:
                    yield conn
                finally:
                    txn.rollback()
        finally:
            conn.close()

    def has(self, table: str) -> bool:
        return table in self.columns

    def select(self, table: str) -> Any:
        t = _T[table]
        return select(*[c for c in t.c if c.name in self.columns[table]])

    def fill(self, table: str, row: dict[str, Any]) -> dict[str, Any]:
        """``row`` (as the driver read it: :func:`cachedb.store.bulk.stream`) with timestamps as
        aware UTC datetimes, booleans as bool, and the columns an older revision lacks filled
        as its migration would (see the module docstring)."""
        out = row
        for name in _DATETIMES[table]:
            value = out.get(name)
            if value is not None:
                out[name] = parse_timestamp(value)
        for name in _BOOLEANS[table]:
            value = out.get(name)
            if value is not None:
                out[name] = bool(value)
        if isinstance(out.get("payload"), memoryview):
            out["payload"] = bytes(out["payload"])
        if table == "guarded_entries":
            out.setdefault("signature", None)
            if out.get("last_used_at") is None:
                out["last_used_at"] = out["created_at"]
        elif table == "best_configs":
            out.setdefault("signature", None)
        return out

    def count(self, conn: Connection, table: str) -> tuple[int, int]:
        """``(rows, estimated bytes)`` of ``table``."""
        if not self.has(table):
            return 0, 0
        t = _T[table]
        sized, fixed = [], 0
        for c in t.c:
            if c.name not in self.columns[table]:
                continue
            if isinstance(c.type, (String, LargeBinary)):
                sized.append(func.coalesce(func.sum(func.length(c)), 0))
            elif c.name != "id":
                fixed += 8
        rows, *lengths = conn.execute(select(func.count(), *sized).select_from(t)).one()
        return int(rows), sum(int(n) for n in lengths) + fixed * int(rows)

    def close(self) -> None:
        if self.owned:
            self.engine.dispose()


def _check_signed(src: _Source, conn: Connection, signer: Signer, target: str) -> None:
    """Raise :class:`UnsignedInputError` if any guarded entry or best config of ``src`` is
    unsigned or does not verify under ``signer``."""
    unsigned = foreign = 0
    first: str | None = None
    if src.has("guarded_entries"):
        g = _T["guarded_entries"]
        has_sig = "signature" in src.columns["guarded_entries"]
        cols = [g.c.kind, g.c.key, g.c.variant, g.c.checksum] + ([g.c.signature] if has_sig else [])
        for row in conn.execute(select(*cols).order_by(g.c.id)):
            kind, key, variant, checksum = row[:4]
            signature = row[4] if has_sig else None
            if signature is None:
                unsigned += 1
            elif not signer.verify(signature, "guarded", kind, key, variant, checksum):
                foreign += 1
            else:
                continue
            first = first or f"{kind}/{key}/{variant}"
    if src.has("best_configs"):
        b = _T["best_configs"]
        has_sig = "signature" in src.columns["best_configs"]
        cols = [b.c.key, b.c.content] + ([b.c.signature] if has_sig else [])
        for row in conn.execute(select(*cols).order_by(b.c.id)):
            key, content = row[:2]
            signature = row[2] if has_sig else None
            if signature is None:
                unsigned += 1
            elif not signer.verify(signature, "best_config", key, hashlib.sha256(content.encode("utf-8")).hexdigest()):
                foreign += 1
            else:
                continue
            first = first or key
    for kind, table in DYNAMO_TABLES.items():
        if not src.has(table):
            continue
        d = _T[table]
        for key, checksum, signature in conn.execute(select(d.c.key, d.c.checksum, d.c.signature).order_by(d.c.id)):
            if signature is None:
                unsigned += 1
            elif not signer.verify(signature, "dynamo", kind, key, checksum):
                foreign += 1
            else:
                continue
            first = first or f"{kind}/{key}"
    if unsigned or foreign:
        raise UnsignedInputError(
            f"{src.where}: {unsigned} unsigned and {foreign} foreign-signed entries (first: {first}); "
            f"--require-signed refuses it, nothing was written to {target}"
        )


# --------------------------------------------------------------------------- the target


def _target_state(location: CacheDB | str | os.PathLike[str], timeout_s: float) -> tuple[int, str | None]:
    """``(rows in DST's tables, source named by an unfinished copy's marker)`` without
    creating or changing anything (an absent or empty SQLite file: ``(0, None)``)."""
    if isinstance(location, CacheDB):
        engine, owned = location.engine, False
    else:
        url = to_url(location)
        path = sqlite_path(url)
        if path is not None:
            if not path.exists() or (path.is_file() and path.stat().st_size == 0):
                return 0, None
            _Source._check_file(path)
            engine, owned = _readonly_sqlite_engine(path, timeout_s), True
        else:
            engine, owned = create_cachedb_engine(url, busy_timeout_s=timeout_s), True
    try:
        names = set(inspect(engine).get_table_names())
        rows, marker = 0, None
        with engine.connect() as conn:
            for name in sorted(names - {"alembic_version", MARKER_TABLE}):
                rows += int(conn.execute(select(func.count()).select_from(Table(name, MetaData()))).scalar_one())
            if MARKER_TABLE in names:
                marker = conn.execute(select(_MARKER.c.source)).scalar()
            conn.rollback()
        return rows, marker
    finally:
        if owned:
            engine.dispose()


# --------------------------------------------------------------------------- the transfer


class _Transfer:
    """Moves the rows of one source into ``dst``, batch by batch."""

    def __init__(self, src: _Source, conn: Connection, dst: CacheDB, report: CopyReport, *, mode: str,
                 progress: ProgressCallback | None, done: list[int], totals: tuple[int, int],
                 batch_rows: int, batch_bytes: int, fresh: bool = False, repack: bool = False,
                 shared: Connection | None = None) -> None:
        self.src, self.conn, self.dst, self.report = src, conn, dst, report
        #: A dry run's one DST transaction: every batch is written in it, and it is rolled back.
        self.shared = shared
        self.mode = mode
        #: FX graph / AOTAutograd payloads re-encoded for DST: asked for, or DST's form differs
        #: from SRC's (an SQLite file stores small entries as they are, PostgreSQL compresses)
        self.repack = repack or src.sqlite != (dst.engine.dialect.name == "sqlite")
        #: ids of the guarded rows of the current batch whose payload was re-encoded: counted
        #: in the report when the batch writes them (:meth:`_added`)
        self._repacked_rows: set[int] = set()
        #: A copy into a target that was empty when it started (not a resumed one): DST holds
        #: only what this run wrote, and SRC's rows are copied as they are, so the natural-key
        #: lookups in DST are skipped.
        self.fresh = fresh
        self.progress = progress
        self.done = done  # [rows, bytes] read so far, over all sources
        self.totals = totals
        self.batch_rows, self.batch_bytes = batch_rows, batch_bytes
        self.fp: dict[int, int] = {}
        self.blob: dict[int, int] = {}
        self.position_offset = 0
        #: What a reader thread does ahead of the writes (:meth:`_batches`).
        self.prefetch: str | None = (
            "prepared" if dst.engine.dialect.name != "sqlite" else None if src.sqlite else "fetched")

    # -- plumbing -----------------------------------------------------------------------------

    def _batches(self, table: str, stmt: Any = None, *, prefetch: bool = True) -> Iterator[list[tuple[dict[str, Any], int]]]:
        """Rows of ``table`` (``stmt``: default all, by id) as ``(row, bytes)`` batches.

        With ``prefetch``, a reader thread reads ahead while the caller writes (the drivers
        release the GIL while they wait on the databases; the source connection is the
        reader's alone until the iteration ends): for a PostgreSQL DST it also prepares the
        rows, for an SQLite DST it only fetches from a PostgreSQL SRC. An SQLite DST's
        inserts release and retake the GIL on every row, and a reader thread busy in Python
        would make each retake wait, so nothing reads ahead from an SQLite SRC into one."""
        if not self.src.has(table):
            return
        if not prefetch or self.prefetch is None:
            yield from self._read(table, stmt)
        elif self.prefetch == "prepared":
            yield from _prefetched(self._read(table, stmt))
        else:
            yield from self._read(table, stmt, fetched=_prefetched)

    def _read(self, table: str, stmt: Any, fetched: Callable[[Iterator[Any]], Iterator[Any]] | None = None
              ) -> Iterator[list[tuple[dict[str, Any], int]]]:
        t = _T[table]
        stmt = stmt if stmt is not None else self.src.select(table).order_by(t.c.id)
        names = [c.name for c in stmt.selected_columns]
        sized = [i for i, c in enumerate(stmt.selected_columns) if isinstance(c.type, (String, LargeBinary))]
        fixed = 8 * (len(names) - len(sized))
        fill = self.src.fill
        try:
            batch: list[tuple[dict[str, Any], int]] = []
            size = 0
            raw = stream(self.conn, stmt, min(self.batch_rows, 2000))
            for rows in (fetched(raw) if fetched is not None else raw):
                for row in rows:
                    n = fixed + sum([len(row[i]) for i in sized if row[i] is not None])
                    batch.append((fill(table, dict(zip(names, row))), n))
                    size += n
                    if len(batch) >= self.batch_rows or size >= self.batch_bytes:
                        yield batch
                        batch, size = [], 0
            if batch:
                yield batch
        except DBAPIError as exc:
            raise self.src._wrap(exc, None) from exc
        except ValueError as exc:  # a timestamp that is not one
            raise CopyError(f"{self.src.where}: {table}: unreadable value: {exc}") from exc

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        """One DST transaction (``BEGIN IMMEDIATE`` on SQLite), committed on success.

        On SQLite the commit does not checkpoint the WAL (``wal_autocheckpoint`` is 0 around
        it, SQLite's default again after): a bulk copy would otherwise write and sync the
        database file at every few batches; :func:`_run` checkpoints once at the end. A dry run
        writes every batch in its one transaction (:attr:`shared`), which :func:`_run` rolls back."""
        if self.shared is not None:
            yield self.shared
            return
        with self.dst.engine.connect().execution_options(**{WRITE_OPTION: True}) as conn:
            # on the driver connection: SQLAlchemy's execute would begin the transaction
            driver = conn.connection.driver_connection if conn.dialect.name == "sqlite" else None
            if driver is not None:
                driver.execute("PRAGMA wal_autocheckpoint = 0")
            try:
                with conn.begin():
                    yield conn
            finally:
                if driver is not None:
                    driver.execute(f"PRAGMA wal_autocheckpoint = {_SQLITE_AUTOCHECKPOINT}")

    def _tick(self, table: str, batch: Sequence[tuple[dict[str, Any], int]]) -> None:
        self.done[0] += len(batch)
        self.done[1] += sum(n for _, n in batch)
        self.report.tables[table].read += len(batch)
        if self.progress is not None:
            self.progress(CopyProgress(self.src.where, table, self.done[0], self.totals[0],
                                       self.done[1], max(self.done[1], self.totals[1])))

    def _added(self, table: str, rows: Sequence[tuple[dict[str, Any], int]]) -> None:
        if self._repacked_rows:
            self.report.repacked += sum(1 for m, _ in rows if id(m) in self._repacked_rows)
            self._repacked_rows.clear()
        entry = self.report.tables[table]
        entry.added += len(rows)
        entry.bytes += sum(n for _, n in rows)

    @staticmethod
    def _strip(values: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in values.items() if k != "id"}

    def _ids(self, w: Connection, table: str, column: str, keys: Sequence[Any]) -> dict[Any, int]:
        t = _T[table]
        out: dict[Any, int] = {}
        for start in range(0, len(keys), 500):
            chunk = list(keys[start:start + 500])
            out.update((k, int(i)) for k, i in w.execute(select(t.c[column], t.c.id).where(t.c[column].in_(chunk))))
        return out

    # -- tables with ids others point at ------------------------------------------------------

    def _by_natural_key(self, table: str, column: str, mapping: dict[int, int]) -> None:
        """Fingerprints and kernel blobs: insert what DST lacks, map SRC ids to DST ids."""
        for batch in self._batches(table):
            with self._write() as w:
                have = self._ids(w, table, column, [v[column] for v, _ in batch])
                new = [(v, n) for v, n in batch if v[column] not in have]
                if new:
                    bulk_insert(w, _T[table], [v for v, _ in new], exclude=("id",))
                    have.update(self._ids(w, table, column, [v[column] for v, _ in new]))
            for v, _ in batch:
                mapping[int(v["id"])] = have[v[column]]
            self._added(table, new)
            self.report.tables[table].skipped += len(batch) - len(new)
            self._tick(table, batch)

    # -- tables keyed by their own natural key -----------------------------------------------

    def _keyed(self, table: str, natural: Callable[[dict[str, Any]], tuple],
               remap: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
        """Insert the rows whose natural key DST lacks (DST's rows are kept). DST's keys are
        read for the batch's values of :data:`_NARROW` (the leading columns of an index)."""
        t = _T[table]
        key_cols = [t.c[name] for name in NATURAL_KEY_COLUMNS[table]]
        narrow = _NARROW[table]
        stamps = [i for i, c in enumerate(key_cols) if isinstance(c.type, DateTime)]
        for batch in self._batches(table):
            mapped = [(m, n) for m, n in ((remap(v), n) for v, n in batch) if m is not None]
            if self.fresh:
                with self._write() as w:
                    bulk_insert(w, t, [m for m, _ in mapped], exclude=("id",))
                self._added(table, mapped)
                self.report.tables[table].skipped += len(batch) - len(mapped)
                self._tick(table, batch)
                continue
            with self._write() as w:
                have: set[tuple] = set()
                values = list({tuple([m[c] for c in narrow]) for m, _ in mapped})
                for start in range(0, len(values), _KEYS_PER_QUERY):
                    chunk = values[start:start + _KEYS_PER_QUERY]
                    for row in w.execute(_matching(w, select(*key_cols), t, narrow, chunk)).all():
                        key = list(row)  # key_cols: the natural key's order
                        for i in stamps:
                            key[i] = _utc(key[i])
                        have.add(tuple(key))
                new = []
                for m, n in mapped:
                    k = natural(m)
                    if k not in have:
                        have.add(k)
                        new.append((m, n))
                if new:
                    bulk_insert(w, t, [m for m, _ in new], exclude=("id",))
            self._added(table, new)
            self.report.tables[table].skipped += len(batch) - len(new)
            self._tick(table, batch)

    def _newest_wins(self, table: str, key: tuple[str, ...], remap: Callable[[dict[str, Any]], dict[str, Any] | None],
                     same: Callable[[dict[str, Any], Any], bool], replace_columns: tuple[str, ...]) -> None:
        """Best configs, LocalCache values: insert what DST lacks; where DST has the key with
        other content, the row with the newer ``updated_at`` wins (a tie keeps DST's)."""
        t = _T[table]
        for batch in self._batches(table):
            mapped = [(m, n) for m, n in ((remap(v), n) for v, n in batch) if m is not None]
            new, replaced = [], []
            with self._write() as w:
                have: dict[tuple, Any] = {}
                seen: set[tuple] = set()  # added by this batch: a later duplicate is skipped
                values = list({tuple([m[k] for k in key]) for m, _ in mapped})
                cols = [t.c.id, *(t.c[k] for k in key), t.c.updated_at, *(t.c[c] for c in NEWEST_WINS_COMPARED[table])]
                for start in range(0, len(values), _KEYS_PER_QUERY):
                    for row in w.execute(_matching(w, select(*cols), t, key, values[start:start + _KEYS_PER_QUERY])).all():
                        have[tuple(row[1:1 + len(key)])] = row
                for m, n in mapped:
                    k = tuple(m[c] for c in key)
                    found = have.get(k)
                    if k in seen:
                        continue
                    if found is None:
                        new.append((m, n))
                        seen.add(k)
                    elif not same(m, found) and m["updated_at"] > _utc(found.updated_at):
                        w.execute(update(t).where(t.c.id == found.id).values({c: m[c] for c in replace_columns}))
                        replaced.append((m, n))
                if new:
                    bulk_insert(w, t, [m for m, _ in new], exclude=("id",))
            self._added(table, new)
            entry = self.report.tables[table]
            entry.replaced += len(replaced)
            entry.bytes += sum(n for _, n in replaced)
            entry.skipped += len(batch) - len(new) - len(replaced)
            self._tick(table, batch)

    # -- remapping -----------------------------------------------------------------------------

    def _fp_or_none(self, values: dict[str, Any]) -> dict[str, Any]:
        fid = values.get("fingerprint_id")
        values["fingerprint_id"] = self.fp.get(int(fid)) if fid is not None else None
        return values

    def _fp_required(self, values: dict[str, Any]) -> dict[str, Any] | None:
        fid = values.get("fingerprint_id")
        if fid is None or int(fid) not in self.fp:
            return None
        values["fingerprint_id"] = self.fp[int(fid)]
        return values

    def _positioned(self, values: dict[str, Any]) -> dict[str, Any] | None:
        out = self._fp_required(values)
        if out is not None:
            out["position"] = int(out["position"]) + self.position_offset
        return out

    def _guarded(self, values: dict[str, Any]) -> dict[str, Any]:
        values = self._fp_or_none(values)
        if not self.repack:
            return values
        where = f"{self.src.where}: guarded_entries {values['kind']}/{values['key']}/{values['variant']}"
        try:
            blob = repacked_guarded(values["payload"], int(values["size_bytes"]), values["checksum"], where=where,
                                    dialect=self.dst.engine.dialect.name)
        except CorruptPayloadError as exc:
            log.warning("%s; copied as stored", exc)
            self.report.not_repacked += 1
            return values
        if blob is not None:
            values["payload"] = blob
            self._repacked_rows.add(id(values))
        return values

    def _artifact(self, values: dict[str, Any]) -> dict[str, Any] | None:
        blob = self.blob.get(int(values["blob_id"]))
        if blob is None:
            return None
        values["blob_id"] = blob
        return self._fp_or_none(values)

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> None:
        self._by_natural_key("system_fingerprints", "fingerprint_key", self.fp)
        self._by_natural_key("kernel_blobs", "sha256", self.blob)
        self._keyed("kernel_artifacts", _natural("kernel_artifacts"), self._artifact)
        self._keyed("guarded_entries", _natural("guarded_entries"), self._guarded)
        if self.mode == "merge" and self.shared is not None:
            self.position_offset = timings_repo.next_position(self.shared)
        elif self.mode == "merge":
            with self.dst.read() as repos:
                self.position_offset = timings_repo.next_position(repos.session)
        self._timings()
        self._newest_wins("local_cache_values", ("fingerprint_id", "key_path"), self._positioned,
                          lambda m, row: m["value_json"] == row.value_json, ("value_json", "updated_at"))
        self._newest_wins(
            "best_configs", ("key",), self._fp_or_none, lambda m, row: m["content"] == row.content,
            ("content", "configs_hash", "num_warps", "num_stages", "found_by_coordesc", "time_taken_ms",
             "triton_cache_hash", "kernel_kwargs", "signature", "fingerprint_id", "updated_at"),
        )
        self._cutlass()
        self._keyed("quarantined_entries", _natural("quarantined_entries"), lambda v: v)
        for table in DYNAMO_TABLES.values():  # Dynamo's caches: one pickle per key, the newer wins
            self._newest_wins(
                table, ("key",), self._fp_or_none, lambda m, row: m["checksum"] == row.checksum,
                ("payload", "size_bytes", "checksum", "signature", "fingerprint_id", "updated_at",
                 "last_used_at", "hit_count"),
            )

    def _timings(self) -> None:
        """Timings, read flat (the view, or an older revision's table) and written through
        the keys and runs they need (:func:`cachedb.repositories.timings.insert_flat`). A
        benchmark DST holds (same key, ``recorded_at`` and choice) is skipped: history is
        kept, never doubled."""
        table = "autotune_timings"
        for batch in self._batches(table):
            mapped = [(m, n) for m, n in ((self._positioned(v), n) for v, n in batch) if m is not None]
            with self._write() as w:
                stored = timings_repo.insert_flat(w, [m for m, _ in mapped], skip_stored=not self.fresh)
            new = [mapped[i] for i in stored]
            self._added(table, new)
            self.report.tables[table].skipped += len(batch) - len(new)
            self._tick(table, batch)

    def _cutlass(self) -> None:
        """Each op list with its ops in one DST transaction (a list is there whole or not)."""
        if not self.src.has("cutlass_op_lists"):
            return
        lists = _T["cutlass_op_lists"]
        has_ops = self.src.has("cutlass_ops")
        for batch in self._batches("cutlass_op_lists", prefetch=False):
            for values, n in batch:
                with self._write() as w:
                    found = w.execute(select(lists.c.id).where(lists.c.request_key == values["request_key"])).scalar()
                    if found is None:
                        w.execute(insert(lists), [self._strip(values)])
                        new_id = int(w.execute(
                            select(lists.c.id).where(lists.c.request_key == values["request_key"])).scalar_one())
                        if has_ops:
                            self._copy_ops(w, int(values["id"]), new_id)
                if found is None:
                    self._added("cutlass_op_lists", [(values, n)])
                else:
                    self.report.tables["cutlass_op_lists"].skipped += 1
                    self._skip_ops(int(values["id"]))
                self._tick("cutlass_op_lists", [(values, n)])

    def _copy_ops(self, w: Connection, src_list_id: int, dst_list_id: int) -> None:
        ops = _T["cutlass_ops"]
        stmt = self.src.select("cutlass_ops").where(ops.c.op_list_id == src_list_id).order_by(ops.c.id)
        for op_batch in self._batches("cutlass_ops", stmt, prefetch=False):
            rows = []
            for v, _ in op_batch:
                v = self._strip(v)
                v["op_list_id"] = dst_list_id
                rows.append(v)
            bulk_insert(w, ops, rows)
            self._added("cutlass_ops", op_batch)
            self.report.tables["cutlass_ops"].read += len(op_batch)
            self.done[0] += len(op_batch)
            self.done[1] += sum(k for _, k in op_batch)

    def _skip_ops(self, src_list_id: int) -> None:
        if not self.src.has("cutlass_ops"):
            return
        ops = _T["cutlass_ops"]
        n = int(self.conn.execute(select(func.count()).select_from(ops).where(ops.c.op_list_id == src_list_id)).scalar_one())
        self.report.tables["cutlass_ops"].read += n
        self.report.tables["cutlass_ops"].skipped += n
        self.done[0] += n


#: The columns of each table :meth:`_Transfer._keyed` handles whose values in a batch select (a
#: superset of) the DST rows its natural keys could match: an index's leading columns (the
#: small ``quarantined_entries`` has none).
_NARROW = {
    "kernel_artifacts": ("kind", "host_key", "key"),
    "guarded_entries": ("kind", "key"),
    "quarantined_entries": ("kind", "key"),
}


def _natural(table: str) -> Callable[[dict[str, Any]], tuple]:
    """The natural key of a row whose timestamps are already UTC (:meth:`_Source.fill`)."""
    return operator.itemgetter(*NATURAL_KEY_COLUMNS[table])


# --------------------------------------------------------------------------- entry points


def _open_sources(sources: Sequence[CacheDB | str | os.PathLike[str]], timeout_s: float,
                  target_where: str | None) -> list[_Source]:
    opened: list[_Source] = []
    try:
        for location in sources:
            opened.append(_Source(location, timeout_s=timeout_s, target=target_where))
    except BaseException:
        for s in opened:
            s.close()
        raise
    return opened


def _where(location: CacheDB | str | os.PathLike[str]) -> str:
    if isinstance(location, CacheDB):
        return location.where
    try:
        url = to_url(location)
    except (ValueError, SQLAlchemyError) as exc:
        raise DatabaseOpenError(f"{location}: not a usable database location or URL: {exc}") from exc
    path = sqlite_path(url)
    return str(path) if path is not None else url.render_as_string(hide_password=True)


def _dry_run_target(mode: str, target: CacheDB | str | os.PathLike[str], where: str,
                    timeout_s: float) -> tuple[CacheDB, tempfile.TemporaryDirectory[str] | None]:
    """The database a dry run writes into, and rolls back: DST as it is (neither created nor
    upgraded), or, for an absent or empty DST (which the run would create), an empty scratch
    SQLite database in a temporary directory, removed afterwards."""
    if isinstance(target, CacheDB):
        return target, None
    path = sqlite_path(to_url(target))
    if path is None or path.exists() and not (path.is_file() and path.stat().st_size == 0):
        db = CacheDB(target, busy_timeout_s=timeout_s, upgrade=False)
        try:
            revision = db.revision()
        except BaseException:
            db.close()
            raise
        if revision == migrate.HEAD_REVISION:
            return db, None
        db.close()
        if revision is not None:
            raise CopyError(f"{where}: schema revision {revision}, not this cachedb's {migrate.HEAD_REVISION}: the "
                            f"{mode} would upgrade it first (`cachedb --db {where} upgrade --dry-run` shows how); "
                            "nothing was changed")
    scratch = tempfile.TemporaryDirectory(prefix=".cachedb-dry-run-")
    try:
        return CacheDB(Path(scratch.name) / "dst.db", busy_timeout_s=timeout_s), scratch
    except BaseException:
        scratch.cleanup()
        raise


def _run(
    mode: Literal["copy", "merge"],
    sources: Sequence[CacheDB | str | os.PathLike[str]],
    target: CacheDB | str | os.PathLike[str],
    *,
    progress: ProgressCallback | None,
    require_signed: bool,
    signer: Signer | None,
    batch_rows: int,
    batch_bytes: int,
    timeout_s: float,
    repack: bool = False,
    dry_run: bool = False,
) -> CopyReport:
    started = time.monotonic()
    if batch_rows < 1 or batch_bytes < 1:
        raise ValueError("batch_rows and batch_bytes must be positive")
    if not sources:
        raise CopyError("no source database given")
    target_where = _where(target)
    for location in sources:
        if _where(location) == target_where:
            raise CopyError(f"{target_where}: source and target are the same database")
    if require_signed:
        signer = signer if signer is not None else Signer.from_environment()
        if signer is None:
            raise CopyError("--require-signed needs the team's key in CACHEDB_HMAC_KEY; nothing was written")
    srcs = _open_sources(sources, timeout_s, target_where)
    report = CopyReport(mode, [s.where for s in srcs], target_where,
                        source_revisions={s.where: s.revision for s in srcs}, dry_run=dry_run)
    dst: CacheDB | None = None
    scratch: tempfile.TemporaryDirectory[str] | None = None
    try:
        # Every refusal comes before DST is opened or created: nothing is written then.
        for s in srcs:
            s.check_integrity(target_where)
        totals = [0, 0]
        for s in srcs:
            with s.snapshot(target_where) as conn:
                if require_signed:
                    assert signer is not None
                    _check_signed(s, conn, signer, target_where)
                for table in TABLES:
                    rows, nbytes = s.count(conn, table)
                    totals[0] += rows
                    totals[1] += nbytes
        if mode == "copy":
            rows, marker = _target_state(target, timeout_s)
            if marker is not None and marker != srcs[0].where:
                raise TargetNotEmptyError(
                    f"{target_where}: holds an unfinished copy of {marker}; re-run that copy to finish it, "
                    f"or remove {target_where}")
            if rows and marker is None:
                raise TargetNotEmptyError(
                    f"{target_where}: not empty ({rows} rows); `cachedb copy` needs an empty or absent target "
                    f"(`cachedb merge SRC --into {target_where}` unions into it)")
            report.resumed = marker is not None
        if dry_run:
            dst, scratch = _dry_run_target(mode, target, target_where, timeout_s)
        else:
            dst = target if isinstance(target, CacheDB) else CacheDB(target, busy_timeout_s=timeout_s)
        if mode == "copy" and not report.resumed and not dry_run:
            with dst.write() as repos:
                conn = cast(Connection, repos.session)
                _MARKER.create(conn, checkfirst=True)
                conn.execute(insert(_MARKER), {"source": srcs[0].where, "started_at": dt.datetime.now(_UTC)})
        done = [0, 0]
        # A dry run: the same transfer, every batch in one DST transaction that is rolled back.
        shared = dst.engine.connect().execution_options(**{WRITE_OPTION: True}) if dry_run else None
        try:
            if shared is not None:
                shared.begin()
            for s in srcs:
                with s.snapshot(target_where) as conn:
                    _Transfer(s, conn, dst, report, mode=mode, progress=progress, done=done,
                              totals=(totals[0], totals[1]), batch_rows=batch_rows, batch_bytes=batch_bytes,
                              fresh=mode == "copy" and not report.resumed, repack=repack, shared=shared).run()
        finally:
            if shared is not None:
                shared.rollback()
                shared.close()
        if mode == "copy" and not dry_run:
            with dst.write() as repos:
                _MARKER.drop(cast(Connection, repos.session), checkfirst=True)
        if dst.engine.dialect.name == "sqlite" and not dry_run:  # the batches left the WAL to this one checkpoint
            with dst.engine.connect() as conn:
                conn.connection.driver_connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        for s in srcs:
            s.close()
        if dst is not None and dst is not target:
            dst.close()
        if scratch is not None:
            scratch.cleanup()
    report.seconds = time.monotonic() - started
    return report


def copy_database(
    source: CacheDB | str | os.PathLike[str],
    target: CacheDB | str | os.PathLike[str],
    *,
    progress: ProgressCallback | None = None,
    require_signed: bool = False,
    signer: Signer | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    timeout_s: float = 30.0,
    repack: bool = False,
    dry_run: bool = False,
) -> CopyReport:
    """Copy every row of ``source`` into ``target`` (empty or absent; created at the code's
    head revision), resumably. See the module docstring for what is copied and how.

    ``source``/``target``: a :class:`CacheDB` (used as opened; a source ``CacheDB`` has been
    upgraded by its own open) or a location (file path or SQLAlchemy URL; a source location is
    opened read-only and never upgraded or created). ``progress`` is called after each
    committed batch; an exception it raises stops the copy, committed batches stay, and a
    re-run continues. ``batch_rows`` (rows) and ``batch_bytes`` (bytes of row values) bound a
    batch, one DST transaction each; ``timeout_s``: seconds to wait on a locked database.
    ``signer`` (default: ``CACHEDB_HMAC_KEY``) is the key ``require_signed`` checks against.
    ``repack``: FX graph / AOTAutograd payloads re-encoded as this version writes them to
    ``target`` also when both are SQLite (or both PostgreSQL), as they always are between the
    two (see the module docstring; a database written before small entries were stored as they
    are reads them ~12x faster after, at the bytes their files take: ~5 against 64 µs for
    100 KB; one written before payload format 3 reads them ~2x faster, 5 against 10.6 µs).

    ``dry_run``: the same run, every check included, with every batch written in one ``target``
    transaction that is then rolled back (into an absent or empty ``target``: an empty scratch
    SQLite database in a temporary directory), so the report counts what the run would write
    and ``target`` is left as it was, neither created nor upgraded (on PostgreSQL, id
    sequences advance as in any rolled-back insert).

    Returns a :class:`CopyReport` (rows and bytes per table, seconds, entries re-encoded).

    Raises:
        CopyError: no source database, source and target the same, or the target not a usable
            location.
        TargetNotEmptyError: ``target`` holds rows and no unfinished copy of ``source``.
        DamagedSourceError: an SQLite ``source`` fails ``PRAGMA quick_check`` (nothing written).
        UnsignedInputError: ``require_signed`` and unsigned or foreign-signed entries (nothing
            written).
        SchemaTooNewError: ``source`` is at a revision newer than this code.
        DatabaseOpenError: either database cannot be opened.
        sqlalchemy.exc.SQLAlchemyError: a write to ``target`` failed (that batch rolled back).
    """
    return _run("copy", [source], target, progress=progress, require_signed=require_signed, signer=signer,
                batch_rows=batch_rows, batch_bytes=batch_bytes, timeout_s=timeout_s, repack=repack, dry_run=dry_run)


def merge_databases(
    sources: Sequence[CacheDB | str | os.PathLike[str]],
    target: CacheDB | str | os.PathLike[str],
    *,
    progress: ProgressCallback | None = None,
    require_signed: bool = False,
    signer: Signer | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    timeout_s: float = 30.0,
    repack: bool = False,
    dry_run: bool = False,
) -> CopyReport:
    """Union every row of each of ``sources`` (in order) into ``target`` (created if absent):
    natural keys deduplicate, timings keep every benchmark of both, best configs and
    LocalCache values keep the newer row (module docstring). Idempotent. Arguments, return
    value and errors as :func:`copy_database` (no :class:`TargetNotEmptyError`); with
    ``require_signed`` every source is checked before anything is written; ``dry_run`` as
    there."""
    return _run("merge", list(sources), target, progress=progress, require_signed=require_signed, signer=signer,
                batch_rows=batch_rows, batch_bytes=batch_bytes, timeout_s=timeout_s, repack=repack, dry_run=dry_run)


__all__ = [
    "COLUMNS",
    "CopyProgress",
    "CopyReport",
    "DamagedSourceError",
    "MARKER_TABLE",
    "TABLES",
    "TableCopy",
    "TargetNotEmptyError",
    "UnsignedInputError",
    "copy_database",
    "merge_databases",
]
