"""Shared primitives of the key formulas: torch/_inductor/cache_key.py's strategies.

``_to_bytes`` mirrors ``CacheKeyStrategy._to_bytes``; ``_sha256_hex`` is the hex digest of the
concatenated components (``AUTOTUNE_CACHE_KEY_STRATEGY`` / ``SYSTEM_CACHE_KEY_STRATEGY``);
``_b32_51`` the compact base32 form (``COMPACT_CACHE_KEY_STRATEGY`` / ``CODE_CACHE_KEY_STRATEGY``).
Notation in the docstrings of this package: see :mod:`cachedb.keys`.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Protocol, Union


#: What torch's cache-key strategies accept as one component (``cache_key.CacheKeyComponent``).
KeyComponent = Union[str, bytes, bytearray, memoryview]


class _Hasher(Protocol):
    def update(self, data: bytes, /) -> None: ...


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


#: Two lower-case base32 characters (RFC 4648 alphabet) per 10-bit value, for :func:`_b32_51`.
_B32_PAIRS = tuple(a + b for a in "abcdefghijklmnopqrstuvwxyz234567" for b in "abcdefghijklmnopqrstuvwxyz234567")


def _b32_51(digest: bytes) -> str:
    """``base64.b32encode(digest)[:51].decode().lower()`` for a 32-byte SHA-256 digest (the
    51 characters drop the ``"Q===="`` tail every encoded digest ends with), in ~4 us instead
    of ~10 us: Python 3.11's ``b32encode`` is pure Python. Other lengths take that slow path."""
    if len(digest) != 32:
        return base64.b32encode(digest)[:51].decode("utf-8").lower()
    pairs = _B32_PAIRS
    out: list[str] = []
    for i in (0, 5, 10, 15, 20, 25):  # 40 bits -> 8 characters
        c = int.from_bytes(digest[i:i + 5], "big")
        out += (pairs[c >> 30], pairs[(c >> 20) & 1023], pairs[(c >> 10) & 1023], pairs[c & 1023])
    c = int.from_bytes(digest[30:], "big") << 4  # the last 16 bits, padded to 20: 4 characters
    out += (pairs[c >> 10], pairs[c & 1023])
    return "".join(out)[:51]


def _sha256_hex(*components: KeyComponent) -> str:
    # AUTOTUNE_CACHE_KEY_STRATEGY / SYSTEM_CACHE_KEY_STRATEGY: hex digest, components concatenated.
    hasher = hashlib.sha256()
    for component in components:
        hasher.update(_to_bytes(component))
    return hasher.hexdigest()
