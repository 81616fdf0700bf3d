"""C++ kernel libraries served from the database (CPU ``torch.compile``).

``CppCodeCache.load_async`` (torch/_inductor/codecache.py; also ``CppPythonBindingsCodeCache``
and ``CppWrapperCodeCache``, which inherit it) keys a library by the ``code_hash`` of its
source and compiler command line, writes ``<cache dir>/<key[1:3]>/<key>.main.cpp`` and builds
``<key>.main.so`` beside it through ``_worker_compile_cpp(lock_path, builders)`` unless the
file exists; ``VecISA.check_build`` (torch/_inductor/cpu_vec_isa.py) builds its ISA probe
``<key[1:3]>/<key>.so`` the same way with ``CppBuilder.build``. Two seams:

- ``codecache._worker_compile_cpp`` (``load_async`` binds it by name on each call): returns at
  once when the final library (the last builder's target) exists, or once the stored library
  is written there (temporary + rename); else builds as torch does. The object files of a
  two-step build are only inputs of that library, so they are not built for a stored one.
- ``CppBuilder.build`` (torch/_inductor/cpp_builder.py), for targets that are ``.so`` files
  named like kernel libraries: a stored library is written instead of building; a built one
  is stored.

The command line says ``-march=native`` and not the compiler's version, so a library is stored
and found under a host key as well (:func:`cachedb.fingerprint.cpp_host_key`): binaries never cross to a host whose CPU flags,
compiler, machine, torch or Python differ.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from ..fingerprint import cpp_host_key as host_key
from . import _artifacts

log = logging.getLogger("cachedb.live")
KIND = "cpp"


def split_library_path(path: str) -> tuple[str, str, str] | None:
    """``(directory, key, file name)`` of a kernel library path ``<dir>/<key[1:3]>/<key>.<...>``
    as ``CppCodeCache`` names it, or ``None`` for any other path (not served)."""
    directory, name = os.path.split(path)
    key = name.split(".", 1)[0]
    if len(key) < 4 or os.path.basename(directory) != key[1:3]:
        return None
    return directory, key, name


def _store_and_key(target: str) -> tuple[Any, str, str, str, str] | None:
    """``(artifacts, host key, directory, key, name)`` for a kernel library ``target`` while
    cachedb is active, else ``None``."""
    if not target.endswith(".so"):
        return None
    parts = split_library_path(target)
    store = _artifacts.current() if parts is not None else None
    if store is None or parts is None:
        return None
    host = store.live.safely("C++ host key", None, host_key)
    if host is None:
        return None
    return (store, host, *parts)


def wrap_worker_compile_cpp(original: Callable[..., Any]) -> Callable[..., Any]:
    """The replacement of ``torch._inductor.codecache._worker_compile_cpp``."""

    def _worker_compile_cpp(lock_path: str, cpp_builders: Sequence[Any]) -> None:
        target = cpp_builders[-1].get_target_file_path()
        if os.path.exists(target):
            return None
        found = _store_and_key(target)
        if found is not None:
            store, host, directory, key, name = found
            if store.materialize_file(KIND, key, name, directory, host_key=host) and os.path.exists(target):
                return None
        return original(lock_path, cpp_builders)  # its .so build goes through wrap_build

    _worker_compile_cpp.__wrapped__ = original  # type: ignore[attr-defined]
    return _worker_compile_cpp


def wrap_build(original: Callable[..., Any]) -> Callable[..., Any]:
    """The replacement of ``torch._inductor.cpp_builder.CppBuilder.build``."""

    @functools.wraps(original)
    def build(self: Any) -> Any:
        target = self.get_target_file_path()
        found = _store_and_key(target)
        if found is None:
            return original(self)
        store, host, directory, key, name = found
        if not os.path.exists(target) and store.materialize_file(KIND, key, name, directory, host_key=host):
            if os.path.exists(target):
                return None
        result = original(self)

        def read() -> bytes:
            with open(target, "rb") as f:
                return f.read()

        data = store.live.safely("C++ library read", None, read)
        if data is not None:
            store.put_files(KIND, key, [(name, data)], host_key=host)
        return result

    return build
