"""The target before a run: what DST holds (rows, an unfinished copy's marker), read without
changing it, and the database a dry run writes into and rolls back."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from sqlalchemy import MetaData, Table, func, inspect, select

from ..store import migrate
from ..store.engine import create_cachedb_engine, sqlite_path, to_url
from .._errors import CopyError
from ..db import CacheDB
from ._copy_source import _Source, _readonly_sqlite_engine
from ._copy_tables import MARKER_TABLE, _MARKER


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
