"""Where the database lives and how its engine is set up.

This is the only module with SQLite-specific SQL (pragmas, ``BEGIN IMMEDIATE``): everything
above it speaks portable SQLAlchemy and runs on PostgreSQL too.
"""

from __future__ import annotations

import os
import sys
import weakref
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.pool import StaticPool

from ._errors import DatabaseOpenError, NotADatabaseError

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
    try:
        with path.open("rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise DatabaseOpenError(f"{path}: cannot read: {exc}") from exc
    if head and head != SQLITE_HEADER[: len(head)]:
        raise NotADatabaseError(path, "file header is not 'SQLite format 3'")
    if 0 < len(head) < len(SQLITE_HEADER):
        raise NotADatabaseError(path, f"file is only {len(head)} bytes long")


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
        mode = cur.execute("PRAGMA journal_mode = WAL").fetchone()
        if mode and str(mode[0]).lower() not in ("wal", "memory"):
            cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        write = conn.get_execution_options().get(WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def create_cachedb_engine(url: URL, *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> Engine:
    """An engine for ``url`` set up for cachedb (see :func:`_setup_sqlite` for SQLite).

    Raises :class:`~cachedb.NotADatabaseError` for an SQLite path that holds something else.
    """
    path = sqlite_path(url)
    if path is not None:
        check_sqlite_file(path)
    kwargs: dict[str, Any] = {}
    if url.get_backend_name() == "sqlite":
        kwargs["connect_args"] = {"timeout": busy_timeout_s, "check_same_thread": False}
        if path is None:  # in-memory: one connection, or every session sees an empty database
            kwargs["poolclass"] = StaticPool
    else:
        kwargs["pool_pre_ping"] = True
    engine = create_engine(url, **kwargs)
    if url.get_backend_name() == "sqlite":
        _setup_sqlite(engine, busy_timeout_s)
    _dispose_in_forked_children(engine)
    return engine


def _dispose_in_forked_children(engine: Engine) -> None:
    """A forked child (a compile worker) must not reuse its parent's pooled connections."""
    ref = weakref.ref(engine)

    def _after_fork() -> None:
        child_engine = ref()
        if child_engine is not None:
            child_engine.dispose(close=False)

    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork)


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
