"""What the live seams call: database reads and writes that never break a compile.

Every public method of :class:`LiveStore` catches its own failures (a database that cannot be
opened, a lock held past the timeout, a corrupt payload, ...), logs one warning per kind of
failure per process, and answers as a miss (reads) or drops the write.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import dataclasses
import datetime as dt
import itertools
import logging
import math
import operator
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from ..formats import local_cache_doc as doc
from ..fleet import tier_sync as sync
from .._errors import CorruptPayloadError
from ..store.trust import untrusted_reason
from ..db import CacheDB, Repos
from ..fingerprint import current as current_fingerprint
from ..keys import split_inputs_key
from ..keys.factors import Factor, parse_debug_lines
from ..store.filesystems import network_filesystem
from ..store import prebuilt
from ..store.payload import pack
from ..store.tables import GUARDED_KINDS, utcnow
from ..repositories import best_configs as best_configs_repo
from ..repositories import dynamo as dynamo_repo
from ..repositories import guarded as guarded_repo
from ..repositories import local_values as local_values_repo
from ..repositories import timings as timings_repo
from ..repositories.timings import next_position
from ._best_configs import BestConfigCopy, Refused
from ..fleet import trust as _trust
from .. import settings
from . import _singleflight, _warm_up
from ._remote import RemoteTier
from ._writer import WriteBehind, enabled_by_environment

log = logging.getLogger("cachedb.live")
_VARIANT_NAME = operator.itemgetter(0)
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


#: FX graph keys whose factors a process holds at most, waiting for their entries.
_PENDING_FACTORS = 256


class LiveStore:
    """The database behind the seams of one process (opened lazily, on first use).

    ``remote``: a shared database behind this one (:mod:`cachedb.live._remote`): a local miss
    is looked up there and copied here, and what is written here is copied there.

    ``write_behind`` (default: ``$CACHEDB_WRITE_BEHIND``, on unless ``0``): FX graph and
    AOTAutograd puts are queued and written by a background thread
    (:mod:`cachedb.live._writer`; a lookup of a queued key waits for it; :meth:`flush` waits
    for all); off, each put is written before it returns.
    """

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

    # -- FX graph and AOTAutograd entries -----------------------------------------------------

    def guarded_candidates(self, kind: str, key: str) -> Iterator[tuple[str, bytes]]:
        """``(variant, pickle bytes)`` of every stored variant of ``key``, in Inductor's order.

        One query reads the key's first variant (on SQLite; elsewhere every row), a second,
        from the index alone, lists the others only if the caller asks for more; each payload
        after the first is decompressed and verified only when the caller asks for its variant.
        Inductor stops at the first variant whose guards hold
        (``GuardedCache.find_guarded_entry``, torch/_inductor/codecache.py), as its own loop
        (``iterate_over_candidates``) stops reading files there, so the variants after a hit
        are never decompressed. A corrupt payload is skipped with a warning and quarantined.
        With a remote tier, the variants only the remote holds follow, fetched (one query)
        once the local ones are exhausted.

        The first query runs when this is called, and without a remote tier the first variant
        is read and checked then too (on SQLite, where that query reads it alone; elsewhere, for
        a key of one variant): the iterator returned holds it, then, for a key of more
        variants, a generator of the later ones, each listed and read only when the caller
        asks for it. So the lookup torch makes most often, one variant, runs no generator."""
        writer = self.writer
        if writer is not None and writer.has_pending((kind, key)):  # this process's own put
            writer.wait_for((kind, key), self.timeout_s)
        rows, more = self.safely(f"{kind} lookup", ([], False), lambda: self._variant_rows(kind, key, None))
        if self.remote is not None:
            return self._candidates(kind, key, rows, more)
        if not rows:
            return iter(())
        if len(rows) > 1:  # off SQLite: every variant's row at once, each checked when asked for
            return self._loaded(kind, key, rows)
        variant = rows[0][0]
        content = self._checked(kind, key, rows.pop())
        first = ((variant, content),) if content is not None else ()
        return itertools.chain(first, self._later(kind, key, variant, set())) if more else iter(first)

    def _candidates(
        self, kind: str, key: str, rows: list[tuple[Any, ...]], more: bool
    ) -> Iterator[tuple[str, bytes]]:
        """:meth:`guarded_candidates` past its first query (``rows``, ``more``: its answer)."""
        served: set[str] = set()
        for variant, content in self._local_candidates(kind, key, served, (rows, more)):
            served.add(variant)
            yield variant, content
        # Inductor stops at the first variant whose guards hold: the remote tier is asked only
        # when no local one did. A local variant found corrupt (quarantined) is served from
        # the remote's copy.
        if self.remote is not None and self.pull(sync.guarded(kind, key)):
            yield from self._local_candidates(kind, key, served)

    def _local_candidates(
        self, kind: str, key: str, skip: set[str], first: tuple[list[tuple[Any, ...]], bool] | None = None
    ) -> Iterator[tuple[str, bytes]]:
        """:meth:`guarded_candidates` of the local database, less the variants in ``skip``;
        ``first``: the first query's answer, when it has run. On SQLite the first query reads
        the key's first variant alone (:data:`~cachedb.repositories.guarded.FIRST_VARIANT`);
        the others are listed from the index
        (:data:`~cachedb.repositories.guarded.LATER_VARIANTS`) only when the caller asks for
        more."""
        if first is None:
            first = self.safely(f"{kind} lookup", ([], False), lambda: self._variant_rows(kind, key, None))
        rows, more = first
        after = rows[0][0] if more else None
        yield from self._loaded(kind, key, [row for row in rows if row[0] not in skip] if skip else rows)
        if after is not None:
            yield from self._later(kind, key, after, skip)

    def _later(self, kind: str, key: str, after: str, skip: set[str]) -> Iterator[tuple[str, bytes]]:
        """:meth:`_loaded` of the variants of ``key`` after ``after`` in Inductor's order
        (:data:`~cachedb.repositories.guarded.LATER_VARIANTS`, on SQLite), less those in
        ``skip``: listed when the caller first asks for one."""
        later, _ = self.safely(f"{kind} lookup", ([], False), lambda: self._variant_rows(kind, key, after))
        yield from self._loaded(kind, key, [row for row in later if row[0] not in skip] if skip else later)

    def _variant_rows(self, kind: str, key: str, after: str | None) -> tuple[list[tuple[Any, ...]], bool]:
        """``(rows, more)``: rows ``(variant, payload, size_bytes, checksum, signature, id)``
        of ``key``, sorted by variant name as Inductor sorts its file names, and whether
        variants after them are stored; none while pickles are refused.

        Where the kept connection reads in place (SQLite): the first variant's row
        (:data:`~cachedb.repositories.guarded.FIRST_VARIANT`), or with ``after`` (that
        variant's name) the rows of the variants after it, ``NULL`` but for ``variant`` and
        ``id`` (:data:`~cachedb.repositories.guarded.LATER_VARIANTS`): :meth:`_loaded` reads
        those in place. Elsewhere: every variant's row
        (:data:`~cachedb.repositories.guarded.VARIANTS`)."""
        db = self._db
        if db is None:
            db = self.db  # opening it decides whether pickles are refused
        if self.pickles_refused is not None:
            return [], False
        kept = db.kept
        if not kept.reads_in_place:
            rows = kept.fetch(guarded_repo.VARIANTS, {"kind": kind, "key": key})
            rows.sort(key=_VARIANT_NAME)
            return rows, False
        if after is None:
            first = kept.fetch(guarded_repo.FIRST_VARIANT, {"kind": kind, "key": key})
            if not first:
                return [], False
            row = first[0]
            log.debug("%s lookup %s: %d variant(s)", kind, key, row[6])
            return [row[:6]], row[6] > 1
        rows = kept.fetch(guarded_repo.LATER_VARIANTS, {"kind": kind, "key": key, "after": after})
        rows.sort(key=_VARIANT_NAME)
        return rows, False

    def _loaded(self, kind: str, key: str, rows: list[tuple[Any, ...]]) -> Iterator[tuple[str, bytes]]:
        """``(variant, payload)`` of ``rows``, each decompressed and verified when it is asked
        for; a corrupt one is warned about, quarantined and skipped. Each row leaves ``rows``
        as it is read, so the compressed payload is freed before the caller unpickles the
        content; a payload the query left in the database (``NULL``, on SQLite: a variant
        after the first, or a large one) is decompressed as it is read from there, never held
        whole, and its size, checksum and signature are read in the same snapshot. Holding the
        stored frame beside the content kept a 20 MB graph's lookup over glibc's heap-trim threshold, and
        every lookup in a loop then faulted its memory in again (§4). A variant deleted since
        the query is skipped as absent."""
        rows.reverse()
        while rows:
            variant = rows[-1][0]
            content = self._checked(kind, key, rows.pop())
            if content is not None:
                yield variant, content

    def _checked(self, kind: str, key: str, row: tuple[Any, ...]) -> bytes | None:
        """The content of ``row`` (a :meth:`_variant_rows` row), decompressed and verified;
        ``None`` when it is corrupt (warned about once, quarantined), gone (deleted since the
        query) or cannot be read (warned about once). A payload the query left ``NULL`` is
        read in place (:meth:`_loaded`)."""
        variant, blob, size, digest, signature, row_id = row
        try:
            db = self._db
            if db is None:
                db = self.db
            if blob is not None:
                return guarded_repo.load_variant(db.signer, kind, key, variant, blob, size, digest, signature)
            # on SQLite, after the first or large: read in place as it is checked
            found, content = db.kept.read_blob(
                "guarded_entries", "payload", row_id, guarded_repo.VARIANT_AT,
                {"id": row_id, "kind": kind, "key": key, "variant": variant},
                lambda source, at: guarded_repo.load_streamed_variant(db.signer, kind, key, variant, source, *at),
            )
            if not found:  # deleted since the query (evicted, quarantined): not there
                log.debug("%s lookup %s: variant %s is gone", kind, key, variant)
            return content
        except CorruptPayloadError as exc:
            self.warn_once(f"{kind} payload check", exc)
            self._quarantine(kind, key, [(variant, exc.reason)])
        except Exception as exc:  # the cache must never break a compile
            self.warn_once(f"{kind} lookup", exc)
        return None

    def _quarantine(self, kind: str, key: str, corrupt: list[tuple[str, str]]) -> None:
        """Move corrupt variants aside (kept for ``cachedb verify``) and count the misses in
        ``counters["inductor"]["cachedb_corrupt_payload"]``."""
        try:
            from torch._dynamo.utils import counters

            counters["inductor"]["cachedb_corrupt_payload"] += len(corrupt)
        except ImportError:
            pass

        def write() -> None:
            with self.db.write() as repos:
                for variant, reason in corrupt:
                    repos.guarded.quarantine(kind, key, variant, reason)

        self.safely(f"{kind} quarantine", None, write)

    def note_hit(self, kind: str, key: str, variant: str) -> None:
        """Count a served variant; hits are written with the next write, and at exit."""
        with self._lock:
            n, _ = self._hits.get((kind, key, variant), (0, None))
            self._hits[(kind, key, variant)] = (n + 1, utcnow())
            if not self._atexit_registered:
                self._atexit_registered = True
                atexit.register(self.flush_hits)

    def _take_hits(self, repos: Repos) -> None:
        with self._lock:
            hits, self._hits = self._hits, {}
        if not hits:
            return
        guarded = {k: v for k, v in hits.items() if k[0] in GUARDED_KINDS}
        if guarded:
            repos.guarded.record_hits(guarded)
        for kind in dynamo_repo.KINDS:  # Dynamo's caches: (kind, key, "")
            served = {k[1]: v for k, v in hits.items() if k[0] == kind}
            if served:
                repos.dynamo(kind).record_hits(served)

    def flush_hits(self) -> None:
        """Write the pending hit counts and last-used times (at exit, or explicitly)."""
        if not self._hits or self.closed and self._db is None:
            return

        def write() -> None:
            with self.db.write() as repos:
                self._take_hits(repos)

        self.safely("hit count write", None, write)

    def guarded_put(self, kind: str, key: str, content: bytes) -> None:
        """Store ``content`` (pickle bytes of an FX graph / AOTAutograd entry) as a variant of
        ``key``: queued for the write-behind thread where there is one
        (:mod:`cachedb.live._writer`), else written before returning. The process's first put
        is written before returning too: it records the process's fingerprint, whose
        computation imports torch modules, and an import running on the writer thread when the
        process forks would leave the child that module's import lock held. Never raises."""
        writer = self.writer
        flights = self._flights
        if flights is not None:
            flights.mark_put_queued(kind, key)  # its claim is released once the entry is written
        if writer is not None and self._known_fingerprint_id() is not None and writer.submit(
            (kind, key), len(content), lambda: self._write_guarded(kind, key, content)
        ):
            return
        self._write_guarded(kind, key, content)

    # -- key factors and the miss log (:mod:`cachedb.live._misses`) ---------------------------

    def note_fx_miss(self, key: str, debug_lines: list[str]) -> None:
        """An FX graph lookup of ``key`` missed: keep its factors (parsed from torch's
        ``debug_lines``, :func:`cachedb.keys.factors.parse_debug_lines`) for the entry put
        next under ``key``, and record the miss (``no_entry`` or ``guards_failed``)."""
        self.note_miss("fxgraph", key, parse_debug_lines(debug_lines))

    def note_miss(self, kind: str, key: str, factors: list[Factor]) -> None:
        """A lookup of ``kind``/``key`` missed: keep its ``factors`` for the entry put next
        under ``key``, and record the miss (``no_entry`` or ``guards_failed``)."""
        with self._lock:
            self._factors[(kind, key)] = factors
            while len(self._factors) > _PENDING_FACTORS:
                self._factors.pop(next(iter(self._factors)))
        outcome = "guards_failed" if self.variant_names(kind, key) else "no_entry"
        self.record_miss(kind, key, outcome, factors)

    def note_aot_key(self, key: str, debug_lines: Callable[[], list[str]]) -> None:
        """torch computed the AOTAutograd ``key`` its lookup asks for next on this thread:
        unless the local database holds variants of it (a hit is likely: nothing computed),
        its factors, from ``debug_lines()`` (torch's, :func:`cachedb.live._misses.aot_debug_lines`),
        are held for :meth:`note_aot_lookup`."""
        factors = None if self.variant_names("aotautograd", key) else parse_debug_lines(debug_lines())
        self._aot_key.held = (key, factors)

    def note_aot_lookup(self, key: str, *, hit: bool) -> None:
        """The AOTAutograd lookup of ``key`` ended: a miss is noted (:meth:`note_miss`) with the
        factors :meth:`note_aot_key` held for it on this thread (none where it held none)."""
        held = getattr(self._aot_key, "held", None)
        self._aot_key.held = None
        if hit:
            return
        factors = held[1] if held is not None and held[0] == key and held[1] is not None else []
        self.note_miss("aotautograd", key, factors)

    def record_miss(self, kind: str, key: str, outcome: str, factors: list[Factor], *, reason: str = "") -> None:
        """Add one miss to the database's miss log (``cache_misses``, the newest
        ``CACHEDB_MISS_LOG`` kept; 0: nothing recorded), through the write-behind queue where
        there is one. Never raises (one warning)."""
        keep = int(settings.value_or_default("CACHEDB_MISS_LOG"))
        if keep <= 0:
            return

        def write() -> None:
            with self.db.write() as repos:
                repos.misses.add(kind, key, outcome, factors, reason=reason, keep=keep)

        def job() -> None:
            self.safely("miss record", None, write)

        writer = self.writer
        if writer is not None and self._known_fingerprint_id() is not None and writer.submit(
                ("miss", kind, key), 64 * len(factors), job):
            return
        job()

    def _write_guarded(self, kind: str, key: str, content: bytes) -> None:
        """:meth:`guarded_put`'s write: one transaction (on the kept connection once the
        process's fingerprint is recorded, unless the key's factors go with it), then the
        remote tier's copy is queued."""
        with self._lock:
            factors = self._factors.pop((kind, key), None)

        def write() -> None:
            db = self.db
            fp_id = self._known_fingerprint_id()
            # Hash (once), scan, compress and sign before BEGIN IMMEDIATE: the write lock is
            # held only for the INSERT (and the fingerprint and hit counts, through db.write()).
            prepared = guarded_repo.prepare_pickled(
                kind, key, content, signer=db.signer, fingerprint_id=fp_id, own=True,
                dialect=db.engine.dialect.name,
            )
            insert_new = guarded_repo.insert_new_for(db.engine.dialect.name)
            if fp_id is None:  # first write of this process: records its fingerprint
                with db.write() as repos:
                    prepared.row["fingerprint_id"] = self._fingerprint_id(repos)
                    repos.guarded.put_prepared(prepared)
                    if factors:
                        repos.key_factors.put(kind, key, factors)
                    self._take_hits(repos)
            elif self._hits or insert_new is None or factors:  # hits and factors go in the same transaction
                with db.write() as repos:
                    repos.guarded.put_prepared(prepared)
                    if factors:
                        repos.key_factors.put(kind, key, factors)
                    self._take_hits(repos)
            else:  # one INSERT ... ON CONFLICT DO NOTHING on the kept connection
                db.kept.write(insert_new, guarded_repo.insert_params(prepared))
            log.debug("%s write %s", kind, key)
            return True

        if self.safely(f"{kind} write", False, write):
            self.push(sync.guarded(kind, key))
        flights = self._flights
        if flights is not None:  # written (or failed): the processes waiting for it look now
            flights.release(kind, key)

    # -- one compile per graph (:mod:`cachedb.live._singleflight`) ----------------------------

    @property
    def flights(self) -> _singleflight.Flights | None:
        """The compile claims of this store's local file (``None``: off, ``CACHEDB_COMPILE_WAIT
        = 0``, or not an SQLite file), made on first use."""
        db = self._db
        if self._flights is None and not self._flights_checked and db is not None:
            self._flights_checked = True
            wait_s = float(settings.value_or_default("CACHEDB_COMPILE_WAIT"))
            if wait_s > 0 and db.path is not None:
                self._flights = _singleflight.for_database(db.path, wait_s=wait_s)
        return self._flights

    def variant_names(self, kind: str, key: str) -> set[str]:
        """The variants of ``key`` stored in the local database (an index-only query)."""
        def read() -> set[str]:
            with self.db.lookup() as repos:
                return set(repos.guarded.variant_names(kind, key))

        return self.safely(f"{kind} lookup", set(), read)

    def on_compile_miss(self, kind: str, key: str, seen: set[str]) -> bool:
        """A lookup of ``kind``/``key`` found no entry whose guards held (``seen``: the variants
        it was given) and torch is about to compile it: claim the key, or wait for the process
        compiling it (:mod:`cachedb.live._singleflight`). True when other variants landed
        meanwhile (the caller gives them to torch's checks); False: torch compiles."""
        flights = self.flights
        if flights is None:
            return False

        def landed() -> bool:
            return bool(self.variant_names(kind, key) - seen)

        remote = None
        tier = self.remote
        if tier is not None:
            entry = sync.guarded(kind, key)
            remote = _singleflight.Remote(
                claim=lambda: tier.claim_compile(kind, key),
                landed=lambda: self.safely("remote lookup", False, lambda: tier.landed(entry, self.db)) and landed(),
                held=lambda: tier.compile_holder(kind, key) is not None,
            )
        try:
            outcome = flights.on_miss(kind, key, landed, remote=remote, warm_up=_warm_up.start)
        except Exception as exc:  # noqa: BLE001 - never the compile's failure: compile alone
            self.warn_once("compile claim", exc)
            return False
        if outcome is _singleflight.Outcome.LANDED and getattr(flights, "last_wait", None):
            self._record_wait(*flights.last_wait)
        return outcome is _singleflight.Outcome.LANDED

    def _record_wait(self, kind: str, key: str, seconds: float, outcome: str, on: str) -> None:
        """Count a compile this process did not run: it waited ``seconds`` for the entry
        another process (``on``) compiled (table ``compile_waits``)."""
        def write() -> None:
            with self.db.write() as repos:
                repos.compile_waits.add(kind, key, seconds=seconds, outcome=outcome, waited_on=on)

        self.safely("compile wait record", None, write)

    def compile_scope(self) -> Any:
        """A compile on this thread (``_compile_fx_inner``, ``aot_module_simplified``): claims
        it took and stored nothing for are released when it ends."""
        self.safely("opening the database", None, lambda: self.db)  # the claims need its file
        flights = self.flights
        return flights.scope() if flights is not None else contextlib.nullcontext()

    def clear_kind(self, kind: str) -> int:
        """Delete every entry of ``kind`` (``fxgraph``, ``aotautograd``, or one of Dynamo's
        kinds: ``pgo``, ``precompile``, ``precompile_refusal``) from this store's database, as
        torch's ``clear()`` removes its directory; queued puts are written first, so none comes
        back after it. One log line (info) says what was removed. A remote tier is never
        cleared. Returns how many rows were deleted (0 where the database cannot be written)."""
        self.flush()

        def write() -> int:
            with self.db.write() as repos:
                n = repos.guarded.clear(kind) if kind in GUARDED_KINDS else repos.dynamo(kind).clear()
            if kind not in GUARDED_KINDS:
                self._dynamo_written = {k: v for k, v in self._dynamo_written.items() if k[0] != kind}
            with self._lock:
                self._hits = {k: v for k, v in self._hits.items() if k[0] != kind}
            return n

        removed = self.safely(f"{kind} clear", 0, write)
        log.info("cachedb: cleared %d %s entr%s from %s", removed, kind, "y" if removed == 1 else "ies",
                 self.location)
        return removed

    # -- autotune timings and LocalCache values ----------------------------------------------

    def local_cache(self, system_hash: str) -> LazyLocalCache:
        return LazyLocalCache(self, system_hash)

    def load_top_level(self, system_hash: str, key: str) -> tuple[bool, Any]:
        """``(found, value)`` of ``cache[key]`` for ``system_hash``: a :class:`LazyOpTimings`
        when ``key`` is an op with timings (its entries load one inputs key at a time), else
        the ``LocalCache`` value stored under that namespace."""

        def read() -> tuple[bool, Any]:
            kept = self.db.kept
            params = {"system_hash": system_hash, "op": key}
            if kept.fetch(timings_repo.OP_EXISTS, params):
                return True, LazyOpTimings(self, system_hash, key)
            rows = kept.fetch(local_values_repo.FOR_NAMESPACE_OF_SYSTEM, {"system_hash": system_hash, "ns": key})
            return local_values_repo.namespace_value(rows, key)

        found = self.safely("autotune/LocalCache lookup", (False, None), read)
        if not found[0] and self.remote is not None and (
            self.pull(sync.timings_of_op(system_hash, key)) or self.pull(sync.local_values(system_hash, key))
        ):
            found = self.safely("autotune/LocalCache lookup", (False, None), read)
        log.debug("local cache lookup %s (system %s): %s", key, system_hash[:8], "hit" if found[0] else "miss")
        return found

    def load_inputs_key(self, system_hash: str, op: str, inputs_key: str) -> dict[str, dict[str, float]] | None:
        """``cache[op][inputs_key]`` (``{precision: {choice_hash: ms}}``), ``None`` if absent:
        one indexed query for what ``PersistentCache.lookup`` asks."""

        def read() -> dict[str, dict[str, float]] | None:
            inputs, hint = split_inputs_key(inputs_key)
            stmt, params = timings_repo.inputs_key_params(system_hash, op, inputs, hint)
            return timings_repo.per_precision(self.db.kept.fetch(stmt, params)) or None

        found = self.safely("autotune/LocalCache lookup", None, read)
        if found is None and self.remote is not None:
            inputs, hint = split_inputs_key(inputs_key)
            # an op pulled whole (load_top_level) holds every inputs key the remote had
            if not self.remote.asked(sync.timings_of_op(system_hash, op)) and self.pull(
                sync.timings(system_hash, op, inputs, hint)
            ):
                found = self.safely("autotune/LocalCache lookup", None, read)
        log.debug("timings lookup %s %s: %s", op, inputs_key[:40], "hit" if found is not None else "miss")
        return found

    def load_op(self, system_hash: str, op: str) -> dict[str, dict[str, dict[str, float]]]:
        """Every ``cache[op][inputs_key]`` of ``op`` (for callers that iterate an op's entries)."""

        def read() -> dict[str, dict[str, dict[str, float]]]:
            rows = self.db.kept.fetch(timings_repo.FOR_OP_OF_SYSTEM, {"system_hash": system_hash, "op": op})
            return timings_repo.per_inputs_key(rows)

        return self.safely("autotune/LocalCache lookup", {}, read)

    def write_changes(self, cache: dict[str, Any], served: dict[str, Any]) -> None:
        """Write the leaves of ``cache`` that differ from what was ``served``: new timings
        become new rows (history), other values are upserted. Leaves another process wrote in
        the meantime are untouched, so no process loses another's updates. An op loaded as a
        :class:`LazyOpTimings` is compared only on the inputs keys that were read or set."""

        def write() -> None:
            changed: dict[str, Any] = {}
            before: dict[str, Any] = {}
            for k, v in dict.items(cache) if isinstance(cache, dict) else cache.items():
                if isinstance(v, LazyOpTimings):
                    now_part, served_part = v.changes()
                    if now_part:
                        changed[k] = now_part
                        if served_part:
                            before[k] = served_part
                elif k not in served or served[k] != v:
                    changed[k] = v
                    if k in served:
                        before[k] = served[k]
            if not changed:
                return
            new_t, new_v = doc.split_cache(changed)
            old_t, old_v = doc.split_cache(before)
            old_timings = {(t.op, t.inputs, t.hint_override, t.precision, t.choice_hash): t.timing_ms for t in old_t}
            old_values = {v.key_path: v.value for v in old_v}
            timings = [
                t for t in new_t
                if old_timings.get((t.op, t.inputs, t.hint_override, t.precision, t.choice_hash)) != t.timing_ms
            ]
            values = [v for v in new_v if v.key_path not in old_values or old_values[v.key_path] != v.value]
            if not timings and not values:
                return
            log.debug("local cache write: %d timing(s), %d value(s)", len(timings), len(values))
            groups: dict[tuple[str, str, int | None, str], dict[str, float]] = {}
            for t in timings:
                groups.setdefault((t.op, t.inputs, t.hint_override, t.precision), {})[t.choice_hash] = t.timing_ms
            db = self.db
            known = self._known_fingerprint_id()
            held: HeldChoices | None = getattr(self._held_choices, "value", None)
            described = held.describe() if held is not None and timings and not held.written else []
            with db.write() as repos:
                fp_id = known if known is not None else self._fingerprint_id(repos)
                for (op, inputs, hint, precision), per_choice in groups.items():
                    repos.timings.record(fp_id, op, inputs, precision, per_choice, hint_override=hint)
                if values:
                    start = next_position(repos.session)
                    repos.local_values.add_leaves(
                        fp_id, [doc.ValueLeaf(v.key_path, v.value, start + i) for i, v in enumerate(values)]
                    )
                added = self._put_choices(repos, described) if described else 0
            if held is not None and timings:
                held.written, held.added = True, held.added + added
            if self.remote is not None and self._fingerprint is not None:
                system_hash = self._fingerprint[2]
                self.push(
                    *dict.fromkeys(sync.timings(system_hash, op, inputs, hint) for op, inputs, hint, _ in groups),
                    *dict.fromkeys(sync.local_values(system_hash, v.key_path[0]) for v in values),
                )

        self.safely("autotune/LocalCache write", None, write)

    def _put_choices(self, repos: Repos, rows: list[dict[str, Any]]) -> int:
        """The descriptions of ``rows`` not stored yet, added in a SAVEPOINT of the timings'
        transaction: a refusal (warned about once) leaves the timings to commit."""
        try:
            with repos.savepoint():
                return repos.choices.put_new(rows)
        except Exception as exc:  # the timings are written all the same
            self.warn_once("autotune choice write", exc)
            return 0

    @contextlib.contextmanager
    def hold_choices(self, held: HeldChoices) -> Iterator[HeldChoices]:
        """For the ``with`` block on this thread (a ``PersistentCache.lookup``,
        :mod:`cachedb.live._choices`): the timings it records are written in one transaction
        with the descriptions ``held.describe()`` makes (those not stored yet; counted in
        ``held.added``, ``held.written`` set); a lookup that recorded nothing leaves
        ``held.written`` false and describes nothing."""
        outer = getattr(self._held_choices, "value", None)
        self._held_choices.value = held
        try:
            yield held
        finally:
            self._held_choices.value = outer

    # -- best configs ------------------------------------------------------------------------

    def _read_best_config(self, key: str) -> bytes | None:
        # the hot path of every Triton kernel's autotune-cache lookup: :meth:`safely` inlined
        try:
            db = self._db or self.db
            copy = self.best_configs
            token = db.kept.version()  # None off SQLite, or while another thread reads
            if token is not None:
                found = copy.lookup(token, key)
                if found is False and copy.due(token):
                    copy.load(db)
                    found = copy.lookup(token, key)
                if found is not False:
                    if isinstance(found, Refused):
                        raise found.error
                    return found  # type: ignore[return-value]
            rows = db.kept.fetch(best_configs_repo.GET_BY_KEY, {"key": key})
            if not rows:
                return None
            content, signature = rows[0]
            return best_configs_repo.checked_content(db.signer, key, content, signature).encode("utf-8")
        except _Unavailable:
            return None
        except Exception as exc:  # the cache must never break a compile
            self.warn_once("best config lookup", exc)
            return None

    def best_config_get(self, key: str) -> bytes | None:
        """The best config stored under ``key`` (``"<k[1:3]>/<name>.best_config"``) as JSON
        bytes, ``None`` on a miss: from the process's copy of every best config while no other
        connection has committed (:mod:`cachedb.live._best_configs`), else one indexed SELECT
        on the kept connection; then the remote tier, if any, on a local miss. Never raises."""
        found = self._read_best_config(key)
        if found is None and self.remote is not None and self.pull(sync.best_config(key)):
            found = self._read_best_config(key)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("best config lookup %s: %s", key, "hit" if found is not None else "miss")
        return found

    def best_config_put(self, key: str, data: bytes) -> None:
        def write() -> None:
            db = self.db
            content = data.decode("utf-8")
            columns = best_configs_repo.prepare_columns(db.signer, key, content)  # before BEGIN IMMEDIATE
            fp_id = self._known_fingerprint_id()
            upsert = best_configs_repo.upsert_for(db.engine.dialect.name)
            if fp_id is None or upsert is None:  # first write of this process: records its fingerprint
                with db.write() as repos:
                    fp_id = self._fingerprint_id(repos)
                    repos.best_configs.put(key, content, fingerprint_id=fp_id, columns=columns)
            else:  # one upsert on the kept connection, the write lock held for it alone
                db.kept.write(upsert, best_configs_repo.upsert_params(key, content, columns, fp_id))
            self.best_configs.wrote(key, bytes(data))  # stored (the upsert keeps equal content as is)
            log.debug("best config write %s", key)
            return True

        if self.safely("best config write", False, write):
            self.push(sync.best_config(key))

    # -- Dynamo's caches: PGO profiles, ... --------------------------------------------------

    def dynamo_get(self, kind: str, key: str) -> bytes | None:
        """The pickle of one of Dynamo's caches (``kind``: ``pgo``, ...; ``key``: its
        :mod:`cachedb.repositories.dynamo` key), checked, or ``None``: a miss, a database that
        cannot be read, pickles refused (an untrusted database), or a corrupt row (warned
        about once per kind, quarantined). On a local miss the remote tier, if any, is asked
        (a local row found corrupt is served from the remote's copy). A hit is counted (written
        with the next write, or at exit). Never raises."""
        found = self._read_dynamo(kind, key)
        if found is None and self.remote is not None and self.pull(sync.dynamo(kind, key)):
            found = self._read_dynamo(kind, key)
        if found is not None:
            self.note_hit(kind, key, "")
        log.debug("%s lookup %s: %s", kind, key, "hit" if found is not None else "miss")
        return found

    def _read_dynamo(self, kind: str, key: str) -> bytes | None:
        try:
            db = self._db or self.db
            if self.pickles_refused is not None:
                return None
            rows = db.kept.fetch(dynamo_repo.statements(kind).get, {"key": key})
            if not rows:
                return None
            return dynamo_repo.checked(db.signer, kind, key, *rows[0])
        except _Unavailable:
            return None
        except CorruptPayloadError as exc:
            self.warn_once(f"{kind} payload check", exc)
            self._quarantine_dynamo(kind, key, exc.reason)
        except Exception as exc:  # the cache must never break a compile
            self.warn_once(f"{kind} lookup", exc)
        return None

    def _quarantine_dynamo(self, kind: str, key: str, reason: str) -> None:
        """Move a corrupt row of Dynamo's caches aside (kept for ``cachedb verify``) and count
        it in ``counters["inductor"]["cachedb_corrupt_payload"]``."""
        try:
            from torch._dynamo.utils import counters

            counters["inductor"]["cachedb_corrupt_payload"] += 1
        except ImportError:
            pass

        def write() -> None:
            with self.db.write() as repos:
                repos.dynamo(kind).quarantine(key, reason)

        self.safely(f"{kind} quarantine", None, write)

    def dynamo_put(self, kind: str, key: str, data: bytes) -> bool:
        """Store ``data`` (a pickle torch just wrote) as the row of ``key``, replacing the one
        stored (the newer wins: this one, written now), then queue it for the remote tier.
        Returns whether it was stored. Never raises."""
        def write() -> bool:
            db = self.db
            packed = pack(bytes(data))  # before BEGIN IMMEDIATE: the write lock is held for the rows alone
            if self._dynamo_written.get((kind, key)) == packed.checksum:
                return True  # torch puts the whole profile after every compile, most often unchanged
            # The fingerprint if this process recorded it already: computing it (triton_key and
            # torch_key hash their sources, ~0.3-0.5 s on 2 cores) would cost a warm start,
            # which writes its profile again and nothing else, that much.
            fp_id = self._known_fingerprint_id()
            with db.write() as repos:
                repos.dynamo(kind).put(key, data, fingerprint_id=fp_id, packed=packed)
                self._take_hits(repos)
            self._dynamo_written[(kind, key)] = packed.checksum
            log.debug("%s write %s", kind, key)
            return True

        stored = self.safely(f"{kind} write", False, write)
        if stored:
            self.push(sync.dynamo(kind, key))
        return stored

    # -- CUTLASS op lists --------------------------------------------------------------------

    def cutlass_get(self, request_key: str) -> bytes | None:
        def read() -> bytes | None:
            with self.db.lookup() as repos:
                return repos.cutlass.get(request_key)

        found = self.safely("CUTLASS op list lookup", None, read)
        if found is None and self.pull(sync.cutlass(request_key)):
            found = self.safely("CUTLASS op list lookup", None, read)
        return found


@dataclasses.dataclass
class HeldChoices:
    """The choice descriptions (``autotune_choices`` rows) of a lookup, waiting for the
    timings it records (:meth:`LiveStore.hold_choices`): ``describe()`` makes them when the
    timings are written (never on a lookup that records nothing); ``written`` says they went
    in the timings' transaction, ``added`` how many rows it stored."""

    describe: Callable[[], list[dict[str, Any]]]
    written: bool = False
    added: int = 0


class _LazyDict(dict):  # type: ignore[type-arg]
    """A dict that loads a key on first access through ``_ensure(key)`` (subclasses define
    it): the point accesses torch makes (``in``, ``[]``, ``get``, ``setdefault``, ``pop``)."""

    def _ensure(self, key: Any) -> None:
        raise NotImplementedError

    def __contains__(self, key: object) -> bool:
        self._ensure(key)
        return dict.__contains__(self, key)

    def __getitem__(self, key: str) -> Any:
        self._ensure(key)
        return dict.__getitem__(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        self._ensure(key)
        return dict.get(self, key, default)

    def setdefault(self, key: str, default: Any = None) -> Any:
        self._ensure(key)
        return dict.setdefault(self, key, default)

    def __setitem__(self, key: str, value: Any) -> None:
        self._ensure(key)
        dict.__setitem__(self, key, value)

    def pop(self, key: str, *default: Any) -> Any:
        self._ensure(key)
        return dict.pop(self, key, *default)


class LazyLocalCache(_LazyDict):
    """The ``"cache"`` object of ``cache/<system hash>``, loaded one top-level key at a time.

    ``CacheBase.get_local_cache()`` returns one of these; ``PersistentCache.lookup`` and
    ``LocalCache`` only ever touch the keys they need (``in``, ``[]``, ``get``,
    ``setdefault``), so a lookup costs one indexed query instead of reading every timing.
    ``served`` keeps what was handed out, so ``update_local_cache`` writes only the changes.
    """

    def __init__(self, store: LiveStore, system_hash: str) -> None:
        super().__init__()
        self._store = store
        self._system_hash = system_hash
        self._loaded: set[str] = set()
        self.served: dict[str, Any] = {}

    @property
    def store(self) -> LiveStore:
        """The store this document was read from (its changes are written there)."""
        return self._store

    def _ensure(self, key: Any) -> None:
        if not isinstance(key, str) or key in self._loaded:
            return
        self._loaded.add(key)
        found, value = self._store.load_top_level(self._system_hash, key)
        if found:
            dict.__setitem__(self, key, value)
            self.served[key] = value if isinstance(value, LazyOpTimings) else copy.deepcopy(value)


    def mark_written(self) -> None:
        """After a write: what is in memory now is what the database holds for these keys."""
        served: dict[str, Any] = {}
        for k, v in dict.items(self):
            if isinstance(v, LazyOpTimings):
                v.mark_written()
                served[k] = v
            else:
                served[k] = copy.deepcopy(v)
        self.served = served


class LazyOpTimings(_LazyDict):
    """``cache[op]`` of an op with stored timings, loaded one inputs key at a time.

    ``PersistentCache.lookup`` reads ``cache.get(op, {}).get(inputs_key, {}).get(precision,
    {})`` and writes ``cache[op].setdefault(inputs_key, {})...``: each inputs key it names costs
    one indexed query (:meth:`LiveStore.load_inputs_key`), never a read of the op's other
    timings. Whatever iterates the whole op (``len``, ``items``, ``==``, ...) loads it whole
    first, so the dict behaves like the document's. :meth:`changes` gives what differs from
    what was served, for :meth:`LiveStore.write_changes`.
    """

    def __init__(self, store: LiveStore, system_hash: str, op: str) -> None:
        super().__init__()
        self._store = store
        self._system_hash = system_hash
        self._op = op
        self._loaded: set[str] = set()
        self._complete = False
        self._served: dict[str, Any] = {}

    def _put_loaded(self, key: str, value: dict[str, dict[str, float]]) -> None:
        if not dict.__contains__(self, key):
            dict.__setitem__(self, key, value)
            self._served[key] = copy.deepcopy(value)

    def _ensure(self, key: Any) -> None:
        if self._complete or not isinstance(key, str) or key in self._loaded:
            return
        self._loaded.add(key)
        value = self._store.load_inputs_key(self._system_hash, self._op, key)
        if value is not None:
            self._put_loaded(key, value)

    def _load_all(self) -> None:
        if self._complete:
            return
        self._complete = True
        stored = self._store.load_op(self._system_hash, self._op)
        held = dict(dict.items(self))
        dict.clear(self)
        for key, value in stored.items():  # document order, what this dict holds winning
            if key in held:
                dict.__setitem__(self, key, held.pop(key))
            elif key not in self._loaded:
                self._put_loaded(key, value)
        for key, value in held.items():  # set here, not stored yet
            dict.__setitem__(self, key, value)
        self._loaded.update(stored)


    def __delitem__(self, key: str) -> None:
        self._ensure(key)
        dict.__delitem__(self, key)

    # whole-op access: load everything first
    def __iter__(self) -> Iterator[str]:
        self._load_all()
        return dict.__iter__(self)

    def __len__(self) -> int:
        self._load_all()
        return dict.__len__(self)

    def keys(self) -> Any:
        self._load_all()
        return dict.keys(self)

    def values(self) -> Any:
        self._load_all()
        return dict.values(self)

    def items(self) -> Any:
        self._load_all()
        return dict.items(self)

    def copy(self) -> dict[str, Any]:
        self._load_all()
        return dict(dict.items(self))

    def __eq__(self, other: object) -> bool:
        self._load_all()
        if isinstance(other, LazyOpTimings):
            other._load_all()
        return dict.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        self._load_all()
        return dict.__repr__(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        self._load_all()
        return copy.deepcopy(dict(dict.items(self)), memo)

    def __reduce__(self) -> Any:  # pickles (and copies) as the plain dict it stands for
        self._load_all()
        return (dict, (dict(dict.items(self)),))

    def changes(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(now, before)``: the inputs keys whose value differs from what was served (as they
        are now) and what was served for those of them that were served. Touches no database."""
        served = self._served
        now = {k: v for k, v in dict.items(self) if k not in served or served[k] != v}
        before = {k: served[k] for k in now if k in served}
        return now, before

    def mark_written(self) -> None:
        """After a write: what is in memory now is what the database holds for these keys."""
        self._served = {k: copy.deepcopy(v) for k, v in dict.items(self)}


def _compile_ahead(db: CacheDB) -> None:
    """Compile the lookups' prebuilt statements for ``db``'s dialect
    (:func:`cachedb.store.prebuilt.compiled_for`: 1-3 ms of CPU each, once per process), read
    the schema on the kept connection (SQLite parses it on a connection's first statement) and
    open the pool's connection for writes (its set-up pragmas and schema: ~2 ms) on a daemon
    thread as the database opens (``install()`` opens it), off the first lookup's path: the
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
                db.kept.fetch(guarded_repo.FIRST_VARIANT, {"kind": "", "key": ""})
                with db.engine.connect() as conn:  # back to the pool, open, its schema read
                    conn.exec_driver_sql("SELECT 1 FROM guarded_entries LIMIT 0")
        except Exception as exc:  # noqa: BLE001 - the lookup compiles it again and reports
            log.debug("cachedb: statements not compiled ahead: %s", exc)

    threading.Thread(target=compile_all, name="cachedb-statements", daemon=True).start()
