"""The remote tier: a shared database (PostgreSQL) behind each machine's local SQLite file.

``install(path, remote=URL)`` (or ``CACHEDB_REMOTE_URL``, or ``cachedb --remote URL run``)
puts a :class:`RemoteTier` behind the :class:`~cachedb.live._store.LiveStore`:

- **Reads**: a lookup tries the local file first; on a local miss the same entry is read from
  the remote in one query (:func:`cachedb.fleet.tier_sync.fetch`), written into the local file, and
  served from there (through the local read path, with its checksum and signature checks).
  A local hit costs no round trip. An entry the remote lacked is not asked for again by this
  process.
- **Writes**: go to the local file as without a remote, then the entry is queued for a
  background thread that copies it to the remote, many entries per remote transaction
  (bounded queue: :data:`DEFAULT_MAX_PENDING` entries; flushed at exit for at most
  ``flush_timeout_s`` seconds). In a :mod:`multiprocessing` child (Inductor's compile
  workers, which their pool terminates without running exit handlers) each write is sent
  before the call returns instead. Kernel blobs the remote already has are not sent again.
- **Connections**: taken for a burst of lookups or writes and closed ``idle_s`` seconds after
  the last one (:class:`~cachedb.fleet.connections.IdleCloser`, ``$CACHEDB_REMOTE_IDLE``,
  default 1 s): the server's connections follow the lookups in flight, not the processes
  alive. At most one per thread that uses the tier (a compiling thread, the writer).
- **Key factors**: an FX graph / AOTAutograd entry carries the factors of its key both ways
  (:mod:`cachedb.fleet.tier_sync`). A push sends them with the entry, the remote's ids of the
  factors this process sent or saw looked up only for the others. A pull reads the remote's
  factor ids in the lookup's one query; those this process has seen resolve at once, the
  others are looked up by the writer thread afterwards (one query per 500 ids), off the
  lookup's path, and stored in the local file.
- **Coalescing**: the processes sharing one local file (the ranks of a machine, compile
  workers) ask the remote for an entry once between them: the first asks, the others wait for
  it and read what it brought into the local file; an entry one of them sent is not sent again
  by the others (:mod:`cachedb.live._coalesce`).
- **Faults**: a full server (``too many clients``), a restart (``connection refused``, ``the
  database system is starting up``), a connection dropped mid-statement and PgBouncer's
  refusals are waited out with jittered backoff (:func:`cachedb.fleet.connections.transient`)
  for up to ``timeout_s`` seconds from the lookup's start. A remote still unreachable then,
  slower than ``timeout_s`` (connect and statement timeouts), that refuses a write, or has
  another schema revision makes the tier step aside: one warning, then local only (reads
  retried after :data:`RETRY_AFTER_S` seconds; a schema mismatch for the rest of the
  process). A compile never fails because of it and a lookup never waits longer than the
  timeout. An empty remote database is created at the
  code's revision (under PostgreSQL's advisory lock); an older one is not upgraded behind its
  other users' backs (:class:`~cachedb.SchemaTooOldError`: ``cachedb --db URL upgrade``).

Rows are merged by natural key as in ``cachedb merge`` (:mod:`cachedb.fleet.tier_sync`), so two
machines writing the same entry, or a pull racing a push, never duplicate or lose a row.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import event
from sqlalchemy.exc import IntegrityError

from ..store import migrate
from ..fleet import tier_read
from ..fleet import tier_sync as sync
from ..fleet import trust as _trust
from ..fleet.connections import IdleCloser, backoff, idle_seconds_from_environment, options_refused, transient
from .._errors import SchemaTooNewError, SchemaTooOldError
from ..db import CacheDB
from ..keys.factors import Factor
from . import _coalesce

log = logging.getLogger("cachedb.live")
T = TypeVar("T")

#: Environment variables: the remote's SQLAlchemy URL, and its timeout in seconds.
ENV_REMOTE_URL = "CACHEDB_REMOTE_URL"
ENV_REMOTE_TIMEOUT = "CACHEDB_REMOTE_TIMEOUT"
#: Seconds a remote lookup may take, waits for a full or restarting server included, before
#: the remote counts as down (also each connect's and statement's bound).
DEFAULT_REMOTE_TIMEOUT_S = 2.0
#: Seconds the tier stays local-only after a remote failure before trying again.
RETRY_AFTER_S = 30.0
#: Entries that may wait for the background writer; more are dropped (one warning).
DEFAULT_MAX_PENDING = 4096
#: Entries per remote write transaction.
PUSH_BATCH = 64
#: Tries of one remote write whose insert meets a row another host inserted meanwhile.
WRITE_CONFLICT_TRIES = 4
#: Remote ``key_factors`` rows a process remembers (by id, and by ``(factor, hash)``); past it
#: the memory starts afresh.
FACTOR_MEMORY = 200_000

_STOP = object()


@dataclass(frozen=True)
class _FactorLookup:
    """A queued lookup of the factors of an entry pulled into ``local`` whose ``key_factors``
    ids (``bundle.factor_ids``, the remote's) this process had not all seen: looked up on the
    remote by the writer thread, off the lookup's path, then stored in ``local``."""

    bundle: sync.Bundle
    local: CacheDB


@dataclass(frozen=True)
class _Release:
    """A queued release of a compile lease: run after the pushes queued before it (the entry a
    waiter on another machine then finds)."""

    kind: str
    key: str


class RemoteLease:
    """This process's lease on an entry it compiles, on the remote (``compile_claims``): renewed
    by :meth:`beat`, given up by :meth:`release` once the entry is sent."""

    def __init__(self, tier: RemoteTier, kind: str, key: str) -> None:
        self.tier, self.kind, self.key = tier, kind, key

    def beat(self) -> None:
        self.tier._beat_lease(self.kind, self.key)

    def release(self) -> None:
        self.tier._queue_release(self.kind, self.key)


class _Down(Exception):
    """The remote is down or in its retry pause (already warned about)."""


def _in_worker() -> bool:
    """True in a :mod:`multiprocessing` child process. Inductor's compile workers are ones
    (a ``ProcessPoolExecutor`` of its compile sidecar), and the sidecar terminates them when it
    shuts down: neither ``atexit`` nor multiprocessing's finalizers run, so a background queue
    there would lose what it had not sent yet."""
    return multiprocessing.parent_process() is not None


def _parts(entry: sync.Entry) -> tuple[object, ...]:
    return (entry.kind, *entry.values)


class RemoteTier:
    """The remote database of one process's live store (opened on first use).

    ``url``: a SQLAlchemy URL (``postgresql+psycopg://host/db``, or PgBouncer's in transaction
    pooling mode) or an SQLite path. ``timeout_s`` (seconds) bounds each lookup (its waits for
    a full or restarting server included), each connect and each statement;
    ``flush_timeout_s`` (seconds) bounds the wait for queued writes at :meth:`close`;
    ``idle_s`` (seconds, default ``$CACHEDB_REMOTE_IDLE`` or 1) is how long a connection
    stays open after its last statement. ``counts`` (a :class:`Counter`) says what happened:
    ``pull`` (remote lookups this process ran), ``pull_hit``, ``pulled_rows``, ``coalesced``
    (lookups another process sharing the local file answered), ``push`` (entries sent),
    ``pushed_rows``, ``push_coalesced`` (entries another process had sent as they are here),
    ``lookup_statements`` (statements the lookups ran on the remote: its round trips),
    ``connections`` (opened to the remote), ``retries`` (transient refusals waited out),
    ``coalesce_timeouts`` (lookups that waited for another process's ask until the timeout),
    ``dropped`` (queue full), ``failures``, ``refused_rows`` (rows the trust policy did not
    take), ``signed_rows`` (rows this writer signed before sending).

    ``trust`` (default: from the environment, :meth:`~cachedb.fleet.trust.TrustPolicy.from_environment`)
    decides what crosses in (:mod:`cachedb.fleet.trust`): rows whose Ed25519 signature a
    trusted key verifies, or, with ``accept_unsigned`` (``CACHEDB_REMOTE_TRUST=1``), any; with
    neither, the remote is not read at all (one warning) and only written. Rows taken are
    recorded in the local file's ``row_origins``. A ``signing_key`` signs what is sent.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = DEFAULT_REMOTE_TIMEOUT_S,
        flush_timeout_s: float = 10.0,
        max_pending: int = DEFAULT_MAX_PENDING,
        idle_s: float | None = None,
        trust: _trust.TrustPolicy | None = None,
    ) -> None:
        self.url = url
        self._trust = trust
        self.timeout_s = timeout_s
        self.flush_timeout_s = flush_timeout_s
        self.max_pending = max_pending
        self.idle_s = idle_seconds_from_environment() if idle_s is None else idle_s
        self.counts: Counter[str] = Counter()
        self._db: CacheDB | None = None
        self._closer: IdleCloser | None = None
        #: False once the server refused the startup ``options`` (a pooler: PgBouncer)
        self._statement_timeout = True
        self._lock = threading.RLock()
        self._tls = threading.local()
        self._read_down_until = 0.0
        self._write_down_until = 0.0
        self._warned: set[str] = set()
        self._asked: set[sync.Entry] = set()
        #: the remote's ``key_factors`` rows seen by this process: by id (a pull's factor ids
        #: resolve without a query) and by ``(factor, hash)`` (a push looks up only the others)
        self._factor_by_id: dict[int, Factor] = {}
        self._factor_ids: dict[tuple[str, str], int] = {}
        self._coalescers: dict[str, _coalesce.Coalescer | None] = {}  # by local database
        self._pid = os.getpid()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_pending)
        self._thread: threading.Thread | None = None
        self.closed = False
        #: this process's name on the remote's compile leases (host, pid, a random part)
        self.holder = _holder_name()
        #: lookups on the driver while the engine is not open (:mod:`cachedb.fleet.tier_read`)
        self._reader = tier_read.DriverReader(url, timeout_s=timeout_s) if tier_read.serves(url) else None
        self._reader_closer: IdleCloser | None = None
        _prepare_driver(url, self._reader)

    @property
    def where(self) -> str:
        return self._db.where if self._db is not None else _redacted(self.url)

    @property
    def trust(self) -> _trust.TrustPolicy:
        """The trust policy (read from the environment on first use; a key that does not
        load is warned about once and trusts nothing)."""
        if self._trust is None:
            try:
                self._trust = _trust.TrustPolicy.from_environment()
            except Exception as exc:
                self._trust = _trust.TrustPolicy()
                self._warn_once("trust configuration", exc, seconds=None)
        return self._trust

    # -- plumbing -----------------------------------------------------------------------------

    def _warn_once(self, what: str, exc: BaseException, *, seconds: float | None) -> None:
        """One warning per kind of failure per process. ``seconds``: how long the remote is
        skipped now (``inf``: for the rest of the process; ``None``: it is not)."""
        self.counts["failures"] += 1
        if what in self._warned:
            log.debug("cachedb: remote %s failed again: %s", what, exc)
            return
        self._warned.add(what)
        if seconds is None:
            then = "the entries it could not take stay in the local cache only"
        elif math.isinf(seconds):
            then = "using the local cache only for the rest of this process"
        else:
            then = f"using the local cache only for {seconds:.0f} s"
        log.warning(
            "cachedb: remote cache %s: %s failed (%s: %s); %s (further remote %s failures are not logged)",
            self.where, what, type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc).strip() else "",
            then, what,
        )

    def _warn_untrusted(self) -> None:
        if "trust" in self._warned:
            return
        self._warned.add("trust")
        log.warning(
            "cachedb: remote cache %s: its entries are not used, because nothing says whose to trust "
            "(they carry code this machine would run). Set CACHEDB_TRUSTED_KEYS to the writers' public "
            "keys, or accept the risk with CACHEDB_REMOTE_TRUST=1 (install(remote_trust=True)); "
            "this machine's own entries are still used and sent", self.where)

    def _warn_refused(self, screened: _trust.Screened) -> None:
        if "refused" in self._warned:
            log.debug("cachedb: remote rows refused again: %d (first: %s)", screened.refused, screened.first_refused)
            return
        self._warned.add("refused")
        log.warning(
            "cachedb: remote cache %s: %d row(s) not taken: no signature a trusted key verifies "
            "(first: %s); further refusals are not logged", self.where, screened.refused, screened.first_refused)

    def _after_fork(self) -> None:
        """In a forked child: a new queue and writer (the parent's thread is not here)."""
        if os.getpid() != self._pid:
            self._pid = os.getpid()
            self._queue = queue.Queue(maxsize=self.max_pending)
            self._thread = None
            self._lock = threading.RLock()
            self.holder = _holder_name()
            if self._reader is not None:  # the parent's connection is not this process's
                self._reader = tier_read.DriverReader(self.url, timeout_s=self.timeout_s,
                                                      statement_timeout=self._statement_timeout)
                self._reader_closer = None

    def _coalescer(self, local: CacheDB) -> _coalesce.Coalescer | None:
        """The sidecar shared with the other processes of ``local``'s file (None: none)."""
        key = local.where
        if key not in self._coalescers:
            self._coalescers[key] = _coalesce.for_database(local.path)
        return self._coalescers[key]

    def _connect(self) -> CacheDB:
        """Open the remote and check its schema (an empty one is created at the code's
        revision); raises what opening raised. The driver reader's connection is closed
        first, and its lookups go through the engine from then on: one connection at a time."""
        self._retire_reader()
        db = CacheDB(self.url, upgrade=False, busy_timeout_s=self.timeout_s, network_timeout_s=self.timeout_s,
                     statement_timeout=self._statement_timeout)
        closer = IdleCloser(db.engine, self.idle_s)
        try:
            with closer.lease():
                revision = db.stamped_revision  # read as it opened
                if revision is None:  # empty: create the schema (one host, under the advisory lock)
                    db.upgrade()
                elif revision != migrate.HEAD_REVISION:
                    raise SchemaTooOldError(db.where, revision, migrate.HEAD_REVISION)
        except BaseException:
            closer.stop()
            db.close()
            raise
        event.listen(db.engine, "before_cursor_execute", self._count_statement)
        event.listen(db.engine, "connect", self._count_connection)
        self.counts["connections"] += 1  # the one opening it made
        self._closer = closer
        return db

    def _open(self, deadline: float, *, for_write: bool = False) -> CacheDB:
        """The remote database, opened on first use, waiting out transient refusals until
        ``deadline`` (``time.monotonic()`` seconds). Raises :class:`_Down` while it is down
        or in its retry pause (warned about once)."""
        now = time.monotonic()
        if now < (self._write_down_until if for_write else self._read_down_until):
            raise _Down()
        with self._lock:
            if self._db is not None:
                return self._db
            delays = backoff(deadline)
            while True:
                try:
                    self._db = self._connect()
                    return self._db
                except (SchemaTooNewError, SchemaTooOldError) as exc:
                    self._read_down_until = self._write_down_until = math.inf
                    self._warn_once("opening", exc, seconds=math.inf)
                    raise _Down() from exc
                except Exception as exc:
                    if self._statement_timeout and options_refused(exc):
                        # a pooler (PgBouncer) takes no startup options: statements are bounded
                        # by its query_timeout and the server's statement_timeout instead
                        log.debug("cachedb: remote %s refused startup options: opening without them", self.where)
                        self._statement_timeout = False
                        continue
                    if self._waited(exc, delays):
                        continue
                    self._read_down_until = self._write_down_until = time.monotonic() + RETRY_AFTER_S
                    self._warn_once("opening", exc, seconds=RETRY_AFTER_S)
                    raise _Down() from exc

    def _run(self, deadline: float, fn: Callable[[CacheDB], T], *, for_write: bool = False) -> T:
        """``fn(remote)`` inside a connection lease, run again after a transient failure (a
        dropped connection, a restart) until ``deadline``; raises :class:`_Down` or the last
        error."""
        delays = backoff(deadline)
        while True:
            db = self._open(deadline, for_write=for_write)
            closer = self._closer
            assert closer is not None
            try:
                with closer.lease():
                    return fn(db)
            except IntegrityError:
                raise
            except Exception as exc:
                if not self._waited(exc, delays):
                    raise

    def _waited(self, exc: BaseException, delays: Iterator[float]) -> bool:
        """Whether ``exc`` is a refusal that passes (:func:`transient`) and ``delays`` (a
        :func:`backoff`) had time left to wait it out: then it has slept (a retry counted)."""
        delay = next(delays, None) if transient(exc) else None
        if delay is None:
            return False
        self.counts["retries"] += 1
        time.sleep(delay)
        return True

    def _count_connection(self, *args: Any) -> None:
        self.counts["connections"] += 1

    def _count_statement(self, *args: Any) -> None:
        if getattr(self._tls, "lookup", False):
            self.counts["lookup_statements"] += 1

    @contextmanager
    def _reading(self, db: CacheDB) -> Iterator[Any]:
        """An autocommit connection (no BEGIN/ROLLBACK round trips) counted as a lookup's."""
        self._tls.lookup = True
        try:
            with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                yield conn
        finally:
            self._tls.lookup = False

    # -- reads --------------------------------------------------------------------------------

    def asked(self, entry: sync.Entry) -> bool:
        """Whether this process already asked the remote for ``entry`` (or wrote it itself)."""
        return entry in self._asked

    def pull(self, entry: sync.Entry, local: CacheDB) -> bool:
        """Bring ``entry`` from the remote into ``local``. True when the remote holds it and its
        rows are in ``local`` now, whoever brought them (this process, or another sharing the
        file, whose ask answers for this one: :mod:`cachedb.live._coalesce`); False when the
        remote lacks it, is down, or this process asked already. Waits at most ``timeout_s``
        seconds. Never raises for the remote's faults (one warning, then local only for
        :data:`RETRY_AFTER_S`)."""
        self._after_fork()
        if self.closed or entry in self._asked or time.monotonic() < self._read_down_until:
            return False
        if not self.trust.reads:
            self._asked.add(entry)
            self._warn_untrusted()
            return False
        deadline = time.monotonic() + self.timeout_s
        coalescer = self._coalescer(local)
        if coalescer is None:
            return self._ask(entry, local, deadline, None)
        started = time.time()
        with coalescer.hold(_parts(entry), deadline) as slot:
            if slot is None:  # another process of this machine is still asking, past the timeout:
                self.counts["coalesce_timeouts"] += 1
                return True  # the caller reads the local file once more (it may have just landed)
            if slot.asked_at >= started - _coalesce.ASKED_FRESH_S:
                self._asked.add(entry)
                self.counts["coalesced"] += 1
                return slot.found
            return self._ask(entry, local, deadline, slot)

    def _ask(self, entry: sync.Entry, local: CacheDB, deadline: float, slot: _coalesce.Slot | None) -> bool:
        def fetch(db: CacheDB) -> sync.Bundle | None:
            self.counts["pull"] += 1
            with self._reading(db) as conn:
                return sync.fetch(conn, entry)

        def fetch_on_driver(reader: tier_read.DriverReader) -> sync.Bundle:
            found = reader.fetch(entry)
            self.counts["pull"] += 1
            self.counts["lookup_statements"] += 1
            return found

        try:
            bundle = self._on_driver(deadline, fetch_on_driver) if entry.kind in tier_read.KINDS else None
            if bundle is None:
                bundle = self._run(deadline, fetch)
        except _Down:
            return False
        except Exception as exc:
            self._read_down_until = time.monotonic() + RETRY_AFTER_S
            self._warn_once("lookup", exc, seconds=RETRY_AFTER_S)
            return False
        self._asked.add(entry)
        if bundle:
            screened = _trust.screen(bundle, self.trust)
            if screened.refused:
                self.counts["refused_rows"] += screened.refused
                self._warn_refused(screened)
        later = False
        if bundle and bundle.factor_ids:  # the key's factors: from memory, else looked up off this path
            known = self._factor_by_id
            found = [known.get(i) for i in bundle.factor_ids]
            later = any(f is None for f in found)
            if not later:
                bundle.factors = [f for f in found if f is not None]
        if bundle:
            sync.in_form_of(bundle, local.engine.dialect.name)  # before the local write lock
            with local.write() as repos:
                added = sync.store(repos.session, bundle)  # type: ignore[arg-type]
                _trust.record_origins(repos.session, bundle.entry.table, bundle.rows,  # type: ignore[arg-type]
                                      screened.origins)
                _trust.record_origins(repos.session, "autotune_choices", bundle.choices,  # type: ignore[arg-type]
                                      screened.choice_origins)
            self.counts["pull_hit"] += 1
            self.counts["pulled_rows"] += added
            log.debug("cachedb: remote hit %s: %d row(s) into the local cache", entry, added)
            if later:
                self._queue_factor_lookup(_FactorLookup(bundle, local))
        if slot is not None:
            slot.mark_asked(bool(bundle))
        return bool(bundle)

    def _on_driver(self, deadline: float, fn: Callable[[tier_read.DriverReader], T]) -> T | None:
        """``fn(reader)`` on the driver reader (:mod:`cachedb.fleet.tier_read`), waiting out
        transient refusals until ``deadline``; ``None`` where the engine's path is to read
        instead (the engine is open, or the remote's schema is not the code's revision).
        Raises :class:`_Down` (warned about) where connecting failed, else the driver's last
        error."""
        reader = self._reader
        if reader is None or reader.closed or self._db is not None:
            return None
        if self._reader_closer is None:
            self._reader_closer = IdleCloser(reader, self.idle_s)
        closer = self._reader_closer
        delays = backoff(deadline)
        while True:
            before = reader.connections
            try:
                with closer.lease():
                    result = fn(reader)
            except (tier_read.StaleSchema, tier_read.ReaderClosed):
                return None
            except tier_read.OpenFailed as failed:  # as the engine's _open: a refusal that passes
                exc = failed.__cause__ or failed    # is waited out, else reads and writes pause
                if reader.statement_timeout and options_refused(exc):
                    reader.statement_timeout = self._statement_timeout = False
                    continue
                if self._waited(exc, delays):
                    continue
                self._read_down_until = self._write_down_until = time.monotonic() + RETRY_AFTER_S
                self._warn_once("opening", exc, seconds=RETRY_AFTER_S)
                raise _Down() from exc
            except Exception as exc:
                if not self._waited(exc, delays):
                    raise
                continue
            finally:
                self.counts["connections"] += reader.connections - before
            return result

    def _retire_reader(self) -> None:
        """Close the driver reader (waiting for a lookup in flight on it) and its idle closer."""
        reader, closer = self._reader, self._reader_closer
        if closer is not None:
            closer.stop()
        if reader is not None and not reader.closed:
            reader.close()

    # -- writes -------------------------------------------------------------------------------

    def push(self, entry: sync.Entry, local: CacheDB) -> None:
        """Queue ``entry`` (just written to ``local``) for the remote; never blocks, but in a
        :mod:`multiprocessing` child (:func:`_in_worker`), where it is sent at once (waits
        at most the remote's timeout)."""
        self._after_fork()
        if self.closed:
            return
        self._asked.add(entry)  # the local file has it now: no need to ask the remote
        item = (entry, local)
        if _in_worker():
            try:
                self._send([item])
            except _Down:
                pass
            except Exception as exc:  # the local file keeps it
                self._write_down_until = time.monotonic() + RETRY_AFTER_S
                self._warn_once("write", exc, seconds=RETRY_AFTER_S)
            return
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.counts["dropped"] += 1
            self._warn_once("write queue", RuntimeError(f"more than {self.max_pending} entries waiting"),
                            seconds=None)
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._writer, name="cachedb-remote-writer", daemon=True)
                self._thread.start()

    def _writer(self) -> None:
        q = self._queue
        while True:
            first = q.get()
            if first is _STOP:
                q.task_done()
                return
            batch = [first]
            while len(batch) < PUSH_BATCH:
                try:
                    item = q.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    q.put(_STOP)  # seen after this batch
                    q.task_done()
                    break
                batch.append(item)
            releases = [item for item in batch if isinstance(item, _Release)]
            lookups = [item for item in batch if isinstance(item, _FactorLookup)]
            try:
                self._send([item for item in batch if not isinstance(item, (_Release, _FactorLookup))])
            except _Down:
                pass
            except Exception as exc:  # never let the thread die
                self._write_down_until = time.monotonic() + RETRY_AFTER_S
                self._warn_once("write", exc, seconds=RETRY_AFTER_S)
            finally:
                for lookup in lookups:
                    self._look_up_factors(lookup)
                for release in releases:  # after the entries queued before them were sent
                    self._release_lease(release.kind, release.key)
                for _ in batch:
                    q.task_done()

    # -- key factors of pulled entries --------------------------------------------------------

    def _remember_factors(self, by_id: dict[int, Factor]) -> None:
        """Remember remote ``key_factors`` rows (``{id: Factor}``), both ways."""
        if len(self._factor_by_id) + len(by_id) > FACTOR_MEMORY:
            self._factor_by_id, self._factor_ids = {}, {}
        self._factor_by_id.update(by_id)
        self._factor_ids.update(((f.factor, f.hash), i) for i, f in by_id.items())

    def _queue_factor_lookup(self, lookup: _FactorLookup) -> None:
        """Look the factors of a pulled entry up on the writer thread (at once in a
        :mod:`multiprocessing` child); dropped when the queue is full."""
        if _in_worker():
            self._look_up_factors(lookup)
            return
        try:
            self._queue.put_nowait(lookup)
        except queue.Full:
            log.debug("cachedb: remote factors of %s not looked up: the queue is full", lookup.bundle.entry)
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._writer, name="cachedb-remote-writer", daemon=True)
                self._thread.start()

    def _look_up_factors(self, lookup: _FactorLookup) -> None:
        """The factors of a pulled entry: the ids this process has not seen looked up on the
        remote (one query per 500), then stored in the local file where it has none for the
        key. Never raises (one warning; the entry is served without its factors)."""
        bundle = lookup.bundle
        unknown = sorted({i for i in bundle.factor_ids if i not in self._factor_by_id})

        def read(db: CacheDB) -> dict[int, Factor]:
            found: dict[int, Factor] = {}
            with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                sync.resolve_factors(conn, sync.Bundle(bundle.entry, factor_ids=unknown), found)
            return found

        try:
            if unknown:
                deadline = time.monotonic() + self.timeout_s
                found = self._on_driver(deadline, lambda reader: reader.factors(unknown))
                self._remember_factors(found if found is not None else self._run(deadline, read))
            bundle.factors = [self._factor_by_id[i] for i in bundle.factor_ids if i in self._factor_by_id]
            if bundle.factors:
                with lookup.local.write() as repos:
                    sync.store_factors(repos.session, bundle)  # type: ignore[arg-type]
        except _Down:
            pass
        except Exception as exc:  # noqa: BLE001 - the entry is served without its factors
            self._warn_once("factor lookup", exc, seconds=None)

    # -- compile leases (:mod:`cachedb.live._singleflight`) ------------------------------------

    def claim_compile(self, kind: str, key: str) -> tuple[RemoteLease | None, str | None]:
        """Take the remote's lease on ``kind``/``key`` for this process: ``(lease, None)``; or
        ``(None, holder)`` where another process holds a live one (it compiles the entry);
        ``(None, None)`` where the remote cannot be asked (this process compiles, unclaimed).
        Waits at most ``timeout_s`` seconds; never raises."""
        from ._singleflight import HOST, STALE_S

        self._after_fork()
        if self.closed or time.monotonic() < self._write_down_until:
            return None, None

        def claim(db: CacheDB) -> str:
            with db.write() as repos:
                return repos.compile_claims.claim(kind, key, self.holder, HOST, os.getpid(), stale_s=STALE_S)

        try:
            current = self._run(time.monotonic() + self.timeout_s, claim, for_write=True)
        except Exception as exc:  # noqa: BLE001 - a compile without the remote's claim
            log.debug("cachedb: remote compile claim of %s %s: %s", kind, key, exc)
            return None, None
        if current == self.holder:
            return RemoteLease(self, kind, key), None
        return None, current

    def compile_holder(self, kind: str, key: str) -> str | None:
        """The process holding a live lease on ``kind``/``key`` on the remote, or ``None`` (no
        lease, a stale one, or the remote cannot be asked)."""
        from ._singleflight import STALE_S

        def read(db: CacheDB) -> str | None:
            with db.lookup() as repos:
                return repos.compile_claims.holder(kind, key, stale_s=STALE_S)

        try:
            return self._run(time.monotonic() + self.timeout_s, read)
        except Exception as exc:  # noqa: BLE001
            log.debug("cachedb: remote compile holder of %s %s: %s", kind, key, exc)
            return None

    def landed(self, entry: sync.Entry, local: CacheDB) -> bool:
        """Ask the remote for ``entry`` again (a process waiting for another machine's
        compile): True when it is in ``local`` now."""
        self._asked.discard(entry)
        return self._ask(entry, local, time.monotonic() + self.timeout_s, None)

    def _beat_lease(self, kind: str, key: str) -> None:
        def beat(db: CacheDB) -> int:
            with db.write() as repos:
                return repos.compile_claims.beat(self.holder, [(kind, key)])

        try:
            self._run(time.monotonic() + self.timeout_s, beat, for_write=True)
        except Exception as exc:  # noqa: BLE001 - the lease then goes stale, as a dead holder's
            log.debug("cachedb: remote compile lease heartbeat: %s", exc)

    def _queue_release(self, kind: str, key: str) -> None:
        """Release the lease once what is queued before it is sent (now, if nothing is)."""
        with self._lock:
            running = self._thread is not None and self._thread.is_alive()
        if not running or _in_worker():
            self._release_lease(kind, key)
            return
        try:
            self._queue.put_nowait(_Release(kind, key))
        except queue.Full:
            self._release_lease(kind, key)

    def _release_lease(self, kind: str, key: str) -> None:
        def release(db: CacheDB) -> None:
            with db.write() as repos:
                repos.compile_claims.release(self.holder, kind, key)

        try:
            self._run(time.monotonic() + self.timeout_s, release, for_write=True)
        except Exception as exc:  # noqa: BLE001 - left to go stale
            log.debug("cachedb: remote compile lease release: %s", exc)

    def _send(self, batch: list[tuple[sync.Entry, CacheDB]]) -> None:
        if time.monotonic() < self._write_down_until:
            return
        deadline = time.monotonic() + self.timeout_s
        entries: dict[sync.Entry, CacheDB] = dict(batch)  # each entry once, in order
        bundles: list[sync.Bundle] = []
        for entry, local in entries.items():
            with local.lookup() as repos:
                bundle = sync.fetch(repos.session, entry, with_blobs=False)  # type: ignore[arg-type]
                if bundle.factor_ids:
                    sync.resolve_factors(repos.session, bundle)  # type: ignore[arg-type]
            if bundle and self._claim(bundle, local, deadline):
                bundles.append(bundle)
        if not bundles:
            return
        # One order on every host (by table, then filter values), so that two hosts writing
        # overlapping batches take their row locks in the same order; a deadlock that still
        # comes (shared factor or blob rows) rolls back one try, which _run runs again.
        bundles.sort(key=lambda b: (b.entry.kind, tuple(map(str, b.entry.values))))
        key = self.trust.signing_key
        if key is not None:
            for bundle in bundles:
                self.counts["signed_rows"] += _trust.sign_bundle(bundle, key)
        db = self._open(deadline, for_write=True)
        for bundle in bundles:  # the remote's form, before its transaction
            sync.in_form_of(bundle, db.engine.dialect.name)  # a kernel's blobs: below, only those the remote lacks

        staged: list[dict[tuple[str, str], int]] = []  # the remote's factor ids this write knows

        def write(db: CacheDB) -> int:
            added = 0
            ids = dict(self._factor_ids)  # afresh on each try: a rolled-back try's ids are void
            staged[:] = [ids]
            # A writer transaction from its BEGIN (SQLite: BEGIN IMMEDIATE, waiting up to the
            # timeout for the lock): a deferred one that reads first fails at once with
            # "database is locked" when another writer got in between.
            with db.write() as repos:
                conn = repos.session
                for bundle in bundles:
                    if bundle.entry.kind == "kernel":
                        missing = sync.missing_blobs(conn, (r["sha256"] for r in bundle.rows))
                        with entries[bundle.entry].lookup() as local_repos:
                            bundle.blobs = sync.fetch_blobs(local_repos.session, missing)  # type: ignore[arg-type]
                    added += sync.store(conn, bundle, factor_ids=ids)  # type: ignore[arg-type]
            return added

        for attempt in range(1, WRITE_CONFLICT_TRIES + 1):
            try:
                added = self._run(deadline, write, for_write=True)
                break
            except IntegrityError:
                # another host wrote the same entry (or factor) between this try's read and its
                # insert (unique key): again, and the next try sees what is there; two hosts
                # pushing the same batches can meet more than once
                if attempt == WRITE_CONFLICT_TRIES:
                    raise
                self.counts["retries"] += 1
        if staged:  # committed: remember the remote's ids of the factors sent
            ids = staged[0]
            self._remember_factors({ids[(f.factor, f.hash)]: f for bundle in bundles for f in bundle.factors
                                    if (f.factor, f.hash) in ids})
        self.counts["push"] += len(bundles)
        self.counts["pushed_rows"] += added
        log.debug("cachedb: remote write: %d entr(ies), %d row(s)", len(bundles), added)

    def _claim(self, bundle: sync.Bundle, local: CacheDB, deadline: float) -> bool:
        """Whether this process sends ``bundle`` (read from ``local``): not when another
        process sharing the local file claimed the same content (:mod:`cachedb.live._coalesce`);
        claimed now otherwise."""
        coalescer = self._coalescer(local)
        if coalescer is None:
            return True
        content = sync.content_digest(bundle)
        with coalescer.hold(_parts(bundle.entry), deadline) as slot:
            if slot is None:  # held past the deadline by a process still asking: send it
                return True
            if slot.sent == content:
                self.counts["push_coalesced"] += 1
                return False
            slot.mark_sent(content)
        return True

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every queued entry is sent (or dropped on failure); False if
        ``timeout_s`` (default ``flush_timeout_s``) seconds passed first."""
        if self._thread is None or os.getpid() != self._pid:
            return True
        deadline = time.monotonic() + (self.flush_timeout_s if timeout_s is None else timeout_s)
        while self._queue.unfinished_tasks:
            if time.monotonic() >= deadline or not self._thread.is_alive():
                return not self._queue.unfinished_tasks
            time.sleep(0.005)
        return True

    def close(self, timeout_s: float | None = None) -> None:
        """Flush queued writes (at most ``timeout_s`` seconds, default ``flush_timeout_s``),
        stop the writer and close the remote's connections."""
        if self.closed:
            return
        bound = self.flush_timeout_s if timeout_s is None else timeout_s
        if not self.flush(bound):
            log.warning("cachedb: remote cache %s: %d write(s) not sent within %.1f s at exit "
                        "(they stay in the local cache)", self.where, self._queue.unfinished_tasks, bound)
        self.closed = True
        thread = self._thread
        if thread is not None and thread.is_alive() and os.getpid() == self._pid:
            try:
                self._queue.put_nowait(_STOP)
            except queue.Full:
                pass
        with self._lock:
            self._retire_reader()
            if self._closer is not None:
                self._closer.stop()
                self._closer = None
            if self._db is not None:
                self._db.close()
                self._db = None
            self._coalescers.clear()


def _prepare_driver(url: str, reader: tier_read.DriverReader | None) -> None:
    """Import the remote's database driver (psycopg: ~40 ms of CPU) and compile the driver
    reader's lookups (:meth:`~cachedb.fleet.tier_read.DriverReader.prepare`, ~5 ms each) on a
    daemon thread, off the first lookup's path, as torch's ``remote_cache.py`` imports
    ``redis`` when it is imported. Opening the remote (:meth:`RemoteTier._connect`) imports it
    anyway; a URL that cannot be parsed is reported there."""

    def load() -> None:
        try:
            from sqlalchemy.engine import make_url

            make_url(url).get_dialect().import_dbapi()
            if reader is not None:
                reader.prepare()
        except Exception as exc:  # noqa: BLE001 - _connect raises and reports it
            log.debug("cachedb: remote driver for %s not imported ahead: %s", _redacted(url), exc)

    threading.Thread(target=load, name="cachedb-remote-driver", daemon=True).start()


def _holder_name() -> str:
    """This process's name on compile leases: ``host:pid:random``."""
    import uuid

    from ._singleflight import HOST

    return f"{HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _redacted(url: str) -> str:
    if "://" not in url:
        return url
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.split("://", 1)[0] + "://..."


def from_environment() -> RemoteTier | None:
    """A :class:`RemoteTier` for ``$CACHEDB_REMOTE_URL`` (timeout ``$CACHEDB_REMOTE_TIMEOUT``
    seconds), or ``None`` when it is not set."""
    from .. import settings

    url = settings.value_or_default(ENV_REMOTE_URL)
    if not url:
        return None
    return RemoteTier(url, timeout_s=float(settings.value_or_default(ENV_REMOTE_TIMEOUT)))
