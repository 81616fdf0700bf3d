"""Keys of torch/_inductor/runtime/autotune_cache.py: local best-config files, the remote and
bundled autotune caches (and ``backend_hash`` of torch/utils/_triton.py, which it calls).

``configs_hash`` (torch/_inductor/runtime/triton_heuristics.py) is in
:mod:`cachedb.keys.triton_heuristics`; Redis key formatting (torch/_inductor/remote_cache.py) in
:mod:`cachedb.keys.remote_cache`.
"""

from __future__ import annotations

import os
import re

from .._errors import BadInputError
from ._common import _sha256_hex
from ._versions import formula_version
from .codecache import code_hash, get_path


#: Salt of the remote autotune cache id (``AutotuneCache._setup_remote_autotune_cache``).
AUTOTUNE_REMOTE_SALT = "autotune-best-config-v2"
#: Salt of the bundled autotune key (``AutotuneCacheBundler.begin_compile``).
BUNDLED_AUTOTUNE_SALT = "bundled-autotune-best-configs-v1"
#: ``cache_id`` the bundled autotune remote cache is created with (``create_cache("bundled-autotune-v1", ...)``).
BUNDLED_AUTOTUNE_CACHE_ID = "bundled-autotune-v1"


#: Extension of local best-config files (``AutotuneCache._make_local_cache_key``).
BEST_CONFIG_EXTENSION = "best_config"


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


def best_config_local_path(
    kernel_py: str, torch_key: bytes, cache_key_tag: str = "", *, torch_version: str | None = None
) -> str:
    """Path of a kernel's local best config: next to the kernel's ``.py``.

    Mirrors torch/_inductor/runtime/autotune_cache.py: AutotuneCache._make_local_cache_key
    (2.13 to 2.15: ``os.path.join(os.path.dirname(filename), name)``); 2.9 to 2.12:
    AutotuneCache._setup_local_cache (``f"{dirname}/{name}"``, which differs only for a
    ``kernel_py`` without a directory or directly under ``/``). This is the key the local
    autotune cache backend (``LocalAutotuneCache``) receives.

    Args:
        kernel_py: path of the kernel's ``.py`` as Inductor passes it (absolute in practice).
        torch_key: ``codecache.torch_key()``.
        cache_key_tag: ``torch.compiler.config.cache_key_tag``.
        torch_version: ``torch.__version__`` whose formula applies; ``None``: the installed
            torch's (see :mod:`cachedb.keys._versions`).

    Returns:
        ``os.path.join(os.path.dirname(kernel_py), best_config_filename(...))`` (2.9 to
        2.12: ``f"{os.path.dirname(kernel_py)}/{best_config_filename(...)}"``).

    Raises:
        TypeError: see :func:`best_config_filename`.
    """
    name = best_config_filename(kernel_py, torch_key, cache_key_tag)
    if formula_version(torch_version) < (2, 13):
        return f"{os.path.dirname(kernel_py)}/{name}"
    return os.path.join(os.path.dirname(kernel_py), name)


def best_config_relative_key(kernel_py: str, torch_key: bytes, cache_key_tag: str = "") -> str:
    """Best-config key relative to the cache dir: ``"<k[1:3]>/<name>.best_config"``.

    Mirrors torch/_inductor/runtime/autotune_cache.py:
    AutotuneCache._artifact_key_from_local_cache_key (2.13 to 2.15; the Mega-Cache
    ``autotune`` artifact key; ``AutotuneCacheArtifact.populate_cache`` writes it to
    ``cache_dir()/key``); 2.9 to 2.12: LocalAutotuneCache._get/_put and
    AutotuneCache.save (``os.path.join(*key.split(os.sep)[-2:])`` of the local path), the
    same value on every release.

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
    name = best_config_filename(kernel_py, torch_key, cache_key_tag)
    if os.path.dirname(kernel_py):
        return os.path.join(*os.path.join(os.path.dirname(kernel_py), name).split(os.sep)[-2:])
    stem = os.path.splitext(kernel_py)[0]
    if len(stem) < 3:
        raise BadInputError(kernel_py, "kernel basename too short to derive its <k[1:3]> directory")
    return os.path.join(stem[1:3], name)


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
