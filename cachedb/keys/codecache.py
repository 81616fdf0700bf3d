"""Keys of torch/_inductor/codecache.py: entry names, code hashes, paths, the system hash and
``PersistentCache`` (autotune timings) keys.

Source-tree digests of the same file (``build_code_hash``, ``torch_key``, ``cutlass_key``) are
in :mod:`cachedb.keys.source_hashes`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from typing import Any

from .._errors import BadInputError
from ._common import KeyComponent, _b32_51, _sha256_hex, _to_bytes


#: ``CacheBase.get_system()["hash"]`` on every machine without a CUDA/ROCm device:
#: ``hex(json.dumps({}))`` = ``hex(b"{}")``.
CPU_SYSTEM_HASH = "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"


# torch/_inductor/codecache.py: get_hash
_TEXT_HASH_TYPES = frozenset({"amdgcn", "code", "ptx", "spv"})
_BINARY_HASH_TYPES = frozenset({"cubin", "hsaco"})


# "<inputs>_<hint_override>" where <inputs> is a list repr and <hint_override> is str(int).
_HINTED_INPUTS_KEY = re.compile(r"(.*\])_(0|-?[1-9][0-9]*)", re.DOTALL)


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
    """:func:`sha256_hash` from an already computed SHA-256 ``digest``: hash once, name and check.

    Mirrors torch/_inductor/codecache.py: sha256_hash (its encoding step only:
    ``b32_51(digest)``), so a caller that already holds the payload's SHA-256 (for its checksum)
    names the entry without hashing the payload again.

    Args:
        digest: ``hashlib.sha256(data).digest()`` (32 bytes).

    Returns:
        51 lower-case base32 characters, equal to ``sha256_hash(data)``.

    Raises:
        Nothing for 32 bytes (other lengths give a name torch would never produce).
    """
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
