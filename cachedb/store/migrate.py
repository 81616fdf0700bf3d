"""Packaged Alembic migrations, run programmatically under a file lock.

The migration scripts live in the repository's top-level ``migrations/`` directory and ship in
the wheel as the package ``cachedb.migrations``; an editable install maps the same package to
the same directory. There is exactly one head.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import shutil
import sqlite3
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from typing import TYPE_CHECKING

from filelock import FileLock, Timeout
from sqlalchemy import Connection, Engine, inspect, text

if TYPE_CHECKING:
    from alembic.config import Config

from .engine import WRITE_OPTION, is_sqlite, sqlite_path
from .._errors import MigrationError, SchemaTooNewError

log = logging.getLogger(__name__)

#: The head revision of the packaged migrations, known without importing Alembic (~0.25 s):
#: opening a database that is already at head reads ``alembic_version`` and nothing else.
#: tests/test_migrations.py checks it equals Alembic's own head.
HEAD_REVISION = "0014"

#: Seconds a process waits for another one's schema upgrade before giving up.
DEFAULT_UPGRADE_LOCK_TIMEOUT_S = 300.0

#: Alembic's ``context``/``op`` proxies are module-global: one migration at a time per process
#: (two threads opening two new databases would otherwise run each other's scripts).
_ALEMBIC_LOCK = threading.Lock()


def migrations_dir() -> Path:
    """The directory holding ``env.py`` and ``versions/``.

    In a source checkout (``pyproject.toml`` and ``migrations/`` beside the imported ``cachedb``
    package), its own ``migrations/``, so that a checkout put first on ``sys.path`` runs its
    migrations and not those of another checkout installed in editable mode; else the package
    ``cachedb.migrations`` (wheel and editable installs). Raises
    :class:`~cachedb.MigrationError` when neither is there.
    """
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "migrations" / "env.py").is_file():
        return root / "migrations"
    spec = importlib.util.find_spec("cachedb.migrations")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            if (Path(location) / "env.py").is_file():
                return Path(location)
    if (root / "migrations" / "env.py").is_file():
        return root / "migrations"
    raise MigrationError("cachedb's migrations are not installed (no cachedb.migrations package)")


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic :class:`Config` for the packaged migrations, bound to ``connection``."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    """The single head revision of the packaged migrations (read by Alembic)."""
    from alembic.script import ScriptDirectory

    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    if len(heads) != 1:
        raise MigrationError(f"cachedb's migrations must have one head, found {heads}")
    return heads[0]


def current_revision(connection: Connection) -> str | None:
    """The revision stamped in the database (``None`` for an empty database)."""
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(connection).get_current_revision()


def _stamped_revision(connection: Connection) -> str | None:
    """``alembic_version.version_num`` read with plain SQL (``None``: no table or no row, or
    several rows: Alembic decides then). Whether the table exists is asked with one catalog
    query (PostgreSQL ``to_regclass``, which follows ``search_path``; SQLite
    ``sqlite_master``), not SQLAlchemy's inspector, whose reflection costs a process opening a
    remote tier several milliseconds."""
    dialect = connection.dialect.name
    if dialect == "postgresql":
        exists = connection.execute(text("SELECT to_regclass('alembic_version') IS NOT NULL")).scalar()
    elif dialect == "sqlite":
        exists = connection.execute(
            text("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'")).first() is not None
    else:
        exists = inspect(connection).has_table("alembic_version")
    if not exists:
        return None
    rows = connection.execute(text("SELECT version_num FROM alembic_version")).all()
    return rows[0][0] if len(rows) == 1 else None


def _check_known(where: str, revision: str | None) -> None:
    if revision is None or revision == HEAD_REVISION:
        return
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config())
    try:
        known = script.get_revision(revision)
    except Exception:  # alembic raises several types for unknown ids
        known = None
    if known is None:
        raise SchemaTooNewError(where, revision, head_revision())


@dataclass(frozen=True)
class UpgradePlan:
    """The migrations an upgrade runs (:func:`plan_upgrade`): ``steps`` are ``(revision,
    description)``, oldest first; none when the database is at ``head``."""

    where: str
    current: str | None
    head: str
    steps: tuple[tuple[str, str], ...]


def plan_upgrade(engine: Engine, *, where: str) -> UpgradePlan:
    """What :func:`upgrade` would run on ``engine``'s database, changing nothing. Raises
    :class:`SchemaTooNewError` for a revision the code does not know."""
    with engine.connect() as conn:
        rev = current_revision(conn)
        conn.rollback()
    _check_known(where, rev)
    from alembic.script import ScriptDirectory

    head = head_revision()
    if rev == head:
        return UpgradePlan(where, rev, head, ())
    script = ScriptDirectory.from_config(alembic_config())
    steps = [(r.revision, ((r.doc or "").strip().splitlines() or [""])[0])
             for r in script.iterate_revisions(head, rev or "base")]
    return UpgradePlan(where, rev, head, tuple(reversed(steps)))


def upgrade(engine: Engine, *, where: str, lock_timeout_s: float = DEFAULT_UPGRADE_LOCK_TIMEOUT_S) -> bool:
    """Bring the database to the head revision. Returns True if an upgrade ran.

    Checks first without locking; if work is needed, takes ``<db>.lock`` (SQLite) with
    filelock, checks again and upgrades in one transaction, so that of many processes opening
    an old database at once exactly one upgrades and the others wait. On PostgreSQL the lock
    is a transaction-scoped advisory lock.

    Raises :class:`SchemaTooNewError` for a revision the code does not know and
    :class:`MigrationError` when the upgrade fails (the transaction is rolled back) or the
    lock is not obtained within ``lock_timeout_s`` seconds.
    """
    with engine.connect() as conn:
        if _stamped_revision(conn) == HEAD_REVISION:
            conn.rollback()
            return False  # the common case, without importing Alembic
        conn.rollback()
    plan = plan_upgrade(engine, where=where)
    if not plan.steps:
        return False
    head = plan.head

    path = sqlite_path(engine.url)
    lock = FileLock(str(path) + ".lock", timeout=lock_timeout_s, mode=0o600) if path is not None else None
    try:
        if lock is not None:
            lock.acquire()
    except Timeout as exc:
        raise MigrationError(
            f"{where}: another process held the upgrade lock {lock.lock_file} "
            f"for more than {lock_timeout_s:.0f} s"
        ) from exc
    try:
        with engine.connect().execution_options(**{WRITE_OPTION: True}) as conn:
            with conn.begin():
                if conn.dialect.name == "postgresql":
                    conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7262230111)")
                rev = current_revision(conn)
                _check_known(where, rev)
                if rev == head:
                    return False
                log.info("cachedb: upgrading %s from %s to %s", where, rev, head)
                from alembic import command

                try:
                    with _ALEMBIC_LOCK:
                        command.upgrade(alembic_config(conn), "head")
                except Exception as exc:
                    raise MigrationError(f"{where}: upgrade from {rev} to {head} failed: {exc}") from exc
        return True
    finally:
        if lock is not None:
            lock.release()


#: This process's database at the head revision, made by the migrations once
#: (:func:`create_at_head`): ``(directory, file)``.
_TEMPLATE: tuple[str, Path] | None = None
_TEMPLATE_LOCK = threading.Lock()


def _template() -> Path:
    """An SQLite file at the head revision, made by running every migration once per process
    into a private temporary directory (removed at exit)."""
    global _TEMPLATE
    with _TEMPLATE_LOCK:
        if _TEMPLATE is None or not _TEMPLATE[1].is_file():
            from .engine import create_cachedb_engine, to_url

            directory = tempfile.mkdtemp(prefix="cachedb-template-")
            path = Path(directory) / "head.db"
            engine = create_cachedb_engine(to_url(str(path)))
            try:
                upgrade(engine, where=str(path))
                with engine.connect() as conn:
                    conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                engine.dispose()
            atexit.register(shutil.rmtree, directory, True)
            _TEMPLATE = (directory, path)
        return _TEMPLATE[1]


def create_at_head(path: Path, *, lock_timeout_s: float = DEFAULT_UPGRADE_LOCK_TIMEOUT_S) -> bool:
    """Make the new SQLite database ``path`` (absent or empty) a copy of this process's
    database at the head revision (:func:`_template`: the migrations, run once per process):
    what :func:`upgrade` makes of an empty database, in a few milliseconds instead of a
    hundred (every revision's steps). Under ``<db>.lock``, as :func:`upgrade`, so of several
    processes creating it at once one copies and the others find it made. Returns True if it
    copied; False (nothing done) for a database that exists and is not empty, or one another
    process has open.

    Raises :class:`MigrationError` when the lock is not obtained within ``lock_timeout_s``
    seconds, and what :func:`~cachedb.store.engine.check_sqlite_file` raises for a path that
    is not a new database.
    """
    from .engine import check_sqlite_file

    if path.exists() and path.stat().st_size > 0:
        return False
    check_sqlite_file(path)  # the directory (0700) and the empty file (0600)
    try:
        lock = FileLock(str(path) + ".lock", timeout=lock_timeout_s, mode=0o600)
        lock.acquire()
    except Timeout as exc:
        raise MigrationError(f"{path}: another process held the upgrade lock {path}.lock "
                             f"for more than {lock_timeout_s:.0f} s") from exc
    try:
        wal = Path(str(path) + "-wal")
        if path.stat().st_size > 0 or (wal.exists() and wal.stat().st_size > 0):
            return False
        try:
            source = sqlite3.connect(_template())
            try:
                target = sqlite3.connect(path)
                try:
                    source.backup(target)
                finally:
                    target.close()
            finally:
                source.close()
            os.chmod(path, 0o600)
        except (sqlite3.Error, OSError) as exc:
            from .._errors import DatabaseOpenError

            raise DatabaseOpenError(f"{path}: cannot create the database: {exc}") from exc
        return True
    finally:
        lock.release()


def downgrade(engine: Engine, revision: str) -> None:
    """Downgrade to ``revision`` (``"base"`` drops everything). For tests and rollbacks. Raises
    :class:`MigrationError` when a step refuses or fails (the transaction is rolled back:
    nothing stored changes)."""
    from alembic import command

    with engine.connect().execution_options(**{WRITE_OPTION: True}) as conn:
        try:
            with conn.begin(), _ALEMBIC_LOCK:
                command.downgrade(alembic_config(conn), revision)
        except Exception as exc:
            raise MigrationError(f"{engine.url.render_as_string()}: downgrade to {revision} failed: {exc}") from exc


__all__ = [
    "UpgradePlan",
    "alembic_config",
    "create_at_head",
    "current_revision",
    "downgrade",
    "head_revision",
    "is_sqlite",
    "migrations_dir",
    "plan_upgrade",
    "upgrade",
]
