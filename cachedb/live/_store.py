"""What the live seams call: database reads and writes that never break a compile.

Every public method of :class:`LiveStore` catches its own failures (a database that cannot be
opened, a lock held past the timeout, a corrupt payload, ...), logs one warning per kind of
failure per process, and answers as a miss (reads) or drops the write.

:class:`LiveStore` joins one part per kind of cache, each in its own module over the shared
:class:`~cachedb.live._store_base.StoreBase`: FX graph and AOTAutograd entries
(:mod:`._store_guarded`), autotune timings and LocalCache values (:mod:`._store_tuning`), best
configs (:mod:`._store_best_configs`), Dynamo's caches (:mod:`._store_dynamo`); the CUTLASS
op lists and clearing a kind are here.
"""

from __future__ import annotations

import logging

from ..fleet import tier_sync as sync
from ..store.tables import GUARDED_KINDS
from ._store_base import DEFAULT_LIVE_TIMEOUT_S, StoreBase, _Unavailable
from ._store_best_configs import BestConfigs
from ._store_dynamo import DynamoCaches
from ._store_guarded import GuardedEntries
from ._store_tuning import HeldChoices, LazyLocalCache, LazyOpTimings, TuningTables

__all__ = ["DEFAULT_LIVE_TIMEOUT_S", "HeldChoices", "LazyLocalCache", "LazyOpTimings", "LiveStore",
           "StoreBase", "_Unavailable"]

log = logging.getLogger("cachedb.live")


class LiveStore(GuardedEntries, TuningTables, BestConfigs, DynamoCaches):
    """The database behind the seams of one process (opened lazily, on first use).

    ``remote``: a shared database behind this one (:mod:`cachedb.live._remote`): a local miss
    is looked up there and copied here, and what is written here is copied there.

    ``write_behind`` (default: ``$CACHEDB_WRITE_BEHIND``, on unless ``0``): FX graph and
    AOTAutograd puts are queued and written by a background thread
    (:mod:`cachedb.live._writer`; a lookup of a queued key waits for it; :meth:`flush` waits
    for all); off, each put is written before it returns.
    """

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

    # -- CUTLASS op lists --------------------------------------------------------------------

    def cutlass_get(self, request_key: str) -> bytes | None:
        def read() -> bytes | None:
            with self.db.lookup() as repos:
                return repos.cutlass.get(request_key)

        found = self.safely("CUTLASS op list lookup", None, read)
        if found is None and self.pull(sync.cutlass(request_key)):
            found = self.safely("CUTLASS op list lookup", None, read)
        return found
