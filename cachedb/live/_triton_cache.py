"""Triton's kernel cache served from the database, through Triton's own seam.

Triton finds its cache manager class in ``TRITON_CACHE_MANAGER=module:Class``
(``triton.knobs.cache.manager_class``, read on every ``get_cache_manager`` call in Triton
>= 3.4; ``os.environ`` in 3.3). ``cachedb.install()``, ``cachedb run`` and the env-var
activation set it to :data:`MANAGER_SPEC`, so Inductor's compile workers inherit it.

:class:`CacheDBTritonCacheManager` is a ``FileCacheManager`` (triton/runtime/cache.py) whose
key directory ``<TRITON_CACHE_DIR>/<key>/`` is filled from the database on a miss:

- ``get_group(name)`` (``triton.compile``'s lookup of ``<name>.json``): local files first;
  else the key's stored files are written into the directory (temporary + rename each), the
  group file ``__grp__<name>`` last, with its child paths pointing at this directory;
- ``get_file(name)`` (launcher ``.so`` files, autotuner results): one stored file;
- ``put`` / ``put_group``: the files are written as Triton writes them and stored; the files of
  a compile are stored in one transaction when its group is put.

Dump and override managers (``TRITON_KERNEL_DUMP``, ``TRITON_KERNEL_OVERRIDE``) behave as
Triton's own. Triton's key covers the source, Triton's build, the backend (GPU arch, ptxas)
and the options, so a stored directory is only found by a process that would have built the
same files.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from triton.runtime.cache import FileCacheManager

from ..formats.triton_layout import GROUP_PREFIX, relocate_group
from . import _artifacts

log = logging.getLogger("cachedb.live")

#: The value of ``TRITON_CACHE_MANAGER`` that selects this manager.
MANAGER_SPEC = "cachedb.live._triton_cache:CacheDBTritonCacheManager"
KIND = "triton"


class CacheDBTritonCacheManager(FileCacheManager):  # type: ignore[misc]
    """``FileCacheManager`` backed by cachedb's ``kernel_artifacts`` (kind ``triton``).

    ``key`` is the base32 key Triton passes (``_base32(sha256(get_cache_key(...)))``).
    """

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        super().__init__(key, override=override, dump=dump)
        self._serve = not (override or dump)
        #: files put during a compile, stored with its group: name -> bytes
        self._pending: dict[str, bytes] | None = None

    # -- reads -------------------------------------------------------------------------------

    def get_group(self, filename: str) -> dict[str, str] | None:
        group = super().get_group(filename)
        if not self._serve or (group is not None and filename in group):
            return group
        store = _artifacts.current()
        if store is not None:
            grp = GROUP_PREFIX + filename
            files = store.fetch_key(KIND, self.key)
            if files and grp in files:
                try:
                    rewrite = {grp: relocate_group(files[grp], self.cache_dir, self.key)}
                except ValueError as exc:
                    store.live.warn_once("triton group file", exc)
                    rewrite = None
                if rewrite is not None and store.materialize_key(
                    KIND, self.key, self.cache_dir, require=grp, rewrite=rewrite, files=files
                ) is not None:
                    group = super().get_group(filename)
                    if group is not None and filename in group:
                        log.debug("triton kernel %s/%s served from the database", self.key, filename)
                        return group
        # A miss: triton.compile builds the kernel now; keep its files for put_group.
        self._pending = {}
        return group

    def get_file(self, filename: str) -> str | None:
        path = super().get_file(filename)
        if path is not None or not self._serve:
            return path
        store = _artifacts.current()
        if store is not None and store.materialize_file(KIND, self.key, filename, self.cache_dir):
            return super().get_file(filename)
        return None

    # -- writes ------------------------------------------------------------------------------

    def put(self, data: Any, filename: str, binary: bool = True) -> str:
        path = super().put(data, filename, binary=binary)
        if not self._serve:
            return path
        raw = data if isinstance(data, bytes) else str(data).encode("utf-8")
        if self._pending is not None:
            self._pending[filename] = raw  # stored with the group
        else:
            store = _artifacts.current()
            if store is not None:
                store.put_files(KIND, self.key, [(filename, raw)])
        return path

    def put_group(self, filename: str, group: dict[str, str]) -> str:
        pending, self._pending = self._pending, {}
        path = super().put_group(filename, group)  # calls self.put for the group file
        files = dict(pending or {})
        files.update(self._pending)
        self._pending = None
        if not self._serve:
            return path
        for child, child_path in group.items():
            if child in files or os.path.dirname(os.path.abspath(child_path)) != os.path.abspath(self.cache_dir):
                continue
            try:  # put by an earlier manager of the same key (a partial directory)
                with open(child_path, "rb") as f:
                    files[child] = f.read()
            except OSError:
                continue
        store = _artifacts.current()
        if store is not None:
            store.put_files(KIND, self.key, sorted(files.items()))
        return path
