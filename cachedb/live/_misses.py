"""Misses explained: the factors of each FX graph and AOTAutograd key a lookup computes, kept
with the entry written for it (``entry_factors``) and, when the lookup misses, in the miss log
(``cache_misses``, the newest ``CACHEDB_MISS_LOG``).

FX graph seams (torch/_inductor/codecache.py, torch 2.9 to 2.15):

- ``FxGraphCache.prepare_key``: a ``bypass`` (torch will not look up nor save: its
  ``cache_bypass_reason``) is recorded as a miss without a key.
- ``FxGraphCache.load_with_key``: it is given the key and the debug lines that
  ``compiled_fx_graph_hash`` made for it; a ``miss`` is recorded (``no_entry`` when no variant
  of the key is stored, ``guards_failed`` when variants are and none held), and the factors are
  held until the entry torch compiles next is put (:meth:`LiveStore.guarded_put`).

AOTAutograd seams (torch/_functorch/_aot_autograd/autograd_cache.py, where torch has them
with these parameters: torch 2.13):

- ``_get_debug_lines_for_cache_key(pickler, details, key)``: ``autograd_cache_key`` calls it
  with the pickler and the ``AOTAutogradCacheDetails`` it has just hashed into ``key``, inside
  its ``sanitize_gm_for_cache`` block. torch makes the lines only under DEBUG logging ("debug_lines
  re-hashes every attribute individually and is expensive"); where the local database holds no
  variant of ``key`` (a miss is likely) cachedb has torch make them, ``pickler.debug_lines(details)``
  (:func:`aot_debug_lines`; ~15 ms for ~690 factors on a 2-core CPU), and holds them for the
  lookup that follows. A key with stored variants costs one index-only query of the local file.
- ``AOTAutogradCache._lookup``: ``None`` (no entry, or none whose guards held) is a miss,
  recorded with those factors, which are then held for the entry torch compiles next.

- ``AOTAutogradCache.try_load`` and ``autograd_cache.autograd_cache_key``: the key that
  ``try_load`` asks for fails when torch will not cache the graph (``BypassAOTAutogradCache``:
  freezing, an unsupported node, the FX graph cache off, ...), which ``try_load`` catches as a
  bypass; such a failure inside ``try_load`` is recorded as a ``bypass`` without a key, with the
  exception's words as its reason, and raised on unchanged.

Torch's functions run first and their results are returned unchanged; whatever fails here is
one warning (:meth:`LiveStore.warn_once`) and never the compile's failure.
"""

from __future__ import annotations

import functools
import logging
import pickle
import re
import threading
import types
from typing import TYPE_CHECKING, Any

from ._scopes import route

if TYPE_CHECKING:
    from ._store import LiveStore

#: ``FxGraphCache.prepare_key``'s parameters (torch/_inductor/codecache.py).
PREPARE_KEY_PARAMETERS = ("gm", "example_inputs", "fx_kwargs", "inputs_to_check", "remote")
#: ``FxGraphCache.load_with_key``'s parameters (torch/_inductor/codecache.py).
LOAD_WITH_KEY_PARAMETERS = ("key", "debug_lines", "example_inputs", "local", "remote_cache", "is_backward",
                            "constants", "evaluate_guards")

#: ``autograd_cache._get_debug_lines_for_cache_key``'s parameters (torch 2.13).
AOT_DEBUG_LINES_PARAMETERS = ("pickler", "details", "key")
#: ``AOTAutogradCache._lookup``'s parameters (torch 2.13).
AOT_LOOKUP_PARAMETERS = ("key", "local", "remote", "args", "cache_info", "aot_config")

#: ``AOTAutogradCache.try_load``'s parameters: torch 2.13, then 2.15 (``act_input_paths``).
AOT_TRY_LOAD_PARAMETERS = (
    ("mod", "args", "aot_config", "compiler_config_extra", "local", "remote", "compile_region_name"),
    ("mod", "args", "aot_config", "compiler_config_extra", "local", "remote", "act_input_paths",
     "compile_region_name"),
)
#: ``autograd_cache.autograd_cache_key``'s parameters: torch 2.13, then 2.15.
AOT_CACHE_KEY_PARAMETERS = (
    ("mod", "example_inputs", "config", "compiler_config_extra"),
    ("mod", "example_inputs", "config", "compiler_config_extra", "act_input_paths"),
)

#: Per thread: how many ``try_load`` calls are running (a key that fails inside one is a bypass).
_loading = threading.local()

#: The debug line of ``AOTAutogradCacheDetails.autograd_config`` (functorch's config, one pickle).
_AUTOGRAD_CONFIG = re.compile(r"\[[a-z0-9]+\] autograd_config: ")

log = logging.getLogger("cachedb.live")


def _state(cache_info: Any) -> str | None:
    return cache_info.get("cache_state") if isinstance(cache_info, dict) else None


def wrap_prepare_key(store: LiveStore, original: Any) -> Any:
    """``FxGraphCache.prepare_key`` that records a bypass in the serving store's miss log."""
    def prepare_key(gm: Any, example_inputs: Any, fx_kwargs: Any, inputs_to_check: Any, remote: bool) -> Any:
        result = original(gm=gm, example_inputs=example_inputs, fx_kwargs=fx_kwargs,
                          inputs_to_check=inputs_to_check, remote=remote)
        try:
            key_info, cache_info = result
            if key_info is None and _state(cache_info) == "bypass":
                served = route(store)
                if served is not None:
                    served.record_miss("fxgraph", "", "bypass", [],
                                       reason=str(cache_info.get("cache_bypass_reason", "")))
        except Exception as exc:  # noqa: BLE001 - never the compile's failure
            store.warn_once("miss record", exc)
        return result

    return prepare_key


def wrap_load_with_key(store: LiveStore, original: Any) -> Any:
    """``FxGraphCache.load_with_key`` that keeps the key's factors and records a miss."""
    def load_with_key(key: str, debug_lines: list[str], example_inputs: Any, local: bool, remote_cache: Any,
                      is_backward: bool, constants: Any, evaluate_guards: Any = None) -> Any:
        result = original(key=key, debug_lines=debug_lines, example_inputs=example_inputs, local=local,
                          remote_cache=remote_cache, is_backward=is_backward, constants=constants,
                          evaluate_guards=evaluate_guards)
        try:
            if _state(result[1]) == "miss":
                served = route(store)
                if served is not None:
                    served.note_fx_miss(key, debug_lines)
        except Exception as exc:  # noqa: BLE001 - never the compile's failure
            store.warn_once("miss record", exc)
        return result

    return load_with_key


def aot_debug_lines(pickler: Any, details: Any, lines: list[str]) -> list[str]:
    """The debug lines of an AOTAutograd key: ``lines`` where torch made them (DEBUG logging),
    else torch's ``pickler.debug_lines(details)``: one ``[<hash>] <attr>: <value>`` line per
    attribute, list item and dict value, each hashed by the key's own pickler.

    ``autograd_config`` (functorch's config, which ``config.save_config()`` gives torch as one
    pickle of a dict, so one line whose value is not printable) is listed as torch lists a dict
    attribute: ``autograd_config[<name>]`` per config, each hashed by the same pickler. That
    pickle is the one torch made a moment before in this process; where it does not load as a
    dict, torch's one line stays."""
    out = list(lines) if lines else list(pickler.debug_lines(details))
    saved = getattr(details, "autograd_config", None)
    if not isinstance(saved, bytes):
        return out
    try:
        items = pickle.loads(saved)
        if not isinstance(items, dict):
            return out
        expanded = list(pickler.debug_lines(types.SimpleNamespace(autograd_config=items)))
    except Exception as exc:  # noqa: BLE001 - torch's one line stays
        log.debug("cachedb: autograd_config left as one factor: %s", exc)
        return out
    at = next((i for i, line in enumerate(out) if _AUTOGRAD_CONFIG.match(line)), None)
    if at is None:
        return out
    return out[:at] + expanded + out[at + 1:]


def wrap_aot_debug_lines(store: LiveStore, original: Any) -> Any:
    """``_get_debug_lines_for_cache_key`` that hands the key's debug lines to the serving store
    (:meth:`LiveStore.note_aot_key`) and returns torch's own result."""
    def _get_debug_lines_for_cache_key(pickler: Any, details: Any, key: str) -> Any:
        lines = original(pickler=pickler, details=details, key=key)
        try:
            served = route(store)
            if served is not None:
                served.note_aot_key(key, lambda: aot_debug_lines(pickler, details, lines))
        except Exception as exc:  # noqa: BLE001 - never the compile's failure
            store.warn_once("miss record", exc)
        return lines

    return _get_debug_lines_for_cache_key


def wrap_aot_lookup(store: LiveStore, original: Any) -> Any:
    """``AOTAutogradCache._lookup`` that records a miss (:meth:`LiveStore.note_aot_lookup`)."""
    def _lookup(key: str, local: bool, remote: bool, args: Any, cache_info: Any, aot_config: Any) -> Any:
        result = original(key=key, local=local, remote=remote, args=args, cache_info=cache_info,
                          aot_config=aot_config)
        try:
            served = route(store)
            if served is not None:
                served.note_aot_lookup(key, hit=result is not None)
        except Exception as exc:  # noqa: BLE001 - never the compile's failure
            store.warn_once("miss record", exc)
        return result

    return _lookup


def wrap_aot_try_load(original: Any) -> Any:
    """``AOTAutogradCache.try_load`` that marks its thread as loading while it runs (for
    :func:`wrap_aot_cache_key`) and returns torch's result unchanged."""
    @functools.wraps(original)
    def try_load(*args: Any, **kwargs: Any) -> Any:
        _loading.depth = getattr(_loading, "depth", 0) + 1
        try:
            return original(*args, **kwargs)
        finally:
            _loading.depth -= 1

    return try_load


def wrap_aot_cache_key(store: LiveStore, original: Any) -> Any:
    """``autograd_cache.autograd_cache_key`` that records, when it fails inside ``try_load``
    (torch bypasses its cache then), a ``bypass`` in the serving store's miss log with the
    exception's words as the reason; the exception is raised on unchanged."""
    @functools.wraps(original)
    def autograd_cache_key(*args: Any, **kwargs: Any) -> Any:  # torch's parameters, as given
        try:
            return original(*args, **kwargs)
        except Exception as bypass:
            if getattr(_loading, "depth", 0):
                try:
                    served = route(store)
                    if served is not None:
                        served.record_miss("aotautograd", "", "bypass", [], reason=str(bypass))
                except Exception as exc:  # noqa: BLE001 - never the compile's failure
                    store.warn_once("miss record", exc)
            raise

    return autograd_cache_key


# -- autotune timings ------------------------------------------------------------------------


def noting_timing_miss(live: LiveStore, cache: Any, op: str, inputs: str, hint_override: int | None,
                       benchmark: Any) -> Any:
    """``benchmark`` as ``PersistentCache.lookup`` (torch/_inductor/codecache.py) is given it:
    torch calls it only when the timing of one of the choices is not stored (``check_cache``
    fails), so the call is the miss. The function returned first records that miss
    (:func:`note_timing_miss`), then benchmarks as torch's own does; a lookup that hits never
    calls it and costs nothing more."""

    def benchmark_noted(choices: Any) -> Any:
        live.safely("autotune timings miss record", None,
                    lambda: note_timing_miss(live, cache, choices, op, inputs, hint_override))
        return benchmark(choices)

    return benchmark_noted


def note_timing_miss(live: LiveStore, cache: Any, choices: Any, op: str, inputs: str,
                     hint_override: int | None) -> None:
    """Record one autotune timings miss (kind ``timings``) with its factors
    (:func:`cachedb.keys.factors.timing_factors`): ``no_entry`` where the database holds no
    timing of that op, inputs key and precision, ``new_choices`` where it does but not of every
    choice asked for."""
    import torch

    from ..keys import persistent_cache_inputs_key
    from ..keys.factors import system_words, timing_factors, timing_key

    system = getattr(cache, "system", None) or {}
    system_hash = str(system.get("hash", ""))
    device = (system.get("device") or {}).get("name")
    version = system.get("version") or {}
    precision = torch.get_float32_matmul_precision()
    stored = live.load_inputs_key(system_hash, op, persistent_cache_inputs_key(inputs, hint_override))
    outcome = "new_choices" if stored and precision in stored else "no_entry"
    named = [(str(c.hash_key()), n if isinstance(n := getattr(c, "name", None), str) else None) for c in choices]
    factors = timing_factors(system_hash, system_words(system_hash, device, version.get("cuda"), version.get("hip")),
                             op, inputs, hint_override, precision, named)
    live.record_miss("timings", timing_key(system_hash, op, inputs, hint_override, precision), outcome, factors)
