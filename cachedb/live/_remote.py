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
- **Faults**: a remote that cannot be reached, answers slower than ``timeout_s`` (connect and
  statement timeouts), refuses a write, or has another schema revision makes the tier step
  aside: one warning, then local only (reads retried after :data:`RETRY_AFTER_S` seconds;
  a schema mismatch for the rest of the process). A compile never fails because of it and a
  lookup never waits longer than the timeout. An empty remote database is created at the
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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.exc import DBAPIError, IntegrityError

from ..store import migrate
from ..fleet import tier_sync as sync
from .._errors import SchemaTooNewError, SchemaTooOldError
from ..db import CacheDB

log = logging.getLogger("cachedb.live")

#: Environment variables: the remote's SQLAlchemy URL, and its timeout in seconds.
ENV_REMOTE_URL = "CACHEDB_REMOTE_URL"
ENV_REMOTE_TIMEOUT = "CACHEDB_REMOTE_TIMEOUT"
#: Seconds a remote connect or statement may take before the remote counts as down.
DEFAULT_REMOTE_TIMEOUT_S = 2.0
#: Seconds the tier stays local-only after a remote failure before trying again.
RETRY_AFTER_S = 30.0
#: Entries that may wait for the background writer; more are dropped (one warning).
DEFAULT_MAX_PENDING = 4096
#: Entries per remote write transaction.
PUSH_BATCH = 64

_STOP = object()


def _in_worker() -> bool:
    """True in a :mod:`multiprocessing` child process. Inductor's compile workers are ones
    (a ``ProcessPoolExecutor`` of its compile sidecar), and the sidecar terminates them when it
    shuts down: neither ``atexit`` nor multiprocessing's finalizers run, so a background queue
    there would lose what it had not sent yet."""
    return multiprocessing.parent_process() is not None


class RemoteTier:
    """The remote database of one process's live store (opened on first use).

    ``url``: a SQLAlchemy URL (``postgresql+psycopg://host/db``) or an SQLite path.
    ``timeout_s`` (seconds) bounds connecting and each statement; ``flush_timeout_s`` (seconds)
    bounds the wait for queued writes at :meth:`close`. ``counts`` (a :class:`Counter`) says
    what happened: ``pull`` (remote lookups), ``pull_hit``, ``pulled_rows``, ``push`` (entries
    sent), ``pushed_rows``, ``lookup_statements`` (statements the lookups ran on the remote:
    its round trips), ``dropped`` (queue full), ``failures``.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = DEFAULT_REMOTE_TIMEOUT_S,
        flush_timeout_s: float = 10.0,
        max_pending: int = DEFAULT_MAX_PENDING,
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.flush_timeout_s = flush_timeout_s
        self.max_pending = max_pending
        self.counts: Counter[str] = Counter()
        self._db: CacheDB | None = None
        self._lock = threading.RLock()
        self._tls = threading.local()
        self._read_down_until = 0.0
        self._write_down_until = 0.0
        self._warned: set[str] = set()
        self._asked: set[sync.Entry] = set()
        self._pid = os.getpid()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_pending)
        self._thread: threading.Thread | None = None
        self.closed = False

    @property
    def where(self) -> str:
        return self._db.where if self._db is not None else _redacted(self.url)

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

    def _after_fork(self) -> None:
        """In a forked child: a new queue and writer (the parent's thread is not here)."""
        if os.getpid() != self._pid:
            self._pid = os.getpid()
            self._queue = queue.Queue(maxsize=self.max_pending)
            self._thread = None
            self._lock = threading.RLock()

    def _open(self, *, for_write: bool = False) -> CacheDB | None:
        """The remote database, or ``None`` while it is down (or in its retry pause)."""
        now = time.monotonic()
        if now < (self._write_down_until if for_write else self._read_down_until):
            return None
        with self._lock:
            if self._db is not None:
                return self._db
            try:
                db = CacheDB(self.url, upgrade=False, busy_timeout_s=self.timeout_s,
                             network_timeout_s=self.timeout_s)
            except SchemaTooNewError as exc:
                self._read_down_until = self._write_down_until = math.inf
                self._warn_once("opening", exc, seconds=math.inf)
                return None
            except Exception as exc:
                self._read_down_until = self._write_down_until = now + RETRY_AFTER_S
                self._warn_once("opening", exc, seconds=RETRY_AFTER_S)
                return None
            try:
                with db.engine.connect() as conn:
                    revision = migrate._stamped_revision(conn)
                if revision is None:  # empty: create the schema (one host, under the advisory lock)
                    db.upgrade()
                elif revision != migrate.HEAD_REVISION:
                    raise SchemaTooOldError(db.where, revision, migrate.HEAD_REVISION)
            except SchemaTooOldError as exc:
                db.close()
                self._read_down_until = self._write_down_until = math.inf
                self._warn_once("opening", exc, seconds=math.inf)
                return None
            except Exception as exc:
                db.close()
                self._read_down_until = self._write_down_until = now + RETRY_AFTER_S
                self._warn_once("opening", exc, seconds=RETRY_AFTER_S)
                return None
            event.listen(db.engine, "before_cursor_execute", self._count_statement)
            self._db = db
            return db

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

    def pull(self, entry: sync.Entry, local: CacheDB) -> int:
        """Copy ``entry`` from the remote into ``local``; the number of rows added (0: the
        remote lacks it, is down, or was already asked by this process). Never raises for
        the remote's faults (one warning, then local only for :data:`RETRY_AFTER_S`)."""
        self._after_fork()
        if self.closed or entry in self._asked:
            return 0
        db = self._open()
        if db is None:
            return 0
        self.counts["pull"] += 1
        bundle = None
        for attempt in (1, 2):
            try:
                with self._reading(db) as conn:
                    bundle = sync.fetch(conn, entry)
                break
            except DBAPIError as exc:
                if attempt == 1 and exc.connection_invalidated:
                    continue  # the server dropped a pooled connection: once more on a new one
                self._read_down_until = time.monotonic() + RETRY_AFTER_S
                self._warn_once("lookup", exc, seconds=RETRY_AFTER_S)
                return 0
            except Exception as exc:
                self._read_down_until = time.monotonic() + RETRY_AFTER_S
                self._warn_once("lookup", exc, seconds=RETRY_AFTER_S)
                return 0
        self._asked.add(entry)
        if not bundle:
            return 0
        sync.in_form_of(bundle, local.engine.dialect.name)  # before the local write lock
        with local.write() as repos:
            added = sync.store(repos.session, bundle)  # type: ignore[arg-type]
        self.counts["pull_hit"] += 1
        self.counts["pulled_rows"] += added
        log.debug("cachedb: remote hit %s: %d row(s) into the local cache", entry, added)
        return added

    # -- writes -------------------------------------------------------------------------------

    def push(self, entry: sync.Entry, local: CacheDB) -> None:
        """Queue ``entry`` (just written to ``local``) for the remote; never blocks, but in a
        :mod:`multiprocessing` child (:func:`_in_worker`), where it is sent at once (waits
        at most the remote's timeout)."""
        self._after_fork()
        if self.closed:
            return
        self._asked.add(entry)  # the local file has it now: no need to ask the remote
        if _in_worker():
            try:
                self._send([(entry, local)])
            except Exception as exc:  # the local file keeps it
                self._write_down_until = time.monotonic() + RETRY_AFTER_S
                self._warn_once("write", exc, seconds=RETRY_AFTER_S)
            return
        try:
            self._queue.put_nowait((entry, local))
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
            try:
                self._send(batch)
            except Exception as exc:  # never let the thread die
                self._write_down_until = time.monotonic() + RETRY_AFTER_S
                self._warn_once("write", exc, seconds=RETRY_AFTER_S)
            finally:
                for _ in batch:
                    q.task_done()

    def _send(self, batch: list[tuple[sync.Entry, CacheDB]]) -> None:
        db = self._open(for_write=True)
        if db is None:
            return
        entries: dict[sync.Entry, CacheDB] = dict(batch)  # each entry once, in order
        bundles: list[sync.Bundle] = []
        for entry, local in entries.items():
            with local.lookup() as repos:
                bundle = sync.fetch(repos.session, entry, with_blobs=False)  # type: ignore[arg-type]
                if bundle:
                    # the remote's form, before its transaction
                    bundles.append(sync.in_form_of(bundle, db.engine.dialect.name))  # a kernel's blobs: below, only those the remote lacks
        if not bundles:
            return
        for attempt in (1, 2):
            try:
                added = 0
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
                        added += sync.store(conn, bundle)
                self.counts["push"] += len(bundles)
                self.counts["pushed_rows"] += added
                log.debug("cachedb: remote write: %d entr(ies), %d row(s)", len(bundles), added)
                return
            except (IntegrityError, DBAPIError) as exc:
                # another host wrote the same entry meanwhile (unique key), or the server
                # dropped the connection: once more, and the second run sees what is there
                if attempt == 2 or not (isinstance(exc, IntegrityError) or exc.connection_invalidated):
                    raise

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

    def close(self) -> None:
        """Flush queued writes (at most ``flush_timeout_s`` seconds), stop the writer and close
        the remote's connections."""
        if self.closed:
            return
        if not self.flush():
            log.warning("cachedb: remote cache %s: %d write(s) not sent within %.0f s at exit "
                        "(they stay in the local cache)", self.where, self._queue.unfinished_tasks,
                        self.flush_timeout_s)
        self.closed = True
        thread = self._thread
        if thread is not None and thread.is_alive() and os.getpid() == self._pid:
            try:
                self._queue.put_nowait(_STOP)
            except queue.Full:
                pass
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


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
    url = os.environ.get(ENV_REMOTE_URL)
    if not url:
        return None
    return RemoteTier(url, timeout_s=float(os.environ.get(ENV_REMOTE_TIMEOUT) or DEFAULT_REMOTE_TIMEOUT_S))
