"""The live store's autotune timings and LocalCache values: Inductor's ``PersistentCache``
document read lazily from the database and its changes written back."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import Any

from ..formats import local_cache_doc as doc
from ..fleet import tier_sync as sync
from ..db import Repos
from ..keys import split_inputs_key
from ..repositories import local_values as local_values_repo
from ..repositories import timings as timings_repo
from ..repositories.timings import next_position
from ._store_base import StoreBase

log = logging.getLogger("cachedb.live")


class TuningTables(StoreBase):
    """Autotune timings and LocalCache values of :class:`~cachedb.live._store.LiveStore`."""

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

    def __init__(self, store: TuningTables, system_hash: str) -> None:
        super().__init__()
        self._store = store
        self._system_hash = system_hash
        self._loaded: set[str] = set()
        self.served: dict[str, Any] = {}

    @property
    def store(self) -> TuningTables:
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

    def __init__(self, store: TuningTables, system_hash: str, op: str) -> None:
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
