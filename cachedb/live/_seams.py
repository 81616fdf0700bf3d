"""The torch seams cachedb replaces (formats doc §5), checked before anything is patched.

=====================================================  ==========================================
seam (torch 2.9 to 2.15 unless said)                   served from
=====================================================  ==========================================
``FxGraphCache._write_to_local_cache``                  ``guarded_entries`` (kind ``fxgraph``)
``FxGraphCache.iterate_over_candidates`` (local part)   ``guarded_entries``
``AOTAutogradCache._write_to_local_cache``              ``guarded_entries`` (kind ``aotautograd``)
``AOTAutogradCache.iterate_over_candidates``            ``guarded_entries``
``FxGraphCache.prepare_key``, ``load_with_key``         ``entry_factors``, ``cache_misses``
                                                        (:mod:`cachedb.live._misses`)
``autograd_cache._get_debug_lines_for_cache_key``,      ``entry_factors``, ``cache_misses``
``AOTAutogradCache._lookup``; ``try_load`` and          (kind ``aotautograd``; a bypass
``autograd_cache_key`` (torch 2.13; left out where      without a key)
torch lacks them)
``FxGraphCache.clear``, ``AOTAutogradCache.clear``      torch's own, then the kind's rows of the
                                                        database that serves (never a remote)
``BundledOutputCodeLoadable.pre_save`` (torch >= 2.11,  ``guarded_entries``: a bundled entry whose
where torch has it)                                     forward ran before it is saved
                                                        (:mod:`cachedb.live._bundled_aot`)
``CacheBase.get_local_cache`` / ``update_local_cache``   ``autotune_timings``, ``local_cache_values``
``PersistentCache.lookup`` (the choices it is given)    ``autotune_choices``: each choice's name,
                                                        description and ``info_dict()``, once
                                                        per hash (:mod:`cachedb.live._choices`)
``LocalAutotuneCache.backend_override_cls``             ``best_configs``
(runtime/autotune_cache.py)
``AutotuneCacheArtifact.populate_cache`` (Mega-Cache)    ``best_configs``
``maybe_fetch_ops`` (codegen/cutlass/cache.py and its   ``cutlass_op_lists``
import in gemm_template.py)
``codecache._worker_compile_cpp``,                      ``kernel_artifacts`` (kind ``cpp``)
``cpp_builder.CppBuilder.build`` (C++ kernel libraries)
``codecache._precompile_header`` (put off until a       (nothing stored)
compile needs it)
Triton's ``CacheManager`` (``TRITON_CACHE_MANAGER``,     ``kernel_artifacts`` (kind ``triton``)
set by :func:`cachedb.install`; checked when Triton is
installed)
``CachingAutotuner.recheck_autotune_cache``,           ``best_configs`` (no re-tuning of stored
``CachingAutotuner._dynamic_scale_rblock``,             winners, :mod:`cachedb.live._autotune`):
``autotune_cache._load_cached_autotuning``              torch 2.13's fixes, on 2.9 to 2.12 only;
(torch < 2.13), Triton's ``Config.__setstate__``        ``Config.__setstate__`` keeps the mark on
(when Triton is installed; not with ``retune=True``)    every release
``torch._dynamo.pgo``: ``get_local_code_state``,        ``pgo_profiles`` (:mod:`cachedb.live._pgo`;
``put_local_code_state``,                               the remote PGO halves stay torch's)
``PGOCacheArtifact.populate_cache`` (Mega-Cache)
``torch._dynamo.package``: ``DiskDynamoCache.load``,     ``dynamo_packages``
``read``, ``_write_to_local_cache``, ``clear``           (:mod:`cachedb.live._precompile`)
(torch >= 2.10; files on 2.9)
``convert_frame._compile``,                            nothing stored: a function torch cannot
``DiskDynamoCache.record_package``,                    package, or whose package fails to load,
``CompilePackage.initialize``, ``install``             compiles without one
(each where torch has it)                              (:mod:`cachedb.live._precompile_fallback`)
``utils.fresh_cache`` (and every module's import of    a block's own database in its directory
it), ``cache_dir_utils.temporary_cache_dir``           / torch's own files
(and its import in standalone_compile.py)              (:mod:`cachedb.live._scopes`)
=====================================================  ==========================================

Each seam asks :func:`cachedb.live._scopes.route` which store serves it at the moment of the
call: the active one, a ``fresh_cache()`` block's, or none, and then torch's own function runs
(inside ``temporary_cache_dir()``, and while the store cannot serve).

All of them or none: :func:`build` (``cachedb.install``) raises :class:`SeamMissingError`
before anything is patched when one is missing or has another signature than the one cachedb
replaces (another torch version moved or changed it: each replaced function's parameter names
are checked, :func:`_function`); the precompile fallback's seams are each left out where torch
lacks it. The replacements call torch's functions passing arguments by name. Under
``CACHEDB_ENABLE=1`` each module of :data:`~cachedb.live._autoload.SEAM_MODULES` is patched
right after torch imports it (:func:`module_patches`, :mod:`cachedb.live._autoload`); a missing
seam then undoes the patches made so far and leaves cachedb inactive in that process.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import json
import logging
import os
import pickle
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .._errors import CacheDBError
from ._autoload import spec_from_others
from . import _best_config_misses, _bundled_aot, _choices, _misses, _pgo, _precompile, _scopes
from ._cpp_cache import wrap_build, wrap_precompile_header, wrap_worker_compile_cpp
from ._scopes import route
from ._store import LazyLocalCache, LiveStore

log = logging.getLogger("cachedb.live")

#: The seam modules (see the table above), named as in :data:`cachedb.live._autoload.SEAM_MODULES`.
CODECACHE, AOT_CACHE, AUTOTUNE_CACHE, CPP_BUILDER = (
    "torch._inductor.codecache", "torch._functorch._aot_autograd.autograd_cache",
    "torch._inductor.runtime.autotune_cache", "torch._inductor.cpp_builder",
)
TRITON_HEURISTICS = "torch._inductor.runtime.triton_heuristics"
#: Dynamo's PGO module (:mod:`cachedb.live._pgo`).
PGO = _pgo.MODULE
#: Dynamo's precompiled packages (:mod:`cachedb.live._precompile`).
PACKAGE = _precompile.MODULE
#: The cache-directory scopes (:mod:`cachedb.live._scopes`).
UTILS, CACHE_DIR_UTILS = _scopes.UTILS, _scopes.CACHE_DIR_UTILS
#: The compiles a claim is held for (:mod:`cachedb.live._singleflight`): one FX graph's
#: (``_compile_fx_inner``) and one AOTAutograd graph's (``aot_module_simplified``).
COMPILE_FX, AOT_AUTOGRAD = "torch._inductor.compile_fx", "torch._functorch.aot_autograd"

#: Where ``maybe_fetch_ops`` lives: torch >= 2.11, then 2.9/2.10.
_CUTLASS_MODULES = (
    ("torch._inductor.codegen.cutlass.cache", "torch._inductor.codegen.cutlass.gemm_template",
     "torch._inductor.codegen.cutlass.utils", "cutlass"),
    ("torch._inductor.codegen.cuda.cutlass_cache", "torch._inductor.codegen.cuda.gemm_template",
     "torch._inductor.codegen.cuda.cutlass_utils", "cuda"),
)


class SeamMissingError(CacheDBError):
    """The installed torch lacks a seam cachedb needs, or has it with another signature;
    nothing was patched."""


@dataclass
class _Patch:
    owner: Any
    name: str
    new: Any
    old: Any = None
    had_own: bool = False

    def apply(self) -> None:
        self.had_own = self.name in vars(self.owner) if isinstance(self.owner, type) else True
        self.old = vars(self.owner)[self.name] if self.had_own else None
        setattr(self.owner, self.name, self.new)

    def restore(self) -> None:
        if self.had_own:
            setattr(self.owner, self.name, self.old)
        else:
            delattr(self.owner, self.name)


def _require(module: str, *attrs: str) -> Any:
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise SeamMissingError(f"torch seam missing: cannot import {module} ({exc})") from exc
    obj: Any = mod
    for attr in attrs:
        if not hasattr(obj, attr):
            raise SeamMissingError(f"torch seam missing: {module}.{'.'.join(attrs)}")
        obj = getattr(obj, attr)
    return obj


def _function(owner: Any, name: str, params: tuple[str, ...] | tuple[tuple[str, ...], ...]) -> Any:
    """The function ``owner.name`` (that of a static or class method; found on ``owner`` or a
    base class), checked to take exactly the parameters named ``params`` (in order, ``self`` /
    ``cls`` included), or one of several such tuples (torch releases that differ). Raises
    :class:`SeamMissingError` when it is missing or takes others: cachedb never calls, nor
    stands in for, a function whose signature it does not know."""
    where = f"{getattr(owner, '__module__', '?')}.{getattr(owner, '__qualname__', getattr(owner, '__name__', '?'))}"
    if not isinstance(owner, type):
        where = getattr(owner, "__name__", where)
    try:
        raw = inspect.getattr_static(owner, name)
    except AttributeError:
        raise SeamMissingError(f"torch seam missing: {where}.{name}") from None
    fn = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    found = _scopes.parameters(fn)
    known = params if params and isinstance(params[0], tuple) else (params,)
    if found is None or found not in known:
        raise SeamMissingError(
            f"torch seam changed: {where}.{name} takes ({', '.join(found or ('?',))}), "
            f"cachedb replaces it taking {' or '.join('(' + ', '.join(p) + ')' for p in known)}"  # type: ignore[arg-type]
        )
    return fn


def _cache_dir() -> str:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()


@functools.lru_cache(maxsize=1 << 16)  # torch asks with the same path string once per kernel
def best_config_key(path: str) -> str:
    """A best config's key: the last two parts of its path, ``"<k[1:3]>/<name>.best_config"``.

    That is its path relative to the cache dir that wrote it, and the Mega-Cache artifact key
    (``LocalAutotuneCache._get``, torch/_inductor/runtime/autotune_cache.py, takes the same
    two parts). Inductor pickles the absolute path into compiled graphs, so a graph loaded in a
    process with another ``cache_dir()`` asks for the old directory's path; keying on the last
    two parts serves it from any cache dir.
    """
    parts = path.rsplit("/", 2)
    if len(parts) == 3 and "\\" not in path and parts[1] not in _NOT_NAMES and parts[2] not in _NOT_NAMES:
        return f"{parts[1]}/{parts[2]}"  # what normpath would leave of the last two parts
    parts = os.path.normpath(path).replace(os.sep, "/").split("/")
    return "/".join(parts[-2:])


#: Path parts that ``os.path.normpath`` rewrites (empty, ``.``, ``..``).
_NOT_NAMES = frozenset({"", ".", ".."})

#: The parameters of ``GuardedCache.find_guarded_entry`` and of its loop (torch/_inductor/codecache.py).
_ITERATE_PARAMETERS = ("cls", "local", "remote_cache", "key")


def _yields_in_local() -> bool:
    """Whether ``GuardedCache.iterate_over_candidates`` yields ``(candidate, content,
    in_local)`` (torch 2.11 on) or ``(candidate, content)`` (torch 2.9 and 2.10), by the
    installed torch's release; ``find_guarded_entry`` unpacks what it yields."""
    from ..keys._versions import installed_torch_version, parse_torch_version

    version = installed_torch_version()
    return version is None or parse_torch_version(version) >= (2, 11)


def _offer(served: LiveStore, kind: str, key: str, candidates: Iterator[tuple[str, bytes]], seen: set[str],
           yields_in_local: bool) -> Iterator[tuple[Any, bytes, bool] | tuple[Any, bytes]]:
    """What ``GuardedCache.iterate_over_candidates`` yields for the stored ``candidates``
    (``(variant, pickle bytes)``) not in ``seen`` (each added to it): the unpickled entry, its
    bytes and (torch 2.11 on) ``in_local``; the one whose guards hold is counted as a hit."""
    for variant, content in candidates:
        if variant in seen:
            continue
        seen.add(variant)
        try:
            entry = pickle.loads(content)
        except Exception as exc:  # same policy as Inductor's own loop
            served.warn_once(f"{kind} unpickle", exc)
            continue
        try:
            yield (entry, content, True) if yields_in_local else (entry, content)
        except GeneratorExit:
            # find_guarded_entry stops iterating at the candidate whose guards hold.
            served.note_hit(kind, key, variant)
            raise


def _guarded_seams(store: LiveStore, cls: type, kind: str) -> list[_Patch]:
    """``_write_to_local_cache``, ``iterate_over_candidates`` and ``clear`` of
    ``FxGraphCache`` or ``AOTAutogradCache`` (``cls``); the remote part of the loop stays
    ``GuardedCache``'s."""
    original_write = _function(cls, "_write_to_local_cache", ("key", "content"))
    original_clear = _function(cls, "clear", ())
    # GuardedCache's own loop (torch/_inductor/codecache.py), found through the class itself:
    # the AOTAutograd cache module may finish importing while codecache is still running.
    base_iterate = _function(cls, "iterate_over_candidates", _ITERATE_PARAMETERS)
    _function(cls, "find_guarded_entry", ("cls", "key", "local", "remote_cache", "evaluate_guards", "hints"))
    yields_in_local = _yields_in_local()

    def write_to_local_cache(key: str, content: bytes) -> None:
        served = route(store)
        if served is None:
            return original_write(key=key, content=content)
        served.guarded_put(kind, key, content)
        return None

    def iterate_over_candidates(
        klass: type, local: bool, remote_cache: Any, key: str
    ) -> Iterator[tuple[Any, bytes, bool] | tuple[Any, bytes]]:
        served = route(store) if local else None
        if local and served is None:  # torch's files serve
            yield from base_iterate(klass, local=local, remote_cache=remote_cache, key=key)
            return
        if served is not None:
            seen: set[str] = set()
            yield from _offer(served, kind, key, served.guarded_candidates(kind, key), seen, yields_in_local)
        if remote_cache:
            yield from base_iterate(klass, local=False, remote_cache=remote_cache, key=key)
        # No stored variant held: torch compiles next, unless another process is compiling this
        # key (:mod:`cachedb.live._singleflight`): then what it stored, through the same checks.
        if served is not None and served.on_compile_miss(kind, key, seen):
            yield from _offer(served, kind, key, served.guarded_candidates(kind, key), seen, yields_in_local)

    def clear() -> None:
        """``clear()`` (torch/_inductor/codecache.py ``FxGraphCache.clear``,
        torch/_functorch/_aot_autograd/autograd_cache.py ``AOTAutogradCache.clear``): torch's
        own, then every entry of this kind in the database that serves now (a remote tier is
        never cleared)."""
        original_clear()
        served = route(store)
        if served is not None:
            served.clear_kind(kind)

    return [
        _Patch(cls, "_write_to_local_cache", staticmethod(write_to_local_cache)),
        _Patch(cls, "iterate_over_candidates", classmethod(iterate_over_candidates)),
        _Patch(cls, "clear", staticmethod(clear)),
    ]


def _miss_seams(store: LiveStore, cls: type) -> list[_Patch]:
    """``FxGraphCache.prepare_key`` and ``load_with_key``: the key factors and the miss log
    (:mod:`cachedb.live._misses`). Left out where torch has them with other parameters: no
    factors nor misses are recorded then, and everything else is served as before."""
    try:
        prepare = _function(cls, "prepare_key", _misses.PREPARE_KEY_PARAMETERS)
        load = _function(cls, "load_with_key", _misses.LOAD_WITH_KEY_PARAMETERS)
    except SeamMissingError as exc:
        log.debug("cachedb: misses not recorded: %s", exc)
        return []
    return [
        _Patch(cls, "prepare_key", staticmethod(_misses.wrap_prepare_key(store, prepare))),
        _Patch(cls, "load_with_key", staticmethod(_misses.wrap_load_with_key(store, load))),
    ]


def _aot_miss_seams(store: LiveStore, module: Any, cls: type) -> list[_Patch]:
    """``autograd_cache._get_debug_lines_for_cache_key`` and ``AOTAutogradCache._lookup``: the
    AOTAutograd key factors and misses; ``AOTAutogradCache.try_load`` and
    ``autograd_cache.autograd_cache_key``: its bypasses (:mod:`cachedb.live._misses`). Each pair
    is left out where torch lacks it or has it with other parameters: nothing of it is recorded
    then, and everything else is served as before."""
    try:
        lines = _function(module, "_get_debug_lines_for_cache_key", _misses.AOT_DEBUG_LINES_PARAMETERS)
        lookup = _function(cls, "_lookup", _misses.AOT_LOOKUP_PARAMETERS)
    except SeamMissingError as exc:
        log.debug("cachedb: AOTAutograd misses not recorded: %s", exc)
        return []
    patches = [
        _Patch(module, "_get_debug_lines_for_cache_key", _misses.wrap_aot_debug_lines(store, lines)),
        _Patch(cls, "_lookup", staticmethod(_misses.wrap_aot_lookup(store, lookup))),
    ]
    try:  # bypasses: where torch has both with these parameters
        try_load = _function(cls, "try_load", _misses.AOT_TRY_LOAD_PARAMETERS)
        cache_key = _function(module, "autograd_cache_key", _misses.AOT_CACHE_KEY_PARAMETERS)
    except SeamMissingError as exc:
        log.debug("cachedb: AOTAutograd bypasses not recorded: %s", exc)
        return patches
    return patches + [
        _Patch(cls, "try_load", staticmethod(_misses.wrap_aot_try_load(try_load))),
        _Patch(module, "autograd_cache_key", _misses.wrap_aot_cache_key(store, cache_key)),
    ]


def _choices_seams(store: LiveStore) -> list[_Patch]:
    try:
        return [_Patch(owner, name, new) for owner, name, new in
                _choices.patches(lambda: route(store), _require(CODECACHE))]
    except AttributeError as exc:
        raise SeamMissingError(f"torch seam missing: {exc}") from exc


def _local_cache_seams(store: LiveStore) -> list[_Patch]:
    CacheBase = _require(CODECACHE, "CacheBase")
    original_get = _function(CacheBase, "get_local_cache", ("self",))
    original_update = _function(CacheBase, "update_local_cache", ("self", "local_cache"))

    def get_local_cache(self: Any) -> dict[str, Any]:
        served = route(store)
        if served is None:
            return original_get(self)  # type: ignore[no-any-return]
        return served.local_cache(CacheBase.get_system()["hash"])

    def update_local_cache(self: Any, local_cache: dict[str, Any]) -> None:
        if isinstance(local_cache, LazyLocalCache):  # written where it was read from
            local_cache.store.write_changes(local_cache, local_cache.served)
            local_cache.mark_written()
        else:  # read from torch's file: written back there
            original_update(self, local_cache=local_cache)

    return [
        _Patch(CacheBase, "get_local_cache", get_local_cache),
        _Patch(CacheBase, "update_local_cache", update_local_cache),
    ]


_ACTIVE_STORE: Callable[[], LiveStore | None] | None = None


def _active_store() -> LiveStore | None:
    """The store that serves now: the active store (activating a deferred activation first:
    ``cachedb.live._active_or_deferred``, looked up once, since an import statement per call
    costs a best-config get about 1 us), routed (:func:`cachedb.live._scopes.route`)."""
    global _ACTIVE_STORE
    if _ACTIVE_STORE is None:
        from . import _active_or_deferred

        _ACTIVE_STORE = _active_or_deferred
    active = _ACTIVE_STORE()
    return route(active) if active is not None else None


@functools.cache
def _best_config_backend_class(base: type) -> type:
    """``LocalAutotuneCache``'s backend (keys are absolute ``.best_config`` paths).

    A module-level class: Inductor pickles autotune caches into compile workers, so it must
    be importable there. It serves from the store that serves now; where none does (cachedb
    not active, torch's files serving) it reads and writes the file, as torch's own backend
    does.
    """

    class CacheDBBestConfigBackend(base):  # type: ignore[misc, valid-type]
        def _get(self, key: str) -> bytes | None:
            store = _active_store()
            if store is None:
                try:
                    with open(key, "rb") as f:
                        return f.read()
                except FileNotFoundError:
                    return None
            return store.best_config_get(best_config_key(key))

        def _put(self, key: str, data: bytes) -> None:
            store = _active_store()
            if store is None:
                from torch._inductor.codecache import write_atomic

                write_atomic(key, data, make_dirs=True)
                return
            store.best_config_put(best_config_key(key), data)

    CacheDBBestConfigBackend.__module__ = __name__
    CacheDBBestConfigBackend.__qualname__ = "CacheDBBestConfigBackend"
    return CacheDBBestConfigBackend


def __getattr__(name: str) -> Any:
    """``pickle`` finds the backend class by name (it subclasses a torch class, so it is
    created on first use rather than at import)."""
    if name == "CacheDBBestConfigBackend":
        RemoteCacheBackend = _require("torch._inductor.remote_cache", "RemoteCacheBackend")
        return _best_config_backend_class(RemoteCacheBackend)
    raise AttributeError(name)


def _best_config_seams(store: LiveStore) -> list[_Patch]:
    # torch 2.13 defines it in remote_cache.py, 2.11 in runtime/autotune_cache.py; the
    # latter module has the name in both.
    LocalAutotuneCache = _require(AUTOTUNE_CACHE, "LocalAutotuneCache")
    _require(AUTOTUNE_CACHE, "LocalAutotuneCache", "backend_override_cls")
    RemoteCacheBackend = _require("torch._inductor.remote_cache", "RemoteCacheBackend")
    _function(RemoteCacheBackend, "_get", ("self", "key"))
    _function(RemoteCacheBackend, "_put", ("self", "key", "data"))
    AutotuneCacheArtifact = _require(AUTOTUNE_CACHE, "AutotuneCacheArtifact")
    original_populate = _function(AutotuneCacheArtifact, "populate_cache", ("self",))

    def populate_cache(self: Any) -> None:
        served = route(store)
        if served is None:
            return original_populate(self)  # type: ignore[no-any-return]
        content = self.content if isinstance(self.content, bytes) else bytes(self.content)
        served.best_config_put(self.key, content)
        return None

    return [
        _Patch(LocalAutotuneCache, "backend_override_cls", _best_config_backend_class(RemoteCacheBackend)),
        _Patch(AutotuneCacheArtifact, "populate_cache", populate_cache),
    ]


def _best_config_miss_seams(store: LiveStore) -> list[_Patch]:
    """``AutotuneCache.create``, ``read_best`` and ``save`` (:mod:`cachedb.live._best_config_misses`),
    where this torch has them with these parameters; else best config misses are not recorded."""
    try:
        cls = _require(AUTOTUNE_CACHE, "AutotuneCache")
        create = _function(cls, "create", ("inductor_meta", "filename", "configs_hash"))
        read_best = _function(cls, "read_best", ("self", "inductor_meta", "configs"))
        save = _function(cls, "save", ("self", "config", "time_taken_ns", "found_by_coordesc", "triton_cache_hash"))
    except SeamMissingError as exc:
        log.debug("cachedb: best config misses not recorded: %s", exc)
        return []
    return [
        _Patch(cls, "create", staticmethod(_best_config_misses.wrap_create(store, create))),
        _Patch(cls, "read_best", _best_config_misses.wrap_read_best(store, read_best, best_config_key)),
        _Patch(cls, "save", _best_config_misses.wrap_save(store, save, best_config_key)),
    ]


class _AfterImport:
    """A one-shot ``sys.meta_path`` finder: runs ``callback(module)`` right after the module
    ``name`` is executed by its own loader (found by the other finders)."""

    def __init__(self, name: str, callback: Callable[[Any], None]) -> None:
        self.name = name
        self.callback = callback

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        spec = spec_from_others(self, fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, callback = spec.loader, self.callback
        exec_module = loader.exec_module

        def exec_then_patch(module: Any) -> None:
            exec_module(module)
            callback(module)

        loader.exec_module = exec_then_patch  # this module's loader instance only
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        return spec


class _DeferredPatches:
    """Patches of a module that is not imported yet: applied when it is imported (so that
    ``install`` does not import it: the CUTLASS modules pull in much of Inductor)."""

    def __init__(self, name: str, make: Callable[[Any], list[_Patch]]) -> None:
        self.name = name
        self.make = make
        self.patches: list[_Patch] = []
        self.finder: _AfterImport | None = None

    def apply(self) -> None:
        self.finder = _AfterImport(self.name, self._on_import)
        sys.meta_path.insert(0, self.finder)

    def _on_import(self, module: Any) -> None:
        try:
            patches = self.make(module)
            apply(patches)
            self.patches = patches
        except Exception as exc:  # noqa: BLE001 - never break the user's import
            log.warning("cachedb: %s imported without cachedb's seam: %s", self.name, exc)

    def restore(self) -> None:
        if self.finder is not None and self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)
        restore(self.patches)
        self.patches = []


def _cutlass_seams(store: LiveStore) -> list[Any]:
    """The CUTLASS op-list seam: patched now if torch imported the module already, else
    when it is imported (checked to exist now, without importing it)."""
    for cache_mod, gemm_mod, utils_mod, config_ns in _CUTLASS_MODULES:
        module = sys.modules.get(cache_mod)
        if module is not None:
            return _cutlass_patches(store, module, gemm_mod, utils_mod, config_ns)
    for cache_mod, gemm_mod, utils_mod, config_ns in _CUTLASS_MODULES:
        try:
            spec = importlib.util.find_spec(cache_mod)
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            def make(module: Any, g: str = gemm_mod, u: str = utils_mod, c: str = config_ns) -> list[_Patch]:
                return _cutlass_patches(store, module, g, u, c)

            return [_DeferredPatches(cache_mod, make)]
    raise SeamMissingError("torch seam missing: no CUTLASS op cache module (maybe_fetch_ops)")


def _cutlass_patches(store: LiveStore, cache: Any, gemm_mod: str, utils_mod: str, config_ns: str) -> list[_Patch]:
    cache_mod = cache.__name__
    original = getattr(cache, "maybe_fetch_ops", None)
    if original is None:
        raise SeamMissingError(f"torch seam missing: {cache_mod}.maybe_fetch_ops")
    # torch 2.13-2.15 ask per device (``maybe_fetch_ops(device_type)``); 2.9-2.11 for CUDA only
    # (``maybe_fetch_ops()``, the arch and version from ``cuda_env``)
    per_device = _scopes.parameters(inspect.getattr_static(cache, "maybe_fetch_ops")) != ()
    if per_device:
        _function(cache, "maybe_fetch_ops", ("device_type",))
    original_fn = getattr(original, "__wrapped__", original)

    from torch._inductor.utils import clear_on_fresh_cache

    def fetch(device_type: str) -> list[Any] | None:
        """Mirrors ``maybe_fetch_ops`` (torch/_inductor/codegen/cutlass/cache.py), reading the
        op list from the database first, then from the file as torch does."""
        if store.closed or route(store) is None:  # uninstalled (gemm_template kept this function), or files serve
            return original(device_type=device_type) if per_device else original()  # type: ignore[no-any-return]
        return cached_fetch(device_type)

    if per_device:
        maybe_fetch_ops = fetch
    else:
        def maybe_fetch_ops() -> list[Any] | None:  # type: ignore[misc]
            """Mirrors torch 2.9-2.11's ``maybe_fetch_ops()`` (CUDA only); as :func:`fetch`."""
            return fetch("cuda")

    @clear_on_fresh_cache
    @functools.cache
    def cached_fetch(device_type: str) -> list[Any] | None:
        import torch._inductor.config as config

        if config.force_disable_caches:
            return None
        served = route(store)

        def from_db() -> list[Any] | None:
            if served is None:
                return None
            utils = importlib.import_module(utils_mod)
            if per_device:
                arch = utils.cutlass_arch(device_type)
                version = utils.toolkit_version(device_type) if hasattr(utils, "toolkit_version") else None
            else:  # torch 2.9-2.11: what its maybe_fetch_ops reads
                arch, version = cache.get_cuda_arch(), cache.get_cuda_version()
            if device_type == "cuda" and version:
                version = ".".join(str(version).split(".")[:2])
            level = getattr(config, config_ns).cutlass_instantiation_level
            request_key = cache.get_config_request_key(arch, version, level)
            data = served.cutlass_get(request_key)
            if data is None:
                return None
            serialized = json.loads(data)
            serializer_mod = importlib.import_module(cache_mod.rsplit(".", 1)[0] + ".serialization")
            serializer = serializer_mod.get_cutlass_operation_serializer()
            return [serializer.deserialize(x) for x in serialized]

        ops = store.safely("CUTLASS op list lookup", None, from_db)
        if ops is not None:
            return ops
        return original_fn(device_type=device_type) if per_device else original_fn()

    maybe_fetch_ops.cache_clear = cached_fetch.cache_clear  # type: ignore[attr-defined]
    patches = [_Patch(cache, "maybe_fetch_ops", maybe_fetch_ops)]
    # gemm_template imports the name; if it is not imported yet it will pick up the patched
    # function from the cache module (importing it here would be a circular import).
    gemm = sys.modules.get(gemm_mod)
    if gemm is not None and hasattr(gemm, "maybe_fetch_ops"):
        patches.append(_Patch(gemm, "maybe_fetch_ops", maybe_fetch_ops))
    return patches


def _worker_compile_cpp_seam() -> list[_Patch]:
    codecache = _require(CODECACHE)
    worker = _function(codecache, "_worker_compile_cpp", ("lock_path", "cpp_builders"))
    _require(CODECACHE, "CppCodeCache", "load_async")
    patches = [_Patch(codecache, "_worker_compile_cpp", wrap_worker_compile_cpp(worker))]
    precompile_header = getattr(codecache, "_precompile_header", None)  # the header preprocessing, put off
    if precompile_header is not None and hasattr(codecache, "_HEADER_DIR"):
        _function(codecache, "_precompile_header", ("header", "hashable_cmd_line", "compile_command"))
        patches.append(_Patch(codecache, "_precompile_header", wrap_precompile_header(precompile_header, codecache)))
    return patches


def _cpp_builder_seam() -> list[_Patch]:
    CppBuilder = _require(CPP_BUILDER, "CppBuilder")
    _function(CppBuilder, "get_target_file_path", ("self",))
    build = _function(CppBuilder, "build", ("self",))
    _require(CPP_BUILDER, "get_compiler_version_info")
    _require(CPP_BUILDER, "get_cpp_compiler")
    return [_Patch(CppBuilder, "build", wrap_build(build))]


def triton_available() -> bool:
    """Whether Triton is installed, checking its cache-manager seam when it is.

    Raises :class:`SeamMissingError` when Triton is there but ``triton.runtime.cache`` lacks
    ``FileCacheManager`` with ``get_file``/``put``/``get_group``/``put_group``.
    """
    if importlib.util.find_spec("triton") is None:
        return False
    for attr in ("get_file", "put", "get_group", "put_group"):
        _require("triton.runtime.cache", "FileCacheManager", attr)
    _require("triton.runtime.cache", "get_cache_manager")
    return True


def _pgo_seams(store: LiveStore) -> list[_Patch]:
    pgo = _require(PGO)
    _function(pgo, "get_local_code_state", ("cache_key",))
    _function(pgo, "put_local_code_state", ("cache_key",))
    try:
        _function(pgo.PGOCacheArtifact, "populate_cache", ("self",))
        return [_Patch(owner, name, new) for owner, name, new in _pgo.patches(store, pgo)]
    except AttributeError as exc:
        raise SeamMissingError(f"torch seam missing: {exc}") from exc


def _precompile_seams(store: LiveStore) -> list[_Patch]:
    package = _require(PACKAGE)
    cls = getattr(package, "DiskDynamoCache", None)
    if cls is not None and all(hasattr(cls, name) for name in _precompile.REQUIRED):
        _function(cls, "load", ("self", "fn"))
        _function(cls, "read", ("self", "path"))
        _function(cls, "_write_to_local_cache", ("self", "pickled_content", "path"))
        _function(cls, "clear", ("self",))
    return [_Patch(owner, name, new) for owner, name, new in _precompile.patches(store, package)]


def _autotune_seams() -> list[_Patch]:
    from . import _autotune

    try:
        found = _autotune.patches()
    except (ImportError, AttributeError, TypeError) as exc:
        raise SeamMissingError(f"torch seam missing: {exc}") from exc
    return [_Patch(owner, name, new) for owner, name, new in found]


def _leading(owner: Any, name: str, params: tuple[str, ...]) -> Any:
    """``owner.name``, a function whose first parameters are ``params`` (the rest differ
    between torch releases: its replacement passes every argument through as given). Raises
    :class:`SeamMissingError` otherwise."""
    fn = getattr(owner, name, None)
    found = _scopes.parameters(fn) if fn is not None else None
    if found is None or found[: len(params)] != params:
        raise SeamMissingError(f"torch seam changed: {owner.__name__}.{name} takes ({', '.join(found or ('?',))}), "
                               f"cachedb wraps it taking ({', '.join(params)}, ...)")
    return fn


def _compile_scope_seams(name: str, store: LiveStore) -> list[_Patch]:
    """``_compile_fx_inner`` or ``aot_module_simplified``, run inside the serving store's
    compile scope (:meth:`LiveStore.compile_scope`): the compile claims taken in it for entries
    it did not store are released when it ends. In their module, and wherever imported by name."""
    if name == COMPILE_FX:
        module = _require(COMPILE_FX)
        original = _leading(module, "_compile_fx_inner", ("gm", "example_inputs"))
    else:
        module = _require(AOT_AUTOGRAD)
        original = _leading(module, "aot_module_simplified", ("mod", "args", "fw_compiler"))

    @functools.wraps(original)
    def scoped(*args: Any, **kwargs: Any) -> Any:
        served = route(store)
        if served is None:
            return original(*args, **kwargs)
        with served.compile_scope():
            return original(*args, **kwargs)

    attr = original.__name__
    patches = [_Patch(holder, held, scoped) for holder, held in _scopes.holders(original, (attr,))]
    if not any(holder is module for holder, _ in _scopes.holders(original, (attr,))):
        patches.append(_Patch(module, attr, scoped))
    return patches


def _scope_seams(name: str) -> list[_Patch]:
    """``fresh_cache`` (``torch._inductor.utils``) or ``temporary_cache_dir``
    (``torch._inductor.runtime.cache_dir_utils``), in their module and in every module that
    imported them by name (:mod:`cachedb.live._scopes`)."""
    if name == UTILS:
        module = _require(UTILS)
        original = _function(module, "fresh_cache", _scopes.FRESH_PARAMETERS)
        new = _scopes.wrap_fresh_cache(original)
    else:
        module = _require(CACHE_DIR_UTILS)
        original = _function(module, "temporary_cache_dir", _scopes.TEMPORARY_PARAMETERS)
        new = _scopes.wrap_temporary_cache_dir(original)
    patches = [_Patch(holder, attr, new) for holder, attr in _scopes.holders(original)]
    if not any(holder is module for holder, _ in _scopes.holders(original)):
        patches.append(_Patch(module, original.__name__, new))
    return patches


def module_patches(name: str, store: LiveStore, *, retune: bool = False) -> list[_Patch]:
    """The patches of seam module ``name`` (one of :data:`cachedb.live._autoload.SEAM_MODULES`,
    imported and complete): what :func:`build` patches in it. Raises :class:`SeamMissingError`
    if a seam is missing or changed. ``retune``: keep torch's own re-tuning of stored winners."""
    if name == CODECACHE:
        return (_guarded_seams(store, _require(CODECACHE, "FxGraphCache"), "fxgraph")
                + _miss_seams(store, _require(CODECACHE, "FxGraphCache"))
                + _local_cache_seams(store) + _choices_seams(store) + _worker_compile_cpp_seam())
    if name == AOT_CACHE:
        return (_guarded_seams(store, _require(AOT_CACHE, "AOTAutogradCache"), "aotautograd")
                + _aot_miss_seams(store, _require(AOT_CACHE), _require(AOT_CACHE, "AOTAutogradCache"))
                + [_Patch(owner, attr, new) for owner, attr, new in _bundled_aot.patches()])
    if name == AUTOTUNE_CACHE:
        return _best_config_seams(store) + _best_config_miss_seams(store)
    if name == CPP_BUILDER:
        return _cpp_builder_seam()
    if name == PGO:
        return _pgo_seams(store)
    if name == PACKAGE:
        return _precompile_seams(store)
    if name == TRITON_HEURISTICS:
        return _autotune_seams() if not retune and triton_available() else []
    if name in (UTILS, CACHE_DIR_UTILS):
        return _scope_seams(name)
    if name in (COMPILE_FX, AOT_AUTOGRAD):
        return _compile_scope_seams(name, store)
    for cache_mod, gemm_mod, utils_mod, config_ns in _CUTLASS_MODULES:
        if name == cache_mod:
            return _cutlass_patches(store, _require(cache_mod), gemm_mod, utils_mod, config_ns)
    raise ValueError(f"{name} is not one of cachedb's seam modules")


def build(store: LiveStore, *, retune: bool = False) -> list[_Patch]:
    """Every patch for the installed torch, importing the seam modules (the CUTLASS one is
    patched when torch imports it). Raises :class:`SeamMissingError` if one is missing or
    changed. ``retune``: keep torch's own re-tuning of stored winners."""
    patches: list[_Patch] = []
    for name in (CODECACHE, AOT_CACHE, AUTOTUNE_CACHE, CPP_BUILDER, PGO, PACKAGE, UTILS, CACHE_DIR_UTILS,
                 COMPILE_FX, AOT_AUTOGRAD):
        patches += module_patches(name, store, retune=retune)
    patches += _cutlass_seams(store)
    if not retune and triton_available():
        patches += _autotune_seams()
    return patches


def apply(patches: list[_Patch]) -> None:
    done: list[_Patch] = []
    try:
        for patch in patches:
            patch.apply()
            done.append(patch)
    except BaseException:
        for patch in reversed(done):
            patch.restore()
        raise


def restore(patches: list[_Patch]) -> None:
    for patch in reversed(patches):
        patch.restore()
