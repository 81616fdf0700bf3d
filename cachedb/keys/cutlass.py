"""Keys of torch/_inductor/codegen/cutlass/cache.py (2.9/2.10:
torch/_inductor/codegen/cuda/cutlass_cache.py): CUTLASS op list files.
"""

from __future__ import annotations

import hashlib

from ._common import _sha256_hex


#: File-name prefix of CUTLASS op lists (``codegen/cutlass/cache.py: CONFIG_PREFIX``).
CUTLASS_CONFIG_PREFIX = "configs"


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
