"""Payload codec: zstd frames with the size and SHA-256 checksum of the uncompressed bytes."""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass

import zstandard

from ._errors import CorruptPayloadError

#: zstd level for stored payloads: level 3 shrinks CPU entries ~4x and GPU entries ~10x.
ZSTD_LEVEL = 3
#: zstd level for payloads of :data:`LARGE_PAYLOAD_BYTES` or more. Measured on the benchmark's
#: FX entries (2 cores): 1 MB compresses in 2.3 ms at level 1 vs 3.3 ms at level 3 (6.65x vs
#: 7.0x), 20 MB in 60 ms vs 102 ms (3.67x vs 4.23x); decompression is as fast or faster.
ZSTD_LEVEL_LARGE = 1
#: Bytes from which a payload is compressed at :data:`ZSTD_LEVEL_LARGE` (1 MiB).
LARGE_PAYLOAD_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Packed:
    """A payload ready to store: ``blob`` (zstd frame), ``size_bytes`` and ``checksum``
    (SHA-256 hex digest) of the uncompressed bytes."""

    blob: bytes
    size_bytes: int
    checksum: str


def checksum(data: bytes) -> str:
    """SHA-256 hex digest (64 characters) of ``data``."""
    return hashlib.sha256(data).hexdigest()


_COMPRESSOR = threading.local()


def pack(data: bytes, *, digest: bytes | None = None) -> Packed:
    """Compress ``data`` (bytes) into a zstd frame that records its content size, at
    :data:`ZSTD_LEVEL` (:data:`ZSTD_LEVEL_LARGE` from :data:`LARGE_PAYLOAD_BYTES` on).
    ``digest``: its SHA-256 digest when the caller already has it (saves hashing twice)."""
    large = len(data) >= LARGE_PAYLOAD_BYTES
    compressor = getattr(_COMPRESSOR, "large" if large else "c", None)
    if compressor is None:
        compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL_LARGE if large else ZSTD_LEVEL, write_content_size=True)
        setattr(_COMPRESSOR, "large" if large else "c", compressor)
    blob = compressor.compress(data)
    hexdigest = digest.hex() if digest is not None else checksum(data)
    return Packed(blob=blob, size_bytes=len(data), checksum=hexdigest)


_DECOMPRESSOR = threading.local()


def unpack(blob: bytes, size_bytes: int, expected_checksum: str, *, where: str) -> bytes:
    """Decompress and verify a stored payload.

    Raises :class:`~cachedb.CorruptPayloadError` (naming ``where``) when the frame does not
    decompress, has the wrong size, or its SHA-256 differs from ``expected_checksum``.

    The SHA-256 pass stays on every read: zstd's own frame checksum cannot tell a payload
    that moved to another row (a self-consistent frame), and serving another entry's graph
    would be the worst failure a compiler cache can have.
    """
    decompressor = getattr(_DECOMPRESSOR, "d", None)
    if decompressor is None:
        decompressor = _DECOMPRESSOR.d = zstandard.ZstdDecompressor()
    try:
        data = decompressor.decompress(bytes(blob), max_output_size=max(size_bytes, 1))
    except zstandard.ZstdError as exc:
        raise CorruptPayloadError(where, f"zstd: {exc}") from exc
    if len(data) != size_bytes:
        raise CorruptPayloadError(where, f"{len(data)} bytes, expected {size_bytes}")
    if checksum(data) != expected_checksum:
        raise CorruptPayloadError(where, "SHA-256 checksum mismatch")
    return data
