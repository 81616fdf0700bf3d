"""Where the database lives and how its engine is set up.

This is the only module with SQLite-specific SQL (pragmas, ``BEGIN IMMEDIATE``): everything
above it speaks portable SQLAlchemy and runs on PostgreSQL too.
"""

from __future__ import annotations

import itertools
import math
import os
import random
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import OperationalError as SAOperationalError
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql import ClauseElement

from . import wal_index
from .checkpoint import BackgroundCheckpointer
from .._errors import CacheDBError, DatabaseOpenError, NotADatabaseError
from .fork import in_forked_children
from .prebuilt import _Compiled, compiled_for

#: SQLite's file header: the first 16 bytes of every database file.
SQLITE_HEADER = b"SQLite format 3\x00"

#: Seconds a connection waits on a locked SQLite database before giving up.
DEFAULT_BUSY_TIMEOUT_S = 30.0

#: Execution option that makes a transaction a writer (``BEGIN IMMEDIATE`` on SQLite).
WRITE_OPTION = "cachedb_write"


def default_location() -> str:
    """The database used when none is given.

    ``$CACHEDB_URL`` (any SQLAlchemy URL) if set, else ``$CACHEDB_PATH`` (an SQLite file), else
    ``$XDG_CACHE_HOME/cachedb/cachedb.db`` (``~/.cache/cachedb/cachedb.db``; on macOS
    ``~/Library/Caches/cachedb/cachedb.db``).
    """
    for var in ("CACHEDB_URL", "CACHEDB_PATH"):
        value = os.environ.get(var)
        if value:
            return value
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return str(base / "cachedb" / "cachedb.db")


def to_url(location: str | os.PathLike[str] | URL) -> URL:
    """A SQLAlchemy URL for a file path or URL string. Paths become ``sqlite:///<abs path>``."""
    if isinstance(location, URL):
        return location
    text = os.fspath(location)
    if "://" in text:
        return make_url(text)
    return URL.create("sqlite", database=str(Path(text).expanduser().resolve()))


def sqlite_path(url: URL) -> Path | None:
    """The database file of an SQLite URL; ``None`` for other backends and in-memory SQLite."""
    if url.get_backend_name() != "sqlite":
        return None
    if not url.database or url.database == ":memory:" or url.database.startswith("file:"):
        return None
    return Path(url.database)


def check_sqlite_file(path: Path) -> None:
    """Refuse a path that exists but is not an SQLite database, without touching it.

    An absent or empty file is fine (SQLite creates the database). Raises
    :class:`~cachedb.NotADatabaseError` otherwise and :class:`~cachedb.DatabaseOpenError` for
    a directory or an unreadable file.
    """
    if not path.exists():
        try:
            # Owner-only: a new directory is 0700, the new file 0600 (SQLite gives its -wal and
            # -shm files the database file's permissions).
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            pass
        except OSError as exc:
            raise DatabaseOpenError(f"{path}: cannot create the database: {exc.strerror or exc}") from exc
        return
    if path.is_dir():
        raise DatabaseOpenError(f"{path}: is a directory, not a database file")
    if not path.is_file():  # SQLite would write its journal beside a device (/dev/null-journal)
        raise DatabaseOpenError(f"{path}: not a regular file (a device, FIFO or socket), not a database file")
    try:
        with path.open("rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise DatabaseOpenError(f"{path}: cannot read: {exc}") from exc
    if head and head != SQLITE_HEADER[: len(head)]:
        raise NotADatabaseError(path, "file header is not 'SQLite format 3'")
    if 0 < len(head) < len(SQLITE_HEADER):
        raise NotADatabaseError(path, f"file is only {len(head)} bytes long")


#: Page size (bytes) of the SQLite databases cachedb creates (SQLite's default: 4096). A
#: payload larger than a page is read one page at a time, each a ``pread`` when SQLite's own
#: cache does not hold it (a warm start reads each entry once): on 2 cores, a 100 KB payload
#: read in 64 us at 4 KiB pages, 23 us at 16 KiB, against 17 us for its file (19 us at
#: 64 KiB); a 20 MB one in 7.2 ms, 4.3 ms, against 1.6 ms. A commit of one small row costs
#: 15 us at 4 KiB, 22 us at 16 KiB, 41 us at 64 KiB (every changed page goes to the WAL
#: whole). docs/hot-paths.md. An existing database keeps its page size; ``cachedb copy`` to a
#: new file gives it this one.
PAGE_SIZE = 16384


def _setup_sqlite(engine: Engine, busy_timeout_s: float) -> None:
    """WAL (many readers, one writer), a busy timeout, foreign keys, and explicit BEGINs.

    pysqlite's own transaction handling is turned off so that SQLAlchemy's ``begin`` emits
    ``BEGIN`` (readers) or ``BEGIN IMMEDIATE`` (writers: the write lock is taken up front, so
    two writers queue on the busy timeout instead of failing on a lock upgrade).
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        cur.execute("PRAGMA foreign_keys = ON")
        # A new database's page size: set before anything is written (WAL fixes it); on an
        # existing database it changes nothing.
        cur.execute(f"PRAGMA page_size = {PAGE_SIZE}")
        mode = _retry_locked(lambda: cur.execute("PRAGMA journal_mode = WAL").fetchone(), busy_timeout_s)
        if mode and str(mode[0]).lower() not in ("wal", "memory"):
            _retry_locked(lambda: cur.execute("PRAGMA journal_mode = WAL"), busy_timeout_s)
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        dbapi_conn = conn.connection.driver_connection
        if conn.get_execution_options().get(WRITE_OPTION, False):
            try:
                begin_immediate(dbapi_conn, busy_timeout_s)
            except sqlite3.Error as exc:
                raise SAOperationalError("BEGIN IMMEDIATE", None, exc) from exc
        elif not dbapi_conn.in_transaction:  # else: inside KeptConnection.snapshot's BEGIN
            try:
                dbapi_conn.execute("BEGIN")
            except sqlite3.Error as exc:
                raise SAOperationalError("BEGIN", None, exc) from exc


T = TypeVar("T")

#: The sqlite3 module reads values in place (``Connection.blobopen``, Python 3.11 on).
_BLOB_IO = hasattr(sqlite3.Connection, "blobopen")

#: Seconds of the first and the longest sleep between two ``BEGIN IMMEDIATE`` attempts.
BUSY_FIRST_SLEEP_S = 0.0005
BUSY_MAX_SLEEP_S = 0.008


def _retry_locked(fn: Callable[[], T], busy_timeout_s: float) -> T:
    """``fn()``, retried for up to ``busy_timeout_s`` seconds while SQLite answers "database is
    locked" (sleeps of 0.5 ms doubling to at most 8 ms, ±50 % jitter).
    Switching a new file to WAL does that when several connections create it at once: the
    switch needs the exclusive lock and SQLite's busy handler is not always called for it.

    Raises:
        sqlite3.OperationalError: still locked after ``busy_timeout_s`` seconds, or any other
            error of ``fn``.
    """
    deadline = time.monotonic() + busy_timeout_s
    sleep_s = BUSY_FIRST_SLEEP_S
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            now = time.monotonic()
            if now >= deadline:
                raise
        time.sleep(min(sleep_s * random.uniform(0.5, 1.5), max(deadline - time.monotonic(), 0)))
        sleep_s = min(sleep_s * 2, BUSY_MAX_SLEEP_S)


def begin_immediate(dbapi_conn: sqlite3.Connection, busy_timeout_s: float) -> None:
    """``BEGIN IMMEDIATE`` on ``dbapi_conn``, retried for up to ``busy_timeout_s`` seconds
    while another writer holds the lock.

    SQLite's own busy handler (``PRAGMA busy_timeout``) sleeps 1, 2, 5, ... ms and then 100 ms
    per step, so a writer queued behind a 2 ms write can wake up to 100 ms late. Here the
    connection's busy timeout is set to 0 for the attempts, which sleep 0.5 ms doubling to at
    most 8 ms (with ±50 % jitter, so queued writers do not wake together), and the timeout is
    restored for the transaction itself (its COMMIT, and statements of non-cachedb callers).

    Raises:
        sqlite3.OperationalError: still locked after ``busy_timeout_s`` seconds ("database is
            locked"), or any other error of ``BEGIN IMMEDIATE``.
    """
    dbapi_conn.execute("PRAGMA busy_timeout = 0")
    try:
        _retry_locked(lambda: dbapi_conn.execute("BEGIN IMMEDIATE"), busy_timeout_s)
    finally:
        dbapi_conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")


def postgres_connect_args(url: URL, network_timeout_s: float, *, statement_timeout: bool = True) -> dict[str, Any]:
    """The driver's connect arguments of a connection to the server database ``url`` whose
    connects and (with ``statement_timeout``) statements give up after ``network_timeout_s``
    seconds: libpq's ``connect_timeout`` (whole seconds, at least 1), PostgreSQL's
    ``statement_timeout`` as a startup ``options`` parameter (added to the URL's own
    ``options``), ``application_name=cachedb`` unless the URL names one, and, for psycopg,
    statements never prepared on the server (``prepare_threshold=None``). What
    :func:`create_cachedb_engine` gives the engine's connections and
    :class:`cachedb.fleet.tier_read.DriverReader` its own."""
    connect_args: dict[str, Any] = {"connect_timeout": max(1, math.ceil(network_timeout_s))}
    if "application_name" not in url.query:  # cachedb's connections, in pg_stat_activity
        connect_args["application_name"] = "cachedb"
    if statement_timeout:
        options = url.query.get("options")
        if isinstance(options, tuple):
            options = " ".join(options)
        statement_ms = max(1, int(network_timeout_s * 1000))
        connect_args["options"] = " ".join(filter(None, [options, f"-c statement_timeout={statement_ms}"]))
    if url.get_driver_name() == "psycopg":
        connect_args["prepare_threshold"] = None
    return connect_args


def create_cachedb_engine(
    url: URL, *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S, network_timeout_s: float | None = None,
    statement_timeout: bool = True,
) -> Engine:
    """An engine for ``url`` set up for cachedb (see :func:`_setup_sqlite` for SQLite).

    ``network_timeout_s`` (seconds; a server database, e.g. the remote tier): connecting gives
    up after it (libpq ``connect_timeout``, whole seconds, at least 1) and, with
    ``statement_timeout``, so does every statement (PostgreSQL ``statement_timeout``, sent as a
    startup ``options`` parameter, which PgBouncer refuses: :mod:`cachedb.fleet.connections`
    then opens the engine without it). Such an engine keeps at most one idle connection
    (``pool_size=1``; up to 4 more while threads overlap, closed when given back), and the
    pool does not ping connections on checkout (the caller retries a statement whose
    connection was lost instead).

    On PostgreSQL through psycopg, statements are never prepared on the server
    (``prepare_threshold=None``): a pooler in transaction mode (PgBouncer) hands each
    transaction whichever server connection is free, where a statement prepared on another
    one does not exist.

    Raises :class:`~cachedb.NotADatabaseError` for an SQLite path that holds something else.
    """
    path = sqlite_path(url)
    if path is not None:
        check_sqlite_file(path)
    kwargs: dict[str, Any] = {}
    backend = url.get_backend_name()
    if backend == "sqlite":
        kwargs["connect_args"] = {"timeout": busy_timeout_s, "check_same_thread": False}
        if path is None:  # in-memory: one connection, or every session sees an empty database
            kwargs["poolclass"] = StaticPool
    elif network_timeout_s is not None and backend == "postgresql":
        kwargs["connect_args"] = postgres_connect_args(url, network_timeout_s, statement_timeout=statement_timeout)
        kwargs.update(pool_size=1, max_overflow=4, pool_timeout=network_timeout_s)
    else:
        kwargs["pool_pre_ping"] = True
    if backend == "postgresql" and url.get_driver_name() == "psycopg":
        kwargs.setdefault("connect_args", {})["prepare_threshold"] = None
    engine = create_engine(url, **kwargs)
    if backend == "sqlite":
        _setup_sqlite(engine, busy_timeout_s)
    _dispose_in_forked_children(engine)
    return engine


def _dispose_in_forked_children(engine: Engine) -> None:
    """A forked child (a compile worker) must not reuse its parent's pooled connections."""
    in_forked_children(engine, lambda child_engine: child_engine.dispose(close=False))


def connection_of(bind: Any) -> Connection:
    """The :class:`~sqlalchemy.Connection` of ``bind``: itself, or an ORM ``Session``'s
    connection (what the repositories are given: :meth:`cachedb.CacheDB.write` /
    :meth:`~cachedb.CacheDB.lookup` pass a Connection, ``transaction`` / ``read`` a Session)."""
    return bind if isinstance(bind, Connection) else bind.connection()


def set_read_only(conn: Connection) -> None:
    """Make the current transaction of ``conn`` refuse writes (for user-supplied SQL)."""
    if conn.dialect.name == "sqlite":
        conn.exec_driver_sql("PRAGMA query_only = ON")
    elif conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SET TRANSACTION READ ONLY")


def vacuum(engine: Engine) -> None:
    """Give freed pages back to the file system (SQLite ``VACUUM``; nothing elsewhere)."""
    if engine.dialect.name != "sqlite":
        return
    raw = engine.raw_connection()
    try:
        raw.driver_connection.execute("VACUUM")  # autocommit connection: outside a transaction
    finally:
        raw.close()


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


# --------------------------------------------------------------------------------------------
# Hot-path reads: one connection kept per process
# --------------------------------------------------------------------------------------------


class HotReadError(CacheDBError):
    """A hot-path read failed in the database driver (locked, damaged, disconnected, ...)."""


class HotWriteError(CacheDBError):
    """A hot-path write failed in the database driver (locked past the timeout, damaged,
    disconnected, a constraint, ...); nothing of it was committed."""


#: Connections a forked child inherited: never used, never closed (closing SQLite's handle in
#: the child could checkpoint or unlink the parent's WAL), only kept from the garbage collector.
_INHERITED: list[Any] = []

#: Numbers the kept connections a process opens (every :class:`KeptConnection`, and each
#: reopening): a :meth:`KeptConnection.fetch_versioned` token never matches one taken on
#: another connection, whose ``PRAGMA data_version`` counts from its own start.
_CONNECTION_NUMBERS = itertools.count(1)


def _bound_bytes(params: Mapping[str, Any]) -> int:
    """The bytes of the ``bytes`` and ``str`` values of ``params`` (what a write adds to the
    WAL, roughly)."""
    return sum(len(v) for v in params.values() if isinstance(v, (bytes, str)))


class KeptConnection:
    """One database connection kept open for the life of a process, for the hot paths.

    A pooled connection costs a checkout, and SQLAlchemy's ``BEGIN`` and rollback, around a
    ~10 µs SELECT; this connection is opened once and reused (``CacheDB.read()`` and
    ``CacheDB.lookup()`` take it when it is free):

    - :meth:`fetch` runs a prebuilt Core ``SELECT`` (compiled once per statement and dialect
      in a process: :data:`_COMPILED`) on the driver connection in autocommit mode: on
      SQLite each statement is its own read transaction, so it sees every write other
      processes committed before it, and no snapshot stays open between calls (PostgreSQL:
      rolled back after).
    - :meth:`write` runs one prebuilt Core statement (an upsert) in its own write transaction:
      on SQLite ``BEGIN IMMEDIATE`` (queued with short sleeps, :func:`begin_immediate`), the
      statement, ``COMMIT``: the write lock is held for that one statement only.
    - :meth:`snapshot` lends the connection as a SQLAlchemy :class:`~sqlalchemy.Connection`
      for a block, inside a read transaction (``CacheDB.read`` / ``CacheDB.lookup``: on SQLite
      the driver's BEGIN ... ROLLBACK).
    - :meth:`version` and :meth:`fetch_versioned` tell, on SQLite, whether another connection
      committed since a given moment (``PRAGMA data_version``), for process-local copies that
      must see other processes' writes (:mod:`cachedb.live._best_configs`).
    - On an SQLite file its writes do not checkpoint the WAL inline (``wal_autocheckpoint =
      0`` while it is kept): :attr:`checkpointer` does it on a background thread
      (:mod:`cachedb.store.checkpoint`); the connection goes back to the pool with its automatic
      checkpoint.

    Thread-safe: one lock; a caller that finds it held (another thread, or a nested block)
    gets a pooled connection instead of waiting. Fork-safe: a child process (a compile worker)
    opens its own on first use and never touches the one it inherited.
    """

    def __init__(self, engine: Engine, *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> None:
        self._engine = engine
        self._busy_timeout_s = busy_timeout_s
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._dbapi: Any = None  # the driver connection of _conn
        self._number = 0  # of _conn, from _CONNECTION_NUMBERS
        self._pid = os.getpid()
        self._sqlite = engine.dialect.name == "sqlite"
        path = sqlite_path(engine.url)
        #: ``(descriptor of SQLite's -shm file, wal-index header, token)``: :meth:`version`'s
        #: token as of that header (:mod:`cachedb.store.wal_index`); ``None``: run the PRAGMA.
        self._wal: tuple[int, bytes, tuple[int, int]] | None = None
        self._wal_sought = 0  # the connection number whose -shm descriptor was looked for
        #: Checkpoints the WAL that this connection's writes grow (it runs without SQLite's
        #: automatic checkpoint, :mod:`cachedb.store.checkpoint`); ``None`` off SQLite files.
        self.checkpointer = BackgroundCheckpointer(path, busy_timeout_s) if path is not None else None
        self._autocheckpoint: int | None = None  # the pages the connection had, restored on close
        self.closed = False
        in_forked_children(self, KeptConnection._forget_inherited)

    def _forget_inherited(self) -> None:
        """In a forked child: drop (without closing) the parent's connection and lock."""
        if self._conn is not None:
            _INHERITED.append(self._conn)
        self._conn = None
        self._dbapi = None
        self._wal = None
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _compile(self, stmt: ClauseElement) -> _Compiled:
        return compiled_for(stmt, self._engine.dialect)

    def _connection(self) -> Connection:
        conn = self._conn
        if conn is None or conn.closed or conn.invalidated:
            conn = self._conn = self._engine.connect()
            self._dbapi = conn.connection.driver_connection
            self._number = next(_CONNECTION_NUMBERS)
            self._wal = None
            if self.checkpointer is not None:  # its writes leave checkpoints to the checkpointer
                self._autocheckpoint = self._dbapi.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
                self._dbapi.execute("PRAGMA wal_autocheckpoint = 0")
                self.checkpointer.set_page_size(self._dbapi.execute("PRAGMA page_size").fetchone()[0])
        return conn

    def _discard(self) -> None:
        conn, self._conn, self._dbapi, self._wal = self._conn, None, None, None
        if conn is not None:
            try:
                conn.invalidate()
                conn.close()
            except Exception:  # already broken: nothing more to release
                pass

    @contextmanager
    def snapshot(self) -> Iterator[Connection | None]:
        """The kept connection in a read transaction for this block: one consistent snapshot,
        rolled back at its end (:meth:`cachedb.CacheDB.read` / :meth:`~cachedb.CacheDB.lookup`).
        ``None`` when it is in use (another thread, a nested block) or closed: the caller then
        takes a pooled connection.

        On SQLite the ``BEGIN`` and ``ROLLBACK`` go straight to the driver (~3 µs, against ~15 µs
        through SQLAlchemy's ``Connection.begin()`` and its events): the repositories' point
        reads run there too (:mod:`cachedb.store.prebuilt`). A statement run through SQLAlchemy in
        the block begins SQLAlchemy's own transaction, which finds the driver's already open
        and joins it (``_setup_sqlite``'s ``begin`` handler), and is rolled back with it.
        Elsewhere: ``Connection.begin()``."""
        if not self._hold():
            yield None
            return
        try:
            conn = self._connection()
            dbapi = self._dbapi
            if self._sqlite:
                try:
                    dbapi.execute("BEGIN")
                except sqlite3.Error as exc:  # as SQLAlchemy's begin (_setup_sqlite) raises it
                    raise SAOperationalError("BEGIN", None, exc) from exc
            else:
                conn.begin()
            try:
                yield conn
            finally:
                try:
                    if conn.in_transaction():
                        conn.rollback()  # SQLAlchemy's: ends the driver's transaction too
                    elif self._sqlite and dbapi.in_transaction:
                        dbapi.execute("ROLLBACK")
                except Exception:
                    self._discard()
                if conn.closed or conn.invalidated:  # SQLAlchemy dropped it: so do fetch/write
                    self._conn = self._dbapi = self._wal = None
        finally:
            self._lock.release()

    def _hold(self) -> bool:
        """Take the kept connection's lock if it is free (False: closed, or another thread or
        an outer block holds it; the caller then uses a pooled connection)."""
        if os.getpid() != self._pid:
            self._forget_inherited()
        return not self.closed and self._lock.acquire(blocking=False)

    def _driver(self) -> Any:
        """The kept driver connection, opened on first use (the caller holds the lock)."""
        self._connection()
        return self._dbapi

    def _raise_driver_error(self, exc: BaseException, error: type[CacheDBError], what: str) -> None:
        """Raise ``exc`` as ``error`` when it is the driver's (or SQLAlchemy's wrapper of it)."""
        if isinstance(exc, (DBAPIError, self._engine.dialect.loaded_dbapi.Error)):
            raise error(f"{what} failed: {type(exc).__name__}: {exc}") from exc

    def fetch(self, stmt: ClauseElement, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """All rows of the prebuilt Core ``SELECT`` ``stmt`` with ``params``, read in autocommit.

        Raises:
            HotReadError: the driver failed (the connection is then discarded; the next call
                opens a new one).
        """
        return self._read(stmt, params, versioned=False)[1]

    def version(self) -> tuple[int, int] | None:
        """A token that changes whenever a connection other than this one commits to the
        SQLite database (another process, or a pooled connection of this one): ``(number of
        the kept connection, PRAGMA data_version)``. Commits made through :meth:`write` do not
        change it: their caller knows what it wrote. ``None`` off SQLite, or when another
        thread holds the connection (the caller then cannot tell, and reads the database).

        While the database's wal-index header holds the bytes it held at the last PRAGMA, the
        token is that PRAGMA's, read with one ``pread`` instead of a statement (~0.6 against
        ~3.3 µs; :mod:`cachedb.store.wal_index`). Any commit, this connection's own included,
        moves the header; the PRAGMA then runs once more. That read takes no lock: should
        another thread reopen the connection meanwhile, the descriptor either still reads the
        same live header (no commit since: the token's rows are still the database's) or
        reads other bytes, and the PRAGMA runs.

        Raises:
            HotReadError: the driver failed (the connection is then discarded).
        """
        wal = self._wal  # read without the lock: see below
        if wal is not None:
            try:
                if os.pread(wal[0], wal_index.HEADER_BYTES, 0) == wal[1]:
                    return wal[2]
            except OSError:
                pass
        return self._read(None, None, versioned=True)[0] if self._sqlite else None

    def _token(self, dbapi: Any) -> tuple[int, int]:
        """``(connection number, PRAGMA data_version)``, and the wal-index header read just
        before that PRAGMA kept for :meth:`version` (the caller holds the lock). Looks up the
        ``-shm`` descriptor once per connection (:func:`cachedb.store.wal_index.find_for`)."""
        wal = self._wal
        if wal is None and self._wal_sought != self._number:
            self._wal_sought = self._number
            descriptor = wal_index.find_for(dbapi)
            wal = (descriptor, b"", (0, 0)) if descriptor is not None else None
        header = wal_index.read(wal[0]) if wal is not None else None  # before the PRAGMA
        token = (self._number, dbapi.execute("PRAGMA data_version").fetchone()[0])
        if wal is not None:  # a header being written (copies differ) matches nothing
            self._wal = (wal[0], header if header is not None else b"", token)
        return token

    def fetch_versioned(
        self, stmt: ClauseElement, params: Mapping[str, Any]
    ) -> tuple[tuple[int, int] | None, list[tuple[Any, ...]]]:
        """:meth:`version` and :meth:`fetch` of ``stmt`` under one hold of the connection: the
        rows hold every commit the token counts (and maybe later ones: a copy built from them
        is then only reloaded once more). The token is ``None`` where :meth:`version` is.

        Raises:
            HotReadError: the driver failed (the connection is then discarded).
        """
        return self._read(stmt, params, versioned=self._sqlite)

    def _read(
        self, stmt: ClauseElement | None, params: Mapping[str, Any] | None, *, versioned: bool
    ) -> tuple[tuple[int, int] | None, list[tuple[Any, ...]]]:
        """``(token, rows)``: the SQLite ``(connection number, PRAGMA data_version)`` when
        ``versioned``, then the rows of ``stmt`` (none without one), on the kept connection;
        on a pooled one (no token) when another thread holds it."""
        if not self._hold():
            if stmt is None:
                return None, []
            with self._engine.connect() as pooled:
                return None, [tuple(r) for r in pooled.execute(stmt, dict(params or {}))]
        try:
            compiled = self._compile(stmt) if stmt is not None else None
            try:
                dbapi = self._dbapi if self._dbapi is not None else self._driver()
                token = self._token(dbapi) if versioned else None
                if compiled is None:
                    return token, []
                if self._sqlite:  # autocommit: the statement is its own read transaction
                    return token, dbapi.execute(compiled.sql, compiled.params(params)).fetchall()
                cursor = dbapi.cursor()
                try:
                    cursor.execute(compiled.sql, compiled.params(params))
                    rows: list[tuple[Any, ...]] = cursor.fetchall()
                finally:
                    cursor.close()
                dbapi.rollback()  # psycopg opened a transaction: end it
                return token, rows
            except Exception as exc:
                self._discard()
                self._raise_driver_error(exc, HotReadError, "read")
                raise
        finally:
            self._lock.release()

    @property
    def reads_in_place(self) -> bool:
        """:meth:`read_blob` can be used: SQLite, through a driver with incremental blob I/O
        (``sqlite3.Connection.blobopen``, Python 3.11 on)."""
        return self._sqlite and _BLOB_IO

    def read_blob(
        self, table: str, column: str, rowid: int, check: ClauseElement, params: Mapping[str, Any],
        consume: Callable[[Any, tuple[Any, ...]], T],
    ) -> tuple[bool, T | None]:
        """Where :attr:`reads_in_place`: ``consume(blob, row)`` over the value in ``column`` of
        row ``rowid`` of ``table``, read in place through SQLite's incremental blob I/O
        (``sqlite3.Connection.blobopen``: ``blob`` is a ``sqlite3.Blob``, read from the
        database pages as ``consume`` asks; the value is never copied whole into memory).
        The prebuilt Core ``SELECT`` ``check`` with ``params`` runs in the blob's read
        transaction, and ``row`` is the row it finds (a tuple; the same snapshot as the blob):
        ``(True, result)`` then, ``(False, None)`` when it finds none or the row is gone
        (deleted since the caller read ``rowid``, which may now name another row). On the kept
        connection, or a pooled one when another thread holds it.

        Raises:
            HotReadError: the driver failed (the kept connection is then discarded).
            Whatever ``consume`` raises (the blob is closed first).
        """
        held = self._hold()
        try:
            compiled = self._compile(check)
            try:
                with ExitStack() as stack:
                    if held:
                        dbapi = self._dbapi if self._dbapi is not None else self._driver()
                    else:
                        dbapi = stack.enter_context(self._engine.connect()).connection.driver_connection
                    try:
                        blob = stack.enter_context(dbapi.blobopen(table, column, rowid, readonly=True))
                    except sqlite3.OperationalError as exc:
                        if "no such rowid" not in str(exc):
                            raise
                        return False, None
                    # the open blob holds its read transaction: the check sees the same snapshot
                    row = dbapi.execute(compiled.sql, compiled.params(params)).fetchone()
                    if row is None:
                        return False, None
                    return True, consume(blob, tuple(row))
            except sqlite3.Error as exc:
                if held:
                    self._discard()
                self._raise_driver_error(exc, HotReadError, "read")
                raise
        finally:
            if held:
                self._lock.release()

    def write(self, stmt: ClauseElement, params: Mapping[str, Any]) -> int:
        """Run the prebuilt Core statement ``stmt`` (an INSERT/UPDATE/upsert) with ``params`` in
        its own write transaction and commit it. Returns the rows it changed (the driver's
        rowcount: 0 for an upsert whose ``WHERE`` kept the stored row).

        On SQLite: ``BEGIN IMMEDIATE`` queued with short sleeps for up to the busy timeout
        (:func:`begin_immediate`), the statement, ``COMMIT``. Elsewhere: the statement and
        ``COMMIT``. When another thread holds the kept connection, a pooled one is used.

        Raises:
            HotWriteError: the driver failed or the lock was not had within the busy timeout;
                the transaction was rolled back (nothing of it is stored).
        """
        if not self._hold():
            with self._engine.connect().execution_options(**{WRITE_OPTION: True}) as pooled:
                try:
                    with pooled.begin():
                        return int(pooled.execute(stmt, dict(params)).rowcount)
                except DBAPIError as exc:
                    self._raise_driver_error(exc, HotWriteError, "write")
                    raise
        try:
            compiled = self._compile(stmt)
            try:
                dbapi = self._driver()
            except Exception as exc:
                self._discard()
                self._raise_driver_error(exc, HotWriteError, "write")
                raise
            try:
                if self._sqlite:
                    begin_immediate(dbapi, self._busy_timeout_s)
                    count = dbapi.execute(compiled.sql, compiled.params(params)).rowcount
                    dbapi.execute("COMMIT")
                    if self.checkpointer is not None:
                        self.checkpointer.after_write(_bound_bytes(params))
                    return int(count)
                cursor = dbapi.cursor()
                try:
                    cursor.execute(compiled.sql, compiled.params(params))
                    count = cursor.rowcount
                finally:
                    cursor.close()
                dbapi.commit()
                return int(count)
            except BaseException as exc:  # KeyboardInterrupt too: never leave the write lock held
                try:
                    if not self._sqlite:
                        dbapi.rollback()
                    elif dbapi.in_transaction:
                        dbapi.execute("ROLLBACK")
                except Exception:
                    self._discard()
                self._raise_driver_error(exc, HotWriteError, "write")
                raise
        finally:
            self._lock.release()

    def close(self) -> None:
        """Close the kept connection (this process's; an inherited one is left alone)."""
        with self._lock:
            self.closed = True
            self._wal = None
            if os.getpid() == self._pid and self._conn is not None:
                try:
                    if self._autocheckpoint is not None and not self._conn.invalidated:
                        # back to the pool as other connections are: with SQLite's checkpoint
                        try:
                            self._dbapi.execute(f"PRAGMA wal_autocheckpoint = {int(self._autocheckpoint)}")
                        except sqlite3.Error:
                            self._conn.invalidate()  # not back to the pool without it
                    self._conn.close()
                finally:
                    self._conn = None
                    self._dbapi = None
            if self.checkpointer is not None:
                self.checkpointer.close()
