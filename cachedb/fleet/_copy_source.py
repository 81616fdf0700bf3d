"""Reading a source: opened read-only, checked (integrity, signatures), one snapshot for the
run, rows filled in as the head revision has them, and a reader thread to read ahead."""

from __future__ import annotations

import hashlib
import os
import queue
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    LargeBinary,
    String,
    create_engine,
    event,
    func,
    inspect,
    select,
)
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from ..store import migrate
from ..store.bulk import parse_timestamp
from ..store.engine import SQLITE_HEADER, create_cachedb_engine, sqlite_path, to_url
from .._errors import CacheDBError, CopyError, DatabaseOpenError
from ..store.signing import Signer
from ..db import CacheDB
from ..store.tables import DYNAMO_TABLES
from ._copy_errors import DamagedSourceError, UnsignedInputError
from ._copy_tables import TABLES, _BOOLEANS, _DATETIMES, _T


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
        as its migration would (see :mod:`cachedb.fleet.copy`)."""
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
