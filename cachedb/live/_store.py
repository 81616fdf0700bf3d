"""What the live seams call: database reads and writes that never break a compile.

Every public method of :class:`LiveStore` catches its own failures (a database that cannot be
opened, a lock held past the timeout, a corrupt payload, ...), logs one warning per kind of
failure per process, and answers as a miss (reads) or drops the write.
"""

from __future__ import annotations

import atexit
import copy
import datetime as dt
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from .. import _local_cache_doc as doc
from .._errors import CorruptPayloadError
from .._trust import untrusted_reason
from ..db import CacheDB, Repos
from ..models import utcnow
from ..fingerprint import current as current_fingerprint
from ..repositories.local_values import current_for_namespace
from ..repositories.timings import current_for_op, next_position

log = logging.getLogger("cachedb.live")
T = TypeVar("T")

#: Seconds a live lookup or write waits on a locked database before it counts as a miss.
DEFAULT_LIVE_TIMEOUT_S = 10.0


class _Unavailable(Exception):
    """The database could not be opened; already warned about, every call is a miss."""


class LiveStore:
    """The database behind the seams of one process (opened lazily, on first use)."""

    def __init__(self, location: str, *, timeout_s: float = DEFAULT_LIVE_TIMEOUT_S, trust: bool = False) -> None:
        self.location = location
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

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def db(self) -> CacheDB:
        """The database, opened on first use. If opening fails, that is warned about once
        and the store stays unavailable for the rest of the process (every call a miss)."""
        with self._lock:
            if self._db is None:
                if self._open_failed:
                    raise _Unavailable()
                try:
                    self._db = CacheDB(self.location, busy_timeout_s=self.timeout_s)
                except Exception as exc:
                    self._open_failed = True
                    self.warn_once("opening the database", exc)
                    raise _Unavailable() from exc
                reason = None if self.trust or self._db.path is None else untrusted_reason(self._db.path)
                if reason is not None:
                    self.pickles_refused = reason
                    log.warning(
                        "cachedb: not loading pickled FX graph/AOTAutograd entries from %s: %s "
                        "(set CACHEDB_TRUST=1 or install(trust=True) to trust it)", self.location, reason,
                    )
            return self._db

    def close(self) -> None:
        self.flush_hits()
        with self._lock:
            self.closed = True
            if self._db is not None:
                self._db.close()
                self._db = None

    def warn_once(self, what: str, exc: BaseException) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning(
                "cachedb: %s failed (%s: %s); Inductor carries on as on a cache miss "
                "(further %s failures in this process are not logged)",
                what, type(exc).__name__, exc, what,
            )

    def safely(self, what: str, default: T, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except _Unavailable:
            return default
        except Exception as exc:  # the cache must never break a compile
            self.warn_once(what, exc)
            return default

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
        A corrupt payload is skipped with a warning."""

        def read() -> list[tuple[str, bytes]]:
            out = []
            corrupt: list[tuple[str, str]] = []
            db = self.db
            if self.pickles_refused is not None:
                return []
            with db.lookup() as repos:
                for variant, load in repos.guarded.raw_candidates(kind, key):
                    try:
                        out.append((variant, load()))
                    except CorruptPayloadError as exc:
                        self.warn_once(f"{kind} payload check", exc)
                        corrupt.append((variant, exc.reason))
            if corrupt:
                self._quarantine(kind, key, corrupt)
            return out

        found = self.safely(f"{kind} lookup", [], read)
        log.debug("%s lookup %s: %d variant(s)", kind, key, len(found))
        return iter(found)

    def _quarantine(self, kind: str, key: str, corrupt: list[tuple[str, str]]) -> None:
        """Move corrupt variants aside (kept for ``cachedb verify``) and count the misses in
        ``counters["inductor"]["cachedb_corrupt_payload"]``."""
        try:
            from torch._dynamo.utils import counters

            counters["inductor"]["cachedb_corrupt_payload"] += len(corrupt)
        except ImportError:
            pass

        def write() -> None:
            with self.db.transaction() as repos:
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
        if hits:
            repos.guarded.record_hits(hits)

    def flush_hits(self) -> None:
        """Write the pending hit counts and last-used times (at exit, or explicitly)."""
        if not self._hits or self.closed and self._db is None:
            return

        def write() -> None:
            with self.db.transaction() as repos:
                self._take_hits(repos)

        self.safely("hit count write", None, write)

    def guarded_put(self, kind: str, key: str, content: bytes) -> None:
        def write() -> None:
            with self.db.transaction() as repos:
                repos.guarded.put_pickled(kind, key, content, fingerprint_id=self._fingerprint_id(repos))
                self._take_hits(repos)
            log.debug("%s write %s", kind, key)

        self.safely(f"{kind} write", None, write)

    # -- autotune timings and LocalCache values ----------------------------------------------

    def local_cache(self, system_hash: str) -> LazyLocalCache:
        return LazyLocalCache(self, system_hash)

    def load_top_level(self, system_hash: str, key: str) -> tuple[bool, Any]:
        """``(found, value)`` of ``cache[key]`` for ``system_hash`` (timings or a value)."""

        def read() -> tuple[bool, Any]:
            with self.db.lookup() as repos:
                fp_ids = repos.fingerprints.ids_for_system_hash(system_hash)
                if not fp_ids:
                    return False, None
                timings = current_for_op(repos.session, fp_ids, key)
                if timings:
                    return True, timings
                return current_for_namespace(repos.session, fp_ids, key)

        found = self.safely("autotune/LocalCache lookup", (False, None), read)
        log.debug("local cache lookup %s (system %s): %s", key, system_hash[:8], "hit" if found[0] else "miss")
        return found

    def write_changes(self, cache: dict[str, Any], served: dict[str, Any]) -> None:
        """Write the leaves of ``cache`` that differ from what was ``served``: new timings
        become new rows (history), other values are upserted. Leaves another process wrote in
        the meantime are untouched, so no process loses another's updates."""

        def write() -> None:
            changed = {k: v for k, v in cache.items() if k not in served or served[k] != v}
            if not changed:
                return
            new_t, new_v = doc.split_cache(changed)
            old_t, old_v = doc.split_cache({k: served[k] for k in changed if k in served})
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
            with self.db.transaction() as repos:
                fp_id = self._fingerprint_id(repos)
                start = next_position(repos.session)
                groups: dict[tuple[str, str, int | None, str], dict[str, float]] = {}
                for t in timings:
                    groups.setdefault((t.op, t.inputs, t.hint_override, t.precision), {})[t.choice_hash] = t.timing_ms
                for (op, inputs, hint, precision), per_choice in groups.items():
                    repos.timings.record(fp_id, op, inputs, precision, per_choice, hint_override=hint)
                if values:
                    repos.local_values.add_leaves(
                        fp_id, [doc.ValueLeaf(v.key_path, v.value, start + i) for i, v in enumerate(values)]
                    )

        self.safely("autotune/LocalCache write", None, write)

    # -- best configs ------------------------------------------------------------------------

    def best_config_get(self, key: str) -> bytes | None:
        def read() -> bytes | None:
            with self.db.lookup() as repos:
                content = repos.best_configs.get(key)
            return None if content is None else content.encode("utf-8")

        found = self.safely("best config lookup", None, read)
        log.debug("best config lookup %s: %s", key, "hit" if found is not None else "miss")
        return found

    def best_config_put(self, key: str, data: bytes) -> None:
        def write() -> None:
            with self.db.transaction() as repos:
                repos.best_configs.put(key, data.decode("utf-8"), fingerprint_id=self._fingerprint_id(repos))
            log.debug("best config write %s", key)

        self.safely("best config write", None, write)

    # -- CUTLASS op lists --------------------------------------------------------------------

    def cutlass_get(self, request_key: str) -> bytes | None:
        def read() -> bytes | None:
            with self.db.lookup() as repos:
                return repos.cutlass.get(request_key)

        return self.safely("CUTLASS op list lookup", None, read)


class LazyLocalCache(dict):  # type: ignore[type-arg]
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

    def _ensure(self, key: Any) -> None:
        if not isinstance(key, str) or key in self._loaded:
            return
        self._loaded.add(key)
        found, value = self._store.load_top_level(self._system_hash, key)
        if found:
            dict.__setitem__(self, key, value)
            self.served[key] = copy.deepcopy(value)

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

    def mark_written(self) -> None:
        """After a write: what is in memory now is what the database holds for these keys."""
        self.served = {k: copy.deepcopy(v) for k, v in dict.items(self)}
