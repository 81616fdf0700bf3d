"""Best config misses recorded with the factors of their key (``cachedb misses --kind best_config``).

torch's ``AutotuneCache`` (torch/_inductor/runtime/autotune_cache.py, torch 2.9 to 2.15) is
made per Triton kernel by ``AutotuneCache.create(inductor_meta, filename, configs_hash)``: its
local key hashes the kernel file's name (the hash of its source) with
``torch.compiler.config.cache_key_tag``, then with ``torch_key()``. ``read_best`` returns the
stored best config when its ``configs_hash`` is the kernel's (the hash of its candidate
configs), else ``None``, and the kernel is tuned again; ``save`` stores the winner.

Three seams, each torch's own function around one step:

- ``create``: the factors of the kernel's key (:func:`cachedb.keys.factors.best_config_factors`)
  are kept per local key, in this process (a pickled ``AutotuneCache`` carries nothing new);
- ``read_best``: a ``None`` is a miss, recorded with those factors and its ``configs_hash``:
  ``no_entry`` where the database holds no best config of the key, ``configs_changed`` where
  it holds one for other candidate configs (``reason``: ``stored for configs_hash <its hash>``);
- ``save``: the factors of the key are stored with the best config (``entry_factors``, kind
  ``best_config``), for later misses to be compared with.

A hit costs the ``None`` check alone. Failures are one warning; torch's result is returned as is.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from ..keys.factors import BEST_CONFIG, best_config_factors
from ._scopes import route
from ._store import LiveStore

log = logging.getLogger("cachedb.live")

#: ``{local cache key: (kernel, cache_key_tag, torch_key hex)}`` of the kernels this process
#: made an ``AutotuneCache`` for (a few hundred bytes each, one per kernel).
_LOOKUPS: dict[str, tuple[str, str, str]] = {}
_LOCK = threading.Lock()


def _local_key(cache: Any) -> str | None:
    local = getattr(cache, "local_cache", None)
    return local[1] if isinstance(local, tuple) and len(local) == 2 and isinstance(local[1], str) else None


def wrap_create(store: LiveStore, original: Callable[..., Any]) -> Callable[..., Any]:
    """``AutotuneCache.create(inductor_meta, filename, configs_hash)``: torch's, then the factors
    of the kernel's key kept for its lookups."""

    @functools.wraps(original)
    def create(inductor_meta: Any, filename: str, configs_hash: str) -> Any:
        cache = original(inductor_meta, filename, configs_hash)
        key = _local_key(cache)
        if key is not None:
            def keep() -> None:
                from torch._inductor.codecache import torch_key
                from torch.compiler import config as cconfig

                parts = (os.path.basename(filename), str(cconfig.cache_key_tag), torch_key().hex())
                with _LOCK:
                    _LOOKUPS[key] = parts

            store.safely("best config factors", None, keep)
        return cache

    return create


def wrap_read_best(store: LiveStore, original: Callable[..., Any], db_key: Callable[[str], str]) -> Callable[..., Any]:
    """``AutotuneCache.read_best(self, inductor_meta, configs)``: torch's; a ``None`` is recorded
    as a miss (``db_key``: the database's key of a local cache key)."""

    @functools.wraps(original)
    def read_best(self: Any, inductor_meta: Any, configs: Any) -> Any:
        found = original(self, inductor_meta, configs)
        if found is None:
            store.safely("best config miss record", None, lambda: _note_miss(store, self, db_key))
        return found

    return read_best


def _note_miss(store: LiveStore, cache: Any, db_key: Callable[[str], str]) -> None:
    key = _local_key(cache)
    served = route(store)
    if key is None or served is None:
        return
    with _LOCK:
        kept = _LOOKUPS.get(key)
    configs_hash = str(cache.configs_hash)
    factors = best_config_factors(*kept, configs_hash) if kept else []
    name = db_key(key)
    stored = served.best_config_get(name)
    outcome, reason = "no_entry", ""
    if stored is not None:
        try:
            content = json.loads(stored)
        except ValueError:
            content = None
        if isinstance(content, dict) and content.get("configs_hash") != configs_hash:
            # the stored one's hash, as it was: the retune about to run replaces it
            outcome, reason = "configs_changed", f"stored for configs_hash {content.get('configs_hash')}"
    served.record_miss(BEST_CONFIG, name, outcome, factors, reason=reason)


def wrap_save(store: LiveStore, original: Callable[..., Any], db_key: Callable[[str], str]) -> Callable[..., Any]:
    """``AutotuneCache.save(self, config, time_taken_ns, ...)``: torch's, then the factors of the
    key stored with the best config it wrote."""

    @functools.wraps(original)
    def save(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        key = _local_key(self)
        with _LOCK:
            kept = _LOOKUPS.get(key) if key is not None else None
        served = route(store)
        if key is not None and kept is not None and served is not None:
            served.put_key_factors(BEST_CONFIG, db_key(key), best_config_factors(*kept))
        return result

    return save
