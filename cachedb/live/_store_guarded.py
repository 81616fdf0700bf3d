"""The live store's FX graph and AOTAutograd entries: guarded lookups and puts, their key
factors and the miss log, and the compile claims of one compile per graph."""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import operator
from collections.abc import Callable, Iterator
from typing import Any

from ..fleet import tier_sync as sync
from .._errors import CorruptPayloadError
from ..db import Repos
from ..keys.factors import Factor, parse_debug_lines
from ..store.tables import GUARDED_KINDS, utcnow
from ..repositories import dynamo as dynamo_repo
from ..repositories import guarded as guarded_repo
from .. import settings
from . import _singleflight, _warm_up
from ._store_base import StoreBase

log = logging.getLogger("cachedb.live")
_VARIANT_NAME = operator.itemgetter(0)
#: FX graph keys whose factors a process holds at most, waiting for their entries.
_PENDING_FACTORS = 256


class GuardedEntries(StoreBase):
    """FX graph and AOTAutograd entries of :class:`~cachedb.live._store.LiveStore`."""

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
        there is one, with the time of the call (what a later write compares against). Never
        raises (one warning)."""
        keep = int(settings.value_or_default("CACHEDB_MISS_LOG"))
        if keep <= 0:
            return
        missed_at = utcnow()

        def write() -> None:
            with self.db.write() as repos:
                repos.misses.add(kind, key, outcome, factors, reason=reason, keep=keep, missed_at=missed_at)

        def job() -> None:
            self.safely("miss record", None, write)

        writer = self.writer
        if writer is not None and self._known_fingerprint_id() is not None and writer.submit(
                ("miss", kind, key), 64 * len(factors), job):
            return
        job()

    def put_key_factors(self, kind: str, key: str, factors: list[Factor]) -> None:
        """Store the factors of ``kind``/``key`` (``entry_factors``) unless that key has some,
        through the write-behind queue where there is one (after the entry's own write). Never
        raises (one warning)."""
        def job() -> None:
            def write() -> None:
                with self.db.write() as repos:
                    repos.key_factors.put(kind, key, factors)

            self.safely("key factors write", None, write)

        writer = self.writer
        if writer is not None and writer.submit(("factors", kind, key), 64 * len(factors), job):
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

