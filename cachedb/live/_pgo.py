"""Dynamo's PGO profiles (automatic dynamic shapes) read from and written to the database.

Dynamo records which input dimensions turned out dynamic in a *code state* and keeps it, per
PGO cache key, in ``cache_dir()/dynamo/code_state_<key>.pkl`` (torch/_dynamo/pgo.py, 2.9 to
2.15): the next process compiles those dimensions dynamic at once, instead of a static
compile first and a recompile. Outside Meta the key exists only when
``torch.compiler.config.job_id`` (``TORCH_COMPILE_JOB_ID``) is set. torch reads and writes it
in two halves, local then remote:

- ``get_code_state()`` (once per process, at the first frame): ``get_local_code_state(key)``,
  then on a miss ``get_remote_code_state(key)`` (``TORCH_DYNAMO_AUTOMATIC_DYNAMIC_REMOTE_PGO``);
- ``put_code_state()`` (after each compiled frame, when the profile changed):
  ``put_local_code_state(key)``, then ``put_remote_code_state(key)``;
- Mega-Cache (``torch.compiler.load_cache_artifacts``): ``PGOCacheArtifact.populate_cache``
  writes the local file.

cachedb replaces the local halves and the Mega-Cache one (:func:`patches`): the profile's
pickle goes to ``pgo_profiles`` (:mod:`cachedb.repositories.dynamo`: checksummed, never
unpickled by cachedb) and comes back from it; the remote halves stay torch's, so a user's
remote PGO cache keeps working beside it. What torch does around the file is kept: the
``automatic_dynamic_local_pgo`` switch (``code_state_path`` is ``None``: nothing read or
written), the Mega-Cache record of what was read and written
(``CacheArtifactManager.record_artifact``, torch/compiler/_cache.py, what 2.13's
``CacheArtifactRecorder.record`` calls and what 2.11, which has no recorder, calls directly; so
``save_cache_artifacts()`` still carries the profile), the ``hit()`` bookkeeping, the
``dynamo_timed`` events, and a pickle torch cannot load (another torch's) being a warning and
a miss. A damaged row is quarantined by the store (one warning, a miss).
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Callable, Iterator
from typing import Any

from ..repositories.dynamo import pgo_key
from ._scopes import route
from ._store import LiveStore

#: The module whose functions are replaced.
MODULE = "torch._dynamo.pgo"

#: What :func:`patches` needs of the module (torch 2.9 to 2.15 have them all).
REQUIRED = ("get_local_code_state", "put_local_code_state", "code_state_path", "hit", "PGOCacheArtifact",
            "get_code_state", "put_code_state")


def _timed(pgo: Any, name: str, **event: Any) -> contextlib.AbstractContextManager[Any]:
    """torch's ``dynamo_timed`` event around a PGO read or write, as torch's own functions
    open it (nothing where this torch lacks it)."""
    timed, logger = getattr(pgo, "dynamo_timed", None), getattr(pgo, "CompileEventLogger", None)
    if timed is None or logger is None:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def scope() -> Iterator[None]:
        with timed(name, log_pt2_compile_event=True):
            logger.pt2_compile(name, **event)
            yield

    return scope()


def patches(store: LiveStore, pgo: Any) -> list[tuple[Any, str, Callable[..., Any]]]:
    """``(owner, attribute, replacement)`` of each seam in ``pgo`` (the imported
    ``torch._dynamo.pgo``): ``get_local_code_state``, ``put_local_code_state`` and
    ``PGOCacheArtifact.populate_cache``. Raises AttributeError naming what this torch lacks."""
    for attr in REQUIRED:
        if not hasattr(pgo, attr):
            raise AttributeError(f"{MODULE}.{attr}")
    artifact = pgo.PGOCacheArtifact
    if not hasattr(artifact, "populate_cache"):
        raise AttributeError(f"{MODULE}.PGOCacheArtifact.populate_cache")
    original_get, original_put = pgo.get_local_code_state, pgo.put_local_code_state
    original_populate = artifact.populate_cache

    def record(cache_key: str, content: bytes) -> None:
        from torch.compiler._cache import CacheArtifactManager  # 2.11 has no CacheArtifactRecorder

        CacheArtifactManager.record_artifact(artifact.type(), cache_key, content)

    def get_local_code_state(cache_key: str) -> Any:
        """``get_local_code_state`` (torch/_dynamo/pgo.py) reading the database instead of
        ``code_state_path(cache_key)``; torch's own where its files serve."""
        served = route(store)
        if served is None:
            return original_get(cache_key=cache_key)
        if pgo.code_state_path(cache_key) is None:  # automatic_dynamic_local_pgo off
            return None
        key = pgo_key(cache_key)
        content = served.dynamo_get("pgo", key)
        if content is None:
            return None
        with _timed(pgo, "pgo.get_local_code_state", cache_key=cache_key, cache_size_bytes=len(content)):
            try:
                pgo._CODE_STATE = pickle.loads(content)
            except Exception:  # as torch's own read: another torch's classes, ...
                pgo.log.warning("get_code_state failed while reading %s from cachedb", key, exc_info=True)
                return None
            record(cache_key, content)
            return pgo.hit(f"cachedb:{key}", "local")

    def put_local_code_state(cache_key: str) -> None:
        """``put_local_code_state`` (torch/_dynamo/pgo.py) writing the database instead of
        ``code_state_path(cache_key)``; torch's own where its files serve."""
        served = route(store)
        if served is None:
            return original_put(cache_key=cache_key)
        with _timed(pgo, "pgo.put_local_code_state", cache_key=cache_key):
            state = pgo._CODE_STATE
            if state is None:
                raise AssertionError("_CODE_STATE must be initialized before writing local code state")
            pickled = pickle.dumps(state)
            record(cache_key, pickled)
            if pgo.code_state_path(cache_key) is None:
                pgo.log.info("put_code_state: local cache disabled")
                return
            served.dynamo_put("pgo", pgo_key(cache_key), pickled)
            pgo.log.info("put_code_state: wrote %s to cachedb, %d entries", pgo_key(cache_key), len(state))

    def populate_cache(self: Any) -> None:
        """``PGOCacheArtifact.populate_cache`` (a Mega-Cache load) storing into the database."""
        served = route(store)
        if served is None:
            return original_populate(self)
        cache_key = self._rewrite_cache_key_for_mega_cache(self.key)
        if pgo.code_state_path(cache_key) is None:
            raise AssertionError("write_local_impl returned None during PGO cache population")
        content = self.content if isinstance(self.content, bytes) else bytes(self.content)
        served.dynamo_put("pgo", pgo_key(cache_key), content)
        return None

    return [
        (pgo, "get_local_code_state", get_local_code_state),
        (pgo, "put_local_code_state", put_local_code_state),
        (artifact, "populate_cache", populate_cache),
    ]
