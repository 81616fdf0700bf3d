"""The :class:`CacheDB` facade: opens the database, migrates it, owns the transactions."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, inspect
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError, DatabaseError, OperationalError

from .store import migrate
from .store.engine import (
    WRITE_OPTION,
    KeptConnection,
    create_cachedb_engine,
    default_location,
    sqlite_path,
    to_url,
)
from ._errors import DatabaseOpenError, NotADatabaseError
from .store.signing import Signer
from .repositories import (
    AutotuneTimingRepository,
    BestConfigRepository,
    CompileClaimRepository,
    CompileWaitRepository,
    KeyFactorRepository,
    MissLogRepository,
    ChoiceRepository,
    CutlassOpListRepository,
    DynamoRepository,
    FingerprintRepository,
    GuardedEntryRepository,
    KernelArtifactRepository,
    LocalCacheValueRepository,
)

if TYPE_CHECKING:
    from sqlalchemy import Connection
    from sqlalchemy.orm import Session


def _session_class() -> type[Session]:
    """The ORM :class:`~sqlalchemy.orm.Session` class of :attr:`Repos.session`, made on first
    use: the hot paths (:meth:`CacheDB.lookup`, :meth:`CacheDB.write`) run Core statements, so
    a compiling process never loads ``sqlalchemy.orm`` (:mod:`cachedb.store.tables`).

    Its :meth:`~sqlalchemy.orm.Session.begin_nested` emits the ``SAVEPOINT`` at once, where
    SQLAlchemy's waits for the Session's next statement: the repositories run their prebuilt
    statements on the Session's connection (:mod:`cachedb.store.prebuilt`), and those must fall
    inside the savepoint the caller asked for."""
    global _SESSION_CLASS
    if _SESSION_CLASS is None:
        from sqlalchemy.orm import Session, SessionTransaction

        class _RepoSession(Session):
            def begin_nested(self) -> SessionTransaction:
                transaction = super().begin_nested()
                self.connection()  # the SAVEPOINT, now
                return transaction

        _SESSION_CLASS = _RepoSession
    return _SESSION_CLASS


_SESSION_CLASS: type[Session] | None = None


class Repos:
    """The repositories of one transaction, all on its one connection.

    :meth:`CacheDB.lookup` and :meth:`CacheDB.write` give Repos over a Core ``Connection``.
    :meth:`CacheDB.read` and :meth:`CacheDB.transaction` give the same, plus an ORM ``Session``
    on that connection and inside its transaction, made the first time :attr:`session` is
    asked for (building one costs ~60 µs, more than a point read): the repositories run on the
    ``Connection`` until then, and on the ``Session`` after, so that what the caller added to
    it is flushed before their statements (autoflush), as before."""

    __slots__ = ("bind", "signer", "_orm", "_session")

    def __init__(self, bind: Session | Connection, signer: Signer | None = None, *, orm: bool = False) -> None:
        #: What the repositories run on: the block's Connection, or its Session once made.
        self.bind: Session | Connection = bind
        self.signer = signer
        self._orm = orm
        self._session: Session | None = None

    @property
    def session(self) -> Session | Connection:
        """The ORM ``Session`` of a :meth:`CacheDB.read` / :meth:`CacheDB.transaction` block
        (made on first use, bound to the block's connection, joined to its transaction; closed
        with the block, flushed before a transaction commits), else the block's
        ``Connection``."""
        if not self._orm:
            return self.bind
        if self._session is None:
            session = _session_class()(bind=self.bind, expire_on_commit=False, autoflush=True)
            self._session = session
            self.bind = session
        return self._session

    def savepoint(self) -> AbstractContextManager[object]:
        """A ``SAVEPOINT`` for the ``with`` block: released when it ends, rolled back (and the
        exception passed on) when it raises, so one refused write leaves the rest of the
        transaction as it was. On the ORM ``Session`` once one was made (what was added to it
        is flushed first, as ``Session.begin_nested`` does), else on the block's
        ``Connection``: an import or a Mega-Cache load writes through the repositories alone
        and never loads ``sqlalchemy.orm`` (~0.09 s of a ``cachedb import`` process)."""
        return self.bind.begin_nested()

    def _finish(self, *, flush: bool) -> None:
        """Flush (on commit) and close the ORM ``Session``, if one was made."""
        session = self._session
        if session is not None:
            try:
                if flush:
                    session.flush()
            finally:
                session.close()

    @property
    def fingerprints(self) -> FingerprintRepository:
        return FingerprintRepository(self.bind)

    @property
    def guarded(self) -> GuardedEntryRepository:
        return GuardedEntryRepository(self.bind, self.signer)

    @property
    def timings(self) -> AutotuneTimingRepository:
        return AutotuneTimingRepository(self.bind)

    @property
    def choices(self) -> ChoiceRepository:
        """What torch said of each autotune choice hash (:mod:`cachedb.repositories.choices`)."""
        return ChoiceRepository(self.bind)

    @property
    def local_values(self) -> LocalCacheValueRepository:
        return LocalCacheValueRepository(self.bind)

    @property
    def best_configs(self) -> BestConfigRepository:
        return BestConfigRepository(self.bind, self.signer)

    @property
    def compile_claims(self) -> CompileClaimRepository:
        """Leases on entries being compiled (a shared database's, :mod:`cachedb.live._singleflight`)."""
        return CompileClaimRepository(self.bind)

    @property
    def compile_waits(self) -> CompileWaitRepository:
        """The compiles this database's processes did not run, having waited for another's."""
        return CompileWaitRepository(self.bind)

    @property
    def key_factors(self) -> KeyFactorRepository:
        """What torch hashed into each entry's key, factor by factor (``entry_factors``)."""
        return KeyFactorRepository(self.bind)

    @property
    def misses(self) -> MissLogRepository:
        """The newest lookups that missed (``cache_misses``)."""
        return MissLogRepository(self.bind)

    @property
    def cutlass(self) -> CutlassOpListRepository:
        return CutlassOpListRepository(self.bind)

    @property
    def artifacts(self) -> KernelArtifactRepository:
        return KernelArtifactRepository(self.bind)

    @property
    def pgo(self) -> DynamoRepository:
        """Dynamo's PGO profiles (:mod:`cachedb.repositories.dynamo`)."""
        return DynamoRepository(self.bind, "pgo", self.signer)

    def dynamo(self, kind: str) -> DynamoRepository:
        """The repository of one of Dynamo's caches by its Mega-Cache type (``pgo``, ...)."""
        return DynamoRepository(self.bind, kind, self.signer)


class CacheDB:
    """One cachedb database: an SQLite file (default) or any SQLAlchemy URL.

    ``CacheDB(location)`` opens ``location`` (a file path or a URL such as
    ``postgresql+psycopg://127.0.0.1/test``; ``None`` = :func:`default_location`), creates it
    if absent, and upgrades its schema to the code's head revision under a file lock.
    ``signer`` (default: from ``$CACHEDB_HMAC_KEY``, see :mod:`cachedb.store.signing`) signs what
    is written and refuses to serve what does not verify. ``network_timeout_s`` bounds, in
    seconds, connecting to a server database and each statement there (see
    :func:`~cachedb.store.engine.create_cachedb_engine`; ``statement_timeout=False`` leaves the
    statements' bound out, for a pooler that refuses it). ``upgrade_lock_timeout_s`` bounds, in
    seconds, the wait for another process's schema upgrade (the live path passes its lookup
    timeout: a compiling process never waits minutes for a migration).

    Raises:
        NotADatabaseError: the path holds a file that is not SQLite (left untouched).
        SchemaTooNewError: the database has a revision newer than this code knows.
        DatabaseOpenError: the database cannot be opened or read.
        MigrationError: the upgrade failed (rolled back) or its lock timed out.
    """

    def __init__(
        self,
        location: str | os.PathLike[str] | URL | None = None,
        *,
        upgrade: bool = True,
        busy_timeout_s: float = 30.0,
        signer: Signer | None = None,
        network_timeout_s: float | None = None,
        statement_timeout: bool = True,
        upgrade_lock_timeout_s: float = migrate.DEFAULT_UPGRADE_LOCK_TIMEOUT_S,
    ) -> None:
        self.signer = signer if signer is not None else Signer.from_environment()
        #: The revision :meth:`check_schema` read when opened with ``upgrade=False``.
        self.stamped_revision: str | None = None
        raw = location if location is not None else default_location()
        try:
            self.url = to_url(raw)
            self.path: Path | None = sqlite_path(self.url)
            self.where = str(self.path) if self.path is not None else self.url.render_as_string(hide_password=True)
            if upgrade and self.path is not None:  # a new file: a copy of one at the head revision
                migrate.create_at_head(self.path, lock_timeout_s=upgrade_lock_timeout_s)
            self.engine: Engine = create_cachedb_engine(
                self.url, busy_timeout_s=busy_timeout_s, network_timeout_s=network_timeout_s,
                statement_timeout=statement_timeout,
            )
        except DatabaseOpenError:
            raise
        except (ArgumentError, ValueError, ImportError) as exc:
            raise DatabaseOpenError(f"{raw}: not a usable database location or URL: {exc}") from exc
        try:
            if upgrade:
                migrate.upgrade(self.engine, where=self.where, lock_timeout_s=upgrade_lock_timeout_s)
            else:
                self.check_schema()
        except (OperationalError, DatabaseError, UnicodeDecodeError) as exc:
            self.engine.dispose()
            if self.path is not None and "file is not a database" in str(exc):
                raise NotADatabaseError(self.path, "SQLite refused it: file is not a database") from exc
            raise DatabaseOpenError(f"{self.where}: cannot open: {getattr(exc, 'orig', None) or exc!r}") from exc
        except BaseException:
            self.engine.dispose()
            raise
        #: The connection kept for hot-path reads (:meth:`lookup`, the live backend's reads).
        self.kept = KeptConnection(self.engine, busy_timeout_s=busy_timeout_s)

    # -- schema ---------------------------------------------------------------------------

    def revision(self) -> str | None:
        """The schema revision stamped in the database (``None``: empty database)."""
        with self.engine.connect() as conn:
            return migrate.current_revision(conn)

    def check_schema(self) -> None:
        """Raise :class:`~cachedb.SchemaTooNewError` if the database is ahead of the code.
        Sets :attr:`stamped_revision` (the revision read, ``None`` for an empty database)."""
        with self.engine.connect() as conn:
            self.stamped_revision = migrate._stamped_revision(conn)
            if self.stamped_revision == migrate.HEAD_REVISION:
                return  # the common case, without importing Alembic
        migrate._check_known(self.where, self.revision())

    def upgrade(self) -> bool:
        """Apply pending migrations (under the file lock). Returns True if any ran."""
        return migrate.upgrade(self.engine, where=self.where)

    def table_names(self) -> list[str]:
        return sorted(inspect(self.engine).get_table_names())

    # -- transactions ---------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[Repos]:
        """A write transaction: commits on success, rolls back on any exception.

        On SQLite it starts with ``BEGIN IMMEDIATE``: writers queue for up to the busy
        timeout rather than failing later on a lock upgrade. The repositories run Core
        statements on the transaction's connection; ``repos.session`` is an ORM ``Session``
        on it (made on first use, flushed before the commit).
        """
        with self.engine.connect().execution_options(**{WRITE_OPTION: True}) as conn:
            with conn.begin():
                repos = Repos(conn, self.signer, orm=True)
                try:
                    yield repos
                except BaseException:
                    repos._finish(flush=False)
                    raise
                repos._finish(flush=True)

    @contextmanager
    def write(self) -> Iterator[Repos]:
        """A write transaction for hot paths: like :meth:`transaction` (``BEGIN IMMEDIATE`` on
        SQLite, commit on success, rollback on any exception) but the repositories run their
        Core statements on a plain :class:`~sqlalchemy.Connection`, with no ORM ``Session``
        (and without importing ``sqlalchemy.orm``): the live store's writes.
        ``BEGIN IMMEDIATE`` comes first thing in the block: compute before entering it."""
        with self.engine.connect().execution_options(**{WRITE_OPTION: True}) as conn:
            with conn.begin():
                yield Repos(conn, self.signer)

    @contextmanager
    def read(self) -> Iterator[Repos]:
        """A read-only transaction: one consistent snapshot; always rolled back.

        On the connection kept for this process when it is free (no pool checkout, and on
        SQLite a ``BEGIN`` / ``ROLLBACK`` of the driver's: :meth:`KeptConnection.snapshot
        <cachedb.store.engine.KeptConnection.snapshot>`), else (another thread's, a nested block's)
        on a pooled one. The repositories run their prebuilt Core statements on it
        (:mod:`cachedb.store.prebuilt`); ``repos.session`` is an ORM ``Session`` on it, made on
        first use."""
        with self.kept.snapshot() as kept:
            if kept is not None:
                repos = Repos(kept, self.signer, orm=True)
                try:
                    yield repos
                finally:
                    repos._finish(flush=False)
                return
        with self.engine.connect() as conn:
            with conn.begin() as txn:
                repos = Repos(conn, self.signer, orm=True)
                try:
                    yield repos
                finally:
                    repos._finish(flush=False)
                txn.rollback()

    @contextmanager
    def lookup(self) -> Iterator[Repos]:
        """A read-only snapshot for hot paths: the repositories run their prebuilt Core
        statements on a plain :class:`~sqlalchemy.Connection` (no ORM ``Session``).

        The connection is the one kept for this process (:meth:`KeptConnection.snapshot
        <cachedb.store.engine.KeptConnection.snapshot>`: no pool checkout), with ``BEGIN`` ...
        ``ROLLBACK`` around the block so that the snapshot ends with it; a nested block or
        another thread's gets a pooled connection.
        """
        with self.kept.snapshot() as kept:
            if kept is not None:
                yield Repos(kept, self.signer)
                return
        with self.engine.connect() as conn:
            with conn.begin() as txn:
                yield Repos(conn, self.signer)
                txn.rollback()

    def close(self) -> None:
        self.kept.close()
        self.engine.dispose()

    def __enter__(self) -> CacheDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CacheDB({self.where!r})"
