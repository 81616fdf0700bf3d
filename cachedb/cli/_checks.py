"""The database a ``cachedb`` command is given: refused without creating anything where no
cachedb database is, and errors from below cachedb's own checks said in one line."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from .._errors import DatabaseOpenError, NotADatabaseError
from ..db import CacheDB
from ..store.engine import SQLITE_HEADER
from ._types import DEFAULT_TIMEOUT_S


class NoDatabaseError(DatabaseOpenError):
    """A read command was pointed at a database that does not exist (nothing is created)."""


def _require_head(db: CacheDB) -> None:
    """Refuse (changing nothing) a database whose schema this cachedb would upgrade first."""
    from ..store.migrate import HEAD_REVISION

    revision = db.revision()
    if revision != HEAD_REVISION:
        raise DatabaseOpenError(
            f"{db.where}: schema revision {revision}, not this cachedb's {HEAD_REVISION}: the command would "
            f"upgrade it first (`cachedb --db {db.where} upgrade --dry-run` shows how); nothing was changed")


def _require_database_file(path: Path, timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """Refuse, without creating or changing anything, a path where no cachedb database is."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise NoDatabaseError(f"no database at {path}") from None
    except OSError as exc:
        raise DatabaseOpenError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if path.is_dir():
        raise DatabaseOpenError(f"{path}: is a directory, not a database file")
    if not path.is_file():
        raise DatabaseOpenError(f"{path}: not a regular file (a device, FIFO or socket), not a database file")
    if st.st_size == 0:
        raise NoDatabaseError(f"no database at {path} (the file is empty)")
    try:
        with path.open("rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise DatabaseOpenError(f"{path}: cannot read: {exc.strerror or exc}{_owner_note(path)}") from exc
    if head != SQLITE_HEADER:
        raise NotADatabaseError(path, "file header is not 'SQLite format 3'")
    # Another program's SQLite file: looked at read-only, so that not even its journal mode
    # changes (cachedb's engine would switch it to WAL).
    con = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=timeout)
    try:
        found = con.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'").fetchone()
    finally:
        con.close()
    if found is None:
        raise NoDatabaseError(f"no cachedb database at {path}: it has no cachedb schema "
                              f"(`cachedb --db {path} init` creates one)")


def _owner_note(path: Path | None) -> str:
    """`` (owned by uid N, not by this user ...)`` when ``path`` belongs to someone else."""
    if path is None or not hasattr(os, "getuid"):
        return ""
    try:
        st = path.stat()
    except OSError:
        return ""
    if st.st_uid != os.getuid():
        return f" (the file is owned by uid {st.st_uid}, not by this user, uid {os.getuid()})"
    if not os.access(path, os.W_OK):
        return " (this user may not write it)"
    return ""


def describe_error(exc: BaseException, where: str | None, timeout: float | None = None) -> str:
    """One line naming the database (``where``) and what is wrong, for an error SQLite, the
    driver or the file system raised below cachedb's own checks."""
    where = where or "the database"
    orig = getattr(exc, "orig", None) or exc
    message = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    low = message.lower()
    path = Path(where) if "://" not in where else None
    if "database is locked" in low or "database table is locked" in low:
        waited = f" longer than the {timeout:g} s timeout (--timeout SECONDS)" if timeout is not None else ""
        return f"{where}: database is locked: another process held it{waited}"
    if "malformed" in low or "disk image" in low or "could not decode" in low or "corrupt" in low:
        return (f"{where}: the database is damaged ({message}); `cachedb verify` lists the damage, "
                f"`cachedb recover` salvages the readable rows")
    if "file is not a database" in low:
        return f"{where}: not an SQLite database ({message})"
    if "readonly" in low or "read-only" in low or "unable to open" in low or isinstance(orig, PermissionError):
        return f"{where}: cannot open or write the database ({message}){_owner_note(path)}"
    if isinstance(orig, OSError) and getattr(orig, "filename", None):
        return f"{orig.filename}: {orig.strerror or message}"
    return f"{where}: {type(orig).__name__}: {message}"
