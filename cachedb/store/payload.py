"""Payload codec: zstd frames with the size and SHA-256 checksum of the uncompressed bytes.

A stored payload (format 2) is::

    zstd frame (content size, XXH64 content checksum) | skippable frame (magic 0x184D2A50,
    32 bytes: the SHA-256 digest of the uncompressed bytes)

and a payload stored as it is (format 3, what :func:`pack` writes at :data:`STORED_LEVEL`:
guarded entries under 1 MiB on SQLite) is::

    zstd frame of raw blocks (content size, XXH64 content checksum) | skippable frame (magic
    0x184D2A51, 8 bytes: the XXH3-64 digest of the uncompressed bytes) | the same SHA-256
    skippable frame

Any zstd decoder reads both (skippable frames are skipped; ``zstd -d`` and
``zstandard.ZstdDecompressor().decompress`` both give the content), so a cachedb of before
either format (decompress, then SHA-256) reads them, as it reads a database copied or synced
from this one; a format-2 reader takes a format-3 payload as format 2 (the SHA-256 frame
still ends it). Payloads written before (format 1: the zstd frame alone, no content checksum)
are read as before.

Reading (:func:`unpack`) proves two things: the bytes are the content that was stored, and
they belong to this row. Neither hashes the content with SHA-256 again:

- format 3: the content is sliced out of the raw blocks (no decompression) and its XXH3-64
  must equal the digest in the second frame (~5 us for 100 KB, copy included, where zstd's
  copy and XXH64 take ~10 us);
- format 2: zstd verifies the XXH64 checksum while it decompresses;

and the digest in the last frame must equal the row's ``checksum`` column (a payload moved to
another row carries another digest). Format 1, a trailer that does not match, and
``full=True`` (signed databases, ``cachedb verify``) compute the SHA-256 of the content
instead.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import threading
from dataclasses import dataclass
from typing import Protocol

import xxhash
import zstandard

from .._errors import CorruptPayloadError
from .. import settings

log = logging.getLogger("cachedb")

#: zstd level for stored payloads. Measured (2 cores, AMD EPYC VM) on real Inductor entries
#: (7 FX graph / AOTAutograd pickles of a CPU compile, 75-190 KB): level 1 compresses them in
#: 105 us an entry against 140 us at level 3, to 5.62x against 5.78x, and both decompress in
#: 45-47 us; a live 100 KB FX graph put went from 452 to 408 us. C++ ``.so`` files shrink 3.18x
#: against 3.35x, Triton kernel directories 3.69x against 3.72x. On the benchmark's larger FX
#: entries: 1 MB in 2.3 ms against 3.3 ms (6.65x against 7.0x), 20 MB in 60 ms against 102 ms
#: (3.67x against 4.23x); decompression as fast or faster.
ZSTD_LEVEL = 1
#: Bytes from which a payload is compressed by :data:`ZSTD_THREADS_LARGE` zstd workers (1 MiB).
LARGE_PAYLOAD_BYTES = 1 << 20
#: zstd worker threads for payloads of :data:`LARGE_PAYLOAD_BYTES` or more (zstd splits the
#: input into jobs of a few MB; smaller payloads gain nothing). Measured on 2 cores: a 20 MB FX
#: entry in 32 ms with 2 workers vs 50 ms with none, the same ratio (3.65x); one zstd frame
#: either way.
ZSTD_THREADS_LARGE = max(1, min(4, os.cpu_count() or 1))

#: Environment variable: the zstd level of every payload this process writes, as ccache's
#: ``compression_level``. Unset or 0: :data:`ZSTD_LEVEL`, except guarded entries under
#: :data:`GUARDED_STORED_BELOW_BYTES`, stored as they are (:func:`guarded_level`).
#: Negative levels (zstd's ``--fast=N`` is level -N) trade bytes for speed: at -1000 a payload
#: is stored as it is (ratio 1.0), still in a zstd frame with its content checksum. Readers
#: take any level; the setting changes what is written, never what can be read.
LEVEL_ENV = "CACHEDB_COMPRESSION_LEVEL"

#: zstd's lowest level (``ZSTD_minCLevel()``: ``-ZSTD_TARGETLENGTH_MAX``); python-zstandard
#: does not export it, and a level past a C ``int`` raises ``OverflowError`` at compression.
MIN_COMPRESSION_LEVEL = -(1 << 17)

_level_setting: tuple[str | None, int | None] = (None, None)  # (raw value, parsed level)

#: zstd level at which a payload is stored as it is (ratio 1.0; format 3): a zstd frame of raw
#: blocks that still records the content size and XXH64 checksum, so every cachedb reads and
#: verifies it as any other payload, followed by the XXH3-64 digest of the content, so that
#: this one reads it without zstd (:func:`unpack`). cachedb writes that frame itself
#: (:func:`_stored_body`): zstd at this level still compresses blocks it finds matches in (a
#: 500 KB benchmark entry came out as two compressed blocks and three raw ones), and those
#: would need decompressing. On a 100 KB FX graph entry (2 cores, in a loop over one entry):
#: read in ~5 us (the content's copy ~2 us, XXH3 ~2 us) against ~10.6 us through zstd (its
#: copy and XXH64) and 64 us at :data:`ZSTD_LEVEL`.
STORED_LEVEL = -1000
#: Guarded entries (FX graph and AOTAutograd pickles) of fewer uncompressed bytes than this
#: are stored as they are (:data:`STORED_LEVEL`) unless :data:`LEVEL_ENV` is set (1 MiB, as
#: :data:`LARGE_PAYLOAD_BYTES`). Inductor reads such a file in ~0.03 ms from the page cache,
#: and zstd's decompression alone took 0.06-0.13 ms: compressed, a live FX graph get was
#: 1.2-2.1x the file get; stored, 0.92x (``benchmarks`` §4, docs/hot-paths.md). They take
#: the bytes their files take. Larger ones stay compressed: their put would cost 2.75x the
#: file write uncompressed, and their get is bound by SQLite's page reads either way.
GUARDED_STORED_BELOW_BYTES = LARGE_PAYLOAD_BYTES


def _configured_level() -> int | None:
    """The level in :data:`LEVEL_ENV`, or None when it is unset, 0 or not a zstd level (a bad
    value is logged once per value)."""
    global _level_setting
    raw = os.environ.get(LEVEL_ENV)
    if raw != _level_setting[0]:
        level: int | None = None
        try:
            level = settings.read(LEVEL_ENV)
        except settings.SettingError as exc:
            log.warning("%s; payloads use the default level", exc)
            level = None
        _level_setting = (raw, level or None)
    return _level_setting[1]


def compression_level() -> int:
    """The zstd level :func:`pack` uses for a payload by default: the integer in
    :data:`LEVEL_ENV` when it is set, non-zero and within zstd's levels
    (:data:`MIN_COMPRESSION_LEVEL` to 22), else :data:`ZSTD_LEVEL`.
    A value that is not such an integer is logged once per value (naming the variable and the
    value) and the default is used: a bad setting never fails a write."""
    chosen = _configured_level()
    return ZSTD_LEVEL if chosen is None else chosen


def guarded_level(size_bytes: int, dialect: str = "sqlite") -> int:
    """The zstd level of a guarded entry (FX graph or AOTAutograd pickle) of ``size_bytes``
    uncompressed bytes written to a database of ``dialect`` (SQLAlchemy's dialect name):
    :data:`LEVEL_ENV` when it is set (as :func:`compression_level`), else on SQLite
    :data:`STORED_LEVEL` below :data:`GUARDED_STORED_BELOW_BYTES` and :data:`ZSTD_LEVEL` from
    there, and :data:`ZSTD_LEVEL` at every size elsewhere.

    Stored as it is pays where the bytes are read from the page cache (SQLite). PostgreSQL
    compresses a ``bytea`` value over ~2 KB itself (TOAST, pglz) when it can, and sends it over
    a socket whole: on 300 synthetic 100 KB entries on the local server, a stored frame took
    2.7 ms to insert and 1.0 ms to read back and check, a level-1 frame 0.9-1.3 ms and
    0.35 ms, and 6.1 MB of table against 8.2 MB."""
    chosen = _configured_level()
    if chosen is not None:
        return chosen
    if dialect != "sqlite":
        return ZSTD_LEVEL
    return STORED_LEVEL if size_bytes < GUARDED_STORED_BELOW_BYTES else ZSTD_LEVEL


#: The header of the skippable frame that ends a format-2 payload: zstd's first skippable
#: magic number and the frame's length (32: a SHA-256 digest), little-endian.
TRAILER_HEADER = struct.pack("<II", 0x184D2A50, 32)
#: Bytes the trailer adds to a payload (header and digest).
TRAILER_BYTES = len(TRAILER_HEADER) + 32
#: The header of the skippable frame between a format-3 payload's zstd frame and its trailer:
#: zstd's second skippable magic number and the frame's length (8: an XXH3-64 digest).
XXH3_HEADER = struct.pack("<II", 0x184D2A51, 8)
#: Bytes that frame takes (header and digest).
XXH3_FRAME_BYTES = len(XXH3_HEADER) + 8
#: zstd's magic number, the first 4 bytes of a zstd frame (little-endian 0xFD2FB528).
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: zstd's largest block (``ZSTD_BLOCKSIZE_MAX``, 128 KiB): a format-3 frame's raw blocks hold
#: this many bytes of content each, the last one the rest.
RAW_BLOCK_BYTES = 1 << 17
#: Frame header descriptor of a format-3 frame (RFC 8878, 3.1.1.1.1): single segment (no
#: window descriptor), content checksum, no dictionary, and a content size of 4 bytes
#: (:data:`_FHD_SIZE8`: 8 bytes, for 4 GiB or more).
_FHD_SIZE4 = 0x80 | 0x20 | 0x04
_FHD_SIZE8 = 0xC0 | 0x20 | 0x04
#: A format-3 frame header: magic, descriptor, content size (4 or 8 bytes, little-endian).
_HEADER4 = struct.Struct("<4sBI")
_HEADER8 = struct.Struct("<4sBQ")


@dataclass(frozen=True, slots=True)
class Packed:
    """A payload ready to store: ``blob`` (a format-2 payload: zstd frame and trailer),
    ``size_bytes`` and ``checksum`` (SHA-256 hex digest) of the uncompressed bytes."""

    blob: bytes
    size_bytes: int
    checksum: str


def checksum(data: bytes) -> str:
    """SHA-256 hex digest (64 characters) of ``data``."""
    return hashlib.sha256(data).hexdigest()


_COMPRESSOR = threading.local()  # (level, single-threaded context), one per thread


class _LargeCompressor:
    """The process's one multi-threaded zstd context, for payloads of
    :data:`LARGE_PAYLOAD_BYTES` or more (made on first use; one caller at a time).

    A zstd context with workers owns threads: freeing it joins them. A forked child has none
    of them, so it must neither use nor free the one it inherited (either waits for ever):
    :meth:`forget_in_child` sets it aside, and a thread-local could not keep it (CPython frees
    the other threads' locals in the child)."""

    inherited: list[zstandard.ZstdCompressor] = []  # set aside in forked children, never freed

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._compressor: zstandard.ZstdCompressor | None = None
        self._level = ZSTD_LEVEL

    def compress(self, data: bytes, level: int) -> bytes:
        with self._lock:
            if self._compressor is None or self._level != level:
                self._compressor = None  # frees the one of the other level (joins its workers)
                self._compressor = zstandard.ZstdCompressor(
                    level=level, write_content_size=True, write_checksum=True, threads=ZSTD_THREADS_LARGE
                )
                self._level = level
            return self._compressor.compress(data)  # type: ignore[no-any-return]

    def forget_in_child(self) -> None:
        if self._compressor is not None:
            self.inherited.append(self._compressor)
        self._compressor = None
        self._lock = threading.Lock()  # another thread may have held it at the fork


_LARGE = _LargeCompressor()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_LARGE.forget_in_child)


def _stored_header(size_bytes: int) -> bytes:
    """The zstd frame header of a format-3 payload of ``size_bytes`` content bytes (9 bytes;
    13 from 4 GiB)."""
    if size_bytes < 1 << 32:
        return _HEADER4.pack(ZSTD_MAGIC, _FHD_SIZE4, size_bytes)
    return _HEADER8.pack(ZSTD_MAGIC, _FHD_SIZE8, size_bytes)


def _stored_body(data: bytes) -> bytes:
    """A format-3 payload of ``data`` but its trailer: a zstd frame (RFC 8878) whose blocks
    are raw (:data:`RAW_BLOCK_BYTES` each, one empty block for empty data), ending in the low
    32 bits of the content's XXH64 as zstd checks them, then the skippable frame of its
    XXH3-64 digest (:data:`XXH3_HEADER`). Deterministic: the same bytes give the same body."""
    size = len(data)
    checks = (
        (xxhash.xxh64_intdigest(data) & 0xFFFFFFFF).to_bytes(4, "little"), XXH3_HEADER, xxhash.xxh3_64_digest(data)
    )
    if size <= RAW_BLOCK_BYTES:  # one block (most entries): no slicing
        return b"".join((_stored_header(size), (size << 3 | 1).to_bytes(3, "little"), data, *checks))
    view = memoryview(data)
    parts: list[bytes | memoryview] = [_stored_header(size)]
    start = 0
    while True:
        end = min(start + RAW_BLOCK_BYTES, size)
        last = end == size
        # block header: little-endian 24 bits, Last_Block (bit 0), Block_Type 0 = raw (bits 1-2),
        # Block_Size (bits 3-23)
        parts.append(((end - start) << 3 | last).to_bytes(3, "little"))
        parts.append(view[start:end])
        start = end
        if last:
            break
    parts.extend(checks)
    return b"".join(parts)


def _stored_content(blob: bytes, size_bytes: int, expected_checksum: str) -> bytes | None:
    """The content of ``blob`` when it is a format-3 payload of ``size_bytes`` content bytes
    (the layout :func:`_stored_body` writes, to the byte count) that ends in the trailer of
    ``expected_checksum`` and whose content's XXH3-64 equals its digest; else ``None`` (not
    format 3, or not intact: the caller decompresses it with zstd, which checks the XXH64,
    and tells which). Reads the block headers not at all: the content's digest covers what
    is returned."""
    header = _stored_header(size_bytes)  # size_bytes checked by the caller (_check_size)
    head = len(header)
    blocks = max(1, -(-size_bytes // RAW_BLOCK_BYTES))
    end = head + 3 * blocks + size_bytes  # where the frame's XXH64 begins
    if (
        len(blob) != end + 4 + XXH3_FRAME_BYTES + TRAILER_BYTES
        or blob[:head] != header
        or blob[end + 4 : end + 12] != XXH3_HEADER
        or blob[-TRAILER_BYTES:-32] != TRAILER_HEADER
        or blob[-32:].hex() != expected_checksum
    ):
        return None
    if blocks == 1:
        content = blob[head + 3 : end]
    else:
        view = memoryview(blob)
        step = RAW_BLOCK_BYTES + 3
        content = b"".join(
            view[at + 3 : min(at + step, end)] for at in range(head, head + step * blocks, step)
        )
    if xxhash.xxh3_64_digest(content) != blob[end + 12 : end + 20]:
        return None
    return content


def _frame(data: bytes, level: int) -> bytes:
    """The stored form of ``data`` at ``level`` but its trailer: at :data:`STORED_LEVEL`
    :func:`_stored_body` (format 3), else the zstd frame at that level (content size and XXH64
    checksum recorded; with :data:`ZSTD_THREADS_LARGE` workers from
    :data:`LARGE_PAYLOAD_BYTES` on)."""
    if level == STORED_LEVEL:
        return _stored_body(data)
    if len(data) >= LARGE_PAYLOAD_BYTES:
        return _LARGE.compress(data, level)
    made = getattr(_COMPRESSOR, "c", None)
    if made is None or made[0] != level:
        made = _COMPRESSOR.c = (
            level, zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=True)
        )
    return made[1].compress(data)  # type: ignore[no-any-return]


def _packed(frame: bytes, data: bytes, digest: bytes) -> Packed:
    return Packed(blob=b"".join((frame, TRAILER_HEADER, digest)), size_bytes=len(data), checksum=digest.hex())


def pack(data: bytes, *, digest: bytes | None = None, level: int | None = None) -> Packed:
    """Compress ``data`` (bytes) into a format-2 payload: a zstd frame recording its content
    size and XXH64 checksum, at ``level`` (default :func:`compression_level`; with
    :data:`ZSTD_THREADS_LARGE` workers from :data:`LARGE_PAYLOAD_BYTES` on), then the
    skippable frame holding its SHA-256 digest; at :data:`STORED_LEVEL`, a format-3 payload
    (raw blocks and the XXH3-64 frame before that trailer). ``digest``: the SHA-256 digest
    (32 bytes) when the caller already has it (saves hashing twice)."""
    if level is None:
        level = compression_level()
    frame = _frame(data, level)
    if digest is None:
        digest = hashlib.sha256(data).digest()
    return _packed(frame, data, digest)


class PackingAside:
    """:func:`pack` of ``data`` at ``level``, begun on a helper thread while the caller hashes
    and reads the payload, for payloads of :data:`LARGE_PAYLOAD_BYTES` or more on a host with
    more than one CPU (zstd and hashlib release the GIL: the SHA-256 and the compression run at
    once instead of one after the other). Smaller payloads, or one CPU: compressed in
    :meth:`packed`, on the caller's thread, as :func:`pack` does.

    Use as a context manager: leaving the block waits for the helper thread, so none outlives
    the call that started it, even when the block raises::

        with PackingAside(payload, level) as aside:
            digest = hashlib.sha256(payload).digest()
            ...
            packed = aside.packed(digest)
    """

    def __init__(self, data: bytes, level: int) -> None:
        self._data = data
        self._level = level
        self._frame: bytes | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if len(data) >= LARGE_PAYLOAD_BYTES and ZSTD_THREADS_LARGE > 1:
            self._thread = threading.Thread(target=self._compress, name="cachedb-pack", daemon=True)
            self._thread.start()

    def _compress(self) -> None:
        try:
            self._frame = _frame(self._data, self._level)
        except BaseException as exc:  # noqa: BLE001 - raised again by packed()
            self._error = exc

    def __enter__(self) -> PackingAside:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._thread.join()

    def packed(self, digest: bytes) -> Packed:
        """The payload, ``digest`` (the SHA-256 of ``data``, 32 bytes) in its trailer. Waits for
        the helper thread; raises what the compression raised."""
        if self._thread is not None:
            self._thread.join()
            if self._error is not None:
                raise self._error
            assert self._frame is not None
            return _packed(self._frame, self._data, digest)
        return _packed(_frame(self._data, self._level), self._data, digest)


def _looks_stored(blob: bytes, size_bytes: int) -> bool:
    """Whether the payload ``blob`` (``size_bytes`` uncompressed bytes) holds at least half its
    content's bytes: written at a level that stores (format 3 at :data:`STORED_LEVEL`; zstd at
    level -1000, as cachedb wrote before format 3, still compressed a block with long runs:
    128 KiB into 119 KiB in one real AOTAutograd entry) or a fast one, or data zstd could not
    compress; level 1 takes FX graph entries to 1/4-1/8. Reads no
    content."""
    return len(blob) - TRAILER_BYTES >= size_bytes // 2


def repacked_guarded(
    blob: bytes, size_bytes: int, expected_checksum: str, *, where: str, dialect: str = "sqlite"
) -> bytes | None:
    """The payload ``blob`` of a guarded entry re-encoded at the level this version writes it
    to a ``dialect`` database (:func:`guarded_level`), or ``None`` when that gives the same
    bytes or is not known to differ. An entry the level stores as it is (on SQLite, under
    :data:`GUARDED_STORED_BELOW_BYTES`) is
    decoded and encoded at :data:`STORED_LEVEL` (deterministic: a payload already in that form
    comes out the same, ~25 us per 100 KB); one the level compresses is re-encoded only when
    its frame holds at least half its content's bytes (a frame's level is not recorded: a
    smaller one is taken as compressed already, and kept). The content is verified first (:func:`unpack`), and the new payload keeps the
    same content and SHA-256, so signatures, which sign that digest, still verify.

    Used by ``cachedb copy --repack`` to bring a database written by an older cachedb (small
    entries compressed) to today's form, and by the fleet tiers (:mod:`cachedb.fleet.tier_sync`) to
    move an entry between an SQLite file and PostgreSQL in each one's form.

    Raises :class:`~cachedb.CorruptPayloadError` (naming ``where``) when ``blob`` fails its
    checks."""
    level = guarded_level(size_bytes, dialect)
    if level != STORED_LEVEL and not _looks_stored(blob, size_bytes):
        return None
    content = unpack(blob, size_bytes, expected_checksum, where=where)
    new = pack(content, digest=bytes.fromhex(expected_checksum), level=level).blob
    return None if new == blob else new


_DECOMPRESSOR = threading.local()


def unpack(blob: bytes, size_bytes: int, expected_checksum: str, *, where: str, full: bool = False) -> bytes:
    """Decompress and verify a stored payload (``size_bytes``: its uncompressed length;
    ``expected_checksum``: the row's SHA-256 hex digest of it).

    A format-3 payload whose trailer holds ``expected_checksum`` is sliced out of its raw
    blocks and verified by its XXH3-64 digest (no decompression). A format-2 payload whose
    trailer holds ``expected_checksum`` and whose frame carries a content checksum is
    verified by zstd while it decompresses (XXH64; no second pass over the content), as is a
    format-3 payload whose XXH3-64 does not match (zstd then tells whether the content is
    intact). Everything else, and every payload when ``full`` is true, is verified by the
    SHA-256 of the decompressed bytes.

    Raises :class:`~cachedb.CorruptPayloadError` (naming ``where``) when ``size_bytes`` is not a
    size (not an integer, negative, 2**63 or more), the frame does not decompress, fails its checksum, has the
    wrong size, or its SHA-256 differs from ``expected_checksum``.
    """
    _check_size(size_bytes, where)
    blob = bytes(blob)
    if not full:
        stored = _stored_content(blob, size_bytes, expected_checksum)
        if stored is not None:
            return stored
    decompressor = getattr(_DECOMPRESSOR, "d", None)
    if decompressor is None:
        decompressor = _DECOMPRESSOR.d = zstandard.ZstdDecompressor()
    try:
        data = decompressor.decompress(blob, max_output_size=max(size_bytes, 1))
    except zstandard.ZstdError as exc:
        raise CorruptPayloadError(where, f"zstd: {exc}") from exc
    if len(data) != size_bytes:
        raise CorruptPayloadError(where, f"{len(data)} bytes, expected {size_bytes}")
    if not full and _trailer_matches(blob, expected_checksum):
        return data
    if hashlib.sha256(data).hexdigest() != expected_checksum:
        raise CorruptPayloadError(where, "SHA-256 checksum mismatch")
    return data


#: Uncompressed bytes from which a live read streams a payload out of the database as it
#: decompresses (:func:`unpack_from`) instead of reading the stored frame whole first (1 MiB).
STREAM_PAYLOAD_BYTES = LARGE_PAYLOAD_BYTES
#: Bytes the stream reader asks its source for at a time (256 KiB).
STREAM_READ_BYTES = 256 << 10
#: The most bytes a zstd frame header takes (``ZSTD_FRAMEHEADERSIZE_MAX``).
_FRAME_HEADER_MAX = 18


class BlobSource(Protocol):
    """A stored payload read in place (``sqlite3.Blob``): its stored length and seekable
    reads."""

    def __len__(self) -> int: ...
    def seek(self, offset: int, origin: int = 0, /) -> None: ...
    def read(self, length: int = -1, /) -> bytes: ...


def unpack_from(
    source: BlobSource, size_bytes: int, expected_checksum: str, *, where: str, full: bool = False
) -> bytes:
    """:func:`unpack` of a payload read from ``source`` (a stored payload opened in place,
    SQLite's incremental blob I/O) while it decompresses: the stored frame is never held
    whole in memory, only :data:`STREAM_READ_BYTES` of it at a time beside the content
    (``size_bytes``). Verified as :func:`unpack` verifies: zstd checks the frame's content
    checksum (XXH64) as it ends, the trailer's digest must equal ``expected_checksum``.
    Anything else (format 1, a trailer that does not match, ``full``), and a stored payload
    under :data:`STREAM_PAYLOAD_BYTES` (a format-3 one is then read without zstd), is read
    whole and handed to :func:`unpack`.

    Raises :class:`~cachedb.CorruptPayloadError` (naming ``where``) as :func:`unpack` does;
    the driver's errors from ``source`` pass through.
    """
    _check_size(size_bytes, where)
    length = len(source)
    if not full and STREAM_PAYLOAD_BYTES <= length:
        source.seek(length - TRAILER_BYTES)
        tail = source.read(TRAILER_BYTES)
        source.seek(0)
        head = source.read(_FRAME_HEADER_MAX)
        if tail[:-32] == TRAILER_HEADER and tail[-32:].hex() == expected_checksum and _has_checksum(head):
            source.seek(0)
            decompressor = getattr(_DECOMPRESSOR, "d", None)
            if decompressor is None:
                decompressor = _DECOMPRESSOR.d = zstandard.ZstdDecompressor()
            try:
                reader = decompressor.stream_reader(
                    source, read_size=STREAM_READ_BYTES, read_across_frames=False, closefd=False
                )
                data = reader.read(size_bytes) if size_bytes else b""
                if 0 < len(data) < size_bytes:  # a short read before the frame's end: read on
                    parts = [data]
                    while (got := sum(map(len, parts))) < size_bytes and (more := reader.read(size_bytes - got)):
                        parts.append(more)
                    data = b"".join(parts)
                # the frame must end here: reading on makes zstd check the content checksum
                beyond = reader.read(1)
            except zstandard.ZstdError as exc:
                raise CorruptPayloadError(where, f"zstd: {exc}") from exc
            if len(data) != size_bytes or beyond:
                raise CorruptPayloadError(
                    where, f"{len(data) + len(beyond)}{'+' if beyond else ''} bytes, expected {size_bytes}"
                )
            return data  # type: ignore[no-any-return]
    source.seek(0)
    return unpack(source.read(), size_bytes, expected_checksum, where=where, full=full)


def _check_size(size_bytes: int, where: str) -> None:
    """Raise :class:`~cachedb.CorruptPayloadError` (naming ``where``) unless ``size_bytes`` can
    be a payload's size (an integer from 0 to 2**63 - 1, SQLite's and PostgreSQL's largest;
    a damaged row may hold ``NULL`` or text)."""
    if not (isinstance(size_bytes, int) and 0 <= size_bytes < 1 << 63):
        raise CorruptPayloadError(where, f"size_bytes {size_bytes} is not a payload size")


def _has_checksum(head: bytes) -> bool:
    """The zstd frame starting ``head`` records a content checksum (False: not a zstd frame)."""
    try:
        return bool(zstandard.get_frame_parameters(head).has_checksum)
    except zstandard.ZstdError:
        return False


def _trailer_matches(blob: bytes, expected_checksum: str) -> bool:
    """``blob`` ends in the trailer holding ``expected_checksum`` and starts with a zstd
    frame that carries a content checksum (which the decompression just verified)."""
    return (
        len(blob) > TRAILER_BYTES
        and blob[-TRAILER_BYTES:-32] == TRAILER_HEADER
        and blob[-32:].hex() == expected_checksum
        and zstandard.get_frame_parameters(blob).has_checksum
    )
