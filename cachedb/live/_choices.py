"""Every autotune choice described: its name, description and ``info_dict()`` beside its hash.

A timing names its choice by ``ChoiceCaller.hash_key()`` alone, and Inductor's timings
document keeps nothing else. What makes a tuning history readable (a Triton template's tile
shape, stages and warps, an extern kernel's name, the backend) torch holds only while it tunes,
on the ``ChoiceCaller`` objects it hands ``PersistentCache.lookup``
(torch/_inductor/codecache.py). ``AlgorithmSelectorCache`` (torch/_inductor/select_algorithm.py)
inherits that method and calls it with the choices it tunes (``do_autotuning``: the
prescreening candidates, then every choice; ``make_precompile_fn``: every choice, before
precompiling), and ``PersistentCache.lookup`` reads and records their timings through the
``CacheBase`` seams (:mod:`cachedb.live._seams`).

:func:`patches` wraps ``PersistentCache.lookup``: torch's own runs first, arguments passed
through by name, then :class:`ChoiceLog` takes each choice's ``name``, ``description`` and
``info_dict()`` (``TritonTemplateCaller.info_dict``: backend, ``tile_shape``, ``num_stages``,
``num_warps``, ``GROUP_M``, ...; ``ExternKernelCaller.info_dict``: backend ``extern``,
``kernel_call_name``; ``CppTemplateCaller.info_dict``, codegen/cpp_template_kernel.py: backend
``CPP``; ``CUTLASSTemplateCaller.info_dict``, codegen/cutlass/kernel.py: backend ``CUDA``, its
op's tile shape and schedules) into a row of ``autotune_choices``
(:func:`cachedb.repositories.choices.describe`).

- **Once per choice hash per process**: a set of the hashes this process described (or found
  it cannot: an object without a ``name``); a lookup whose choices are all in it costs a
  ``hash_key()`` and a set lookup per choice, nothing more.
- **With the timings, or read first**: the descriptions of a lookup that records timings are
  made as the timings are written and added in their own transaction
  (``LiveStore.hold_choices``: no write of their own). A lookup that records nothing (a hit)
  reads which of its new hashes are described (one indexed query on the kept connection):
  a warm start from a database its tuning filled describes nothing and writes nothing. Only
  the others (timings imported from files, or tuned by a process without this seam) are
  described and written, by the live store's write-behind thread (:mod:`cachedb.live._writer`;
  before the lookup returns where there is none, or in a compile worker), once per database.
  A description stored stays (a hash names one kernel). Either way the rows reach the remote
  tier, if any: with the timings' entry, or as their own (:func:`cachedb.fleet.tier_sync.choices`).
- **Never breaks a compile**: a choice torch cannot describe is stored with what it gives
  (``info_dict()`` failing: ``{}``); any other failure is one warning per process
  (``LiveStore.warn_once``) and the tuning goes on as torch's own. Nothing is unpickled.

``PersistentCache.lookup`` takes ``(self, choices, op, inputs, benchmark, hint_override=None)``
in torch 2.13 (and in the newer source of pytorch/pytorch checked); a lookup with other
parameters is refused at install (:func:`patches` raises ``AttributeError``, which
:mod:`cachedb.live._seams` turns into ``SeamMissingError``), one without ``hint_override`` is
called without it.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..fleet import tier_sync as sync
from ..repositories import choices as choices_repo

from . import _misses
from ._store import HeldChoices

if TYPE_CHECKING:
    from ._store import LiveStore

log = logging.getLogger("cachedb.live")

#: The module of ``PersistentCache``.
MODULE = "torch._inductor.codecache"
#: ``PersistentCache.lookup``'s parameters, and the one it may have after them.
PARAMETERS = ("self", "choices", "op", "inputs", "benchmark")
OPTIONAL = ("hint_override",)

#: The write-behind key of the description writes (no lookup ever waits for it).
_WRITER_KEY = ("autotune_choices",)


def describe_choice(choice: Any, choice_hash: str) -> dict[str, Any] | None:
    """The ``autotune_choices`` row of ``choice`` (a ``ChoiceCaller``, torch/_inductor/ir.py,
    or a wrapper forwarding its attributes, as ``DataProcessorChoiceCallerWrapper`` does), or
    ``None`` for an object without a ``name`` (nothing to say of it). ``info_dict()`` failing
    or holding what JSON cannot (keys that are not strings) counts as ``{}``; a template's
    benchmark request's ``kernel_name`` (``TritonBenchmarkRequest``, autotune_process.py) is
    the kernel name where ``info_dict()`` names none."""
    name = getattr(choice, "name", None)
    if not isinstance(name, str) or not name:
        return None
    description = getattr(choice, "description", None)
    description = description if isinstance(description, str) else None
    try:
        info = choice.info_dict()
        if not isinstance(info, Mapping):
            info = {}
    except Exception as exc:  # e.g. a ROCm choice without its op: described without it
        log.debug("cachedb: info_dict() of %s failed: %s", name, exc)
        info = {}
    kernel = getattr(getattr(choice, "bmreq", None), "kernel_name", None)
    kernel = kernel if isinstance(kernel, str) else None
    try:
        return choices_repo.describe(choice_hash, name, description, info, kernel_name=kernel)
    except (TypeError, ValueError) as exc:
        log.debug("cachedb: info_dict() of %s is not JSON: %s", name, exc)
        return choices_repo.describe(choice_hash, name, description, {}, kernel_name=kernel)


class ChoiceLog:
    """The choices one live store has described in this process, and their writes.

    ``counts`` (a :class:`~collections.Counter`): ``described`` (rows made), ``undescribed``
    (objects without a name), ``written`` (rows the database did not have), ``known`` (hashes
    a hit found described already)."""

    def __init__(self, store: LiveStore) -> None:
        self.store = store
        #: the hashes this process described, or found it cannot
        self.seen: set[str] = set()
        self.counts: Counter[str] = Counter()

    def unseen(self, choices: Iterable[Any]) -> list[tuple[str, Any]]:
        """``(hash, choice)`` of the choices whose hash this process has not seen (a
        ``hash_key()`` and a set lookup per choice). Never raises: a failure is one warning
        per process, and none."""
        if self.store.closed:
            return []
        try:
            seen = self.seen
            fresh: dict[str, Any] = {}
            for choice in choices:
                choice_hash = choice.hash_key()
                if choice_hash not in seen:
                    fresh.setdefault(choice_hash, choice)
            return list(fresh.items())
        except Exception as exc:  # the tuning goes on as torch's own
            self.store.warn_once("describing autotune choices", exc)
            return []

    def describe(self, fresh: list[tuple[str, Any]]) -> list[dict[str, Any]]:
        """The rows of ``fresh`` (:meth:`unseen`), whose hashes are then seen; an object
        torch gives no name is left out (seen too). Never raises."""
        rows = []
        try:
            for choice_hash, choice in fresh:
                self.seen.add(choice_hash)
                row = describe_choice(choice, choice_hash)
                if row is None:
                    self.counts["undescribed"] += 1
                else:
                    self.counts["described"] += 1
                    rows.append(row)
        except Exception as exc:
            self.store.warn_once("describing autotune choices", exc)
        return rows

    def finish(self, held: HeldChoices, fresh: list[tuple[str, Any]]) -> None:
        """After the lookup of the choices ``fresh`` (:meth:`unseen`): where its timings were
        written, their transaction held the descriptions (counted); else (a hit) the stored
        hashes among them are read (one indexed query on the kept connection) and only the
        others are described and written (:meth:`write`, on the write-behind thread where
        there is one). Never raises."""
        store = self.store
        if held.written:
            self.counts["written"] += held.added
            return
        if store.closed:
            return
        hashes = [h for h, _ in fresh]

        def read() -> set[str]:
            db = store.db
            stmt = choices_repo.stored_statement(db.engine.dialect.name)
            if stmt is None:
                with db.lookup() as repos:
                    return repos.choices.stored(hashes)
            return {h for (h,) in db.kept.fetch(stmt, choices_repo.stored_params(db.engine.dialect.name, hashes))}

        have = store.safely("autotune choice lookup", None, read)
        if have is None:  # the database cannot be read: nothing to add to it now
            self.seen.update(hashes)
            return
        self.counts["known"] += len(have)
        self.seen.update(have)
        rows = self.describe([(h, c) for h, c in fresh if h not in have])
        if not rows:
            return
        writer = store.writer
        job = functools.partial(self.write, rows)
        if writer is None or not writer.submit(_WRITER_KEY, sum(len(r["info_json"]) for r in rows), job):
            job()

    def write(self, rows: list[dict[str, Any]]) -> None:
        """Store the ``rows`` (those another writer has not added meanwhile) in one write
        transaction, then queue them for the remote tier. Never raises."""
        store = self.store

        def write() -> list[str]:
            with store.db.write() as repos:
                added = repos.choices.put_new(rows)
            self.counts["written"] += added
            log.debug("cachedb: %d autotune choice(s) described", added)
            return [r["choice_hash"] for r in rows]

        written = store.safely("autotune choice write", [], write)
        if written:
            store.push(sync.choices(written))


def _checked_lookup(cache: type) -> tuple[Callable[..., Any], bool]:
    """``PersistentCache.lookup`` and whether it takes ``hint_override``, checked to have the
    parameters :data:`PARAMETERS` (then :data:`OPTIONAL`). Raises ``AttributeError`` naming what
    differs."""
    original = getattr(cache, "lookup", None)
    if original is None or not callable(original):
        raise AttributeError(f"{MODULE}.PersistentCache.lookup")
    try:
        names = tuple(inspect.signature(original).parameters)
    except (TypeError, ValueError) as exc:
        raise AttributeError(f"{MODULE}.PersistentCache.lookup has no signature ({exc})") from exc
    if names[:len(PARAMETERS)] != PARAMETERS or names[len(PARAMETERS):] not in ((), OPTIONAL):
        raise AttributeError(f"{MODULE}.PersistentCache.lookup takes ({', '.join(names)}), "
                             f"not ({', '.join(PARAMETERS + OPTIONAL)})")
    return original, bool(names[len(PARAMETERS):])


def patches(store: LiveStore | Callable[[], LiveStore | None],
            codecache: Any) -> list[tuple[Any, str, Callable[..., Any]]]:
    """``(owner, attribute, replacement)``: ``PersistentCache.lookup`` of ``codecache`` (the
    imported ``torch._inductor.codecache``), which then describes the choices it was given
    (:class:`ChoiceLog`, one per store) along with torch's own lookup. ``store``: the live
    store, or a function giving the one that serves at each call (``None``: none does, torch's
    lookup alone runs). The replacement's ``choice_log_for(store)`` gives a store's
    :class:`ChoiceLog`. Raises ``AttributeError`` naming what this torch lacks or has
    otherwise."""
    cache = getattr(codecache, "PersistentCache", None)
    if not isinstance(cache, type):
        raise AttributeError(f"{MODULE}.PersistentCache")
    original, takes_hint = _checked_lookup(cache)
    store_now: Callable[[], LiveStore | None] = store if callable(store) else (lambda: store)  # type: ignore[assignment]
    def choice_log_for(live: LiveStore) -> ChoiceLog:
        found = live.choice_log
        if found is None:  # kept on the store: it goes with it (a fresh_cache block's, say)
            found = live.choice_log = ChoiceLog(live)
        return found  # type: ignore[no-any-return]

    def described_lookup(call: Callable[[], Any], choices: list[Any]) -> Any:
        live = store_now()
        if live is None:  # no store serves now: torch's lookup on its files
            return call()
        described = choice_log_for(live)
        fresh = described.unseen(choices)
        if not fresh:  # every choice seen in this process: torch's lookup alone
            return call()
        held = HeldChoices(functools.partial(described.describe, fresh))
        with live.hold_choices(held):  # described and written with the timings it records, if any
            timings = call()
        described.finish(held, fresh)
        return timings

    def noted(cache: Any, op: str, inputs: str, hint_override: int | None, benchmark: Any) -> Any:
        """``benchmark``, which records the miss when torch calls it (a lookup that hits does not)."""
        live = store_now()
        if live is None or benchmark is None:
            return benchmark
        return _misses.noting_timing_miss(live, cache, op, inputs, hint_override, benchmark)

    if takes_hint:
        def lookup(self: Any, choices: list[Any], op: str, inputs: str, benchmark: Any,
                   hint_override: int | None = None) -> Any:
            """``PersistentCache.lookup`` (torch/_inductor/codecache.py), the choices described
            (:class:`ChoiceLog`) and written with the timings it records, else after it; a
            miss (torch benchmarks) recorded with its factors."""
            benchmark = noted(self, op, inputs, hint_override, benchmark)
            return described_lookup(lambda: original(self, choices=choices, op=op, inputs=inputs, benchmark=benchmark,
                                                     hint_override=hint_override), choices)
    else:
        def lookup(self: Any, choices: list[Any], op: str, inputs: str, benchmark: Any) -> Any:  # type: ignore[misc]
            """``PersistentCache.lookup`` (torch/_inductor/codecache.py), the choices described
            (:class:`ChoiceLog`) and written with the timings it records, else after it; a
            miss (torch benchmarks) recorded with its factors."""
            benchmark = noted(self, op, inputs, None, benchmark)
            return described_lookup(lambda: original(self, choices=choices, op=op, inputs=inputs, benchmark=benchmark),
                                    choices)

    lookup.__wrapped__ = original  # type: ignore[attr-defined]
    lookup.choice_log_for = choice_log_for  # type: ignore[attr-defined]
    return [(cache, "lookup", lookup)]
