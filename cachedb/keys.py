"""Inductor's cache-key formulas, re-implemented without torch and bit-exact with torch 2.13.

Every public function names the torch function it mirrors (paths relative to the installed
``torch`` package). They only hash and format: they never import torch, never read torch's
live state (configs, ``cache_dir()``, devices) and take whatever that state would supply as
arguments instead. The only functions that touch the file system are :func:`build_code_hash`,
:func:`torch_key` and :func:`cutlass_key`, which read a source tree the way torch does.

Notation used below: ``hex(x) = hashlib.sha256(x).hexdigest()``; ``b32_51(d) =
base64.b32encode(d)[:51].decode().lower()``; ``‖`` is byte concatenation; strings are UTF-8
encoded before hashing. torch 2.13 spells these as the strategies of
``torch/_inductor/cache_key.py`` (``COMPACT``, ``CODE``, ``SYSTEM``, ``AUTOTUNE``).

Frozen test vectors: ``tests/data/key_vectors.json`` (made by ``tests/data/make_key_vectors.py``
from torch's own functions).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.machinery
import inspect
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, Union

from ._errors import BadInputError

__all__ = [
    "AUTOTUNE_REMOTE_SALT",
    "BEST_CONFIG_EXTENSION",
    "BUNDLED_AUTOTUNE_CACHE_ID",
    "BUNDLED_AUTOTUNE_SALT",
    "CPU_SYSTEM_HASH",
    "CUTLASS_CONFIG_PREFIX",
    "REDIS_KEY_VERSION",
    "autotune_redis_key",
    "autotune_remote_cache_id",
    "backend_hash",
    "best_config_filename",
    "best_config_local_path",
    "best_config_prepare_key",
    "best_config_relative_key",
    "build_code_hash",
    "bundled_autotune_key",
    "bundled_best_config_path",
    "code_hash",
    "comment_stripped_hash",
    "configs_hash",
    "cutedsl_kernel_name",
    "cutlass_config_filename",
    "cutlass_config_request_key",
    "cutlass_key",
    "cutlass_toolkit_version",
    "get_hash",
    "get_path",
    "isolation_key",
    "isolation_torch_version_hash",
    "persistent_cache_inputs_key",
    "sha256_hash",
    "split_inputs_key",
    "system_hash",
    "system_info",
    "torch_key",
]

#: What torch's cache-key strategies accept as one component (``cache_key.CacheKeyComponent``).
KeyComponent = Union[str, bytes, bytearray, memoryview]

#: ``CacheBase.get_system()["hash"]`` on every machine without a CUDA/ROCm device:
#: ``hex(json.dumps({}))`` = ``hex(b"{}")``.
CPU_SYSTEM_HASH = "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"

#: Salt of the remote autotune cache id (``AutotuneCache._setup_remote_autotune_cache``).
AUTOTUNE_REMOTE_SALT = "autotune-best-config-v2"
#: Salt of the bundled autotune key (``AutotuneCacheBundler.begin_compile``).
BUNDLED_AUTOTUNE_SALT = "bundled-autotune-best-configs-v1"
#: ``cache_id`` the bundled autotune remote cache is created with (``create_cache("bundled-autotune-v1", ...)``).
BUNDLED_AUTOTUNE_CACHE_ID = "bundled-autotune-v1"
#: The ``c<version>`` suffix of Redis keys (``RedisRemoteCache.__init__``: ``version = 1``).
REDIS_KEY_VERSION = 1
#: Extension of local best-config files (``AutotuneCache._make_local_cache_key``).
BEST_CONFIG_EXTENSION = "best_config"
#: File-name prefix of CUTLASS op lists (``codegen/cutlass/cache.py: CONFIG_PREFIX``).
CUTLASS_CONFIG_PREFIX = "configs"

# torch/_inductor/codecache.py: get_hash
_TEXT_HASH_TYPES = frozenset({"amdgcn", "code", "ptx", "spv"})
_BINARY_HASH_TYPES = frozenset({"cubin", "hsaco"})

# torch/_inductor/codecache.py: torch_key (get_code_hash's extra_files, relative to torch/_inductor)
_TORCH_KEY_EXTRA_FILES = ("codegen/aoti_runtime/interface.cpp", "script.ld")

# "<inputs>_<hint_override>" where <inputs> is a list repr and <hint_override> is str(int).
_HINTED_INPUTS_KEY = re.compile(r"(.*\])_(0|-?[1-9][0-9]*)", re.DOTALL)


class _Hasher(Protocol):
    def update(self, data: bytes, /) -> None: ...


# --------------------------------------------------------------------------------------------
# Primitives (torch/_inductor/cache_key.py, codecache.py)
# --------------------------------------------------------------------------------------------


def _to_bytes(component: object) -> bytes:
    # torch/_inductor/cache_key.py: CacheKeyStrategy._to_bytes
    if isinstance(component, str):
        return component.encode("utf-8")
    if isinstance(component, bytes):
        return component
    if isinstance(component, bytearray):
        return bytes(component)
    if isinstance(component, memoryview):
        return component.tobytes()
    raise TypeError(f"Unsupported cache key component: {type(component)!r}")


def _b32_51(digest: bytes) -> str:
    # [:51] drops the "Q====" tail every base32-encoded SHA-256 digest ends with.
    return base64.b32encode(digest)[:51].decode("utf-8").lower()


def _sha256_hex(*components: KeyComponent) -> str:
    # AUTOTUNE_CACHE_KEY_STRATEGY / SYSTEM_CACHE_KEY_STRATEGY: hex digest, components concatenated.
    hasher = hashlib.sha256()
    for component in components:
        hasher.update(_to_bytes(component))
    return hasher.hexdigest()


def sha256_hash(data: KeyComponent) -> str:
    """Compact base32 SHA-256: the file name of an FX-graph / AOTAutograd entry's bytes.

    Mirrors torch/_inductor/codecache.py: sha256_hash (``COMPACT_CACHE_KEY_STRATEGY.key``).

    Args:
        data: the bytes to hash (``bytes``; ``str`` is UTF-8 encoded, ``bytearray`` and
            ``memoryview`` are accepted as torch accepts them).

    Returns:
        51 lower-case base32 characters, ``b32_51(sha256(data).digest())``.

    Raises:
        TypeError: ``data`` is none of the accepted types (torch raises the same).
    """
    return _b32_51(hashlib.sha256(_to_bytes(data)).digest())


def sha256_digest_name(digest: bytes) -> str:
    """:func:`sha256_hash` from an already computed SHA-256 ``digest`` (32 bytes)."""
    return _b32_51(digest)


def code_hash(code: KeyComponent, extra: KeyComponent = "") -> str:
    """Key of a generated module (``PyCodeCache``, ``CppCodeCache``, ...): ``"c" + b32_51(...)``.

    Mirrors torch/_inductor/codecache.py: code_hash (``CODE_CACHE_KEY_STRATEGY.key``).

    Args:
        code: source text or bytes (``str`` is UTF-8 encoded).
        extra: optional extra component; when truthy it is hashed after a ``b"||"``
            separator, when empty (``""``/``b""``) nothing is appended.

    Returns:
        52 characters: ``"c" + b32_51(sha256(code ‖ (b"||" ‖ extra if extra else b"")))``.

    Raises:
        TypeError: ``code`` or ``extra`` is not str/bytes/bytearray/memoryview.
    """
    hasher = hashlib.sha256(_to_bytes(code))
    if extra:
        hasher.update(b"||")
        hasher.update(_to_bytes(extra))
    return "c" + _b32_51(hasher.digest())


def get_path(
    basename: str, extension: str, specified_dir: str = "", *, cache_dir: str
) -> tuple[str, str, str]:
    """Directory and file a cache artifact named ``basename`` lives at.

    Mirrors torch/_inductor/codecache.py: get_path, with torch's ``cache_dir()`` passed in
    as ``cache_dir`` (torch's is always absolute: ``os.path.abspath($TORCHINDUCTOR_CACHE_DIR)``
    or ``<tmp>/torchinductor_<user>``; this function uses it as given).

    Args:
        basename: the key (e.g. a :func:`code_hash`); its characters ``[1:3]`` shard it.
        extension: file extension without the dot (``"py"``, ``"best_config"``, ...).
        specified_dir: optional directory: used as is when absolute, else joined to ``cache_dir``.
        cache_dir: the Inductor cache directory.

    Returns:
        ``(basename, subdir, path)`` with ``subdir`` = ``specified_dir`` (absolute),
        ``cache_dir/specified_dir`` or ``cache_dir/basename[1:3]``, and
        ``path = subdir/f"{basename}.{extension}"``.

    Raises:
        TypeError: an argument is not a ``str``.
        ValueError: ``cache_dir`` is empty.
    """
    for name, value in (
        ("basename", basename),
        ("extension", extension),
        ("specified_dir", specified_dir),
        ("cache_dir", cache_dir),
    ):
        if not isinstance(value, str):
            raise TypeError(f"get_path: {name} must be a str, not {type(value).__name__}")
    if not cache_dir:
        raise ValueError("get_path: cache_dir must not be empty")
    if specified_dir:
        if os.path.isabs(specified_dir):
            subdir = specified_dir
        else:
            subdir = os.path.join(cache_dir, specified_dir)
    else:
        subdir = os.path.join(cache_dir, basename[1:3])
    path = os.path.join(subdir, f"{basename}.{extension}")
    return basename, subdir, path


def get_hash(
    content: KeyComponent,
    extra: KeyComponent = "",
    hash_type: str = "code",
    *,
    xpu_kernel_format: str = "zebin",
) -> str:
    """Key of a kernel source or binary, by kind.

    Mirrors torch/_inductor/codecache.py: get_hash.

    Args:
        content: source (``str``) or binary (``bytes``).
        extra: extra component for text kinds (ignored for binary kinds, as in torch).
        hash_type: ``"code"``, ``"ptx"``, ``"amdgcn"``, ``"spv"`` (text kinds:
            ``code_hash(content, extra)``) or ``"cubin"``, ``"hsaco"`` or the XPU binary
            format (binary kinds: ``code_hash(repr(content))``).
        xpu_kernel_format: torch's ``torch/_inductor/utils.py: XPU_KERNEL_FORMAT``
            (``$TORCHINDUCTOR_XPU_KERNEL_FORMAT``, default ``"zebin"``; ``"spv"`` on Windows).

    Returns:
        A :func:`code_hash` string (52 characters).

    Raises:
        ValueError: unknown ``hash_type`` (torch raises ``AssertionError``).
        TypeError: ``content``/``extra`` of an unsupported type.
    """
    if hash_type in _TEXT_HASH_TYPES:
        return code_hash(content, extra)
    if hash_type in _BINARY_HASH_TYPES or hash_type == xpu_kernel_format:
        return code_hash(repr(content))
    raise ValueError(f"Unknown hash type {hash_type}")


# --------------------------------------------------------------------------------------------
# System hash (codecache.py: CacheBase.get_system) and PersistentCache keys
# --------------------------------------------------------------------------------------------


def system_hash(system: Mapping[str, Any]) -> str:
    """The ``system_hash`` naming ``cache/<system_hash>``, recomputed from a system description.

    Mirrors torch/_inductor/codecache.py: CacheBase.get_system (its ``"hash"`` field:
    ``SYSTEM_CACHE_KEY_STRATEGY.key_from_json(...)``).

    Args:
        system: a dict as ``get_system()`` returns it (a ``"hash"`` key, if present, is
            ignored). With ``"device"`` and ``"version"`` (GPU): the hash is
            ``hex(json.dumps({"device": ..., "version": ...}, sort_keys=True))``. With
            neither (no GPU): ``hex(json.dumps({}))`` = :data:`CPU_SYSTEM_HASH`.

    Returns:
        64 lower-case hex characters.

    Raises:
        BadInputError: ``system`` is not a mapping, has only one of ``"device"``/``"version"``,
            or is not JSON-serializable.
    """
    if not isinstance(system, Mapping):
        raise BadInputError("system", f"not a mapping: {type(system).__name__}")
    has_device, has_version = "device" in system, "version" in system
    if has_device != has_version:
        raise BadInputError("system", "has one of 'device'/'version' without the other")
    hash_input: dict[str, Any] = (
        {"device": system["device"], "version": system["version"]} if has_device else {}
    )
    try:
        text = json.dumps(hash_input, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise BadInputError("system", f"not JSON-serializable: {exc}") from exc
    return _sha256_hex(text)


def system_info(
    device_name: str | None,
    triton_key: str | None,
    cuda_version: str | None = None,
    hip_version: str | None = None,
) -> dict[str, Any]:
    """The dict ``CacheBase.get_system()`` returns (and Inductor writes as ``"system"``).

    Mirrors torch/_inductor/codecache.py: CacheBase.get_system.

    Args:
        device_name: ``torch.cuda.get_device_properties(...).name`` on CUDA,
            ``.gcnArchName`` on ROCm; ``None`` for a machine without a GPU (torch's
            ``except (AssertionError, RuntimeError)`` branch).
        triton_key: ``codecache.triton_key()`` (``None`` without Triton).
        cuda_version: ``torch.version.cuda``; when not ``None`` it is recorded as ``"cuda"``.
        hip_version: ``torch.version.hip``, recorded as ``"hip"`` when ``cuda_version`` is None.

    Returns:
        ``{"hash": CPU_SYSTEM_HASH}`` when ``device_name`` is None, else
        ``{"device": {"name": N}, "version": {"triton": T, "cuda": C} (or "hip"), "hash": H}``
        with keys in torch's insertion order.

    Raises:
        Nothing beyond :func:`system_hash`'s errors.
    """
    if device_name is None:
        return {"hash": CPU_SYSTEM_HASH}
    device_info: dict[str, Any] = {"name": device_name}
    version_info: dict[str, Any] = {"triton": triton_key}
    if cuda_version is not None:
        version_info["cuda"] = cuda_version
    else:
        version_info["hip"] = hip_version
    hash_input = {"device": device_info, "version": version_info}
    return {"device": device_info, "version": version_info, "hash": system_hash(hash_input)}


def persistent_cache_inputs_key(inputs: str, hint_override: int | None) -> str:
    """Second-level key of an autotune timing: ``inputs`` or ``f"{inputs}_{hint_override}"``.

    Mirrors torch/_inductor/codecache.py: PersistentCache.lookup (its ``cache_key``).

    Args:
        inputs: the ``inputs`` string Inductor passes, ``repr`` of a list of tuples, so it
            ends with ``"]"``.
        hint_override: ``None`` or an ``int`` (``bool`` is refused).

    Returns:
        ``inputs`` when ``hint_override`` is None, else ``f"{inputs}_{hint_override}"``.

    Raises:
        TypeError: ``inputs`` is not a str or ``hint_override`` is not an int/None.
        BadInputError: a ``hint_override`` is given and ``inputs`` does not end with ``"]"``
            (the key could not be split back unambiguously by :func:`split_inputs_key`).
    """
    if not isinstance(inputs, str):
        raise TypeError(f"inputs must be a str, not {type(inputs).__name__}")
    if hint_override is None:
        return inputs
    if isinstance(hint_override, bool) or not isinstance(hint_override, int):
        raise TypeError(f"hint_override must be an int or None, not {type(hint_override).__name__}")
    if not inputs.endswith("]"):
        raise BadInputError("inputs", "with a hint_override, inputs must be a list repr ending in ']'")
    return f"{inputs}_{hint_override}"


def split_inputs_key(key: str) -> tuple[str, int | None]:
    """Inverse of :func:`persistent_cache_inputs_key`.

    Mirrors (inverts) torch/_inductor/codecache.py: PersistentCache.lookup's ``cache_key``.

    A key ending in ``"]_<int>"`` (``<int>`` as ``str(int)`` writes it: optional ``-``, no
    leading zeros, never ``-0``) is split at that last ``"_"``; any other key is returned whole with
    ``None``. Exact: ``split_inputs_key(persistent_cache_inputs_key(i, h)) == (i, h)`` for
    every ``i`` ending in ``"]"`` (every list repr) and every ``h``, and
    ``persistent_cache_inputs_key(*split_inputs_key(k)) == k`` for every string ``k``.

    Args:
        key: a second-level key of ``cache[op]``.

    Returns:
        ``(inputs, hint_override)``.

    Raises:
        TypeError: ``key`` is not a str.
    """
    if not isinstance(key, str):
        raise TypeError(f"key must be a str, not {type(key).__name__}")
    match = _HINTED_INPUTS_KEY.fullmatch(key)
    if match is None:
        return key, None
    return match.group(1), int(match.group(2))


# --------------------------------------------------------------------------------------------
# Source-tree hashes: build_code_hash, torch_key, cutlass_key (codecache.py)
# --------------------------------------------------------------------------------------------


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

    Mirrors torch/_inductor/codecache.py: torch_key (OSS branch, ``get_code_hash``):
    ``sha256(torch_version ‖ build_code_hash([torch_dir], "") ‖ bytes of
    _inductor/codegen/aoti_runtime/interface.cpp ‖ bytes of _inductor/script.ld)``, each
    extra file only if it exists. fbcode builds read ``torch/src_hash.txt`` instead (not
    mirrored).

    Which files count as modules depends on the running interpreter's suffixes
    (``importlib.machinery.EXTENSION_SUFFIXES``): torch's own ``_C.cpython-311-<platform>.so``
    is hashed as module ``_C`` only by a CPython 3.11 of that platform. Compute the key with
    the Python version (ABI tag) the torch installation is for, as torch itself does.

    Args:
        torch_dir: the installed ``torch`` package directory (``os.path.dirname(torch.__file__)``).
        torch_version: ``torch.__version__`` exactly, e.g. ``"2.13.0+cpu"``.

    Returns:
        32 bytes (a SHA-256 digest); torch writes it as ``.hex()`` or base64 in other keys.

    Raises:
        TypeError: ``torch_version`` is not a str.
        BadInputError: ``torch_dir`` is not a directory, or see :func:`build_code_hash`.
    """
    if not isinstance(torch_version, str):
        raise TypeError(f"torch_version must be a str, not {type(torch_version).__name__}")
    root = os.fspath(torch_dir)
    if not os.path.isdir(root):
        raise BadInputError(root, "not a directory (expected the installed torch package)")
    hasher = hashlib.sha256()
    hasher.update(torch_version.encode("utf-8"))
    build_code_hash([root], "", hasher)
    inductor_root = os.path.join(root, "_inductor")
    for rel in _TORCH_KEY_EXTRA_FILES:
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


# --------------------------------------------------------------------------------------------
# Autotune best configs (runtime/autotune_cache.py, runtime/triton_heuristics.py, remote_cache.py)
# --------------------------------------------------------------------------------------------


def best_config_prepare_key(kernel_py: str, cache_key_tag: str = "") -> str:
    """The per-kernel autotune key: ``hex(f"{basename(kernel_py)}:{cache_key_tag}")``.

    Mirrors torch/_inductor/runtime/autotune_cache.py: AutotuneCache._prepare_key. It is
    also the key of the kernel's entry in the remote autotune cache.

    Args:
        kernel_py: path or basename of the kernel's ``.py`` (``<cache>/<k[1:3]>/<k>.py``);
            only ``os.path.basename`` of it is used.
        cache_key_tag: ``torch.compiler.config.cache_key_tag``
            (``$TORCH_COMPILE_CACHE_KEY_TAG``, default ``""``).

    Returns:
        64 lower-case hex characters.

    Raises:
        TypeError: an argument is not a str.
    """
    if not isinstance(kernel_py, str) or not isinstance(cache_key_tag, str):
        raise TypeError("best_config_prepare_key: kernel_py and cache_key_tag must be str")
    return _sha256_hex(f"{os.path.basename(kernel_py)}:{cache_key_tag}")


def best_config_filename(kernel_py: str, torch_key: bytes, cache_key_tag: str = "") -> str:
    """File name of a kernel's local best config: ``hex(prepare_key ‖ torch_key) + ".best_config"``.

    Mirrors torch/_inductor/runtime/autotune_cache.py: AutotuneCache._make_local_cache_key
    (the name part).

    Args:
        kernel_py: path or basename of the kernel's ``.py``.
        torch_key: ``codecache.torch_key()`` (32 bytes; see :func:`torch_key`).
        cache_key_tag: ``torch.compiler.config.cache_key_tag``.

    Returns:
        ``"<64 hex>.best_config"``.

    Raises:
        TypeError: ``torch_key`` is not bytes, or see :func:`best_config_prepare_key`.
    """
    if not isinstance(torch_key, (bytes, bytearray, memoryview)):
        raise TypeError(f"torch_key must be bytes, not {type(torch_key).__name__}")
    key = best_config_prepare_key(kernel_py, cache_key_tag)
    return f"{_sha256_hex(key, torch_key)}.{BEST_CONFIG_EXTENSION}"


def best_config_local_path(kernel_py: str, torch_key: bytes, cache_key_tag: str = "") -> str:
    """Path of a kernel's local best config: next to the kernel's ``.py``.

    Mirrors torch/_inductor/runtime/autotune_cache.py: AutotuneCache._make_local_cache_key
    (``os.path.join(os.path.dirname(filename), name)``). This is the key the local
    autotune cache backend (``LocalAutotuneCache``) receives.

    Args:
        kernel_py: path of the kernel's ``.py`` as Inductor passes it (absolute in practice).
        torch_key: ``codecache.torch_key()``.
        cache_key_tag: ``torch.compiler.config.cache_key_tag``.

    Returns:
        ``os.path.join(os.path.dirname(kernel_py), best_config_filename(...))``.

    Raises:
        TypeError: see :func:`best_config_filename`.
    """
    name = best_config_filename(kernel_py, torch_key, cache_key_tag)
    return os.path.join(os.path.dirname(kernel_py), name)


def best_config_relative_key(kernel_py: str, torch_key: bytes, cache_key_tag: str = "") -> str:
    """Best-config key relative to the cache dir: ``"<k[1:3]>/<name>.best_config"``.

    Mirrors torch/_inductor/runtime/autotune_cache.py:
    AutotuneCache._artifact_key_from_local_cache_key (the Mega-Cache ``autotune`` artifact
    key; ``AutotuneCacheArtifact.populate_cache`` writes it to ``cache_dir()/key``).

    Args:
        kernel_py: path of the kernel's ``.py``: the last directory component of the path is
            used, exactly as torch does; or a bare basename ``<k>.py``, for which the
            standard layout is assumed (the kernel lives in ``<cache_dir>/<k[1:3]>/``).
        torch_key: ``codecache.torch_key()``.
        cache_key_tag: ``torch.compiler.config.cache_key_tag``.

    Returns:
        ``"<dir>/<64 hex>.best_config"`` (``os.sep``-joined).

    Raises:
        BadInputError: a bare basename whose stem is shorter than 3 characters (no shard).
        TypeError: see :func:`best_config_filename`.
    """
    local = best_config_local_path(kernel_py, torch_key, cache_key_tag)
    if os.path.dirname(kernel_py):
        return os.path.join(*local.split(os.sep)[-2:])
    stem = os.path.splitext(kernel_py)[0]
    if len(stem) < 3:
        raise BadInputError(kernel_py, "kernel basename too short to derive its <k[1:3]> directory")
    return os.path.join(stem[1:3], local)


def _config_fields(config: object, index: int) -> tuple[Mapping[str, Any], Any, Any]:
    if isinstance(config, (tuple, list)):
        if len(config) != 3:
            raise BadInputError(f"configs[{index}]", "expected (kwargs, num_warps, num_stages)")
        kwargs, num_warps, num_stages = config
    else:
        try:
            kwargs = config.kwargs  # type: ignore[attr-defined]
            num_warps = config.num_warps  # type: ignore[attr-defined]
            num_stages = config.num_stages  # type: ignore[attr-defined]
        except AttributeError as exc:
            raise BadInputError(f"configs[{index}]", f"not a Triton config: {exc}") from exc
    if not isinstance(kwargs, Mapping):
        raise BadInputError(f"configs[{index}]", f"kwargs is not a mapping: {type(kwargs).__name__}")
    return kwargs, num_warps, num_stages


def configs_hash(configs: Iterable[object]) -> str:
    """Hash of a kernel's candidate Triton configs (stored as ``"configs_hash"`` in a best config).

    Mirrors torch/_inductor/runtime/triton_heuristics.py: hash_configs (2.13 hashes only
    ``kwargs``, ``num_warps`` and ``num_stages``):
    ``hex("".join(f"{sorted(kwargs.items())} {num_warps} {num_stages}\\n" for each config))``.
    Values are formatted with Python's ``repr``/``str``, exactly as torch formats them.

    Args:
        configs: each either a tuple (or list, as JSON gives it) ``(kwargs: dict,
            num_warps: int, num_stages: int)`` or an object with ``.kwargs``,
            ``.num_warps``, ``.num_stages`` (a ``triton.Config``).

    Returns:
        64 lower-case hex characters.

    Raises:
        BadInputError: a config has the wrong shape or its kwargs are not a mapping.
    """
    hasher = hashlib.sha256()
    for index, config in enumerate(configs):
        kwargs, num_warps, num_stages = _config_fields(config, index)
        hasher.update(f"{sorted(kwargs.items())} {num_warps} {num_stages}\n".encode())
    return hasher.hexdigest()


def backend_hash(triton_key: str, backend: str) -> str:
    """``inductor_meta["backend_hash"]``: Triton's key and backend hash, upper-case hex.

    Mirrors torch/utils/_triton.py: triton_hash_with_backend (called by
    torch/_inductor/runtime/autotune_cache.py: inductor_meta_from_config):
    ``hex(f"{triton_key}-{backend}").upper()``.

    Args:
        triton_key: ``triton.compiler.compiler.triton_key()``.
        backend: ``make_backend(driver.active.get_current_target()).hash()``.

    Returns:
        64 upper-case hex characters.

    Raises:
        TypeError: an argument is not a str.
    """
    if not isinstance(triton_key, str) or not isinstance(backend, str):
        raise TypeError("backend_hash: triton_key and backend must be str")
    return _sha256_hex(f"{triton_key}-{backend}").upper()


def autotune_remote_cache_id(torch_key: bytes, backend_hash: str, configs_hash: str) -> str:
    """``cache_id`` of the remote (Redis) autotune cache of one kernel.

    Mirrors torch/_inductor/runtime/autotune_cache.py:
    AutotuneCache._setup_remote_autotune_cache:
    ``hex(torch_key.hex() ‖ backend_hash ‖ configs_hash ‖ "autotune-best-config-v2")``.
    The entry itself is stored under :func:`best_config_prepare_key`, so its Redis key is
    ``autotune_redis_key(this id, best_config_prepare_key(kernel_py, tag))``.

    Args:
        torch_key: ``codecache.torch_key()`` (bytes).
        backend_hash: ``inductor_meta["backend_hash"]`` (see :func:`backend_hash`).
        configs_hash: see :func:`configs_hash`.

    Returns:
        64 lower-case hex characters.

    Raises:
        TypeError: wrong argument types.
    """
    if not isinstance(torch_key, (bytes, bytearray, memoryview)):
        raise TypeError(f"torch_key must be bytes, not {type(torch_key).__name__}")
    if not isinstance(backend_hash, str) or not isinstance(configs_hash, str):
        raise TypeError("autotune_remote_cache_id: backend_hash and configs_hash must be str")
    return _sha256_hex(bytes(torch_key).hex(), backend_hash, configs_hash, AUTOTUNE_REMOTE_SALT)


def comment_stripped_hash(code: str) -> str:
    """:func:`code_hash` of source with every ``#`` comment (to end of line) removed.

    Mirrors torch/_inductor/runtime/autotune_cache.py: _comment_stripped_hash
    (``code_hash(re.sub(r"#.*$", "", code, flags=re.MULTILINE))``).

    Args:
        code: the compiled module's source (``str``).

    Returns:
        A :func:`code_hash` string (52 characters).

    Raises:
        TypeError: ``code`` is not a str.
    """
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, not {type(code).__name__}")
    return code_hash(re.sub(r"#.*$", "", code, count=0, flags=re.MULTILINE))


def bundled_autotune_key(
    backend_hash: str, *, code: str | None = None, code_hash: str | None = None
) -> str:
    """Key of a module's bundled best configs in the bundled autotune remote cache.

    Mirrors torch/_inductor/runtime/autotune_cache.py: AutotuneCacheBundler.begin_compile:
    ``hex(code_hash ‖ backend_hash ‖ "bundled-autotune-best-configs-v1")`` with
    ``code_hash = comment_stripped_hash(code)`` when ``code`` is given. The cache is created
    with ``cache_id`` :data:`BUNDLED_AUTOTUNE_CACHE_ID`, so the Redis key is
    ``autotune_redis_key(BUNDLED_AUTOTUNE_CACHE_ID, this key)``. The value is a JSON object
    ``{"<name>.best_config": best config, ...}``.

    Args:
        backend_hash: ``inductor_meta["backend_hash"]``.
        code: the module source (exclusive with ``code_hash``).
        code_hash: a precomputed hash (exclusive with ``code``).

    Returns:
        64 lower-case hex characters.

    Raises:
        ValueError: both or neither of ``code`` and ``code_hash`` given (torch asserts).
        TypeError: wrong argument types.
    """
    if (code is None) == (code_hash is None):
        raise ValueError("bundled_autotune_key: give exactly one of code and code_hash")
    if code is not None:
        code_hash = comment_stripped_hash(code)
    assert code_hash is not None
    if not isinstance(backend_hash, str) or not isinstance(code_hash, str):
        raise TypeError("bundled_autotune_key: backend_hash and code_hash must be str")
    return _sha256_hex(code_hash, backend_hash, BUNDLED_AUTOTUNE_SALT)


def bundled_best_config_path(entry_name: str, *, cache_dir: str) -> str:
    """Where a best config loaded from a bundle is written locally.

    Mirrors torch/_inductor/runtime/autotune_cache.py: _AutotuneCacheBundlerImpl._load_cache
    (``root, ext = _splitext_nodot(basename); codecache.get_path(root, ext)[2]``). Note the
    shard is ``entry_name[1:3]`` (of the best-config hash), not the kernel's ``k[1:3]``
    directory the entry was first written to.

    Args:
        entry_name: a key of the bundle, ``"<64 hex>.best_config"``.
        cache_dir: the Inductor cache directory.

    Returns:
        ``cache_dir/<entry_name[1:3]>/<entry_name>``.

    Raises:
        see :func:`get_path`.
    """
    root, ext = os.path.splitext(entry_name)
    if ext:
        ext = ext[1:]
    return get_path(root, ext, cache_dir=cache_dir)[2]


def autotune_redis_key(cache_id: str, key: str, version: int = REDIS_KEY_VERSION) -> str:
    """Redis key of an entry of a Redis-backed remote cache: ``f"pt2:{cache_id}::{key}:c1"``.

    Mirrors torch/_inductor/remote_cache.py: RedisRemoteCache.__init__/_get_key (used by
    ``RemoteAutotuneCache``, ``RemoteBundledAutotuneCache``, ``RemoteFxGraphCache``, ...).
    torch first builds the template ``f"pt2:{cache_id}::{{key}}:c{version}"`` and then
    ``str.format``s it with ``key``, so braces in ``cache_id`` are format syntax (``"{{"``
    becomes ``"{"``, ``"{key}"`` becomes the key); this function does the same. Real ids
    (hex digests, ``"bundled-autotune-v1"``) hold no braces, which makes the result plain
    ``f"pt2:{cache_id}::{key}:c{version}"``.

    Args:
        cache_id: the id the cache was created with (:func:`autotune_remote_cache_id`,
            :data:`BUNDLED_AUTOTUNE_CACHE_ID`, ...).
        key: the entry's key within that cache (inserted verbatim).
        version: the ``c<version>`` suffix (1 in torch 2.13).

    Returns:
        The Redis key.

    Raises:
        TypeError: wrong argument types.
        BadInputError: ``cache_id`` holds braces that ``str.format`` rejects (torch raises
            ``KeyError``/``IndexError``/``ValueError`` there).
    """
    if not isinstance(cache_id, str) or not isinstance(key, str):
        raise TypeError("autotune_redis_key: cache_id and key must be str")
    if isinstance(version, bool) or not isinstance(version, int):
        raise TypeError("autotune_redis_key: version must be an int")
    template = f"pt2:{cache_id}::{{key}}:c{version}"
    try:
        return template.format(key=key)
    except (KeyError, IndexError, ValueError, AttributeError) as exc:
        raise BadInputError("cache_id", f"braces that str.format rejects ({exc!r})") from exc


# --------------------------------------------------------------------------------------------
# CUTLASS op lists (codegen/cutlass/cache.py; 2.9/2.10: codegen/cuda/cutlass_cache.py)
# --------------------------------------------------------------------------------------------


def cutlass_config_request_key(
    arch: str,
    version: str,
    instantiation_level: str,
    *,
    cutlass_key: bytes,
    serialization_py: bytes,
    utils_py: bytes,
) -> str:
    """Request key naming a CUTLASS op list file ``configs_<key>.json``.

    Mirrors torch/_inductor/codegen/cutlass/cache.py: get_config_request_key (torch 2.13):
    ``hex("-".join([cutlass_key.hex(), arch, version, instantiation_level,
    hex(serialization_py), hex(utils_py)]))[:8]``. In 2.13 the two hashed files are
    ``torch/_inductor/codegen/cutlass/serialization.py`` and
    ``torch/_inductor/codegen/cutlass/utils.py``; in 2.9/2.10 the function lives in
    ``torch/_inductor/codegen/cuda/cutlass_cache.py`` and hashes
    ``torch/_inductor/codegen/cuda/serialization.py`` and
    ``torch/_inductor/codegen/cuda/cutlass_utils.py`` (same formula; ``instantiation_level``
    from ``config.cuda.cutlass_instantiation_level`` there, ``config.cutlass.…`` in 2.13).

    Args:
        arch: ``utils.cutlass_arch(device)``, e.g. ``"90"``.
        version: toolkit version; for CUDA ``maybe_fetch_ops`` keeps ``major.minor`` only
            (see :func:`cutlass_toolkit_version`).
        instantiation_level: ``config.cutlass.cutlass_instantiation_level`` (default ``"0"``).
        cutlass_key: ``codecache.cutlass_key()`` (see :func:`cutlass_key`).
        serialization_py: raw bytes of the installed serialization module's file.
        utils_py: raw bytes of the installed utils module's file.

    Returns:
        8 lower-case hex characters.

    Raises:
        TypeError: wrong argument types.
    """
    for name, value in (("arch", arch), ("version", version), ("instantiation_level", instantiation_level)):
        if not isinstance(value, str):
            raise TypeError(f"cutlass_config_request_key: {name} must be a str")
    for name, blob in (("cutlass_key", cutlass_key), ("serialization_py", serialization_py), ("utils_py", utils_py)):
        if not isinstance(blob, (bytes, bytearray, memoryview)):
            raise TypeError(f"cutlass_config_request_key: {name} must be bytes")
    hash_target = "-".join(
        [
            bytes(cutlass_key).hex(),
            arch,
            version,
            instantiation_level,
            hashlib.sha256(serialization_py).hexdigest(),
            hashlib.sha256(utils_py).hexdigest(),
        ]
    )
    return _sha256_hex(hash_target)[0:8]


def cutlass_config_filename(request_key: str) -> str:
    """File name of a CUTLASS op list at the top of the cache dir: ``f"configs_{request_key}.json"``.

    Mirrors torch/_inductor/codegen/cutlass/cache.py: _generate_config_filename.

    Args:
        request_key: see :func:`cutlass_config_request_key`.

    Returns:
        ``"configs_<request_key>.json"``.

    Raises:
        TypeError: ``request_key`` is not a str.
    """
    if not isinstance(request_key, str):
        raise TypeError("request_key must be a str")
    return f"{CUTLASS_CONFIG_PREFIX}_{request_key}.json"


def cutlass_toolkit_version(version: str) -> str:
    """CUDA version as the CUTLASS request key uses it: ``major.minor`` (``"12.4.0"`` -> ``"12.4"``).

    Mirrors torch/_inductor/codegen/cutlass/cache.py: maybe_fetch_ops
    (``".".join(version.split(".")[:2])``, applied for ``device_type == "cuda"`` only).

    Args:
        version: ``utils.toolkit_version("cuda")``.

    Returns:
        The first two dot-separated parts.

    Raises:
        TypeError: ``version`` is not a str.
    """
    if not isinstance(version, str):
        raise TypeError("version must be a str")
    return ".".join(version.split(".")[:2])


# --------------------------------------------------------------------------------------------
# runtime/caching isolation key, CuTe-DSL kernel names
# --------------------------------------------------------------------------------------------


def isolation_key(context: Mapping[str, Any]) -> str:
    """Isolation key of the runtime-caching memoizers: ``hex(json.dumps(context, sort_keys=True))[:32]``.

    Mirrors torch/_inductor/runtime/caching/context.py: _isolation_key (over the dict
    ``_isolation_context(ischema)`` returns: ``{"runtime_context": {...} | None,
    "compile_context": {...} | None}``).

    Args:
        context: the isolation context dict (JSON-serializable).

    Returns:
        32 lower-case hex characters.

    Raises:
        BadInputError: ``context`` is not a mapping or not JSON-serializable.
    """
    if not isinstance(context, Mapping):
        raise BadInputError("context", f"not a mapping: {type(context).__name__}")
    try:
        text = json.dumps(context, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise BadInputError("context", f"not JSON-serializable: {exc}") from exc
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def isolation_torch_version_hash(torch_key: bytes) -> str:
    """The ``compile_context["torch_version_hash"]`` entry: base64 of ``torch_key()``.

    Mirrors torch/_inductor/runtime/caching/context.py: _CompileContext.torch_version_hash.

    Args:
        torch_key: ``codecache.torch_key()`` (bytes).

    Returns:
        Standard base64 text (44 characters for a 32-byte key).

    Raises:
        TypeError: ``torch_key`` is not bytes.
    """
    if not isinstance(torch_key, (bytes, bytearray, memoryview)):
        raise TypeError("torch_key must be bytes")
    return base64.b64encode(bytes(torch_key)).decode()


def cutedsl_kernel_name(fused_name: str, src: str) -> str:
    """Name of a CuTe-DSL kernel in the generated wrapper.

    Mirrors torch/_inductor/codegen/cutedsl/cutedsl_scheduling.py:
    CuteDSLScheduling.define_kernel: ``h = hex(src)[:8]``; ``f"cutedsl_{h}"`` when
    ``fused_name == "fused"``, else ``f"cutedsl_{fused_name}_{h}"``. ``fused_name`` is
    ``get_fused_kernel_name(...)`` with ``config.triton.descriptive_names`` on, ``""``
    with it off (which gives ``"cutedsl__<h>"``).

    Args:
        fused_name: the descriptive fused name (``"fused"``, ``"fused_add_mul"``, ``""``).
        src: the kernel source *before* the ``KERNEL_NAME`` placeholder is replaced.

    Returns:
        The kernel name.

    Raises:
        TypeError: an argument is not a str.
    """
    if not isinstance(fused_name, str) or not isinstance(src, str):
        raise TypeError("cutedsl_kernel_name: fused_name and src must be str")
    kernel_hash = hashlib.sha256(src.encode("utf-8")).hexdigest()[:8]
    if fused_name == "fused":
        return f"cutedsl_{kernel_hash}"
    return f"cutedsl_{fused_name}_{kernel_hash}"
