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

Precompiled headers. Before it looks for a library, ``load_async`` has ``_precompile_header``
(codecache.py) make the precompiled header its compile would include (``cpp_prefix.h`` for
CPU kernels: a ~150 MB ``.gch`` under ``default_cache_dir()/precompiled_headers``, outside the
cache directory, so absent on a fresh machine): it runs the preprocessor over the header and
hashes the output (a g++ and an ``openssl`` subprocess, ~0.2 s, in every process, warm or
not: the hash keys the header so that a changed include invalidates it), then builds the
``.gch`` through the same ``_worker_compile_cpp``. While cachedb is active the whole call is
put off (:func:`wrap_precompile_header`): it returns at once an *alias* header, named by the
header and command line alone, and the real ``_precompile_header`` runs, and its header is
built (:data:`_PENDING_HEADERS`), only when a library or object file must really be compiled
in this process; the alias's ``.gch`` is then linked to the real one, so that compile uses
the header torch made for it, freshly preprocessed, as torch would have. A warm start whose
libraries all come from the database neither preprocesses nor builds a header (measured on
this repository's CPU workloads: 4.8 s of an 8.5 s warm start on a machine without the
header; the preprocessing alone, 0.2 to 0.3 s of every warm start, is what Inductor's own warm
files pay). A compile that reaches g++ without these seams includes the alias's plain text,
``#include <header>``: slower, the same library.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..fingerprint import cpp_host_key as host_key
from ..fingerprint import cpp_host_parts
from ..keys.factors import cpp_host_factors, cpp_library_factors
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


#: Precompiled-header builds put off in this process: ``{.gch path: (torch's
#: _worker_compile_cpp, lock path, builders)}``, the call ``_precompile_header`` made.
_PENDING_HEADERS: dict[str, tuple[Callable[..., Any], str, tuple[Any, ...]]] = {}
#: Precompiled headers whose ``_precompile_header`` call was put off: ``{alias header path:
#: (torch's _precompile_header, its arguments, its keyword arguments)}``.
_PENDING_ALIASES: dict[str, tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = {}
#: Held while pending headers are built: a compile in another thread waits for the header its
#: command line includes instead of reading it half-written.
_HEADERS_LOCK = threading.RLock()
#: Targets whose compile includes a precompiled header (libraries and object files).
_COMPILED = (".so", ".o")


def _after_fork_in_child() -> None:
    global _HEADERS_LOCK
    _HEADERS_LOCK = threading.RLock()  # another thread may have held it at the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _is_precompiled_header(target: str) -> bool:
    """``target`` is one of ``_precompile_header``'s ``<default_cache_dir()>/precompiled_headers/
    <hash>.h.gch`` (``.pch`` for clang) files."""
    return target.endswith((".h.gch", ".h.pch")) and os.path.basename(os.path.dirname(target)) == "precompiled_headers"


def _build_pending_headers() -> None:
    """Before a compile: run every ``_precompile_header`` call put off in this process (the real
    one: preprocess, hash) and link each alias to the header it returns; build every
    precompiled header put off, with torch's ``_worker_compile_cpp`` (its file lock; it skips
    one that exists); or wait for the thread doing it. Raises what torch's calls raise (as
    ``_precompile_header`` would have)."""
    with _HEADERS_LOCK:
        while _PENDING_ALIASES or _PENDING_HEADERS:
            links: list[tuple[str, str]] = []
            while _PENDING_ALIASES:
                alias, (precompile_header, args, kwargs) = _PENDING_ALIASES.popitem()
                links.append((alias, precompile_header(*args, **kwargs)))  # its build: put off below
            while _PENDING_HEADERS:
                target, (worker_compile_cpp, lock_path, builders) = _PENDING_HEADERS.popitem()
                log.debug("building the precompiled header %s put off until now", target)
                worker_compile_cpp(lock_path, builders)
            for alias, real in links:
                _link_alias(alias, real)


def _alias_path(header_dir: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """``<header_dir>/cachedb-<sha256 of the call's arguments>.h``: the name of an alias
    header, the same in every process that makes the same call."""
    text = repr((args, sorted((k, str(v)) for k, v in kwargs.items())))
    return os.path.join(header_dir, f"cachedb-{hashlib.sha256(text.encode()).hexdigest()[:40]}.h")


def _write_alias(alias: str, header: str) -> None:
    """The alias's text, ``#include <header>`` (what ``_precompile_header`` writes in its own
    header), unless it exists; atomic (temporary + rename). Raises OSError."""
    if os.path.exists(alias):
        return
    os.makedirs(os.path.dirname(alias), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(alias), prefix=".tmp-", suffix=".h")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"#include <{header}>\n")
        os.chmod(tmp, 0o644)  # as torch's own header (mkstemp makes it 0600)
        os.replace(tmp, alias)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _link_alias(alias: str, real: str) -> None:
    """Point the alias's precompiled header (``<alias>.gch``, ``.pch`` for clang) at the one
    torch built for ``real`` (a symbolic link, replaced atomically); where there is none, or
    linking fails, the alias stays a plain header (the compile is slower, not wrong)."""
    for ext in (".gch", ".pch"):
        if not os.path.exists(real + ext):
            continue
        tmp = f"{alias}{ext}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            os.symlink(real + ext, tmp)
            os.replace(tmp, alias + ext)
        except OSError as exc:
            log.debug("precompiled header alias %s not linked: %s", alias, exc)
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def wrap_precompile_header(original: Callable[..., Any], codecache: Any) -> Callable[..., Any]:
    """The replacement of ``torch._inductor.codecache._precompile_header(header,
    hashable_cmd_line, **compile_command)`` (returns the path of the header to ``-include``;
    ``codecache``: the module, whose ``_HEADER_DIR`` holds the headers): while cachedb is
    active, the alias header of the call (written now) and the call put off (see the module's
    docstring); otherwise, or where the alias cannot be written, torch's."""

    @functools.wraps(original)
    def _precompile_header(*args: Any, **kwargs: Any) -> Any:
        header_dir = getattr(codecache, "_HEADER_DIR", None)
        if _artifacts.current() is None or not isinstance(header_dir, str) or not args:
            return original(*args, **kwargs)
        alias = _alias_path(header_dir, args, kwargs)
        try:
            _write_alias(alias, str(args[0]))
        except OSError:
            return original(*args, **kwargs)
        with _HEADERS_LOCK:
            _PENDING_ALIASES.setdefault(alias, (original, args, dict(kwargs)))
        return alias

    return _precompile_header


def wrap_worker_compile_cpp(original: Callable[..., Any]) -> Callable[..., Any]:
    """The replacement of ``torch._inductor.codecache._worker_compile_cpp``."""

    def _worker_compile_cpp(lock_path: str, cpp_builders: Sequence[Any]) -> None:
        target = cpp_builders[-1].get_target_file_path()
        if os.path.exists(target):
            return None
        if _is_precompiled_header(target) and _artifacts.current() is not None:
            with _HEADERS_LOCK:
                _PENDING_HEADERS.setdefault(target, (original, lock_path, tuple(cpp_builders)))
            return None
        found = _store_and_key(target)
        if found is not None:
            store, host, directory, key, name = found
            if store.materialize_file(KIND, key, name, directory, host_key=host) and os.path.exists(target):
                return None
        if target.endswith(_COMPILED):
            _build_pending_headers()
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
            if target.endswith(_COMPILED):
                _build_pending_headers()
            return original(self)
        store, host, directory, key, name = found
        parts = None
        if not os.path.exists(target):
            if store.materialize_file(KIND, key, name, directory, host_key=host) and os.path.exists(target):
                return None
            parts = store.live.safely("C++ host parts", None, cpp_host_parts)
            store.live.safely("C++ library miss record", None, lambda: store.live.record_miss(
                KIND, key, "no_entry", cpp_library_factors(key, host, parts)))
        _build_pending_headers()
        result = original(self)

        def read() -> bytes:
            with open(target, "rb") as f:
                return f.read()

        data = store.live.safely("C++ library read", None, read)
        if data is not None:
            if parts is None:
                parts = store.live.safely("C++ host parts", None, cpp_host_parts)
            factors = store.live.safely("C++ host factors", (), lambda: cpp_host_factors(host, parts) if parts else ())
            store.put_files(KIND, key, [(name, data)], host_key=host, host_factors=factors)
        return result

    return build
