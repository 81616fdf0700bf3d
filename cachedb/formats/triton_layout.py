"""Triton's cache layout (triton/runtime/cache.py ``FileCacheManager``), torch- and Triton-free.

A kernel's directory ``<TRITON_CACHE_DIR>/<key>/`` holds one file per compile stage and the
group file ``__grp__<name>.json`` = ``{"child_paths": {file name: absolute path}}``, written by
``put_group`` with ``json.dumps``. Inductor points ``TRITON_CACHE_DIR`` at
``<cache dir>/triton/<device index>`` (torch/_inductor/runtime/cache_dir_utils.py
``triton_cache_dir``).
"""

from __future__ import annotations

import json
import os

#: Prefix of group files (``FileCacheManager.get_group``/``put_group``).
GROUP_PREFIX = "__grp__"
#: Where exports put Triton's key directories, relative to the cache dir (device index 0; the
#: key does not depend on the device index).
EXPORT_DIR = "triton/0"


def relocate_group(data: bytes, directory: str, key: str) -> bytes:
    """A group file's bytes with the child paths that point into a directory named ``key``
    (on whatever machine wrote them) pointing into ``directory`` instead; other paths are kept.
    The JSON is written as ``FileCacheManager.put_group`` writes it (``json.dumps``), so a
    group already pointing at ``directory`` comes back byte-identical.
    Raises ``ValueError`` for bytes that are not a group file."""
    group = json.loads(data)
    if not isinstance(group, dict) or not isinstance(group.get("child_paths"), dict):
        raise ValueError("not a Triton group file: no child_paths object")
    children = {}
    for child, path in group["child_paths"].items():
        if isinstance(path, str) and os.path.basename(os.path.dirname(path)) == key:
            path = os.path.join(directory, os.path.basename(path))
        children[child] = path
    relocated = json.dumps({**group, "child_paths": children}).encode("utf-8")
    return data if relocated == data else relocated
