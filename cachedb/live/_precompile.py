"""Precompiled Dynamo packages (torch's *caching precompile*) read from and written to the database.

With ``torch._dynamo.config.caching_precompile`` on (``TORCH_CACHING_PRECOMPILE=1``, or
``cachedb.install(precompile=True)``), ``torch.compile(fn)`` asks ``DynamoCache`` for a package
of ``fn`` (``_optimize_catch_errors.__call__``, torch/_dynamo/eval_frame.py): Dynamo's output for
every frame it compiled of ``fn`` (bytecode, guards) and the backends they need (the bundled
AOTAutograd entries). A hit installs them and skips Dynamo's tracing; ``counters["dynamo_cache"]``
counts ``dynamo_cache_hit``, ``_miss`` and ``_error``. torch 2.10 to 2.15 keep the packages in
``DiskDynamoCache`` (torch/_dynamo/package.py), one file per function,
``cache_dir()/dynamo/<source id>/entry`` (``CompilePackage.source_id_from_fn``: the SHA-256 of
the function's qualified name and first line), a pickled ``PrecompileCacheEntry``.

torch writes them only inside ``torch.compiler.save_cache_artifacts()``
(``PrecompileContext.save_to_dynamo_cache``, torch/_dynamo/precompile_context.py): a program
that never calls it saves nothing. Under cachedb :func:`save_packages` does it when the process
exits (``cachedb.live``'s exit hook) and at ``uninstall``, so turning precompile on is enough.

:func:`patches` replaces three methods of ``DiskDynamoCache`` (the class of torch's one
``DynamoCache``; a ``DiskDynamoStore`` a program makes itself keeps its files):

- ``load(fn)``: the package from ``dynamo_packages`` (:mod:`cachedb.repositories.dynamo`),
  unpickled here as torch's ``read`` does, its backends recorded in the ``PrecompileContext``,
  the same counters; a row that fails its checks is quarantined by the store (one warning, a
  miss);
- ``read(key)``: the same row for torch's other readers (``load_cache_entry``);
- ``_write_to_local_cache(pickle, key)``: every write (``save_to_dynamo_cache`` and a Mega-Cache
  ``precompile`` artifact's ``populate_cache``) goes to the database.

It also returns the seams of :mod:`cachedb.live._precompile_fallback` (``convert_frame._compile``,
``DiskDynamoCache.record_package``, ``CompilePackage.initialize`` and ``install``): a function
torch cannot package (a ``PackageError`` while Dynamo compiles it) or whose stored package fails
to load compiles without one, with one warning naming it; precompile never fails a compile. A
function torch could not package is recorded (``precompile_refusal``, per function and system),
and later processes compile it without a package at once.

Packages are stored per function **and system** (:func:`cachedb.keys.package_key`: the source
id and a tag of torch's ``SystemInfo.current()``, what torch checks when it loads a package),
so machines of a mixed fleet (another Python, torch, CUDA, Triton or GPU) sharing one database
each keep and hit their own. A lookup tries this system's key, then the source id alone (a
package imported from torch's files or a Mega-Cache blob, whose system cachedb does not read:
torch's own check refuses it on another system).

torch marks the feature experimental (torch/_dynamo/config.py: "Experimental feature for running
automatic caching precompile"), and with it on Dynamo drops the ``ID_MATCH``, ``CLOSURE_MATCH``,
``WEAKREF_ALIVE`` and ``DICT_VERSION`` guards (torch/_dynamo/guards.py, "guard on %s is dropped
with caching_precompile=True"): see docs/dynamo-caches.md. Off unless asked.
"""

from __future__ import annotations

import logging
import os
import pickle
from collections.abc import Callable
from typing import Any

from ..keys import package_key, package_system_tag
from ..keys.factors import PACKAGE_SYSTEM, package_factors, package_system_factors
from . import _precompile_fallback
from ._scopes import route
from ._store import LiveStore

log = logging.getLogger("cachedb.live")

#: The module whose class is patched.
MODULE = "torch._dynamo.package"

#: What :func:`patches` needs of ``DiskDynamoCache`` (torch 2.10 to 2.15; 2.9 has no
#: ``_write_to_local_cache``, and cachedb leaves its packages to files), beside
#: ``CompilePackage`` and ``SystemInfo``.
REQUIRED = ("load", "read", "_write_to_local_cache", "load_cache_entry")


def _key_of(path: str) -> str | None:
    """The package key torch passes as a ``path`` (a source id), or ``None`` for a path that
    names a file elsewhere (torch's own readers then use it)."""
    return path if path and os.sep not in path and "/" not in path and path not in (".", "..") else None


def _system_info(package: Any) -> dict[str, Any]:
    """``dataclasses.asdict(SystemInfo.current())`` (torch/_dynamo/package.py), once per process."""
    global _SYSTEM_INFO
    if _SYSTEM_INFO is None:
        import dataclasses

        _SYSTEM_INFO = dataclasses.asdict(package.SystemInfo.current())
    return _SYSTEM_INFO


def _system_key(package: Any, source_id: str) -> str:
    """The database key of ``source_id``'s package on this system
    (:func:`cachedb.keys.package_key` of ``SystemInfo.current()``, computed once per process)."""
    return package_key(source_id, _system_info(package))


#: This process's ``dataclasses.asdict(SystemInfo.current())`` (torch/_dynamo/package.py).
_SYSTEM_INFO: dict[str, Any] | None = None


class _StoreRefusals:
    """:class:`cachedb.live._precompile_fallback.Refusals` in the store: the
    ``precompile_refusal`` row of the function's package key on this system."""

    def __init__(self, store: LiveStore, package: Any) -> None:
        self.store, self.package = store, package

    def get(self, source_id: str) -> bytes | None:
        served = route(self.store)
        return served.dynamo_get("precompile_refusal", _system_key(self.package, source_id)) if served else None

    def put(self, source_id: str, data: bytes) -> None:
        served = route(self.store)
        if served is not None:
            served.dynamo_put("precompile_refusal", _system_key(self.package, source_id), data)


def patches(store: LiveStore, package: Any) -> list[tuple[Any, str, Callable[..., Any]]]:
    """``(owner, attribute, replacement)`` of each seam of ``package`` (the imported
    ``torch._dynamo.package``), and the fallback seams of :mod:`cachedb.live._precompile_fallback`
    (a function torch cannot package, or whose package fails to load, compiles without one);
    of the store's seams none where this torch lacks one of :data:`REQUIRED` (its packages stay
    files)."""
    fallback = _precompile_fallback.patches(package, _StoreRefusals(store, package))
    cls = getattr(package, "DiskDynamoCache", None)
    if (cls is None or not all(hasattr(cls, name) for name in REQUIRED) or not hasattr(package, "CompilePackage")
            or not hasattr(package, "SystemInfo")):
        log.debug("cachedb: %s has no DiskDynamoCache seam: precompiled packages stay files", MODULE)
        return fallback
    original_read = cls.read
    original_write = cls._write_to_local_cache
    original_load = cls.load
    original_clear = cls.clear

    def counters() -> Any:
        return package.counters["dynamo_cache"]

    def stored(served: LiveStore, source_id: str) -> bytes | None:
        """This system's package of ``source_id``, else one stored without a system."""
        content = served.dynamo_get("precompile", _system_key(package, source_id))
        return content if content is not None else served.dynamo_get("precompile", source_id)

    def read(self: Any, path: str) -> Any:
        """``DiskDynamoStore.read`` (torch/_dynamo/package.py) from the database."""
        key = _key_of(path)
        served = route(store)
        if key is None or served is None:
            return original_read(self, path=path)
        content = stored(served, key)
        if content is None:
            raise RuntimeError(f"Failed to load package from path {key}: not in cachedb")
        try:
            return pickle.loads(content)
        except Exception as exc:
            raise RuntimeError(f"Failed to load package from path {key}: {exc}") from exc

    def load(self: Any, fn: Callable[..., Any]) -> Any:
        """``DiskDynamoCache.load`` (torch/_dynamo/package.py) from the database: a package
        stored under ``fn``'s source id is a hit, its backends recorded as torch records them."""
        served = route(store)
        if served is None:
            return original_load(self, fn=fn)
        key = package.CompilePackage.source_id_from_fn(fn)
        content = stored(served, key)
        if content is None:
            package.logger.info("No package found for %s", key)
            counters()["dynamo_cache_miss"] += 1
            served.safely("precompiled package miss record", None, lambda: served.record_miss(
                "precompile", _system_key(package, key), "no_entry",
                package_factors(key, package_system_tag(_system_info(package)), _system_info(package))))
            return None
        try:
            entry = pickle.loads(content)
            from torch._dynamo.precompile_context import BackendCacheArtifact, PrecompileContext

            for backend in entry.backends.values():
                if not isinstance(backend, BackendCacheArtifact):
                    raise AssertionError(f"Expected BackendCacheArtifact, got {type(backend)}")
                PrecompileContext.record_artifact(backend)
        except Exception:
            counters()["dynamo_cache_error"] += 1
            package.logger.warning("Failed to load package %s from cachedb", key, exc_info=True)
            return None
        counters()["dynamo_cache_hit"] += 1
        _precompile_fallback.note_loaded(getattr(entry, "dynamo", None))
        return entry

    def write_to_local_cache(self: Any, pickled_content: bytes, path: str) -> None:
        """``DiskDynamoStore._write_to_local_cache`` into the database."""
        key = _key_of(path)
        served = route(store)
        if key is None or served is None:
            original_write(self, pickled_content=pickled_content, path=path)
            return
        tag = package_system_tag(_system_info(package))
        factors = served.safely("package system factors", None,
                                lambda: (PACKAGE_SYSTEM, tag, package_system_factors(tag, _system_info(package))))
        served.dynamo_put("precompile", _system_key(package, key), bytes(pickled_content), factors=factors)

    def clear(self: Any) -> None:
        """``DiskDynamoStore.clear`` (torch/_dynamo/package.py): torch's own, which removes
        ``cache_dir()/dynamo`` (packages and PGO profiles alike), then the packages, the
        functions recorded as not packageable, and the PGO profiles of the database that
        serves now (a remote tier is never cleared)."""
        original_clear(self)
        served = route(store)
        if served is not None:
            for kind in ("precompile", "precompile_refusal", "pgo"):
                served.clear_kind(kind)

    return [(cls, "load", load), (cls, "read", read), (cls, "_write_to_local_cache", write_to_local_cache),
            (cls, "clear", clear), *fallback]


def save_packages() -> None:
    """What ``torch.compiler.save_cache_artifacts()`` does for precompile
    (``PrecompileContext.save_to_dynamo_cache()``), run by cachedb's exit hook and
    ``uninstall``: every package this process compiled, stored. Nothing unless ``caching_precompile`` is on and Dynamo was
    imported; a failure is one warning (the compile already ran)."""
    import sys

    config = sys.modules.get("torch._dynamo.config")
    if config is None or not getattr(config, "caching_precompile", False):
        return
    context = sys.modules.get("torch._dynamo.precompile_context")
    if context is None or not getattr(context.PrecompileContext, "_dynamo_cache_entries", None):
        return
    try:
        context.PrecompileContext.save_to_dynamo_cache()
    except Exception as exc:  # noqa: BLE001 - never the user's failure
        log.warning("cachedb: saving the precompiled Dynamo packages at exit failed (%s: %s)",
                    type(exc).__name__, exc)
