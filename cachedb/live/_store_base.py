"""The shared part of the live store: the database of one process, opened lazily, and the
failure handling every read and write goes through (:class:`StoreBase`)."""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from ..fleet import tier_sync as sync
from ..store.trust import untrusted_reason
from ..db import CacheDB, Repos
from ..fingerprint import current as current_fingerprint
from ..keys.factors import Factor
from ..store.filesystems import network_filesystem
from ..store import prebuilt
from ..repositories import best_configs as best_configs_repo
from ..repositories import guarded as guarded_repo
from ._best_configs import BestConfigCopy
from ..fleet import trust as _trust
from . import _singleflight
from ._remote import RemoteTier
from ._writer import WriteBehind, enabled_by_environment

log = logging.getLogger("cachedb.live")
T = TypeVar("T")

#: Seconds a live lookup or write waits on a locked database before it counts as a miss.
DEFAULT_LIVE_TIMEOUT_S = 10.0
#: Seconds a store that found its database locked past its timeout is left alone (torch's own
#: files serve meanwhile) before it is tried again: the remote tier's ``RETRY_AFTER_S``.
LOCKED_RETRY_S = 30.0


class _Unavailable(Exception):
    """The database could not be opened, or is left alone for a while; already warned about."""


def _is_locked(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) is SQLite's "database is locked" / "busy", or a
    migration lock that was not obtained in time."""
    from .._errors import MigrationError

    seen = 0
    while exc is not None and seen < 5:
        text = str(exc)
        if isinstance(exc, MigrationError) and "held the upgrade lock" in text:
            return True
        if "database is locked" in text or "database table is locked" in text or "database is busy" in text:
            return True
        exc = getattr(exc, "orig", None) or exc.__cause__  # type: ignore[assignment]
        seen += 1
    return False




class StoreBase:
    """What every part of :class:`~cachedb.live._store.LiveStore` shares: the database (opened
    lazily), the remote tier, the write-behind queue, the one-warning failure handling
    (:meth:`safely`) and this process's fingerprint. The parts of each kind
    (:mod:`._store_guarded`, :mod:`._store_tuning`, :mod:`._store_best_configs`,
    :mod:`._store_dynamo`) subclass it; :class:`~cachedb.live._store.LiveStore` joins them."""

    def __init__(
        self, location: str, *, timeout_s: float = DEFAULT_LIVE_TIMEOUT_S, trust: bool = False,
        remote: RemoteTier | None = None, write_behind: bool | None = None,
    ) -> None:
        self.location = location
        self.remote = remote
        if write_behind is None:
            write_behind = enabled_by_environment()
        #: the queue of FX graph / AOTAutograd puts (``None``: every put is written at once)
        self.writer: WriteBehind | None = WriteBehind() if write_behind else None
        self.timeout_s = timeout_s
        self.trust = trust
        self.pickles_refused: str | None = None
        self._hits: dict[tuple[str, str, str], tuple[int, dt.datetime]] = {}
        self._atexit_registered = False
        self._db: CacheDB | None = None
        self._lock = threading.RLock()
        self._fingerprint: tuple[int, int, str] | None = None  # (pid, id, system hash)
        self._warned: set[str] = set()
        self.closed = False
        self._open_failed = False
        #: ``time.monotonic()`` before which this store does not serve (torch's files do):
        #: 0 while it serves, ``math.inf`` once it failed to open (:meth:`serving`)
        self.down_until = 0.0
        self._warned_locked = False
        #: every best config, while no other connection commits (:mod:`._best_configs`)
        self.best_configs = BestConfigCopy()
        #: the checksum this process last stored per (kind, key) of Dynamo's caches
        self._dynamo_written: dict[tuple[str, str], str] = {}
        #: the compile claims of its local file (:attr:`flights`)
        self._flights: _singleflight.Flights | None = None
        self._flights_checked = False
        #: its kernel-artifact side (``cachedb.live._artifacts.for_store`` makes it)
        self.kernel_artifacts: Any = None
        #: its choice descriptions written or read (``cachedb.live._choices`` makes it)
        self.choice_log: Any = None
        #: per thread: the choice descriptions of the ``PersistentCache.lookup`` running on it
        #: (:meth:`hold_choices`), written with the timings it records
        self._held_choices = threading.local()
        #: the factors of FX graph keys that missed, until their entry is put (:meth:`note_fx_miss`)
        self._factors: dict[tuple[str, str], list[Factor]] = {}
        #: per thread: the AOTAutograd key computed last and its factors (:meth:`note_aot_key`)
        self._aot_key = threading.local()

    # -- plumbing ---------------------------------------------------------------------------

    def serving(self) -> bool:
        """Whether this store serves now: not after its database failed to open (for the rest
        of the process), nor for :data:`LOCKED_RETRY_S` seconds after it stayed locked past
        the timeout. While it does not, :func:`cachedb.live._scopes.route` answers ``None``
        and torch's own files serve."""
        until = self.down_until
        if not until:
            return True
        if until != math.inf and time.monotonic() >= until:
            self.down_until = 0.0
            return True
        return False

    @property
    def db(self) -> CacheDB:
        """The database, opened on first use. If opening fails, that is warned about once
        and the store stays unavailable for the rest of the process (torch's files serve).

        A database on a network file system (NFS, SMB, FUSE, ...:
        :func:`cachedb.store.filesystems.network_filesystem`) is not opened: SQLite's
        write-ahead log is unsafe there. A database behind the code's schema revision is
        upgraded only if the upgrade lock is had within the timeout (else it is left to
        ``cachedb upgrade``)."""
        with self._lock:
            if self._db is None:
                if self._open_failed:
                    raise _Unavailable()
                try:
                    self._check_filesystem()
                    self._db = CacheDB(self.location, busy_timeout_s=self.timeout_s,
                                       upgrade_lock_timeout_s=self.timeout_s)
                except _Unavailable:
                    raise
                except Exception as exc:
                    if not _is_locked(exc):  # else: tried again once the lock is left alone
                        self._open_failed = True
                        self.down_until = math.inf
                    self.warn_once("opening the database", exc)
                    raise _Unavailable() from exc
                self._sweep(self._db)
                _compile_ahead(self._db)
                reason = None if self.trust or self._db.path is None else untrusted_reason(self._db.path)
                if reason is not None:
                    self.pickles_refused = reason
                    log.warning(
                        "cachedb: not loading pickled FX graph/AOTAutograd entries, PGO profiles or Dynamo "
                        "packages from %s: %s (set CACHEDB_TRUST=1 or install(trust=True) to trust it)",
                        self.location, reason,
                    )
            return self._db

    def _check_filesystem(self) -> None:
        """Refuse (one warning; :class:`_Unavailable`) an SQLite file on a network file system."""
        if "://" in self.location and not self.location.startswith("sqlite"):
            return
        path = self.location.split("///", 1)[1] if self.location.startswith("sqlite") else self.location
        if not path or path == ":memory:":
            return
        found = network_filesystem(path)
        if found is None:
            return
        self._open_failed = True
        self.down_until = math.inf
        log.warning("cachedb: %s is on a network file system, %s, where SQLite's write-ahead log is unsafe; "
                    "it is not opened and torch's own files serve Inductor (point CACHEDB_PATH at a local "
                    "disk, or a shared tier at PostgreSQL)", self.location, found)
        raise _Unavailable()

    def _sweep(self, db: CacheDB) -> None:
        """Delete the rows that crossed in from another database under a trust this process
        no longer has (a key removed from ``CACHEDB_TRUSTED_KEYS``, remote trust off): they
        are misses, then replaced (:func:`cachedb.fleet.trust.sweep`). One indexed query when
        nothing is stale. Never raises (one warning)."""
        try:
            policy = self.remote.trust if self.remote is not None else _trust.TrustPolicy.from_environment()
            with db.lookup() as repos:
                stale = _trust.stale_origins(repos.session, policy)  # type: ignore[arg-type]
            if stale:
                with db.write() as repos:
                    deleted = _trust.sweep(repos.session, policy, stale)  # type: ignore[arg-type]
                log.warning("cachedb: %s: %d row(s) from another database no longer trusted (%s) were "
                            "removed; they are looked up again", self.location, deleted, ", ".join(stale))
        except Exception as exc:
            self.warn_once("checking where rows came from", exc)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Write every queued FX graph / AOTAutograd put now (:mod:`cachedb.live._writer`);
        False if ``timeout_s`` seconds (default: the writer's flush timeout, 60) passed first.
        Other processes see a put once it is written."""
        return self.writer.flush(timeout_s) if self.writer is not None else True

    def close(self, timeout_s: float | None = None) -> None:
        """Write what is queued (the FX graph / AOTAutograd puts, the hit counts, the remote
        tier's copies: at most ``timeout_s`` seconds in all, default each queue's own bound),
        then close the database."""
        deadline = time.monotonic() + timeout_s if timeout_s is not None else None

        def left() -> float | None:
            return max(0.0, deadline - time.monotonic()) if deadline is not None else None

        if self.writer is not None:
            self.writer.close(left())  # queued puts first (bounded wait)
        self.flush_hits()
        if self.remote is not None:
            self.remote.close(left())  # sends what is queued first (bounded wait)
        with self._lock:
            self.closed = True
            if self._db is not None:
                self._db.close()
                self._db = None
            self.best_configs.clear()

    def warn_once(self, what: str, exc: BaseException) -> None:
        """One warning per kind of failure (``what``) and process. A database found locked past
        the timeout is left alone for :data:`LOCKED_RETRY_S` seconds (torch's files serve
        meanwhile), said once per process."""
        if _is_locked(exc):
            self.down_until = time.monotonic() + LOCKED_RETRY_S
            if not self._warned_locked:
                self._warned_locked = True
                reason = " ".join(str(exc).split())[:300]
                log.warning(
                    "cachedb: %s stayed locked past CACHEDB_TIMEOUT (%g s) while %s (%s: %s); torch's own "
                    "files serve Inductor for %g s, then cachedb tries again (not logged again)",
                    self.location, self.timeout_s, what, type(exc).__name__, reason, LOCKED_RETRY_S,
                )
            else:
                log.debug("cachedb: %s locked while %s: %s", self.location, what, exc)
            return
        if what not in self._warned:
            self._warned.add(what)
            log.warning(
                "cachedb: %s failed (%s: %s); Inductor carries on as on a cache miss "
                "(further %s failures in this process are not logged)",
                what, type(exc).__name__, exc, what,
            )

    def safely(self, what: str, default: T, fn: Callable[[], T]) -> T:
        """``fn()``, or ``default`` when it fails (one warning per kind of failure,
        :meth:`warn_once`) or while the store does not serve (:meth:`serving`)."""
        if self.down_until and not self.serving():
            return default
        try:
            return fn()
        except _Unavailable:
            return default
        except Exception as exc:  # the cache must never break a compile
            self.warn_once(what, exc)
            return default

    def pull(self, entry: sync.Entry) -> bool:
        """After a local miss: copy ``entry`` from the remote tier into the local database.
        True if the remote holds it and its rows are in the local database now, whichever
        process brought them (the caller reads the local database again)."""
        remote = self.remote
        if remote is None:
            return False
        return self.safely("remote lookup", False, lambda: remote.pull(entry, self.db))

    def push(self, *entries: sync.Entry) -> None:
        """After a local write: queue ``entries`` for the remote tier (never blocks)."""
        remote = self.remote
        if remote is None:
            return
        for entry in entries:
            self.safely("remote write", None, lambda: remote.push(entry, self.db))

    def _known_fingerprint_id(self) -> int | None:
        """This process's fingerprint id if already recorded (no database access)."""
        fp = self._fingerprint
        return fp[1] if fp is not None and fp[0] == os.getpid() else None

    def _fingerprint_id(self, repos: Repos) -> int:
        """This process's fingerprint, recorded once per process."""
        pid = os.getpid()
        if self._fingerprint is None or self._fingerprint[0] != pid:
            fp = current_fingerprint()
            self._fingerprint = (pid, repos.fingerprints.ensure(fp), fp.system_hash)
        return self._fingerprint[1]


def _compile_ahead(db: CacheDB) -> None:
    """Compile the lookups' prebuilt statements for ``db``'s dialect
    (:func:`cachedb.store.prebuilt.compiled_for`: 1-3 ms of CPU each, once per process) and
    open the pool's connection for writes (its set-up pragmas, and its schema read: SQLite
    parses it on a connection's first statement; ~2 ms) on a daemon thread as the database
    opens (``install()`` opens it), off the first lookup's path: the
    FX graph / AOTAutograd reads, a best config's, and the write of an entry a remote lookup
    brought (:data:`cachedb.fleet.tier_sync.PREBUILT`). A lookup that comes first compiles or
    opens what it needs itself."""
    dialect = db.engine.dialect
    if dialect.server_version_info is None:  # not connected yet: its statements' key is not known
        return
    statements = (guarded_repo.FIRST_VARIANT, guarded_repo.LATER_VARIANTS, guarded_repo.VARIANTS,
                  best_configs_repo.GET_BY_KEY, *sync.PREBUILT, _trust.DELETE_ORIGIN)

    def compile_all() -> None:
        try:
            for stmt in statements:
                prebuilt.compiled_for(stmt, dialect)
            if db.path is not None:  # SQLite reads its schema on a connection's first statement
                with db.engine.connect() as conn:  # back to the pool, open, its schema read
                    conn.exec_driver_sql("SELECT 1 FROM guarded_entries LIMIT 0")
        except Exception as exc:  # noqa: BLE001 - the lookup compiles it again and reports
            log.debug("cachedb: statements not compiled ahead: %s", exc)

    thread = threading.Thread(target=compile_all, name="cachedb-statements", daemon=True)
    _AHEAD.add(thread)
    thread.start()


#: The :func:`_compile_ahead` threads started: a fork waits for them (:func:`_before_fork`).
_AHEAD: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


def _before_fork() -> None:
    """Let a running :func:`_compile_ahead` thread end before ``os.fork`` (a few ms): forked
    while it held the pool's or the statement cache's lock, the child would wait for a lock
    no thread of its own releases (a DataLoader worker's first lookup hanging)."""
    for thread in list(_AHEAD):
        if thread.is_alive():
            thread.join(5.0)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork)
