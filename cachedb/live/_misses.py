"""Misses explained: the factors of each FX graph key a lookup computes, kept with the entry
written for it (``entry_factors``) and, when the lookup misses, in the miss log
(``cache_misses``, the newest ``CACHEDB_MISS_LOG``).

Seams (torch/_inductor/codecache.py, torch 2.9 to 2.15):

- ``FxGraphCache.prepare_key``: a ``bypass`` (torch will not look up nor save: its
  ``cache_bypass_reason``) is recorded as a miss without a key.
- ``FxGraphCache.load_with_key``: it is given the key and the debug lines that
  ``compiled_fx_graph_hash`` made for it; a ``miss`` is recorded (``no_entry`` when no variant
  of the key is stored, ``guards_failed`` when variants are and none held), and the factors are
  held until the entry torch compiles next is put (:meth:`LiveStore.guarded_put`).

Torch's functions run first and their results are returned unchanged; whatever fails here is
one warning (:meth:`LiveStore.warn_once`) and never the compile's failure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._scopes import route

if TYPE_CHECKING:
    from ._store import LiveStore

#: ``FxGraphCache.prepare_key``'s parameters (torch/_inductor/codecache.py).
PREPARE_KEY_PARAMETERS = ("gm", "example_inputs", "fx_kwargs", "inputs_to_check", "remote")
#: ``FxGraphCache.load_with_key``'s parameters (torch/_inductor/codecache.py).
LOAD_WITH_KEY_PARAMETERS = ("key", "debug_lines", "example_inputs", "local", "remote_cache", "is_backward",
                            "constants", "evaluate_guards")


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
