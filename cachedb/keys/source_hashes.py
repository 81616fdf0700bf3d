"""Source-tree digests of torch/_inductor/codecache.py: ``build_code_hash``, ``torch_key``,
``cutlass_key``.

The only functions of :mod:`cachedb.keys` that touch the file system: they read a source tree
the way torch does (through the directory listing, not the import machinery).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import inspect
import os
from collections.abc import Sequence

from .._errors import BadInputError
from ._common import _Hasher
from ._versions import parse_torch_version


# torch/_inductor/codecache.py: torch_key (get_code_hash's extra_files, relative to
# torch/_inductor), up to 2.13 and from 2.14 on.
_TORCH_KEY_EXTRA_FILES = ("codegen/aoti_runtime/interface.cpp", "script.ld")
_TORCH_KEY_EXTRA_FILES_2_14 = ("codegen/aoti_runtime/interface.cpp", "codegen/aoti_runtime/streams.h", "script.ld")


def _loader_suffixes() -> list[str]:
    # importlib's FileFinder tries loaders in _get_supported_file_loaders() order:
    # extension modules, then source, then bytecode.
    return (
        list(importlib.machinery.EXTENSION_SUFFIXES)
        + list(importlib.machinery.SOURCE_SUFFIXES)
        + list(importlib.machinery.BYTECODE_SUFFIXES)
    )


def _iter_dir_modules(path: str) -> list[tuple[str, bool]]:
    # pkgutil._iter_file_finder_modules, read straight from the directory (no importer caches).
    if not os.path.isdir(path):
        return []
    try:
        filenames = os.listdir(path)
    except OSError:
        filenames = []
    filenames.sort()  # packages before same-named modules
    yielded: dict[str, bool] = {}
    found: list[tuple[str, bool]] = []
    for fn in filenames:
        modname = inspect.getmodulename(fn)
        if modname == "__init__" or modname in yielded:
            continue
        full = os.path.join(path, fn)
        ispkg = False
        if not modname and os.path.isdir(full) and "." not in fn:
            modname = fn
            try:
                dircontents = os.listdir(full)
            except OSError:
                dircontents = []
            for sub in dircontents:
                if inspect.getmodulename(sub) == "__init__":
                    ispkg = True
                    break
            else:
                continue  # not a package
        if modname and "." not in modname:
            yielded[modname] = True
            found.append((modname, ispkg))
    return found


def _find_spec(path: str, tail: str) -> tuple[str | None, str | None]:
    # importlib.machinery.FileFinder(path).find_spec(tail): (origin, package dir or None);
    # (None, dir) is a namespace portion, (None, None) nothing found.
    try:
        contents = set(os.listdir(path))
    except OSError:
        contents = set()
    suffixes = _loader_suffixes()
    is_namespace = False
    base = os.path.join(path, tail)
    if tail in contents:
        for suffix in suffixes:
            init = os.path.join(base, "__init__" + suffix)
            if os.path.isfile(init):
                return init, base
        is_namespace = os.path.isdir(base)
    for suffix in suffixes:
        if tail + suffix in contents:
            full = os.path.join(path, tail + suffix)
            if os.path.isfile(full):
                return full, None
    if is_namespace:
        return None, base
    return None, None


def build_code_hash(
    roots: Sequence[str | os.PathLike[str]], prefix: str, hasher: _Hasher
) -> None:
    """Feed every module of the packages under ``roots`` into ``hasher``, in torch's order.

    Mirrors torch/_inductor/codecache.py: build_code_hash, reading the directories
    directly instead of through ``pkgutil``/``sys.path_importer_cache`` (same result,
    no import machinery caches). For each module found by ``pkgutil.iter_modules(roots,
    prefix)`` sorted by name: ``hasher.update(name)``, ``hasher.update(<bytes of its file>)``
    (a package's file is its ``__init__``), then recurse into packages with prefix
    ``name + "."``. Modules are what the running interpreter would import: ``*.py``,
    ``*.pyc``, extension modules (``importlib.machinery.EXTENSION_SUFFIXES``) and
    directories holding an ``__init__`` module; ``__pycache__`` and other directories
    without ``__init__`` are skipped. Case-sensitive file systems (Linux) are assumed.

    Args:
        roots: directories to scan (``str``/path-like); a root that is not a directory
            contributes nothing (like torch); a module name found in several roots is taken
            from the first.
        prefix: prepended to every top-level module name (``""`` for torch_key).
        hasher: anything with ``update(bytes)``, e.g. ``hashlib.sha256()``; updated in place.

    Returns:
        None (``hasher`` is updated).

    Raises:
        TypeError: ``roots`` is a single string or None (torch would scan ``sys.path``).
        BadInputError: a listed module has no file torch could open (a directory named
            ``x.py``, or a package whose ``__init__.py`` is a directory: torch fails an
            assertion there), a package whose ``__init__`` is a directory while a same-named
            ``pkg.py`` exists (torch then hashes ``pkg.py`` and recurses into
            ``pkgutil.iter_modules(None)``, i.e. all of ``sys.path``: not reproducible, so
            refused here), or a module file cannot be read.
    """
    if roots is None or isinstance(roots, (str, bytes)):
        raise TypeError("build_code_hash: roots must be a sequence of directories")
    modules: list[tuple[str, bool, str]] = []
    seen: set[str] = set()
    for root in roots:
        root_path = os.fspath(root) or os.getcwd()
        for modname, ispkg in _iter_dir_modules(root_path):
            name = prefix + modname
            if name not in seen:
                seen.add(name)
                modules.append((name, ispkg, root_path))
    modules.sort(key=lambda m: m[0])
    for name, ispkg, root_path in modules:
        tail = name.rpartition(".")[2]
        origin, package_dir = _find_spec(root_path, tail)
        where = os.path.join(root_path, tail)
        if origin is None:
            raise BadInputError(where, f"module {name!r} has no loadable file (torch asserts here)")
        if ispkg and package_dir is None:
            raise BadInputError(where, f"package {name!r} has no __init__ file torch could load")
        try:
            with open(origin, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise BadInputError(origin, f"cannot read module file: {exc}") from exc
        hasher.update(name.encode("utf-8"))
        hasher.update(data)
        if ispkg:
            assert package_dir is not None
            build_code_hash([package_dir], f"{name}.", hasher)


def torch_key(torch_dir: str | os.PathLike[str], torch_version: str) -> bytes:
    """``torch_key()``: the digest of torch's version and Python sources, from a directory.

    Mirrors torch/_inductor/codecache.py: torch_key (OSS branch, ``get_code_hash``), per
    torch release: ``sha256(torch_version ‖ build_code_hash([torch_dir], "") ‖ extra
    files)``, each extra file (under ``_inductor/``) only if it exists:

    - 2.9 to 2.13: ``codegen/aoti_runtime/interface.cpp``, ``script.ld``;
    - 2.14 and 2.15: ``codegen/aoti_runtime/interface.cpp``, ``codegen/aoti_runtime/streams.h``,
      ``script.ld``.

    The release is ``torch_version``'s. fbcode builds read ``torch/src_hash.txt`` instead (not
    mirrored).

    Which files count as modules depends on the running interpreter's suffixes
    (``importlib.machinery.EXTENSION_SUFFIXES``): torch's own ``_C.cpython-311-<platform>.so``
    is hashed as module ``_C`` only by a CPython 3.11 of that platform. Compute the key with
    the Python version (ABI tag) the torch installation is for, as torch itself does.

    Args:
        torch_dir: the installed ``torch`` package directory (``os.path.dirname(torch.__file__)``).
        torch_version: ``torch.__version__`` exactly, e.g. ``"2.13.0+cpu"``: hashed, and it
            picks the release's extra files.

    Returns:
        32 bytes (a SHA-256 digest); torch writes it as ``.hex()`` or base64 in other keys.

    Raises:
        TypeError: ``torch_version`` is not a str.
        BadInputError: ``torch_dir`` is not a directory, ``torch_version`` does not start
            with ``MAJOR.MINOR``, or see :func:`build_code_hash`.
    """
    if not isinstance(torch_version, str):
        raise TypeError(f"torch_version must be a str, not {type(torch_version).__name__}")
    extra_files = _TORCH_KEY_EXTRA_FILES_2_14 if parse_torch_version(torch_version) >= (2, 14) else _TORCH_KEY_EXTRA_FILES
    root = os.fspath(torch_dir)
    if not os.path.isdir(root):
        raise BadInputError(root, "not a directory (expected the installed torch package)")
    hasher = hashlib.sha256()
    hasher.update(torch_version.encode("utf-8"))
    build_code_hash([root], "", hasher)
    inductor_root = os.path.join(root, "_inductor")
    for rel in extra_files:
        path = os.path.join(inductor_root, rel)
        if os.path.exists(path):
            with open(path, "rb") as f:
                hasher.update(f.read())
    return hasher.digest()


def cutlass_key(cutlass_dir: str | os.PathLike[str]) -> bytes:
    """``cutlass_key()``: the digest of the Python packages directly under a CUTLASS root.

    Mirrors torch/_inductor/codecache.py: cutlass_key (OSS branch):
    ``sha256(build_code_hash([cutlass_dir], "")).digest()``. A CUTLASS checkout keeps its
    Python under ``python/`` (no ``__init__``), so for a plain checkout, and for a
    directory that does not exist, the key is ``sha256(b"").digest()``. fbcode reads
    ``cutlass_library/src_hash.txt`` instead (not mirrored).

    Args:
        cutlass_dir: torch's ``config.cutlass.cutlass_dir`` (2.9/2.10: ``config.cuda.cutlass_dir``).

    Returns:
        32 bytes.

    Raises:
        BadInputError: see :func:`build_code_hash`.
    """
    hasher = hashlib.sha256()
    build_code_hash([os.fspath(cutlass_dir)], "", hasher)
    return hasher.digest()
