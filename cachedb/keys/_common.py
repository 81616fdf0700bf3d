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


def _b32_51(digest: bytes) -> str:
    # [:51] drops the "Q====" tail every base32-encoded SHA-256 digest ends with.
    return base64.b32encode(digest)[:51].decode("utf-8").lower()


def _sha256_hex(*components: KeyComponent) -> str:
    # AUTOTUNE_CACHE_KEY_STRATEGY / SYSTEM_CACHE_KEY_STRATEGY: hex digest, components concatenated.
    hasher = hashlib.sha256()
    for component in components:
        hasher.update(_to_bytes(component))
    return hasher.hexdigest()
