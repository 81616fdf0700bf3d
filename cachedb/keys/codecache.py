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
from ._versions import formula_version


#: ``CacheBase.get_system()["hash"]`` on every machine without a CUDA/ROCm device, torch 2.9
#: to 2.14: ``hex(json.dumps({}))`` = ``hex(b"{}")`` (2.15 hashes Triton's key there too).
CPU_SYSTEM_HASH = "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"


# torch 2.15's CacheBase.get_system: what its hash_input may hold.
_SYSTEM_HASH_FIELDS = ("version", "device", "device_interfaces")

# torch/_inductor/codecache.py: get_hash
_TEXT_HASH_TYPES = frozenset({"amdgcn", "code", "ptx", "spv"})
_BINARY_HASH_TYPES = frozenset({"cubin", "hsaco"})


# "<inputs>_<hint_override>" where <inputs> is a list repr and <hint_override> is str(int).
_HINTED_INPUTS_KEY = re.compile(r"(.*\])_(0|-?[1-9][0-9]*)", re.DOTALL)


def sha256_hash(data: KeyComponent) -> str:
    """Compact base32 SHA-256: the file name of an FX-graph / AOTAutograd entry's bytes.

    Mirrors torch/_inductor/codecache.py: sha256_hash (2.13 on:
    ``COMPACT_CACHE_KEY_STRATEGY.key`` of torch/_inductor/cache_key.py; 2.9 to 2.12: the same
    formula inline, over ``bytes`` only).

    Args:
        data: the bytes to hash (``bytes``; ``str`` is UTF-8 encoded and ``bytearray`` and
            ``memoryview`` are accepted as torch 2.13 on accepts them; 2.9 to 2.12 raise
            ``TypeError`` for a ``str``, the same value on everything they accept).

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

    Mirrors torch/_inductor/codecache.py: code_hash (2.13 on: ``CODE_CACHE_KEY_STRATEGY.key``;
    2.9 to 2.12: the same formula inline, over ``str`` and ``bytes`` only).

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

    Mirrors torch/_inductor/codecache.py: get_path (2.9 to 2.15), with torch's ``cache_dir()``
    passed in as ``cache_dir`` (2.13 on it is always absolute:
    ``os.path.abspath($TORCHINDUCTOR_CACHE_DIR)`` or ``<tmp>/torchinductor_<user>``; 2.9 to
    2.12 keep a relative ``$TORCHINDUCTOR_CACHE_DIR`` as it is; this function uses it as given).

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
    torch_version: str | None = None,
) -> str:
    """Key of a kernel source or binary, by kind.

    Mirrors torch/_inductor/codecache.py: get_hash, per torch release: the binary kinds are
    ``cubin``, ``hsaco`` and the XPU format from 2.11 on, ``cubin`` and ``hsaco`` only in
    2.9/2.10 (which list ``spv`` there too, already taken as text).

    Args:
        content: source (``str``) or binary (``bytes``).
        extra: extra component for text kinds (ignored for binary kinds, as in torch).
        hash_type: ``"code"``, ``"ptx"``, ``"amdgcn"``, ``"spv"`` (text kinds:
            ``code_hash(content, extra)``) or ``"cubin"``, ``"hsaco"`` or the XPU binary
            format (binary kinds: ``code_hash(repr(content))``).
        xpu_kernel_format: torch's ``torch/_inductor/utils.py: XPU_KERNEL_FORMAT``
            (``$TORCHINDUCTOR_XPU_KERNEL_FORMAT``, default ``"zebin"``; ``"spv"`` on Windows;
            2.11 on).
        torch_version: ``torch.__version__`` whose formula applies; ``None``: the installed
            torch's (see :mod:`cachedb.keys._versions`).

    Returns:
        A :func:`code_hash` string (52 characters).

    Raises:
        ValueError: unknown ``hash_type`` (torch raises ``AssertionError``).
        TypeError: ``content``/``extra`` of an unsupported type.
    """
    if hash_type in _TEXT_HASH_TYPES:
        return code_hash(content, extra)
    if hash_type in _BINARY_HASH_TYPES or (
        hash_type == xpu_kernel_format and formula_version(torch_version) >= (2, 11)
    ):
        return code_hash(repr(content))
    raise ValueError(f"Unknown hash type {hash_type}")


def system_hash(system: Mapping[str, Any], *, torch_version: str | None = None) -> str:
    """The ``system_hash`` naming ``cache/<system_hash>``, recomputed from a system description.

    Mirrors torch/_inductor/codecache.py: CacheBase.get_system (its ``"hash"`` field), per
    torch release:

    - 2.9 to 2.12: ``hashlib.sha256(json.dumps(system, sort_keys=True))`` over the dict before
      ``"hash"`` is added (inline code of ``get_system``);
    - 2.13 and 2.14: ``SYSTEM_CACHE_KEY_STRATEGY.key_from_json(hash_input)``
      (torch/_inductor/cache_key.py), same value;
    - 2.15: the same strategy over ``hash_input``, which now always holds ``"version"``
      and holds ``"device"`` only with a GPU and ``"device_interfaces"`` only when a device
      interface reports ``get_cache_system_info()``.

    Args:
        system: a dict as ``get_system()`` returns it (a ``"hash"`` key, if present, is
            ignored). Up to 2.14: with ``"device"`` and ``"version"`` (GPU) the hash is
            ``hex(json.dumps({"device": ..., "version": ...}, sort_keys=True))``; with
            neither (no GPU) ``hex(json.dumps({}))`` = :data:`CPU_SYSTEM_HASH`. From 2.15:
            ``hex(json.dumps(<"version", "device", "device_interfaces" present>,
            sort_keys=True))``.
        torch_version: ``torch.__version__`` whose formula applies (for stored data, the
            fingerprint's); ``None``: the installed torch's (see :mod:`cachedb.keys._versions`).

    Returns:
        64 lower-case hex characters.

    Raises:
        BadInputError: ``system`` is not a mapping, is not JSON-serializable, or (up to 2.14)
            has only one of ``"device"``/``"version"``.
    """
    if not isinstance(system, Mapping):
        raise BadInputError("system", f"not a mapping: {type(system).__name__}")
    if formula_version(torch_version) >= (2, 15):
        hash_input: dict[str, Any] = {k: system[k] for k in _SYSTEM_HASH_FIELDS if k in system}
    else:
        has_device, has_version = "device" in system, "version" in system
        if has_device != has_version:
            raise BadInputError("system", "has one of 'device'/'version' without the other")
        hash_input = {"device": system["device"], "version": system["version"]} if has_device else {}
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
    *,
    device_interfaces: Mapping[str, Mapping[str, Any]] | None = None,
    torch_version: str | None = None,
) -> dict[str, Any]:
    """The dict ``CacheBase.get_system()`` returns (and Inductor writes as ``"system"``).

    Mirrors torch/_inductor/codecache.py: CacheBase.get_system, per torch release:

    - 2.9 to 2.14: ``{"hash": CPU_SYSTEM_HASH}`` without a GPU, else ``{"device": {"name":
      N}, "version": {"triton": T, "cuda": C} (or "hip"), "hash": H}``;
    - 2.15: ``{"version": {"triton": T}, "hash": H}`` without a GPU (Triton's key is
      recorded whether or not there is a GPU; ``None`` without Triton), else ``{"version":
      {"triton": T, "cuda": C} (or "hip"), "device": {"name": N}, "hash": H}``; either with
      ``"device_interfaces"`` before ``"hash"`` when a registered device interface reports
      ``get_cache_system_info()`` (none of torch's own do).

    Args:
        device_name: ``torch.cuda.get_device_properties(...).name`` on CUDA,
            ``.gcnArchName`` on ROCm; ``None`` for a machine without a GPU (torch's
            ``except (AssertionError, RuntimeError)`` branch).
        triton_key: ``codecache.triton_key()`` (``None`` without Triton).
        cuda_version: ``torch.version.cuda``; when not ``None`` it is recorded as ``"cuda"``.
        hip_version: ``torch.version.hip``, recorded as ``"hip"`` when ``cuda_version`` is None.
        device_interfaces: 2.15: ``{backend name: get_cache_system_info()}`` of the available
            device interfaces that returned a dict (empty or ``None``: none; ignored before 2.15).
        torch_version: ``torch.__version__`` whose formula applies; ``None``: the installed
            torch's (see :mod:`cachedb.keys._versions`).

    Returns:
        The dict, with keys in torch's insertion order.

    Raises:
        Nothing beyond :func:`system_hash`'s errors.
    """
    version_info: dict[str, Any] = {"triton": triton_key}
    device_info: dict[str, Any] | None = None
    if device_name is not None:
        device_info = {"name": device_name}
        if cuda_version is not None:
            version_info["cuda"] = cuda_version
        else:
            version_info["hip"] = hip_version
    if formula_version(torch_version) >= (2, 15):
        hash_input: dict[str, Any] = {"version": version_info}
        if device_info is not None:
            hash_input["device"] = device_info
        if device_interfaces:
            hash_input["device_interfaces"] = {k: dict(v) for k, v in device_interfaces.items()}
        return {**hash_input, "hash": system_hash(hash_input, torch_version="2.15")}
    if device_info is None:
        return {"hash": CPU_SYSTEM_HASH}
    hash_input = {"device": device_info, "version": version_info}
    return {**hash_input, "hash": system_hash(hash_input, torch_version="2.14")}


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
