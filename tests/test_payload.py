"""The payload codec (cachedb/store/payload.py): format 3 (a zstd frame of raw blocks, a skippable
frame holding the content's XXH3-64, then the SHA-256 one), format 2 (zstd frame with XXH64
content checksum, then a skippable frame holding the SHA-256 digest) and format 1 (the frame
alone, as written before), on real zstd frames and real stored rows."""

from __future__ import annotations

import hashlib
import os
import random
import sqlite3
from pathlib import Path

import pytest
import xxhash
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from cachedb import CacheDB, CorruptPayloadError
from cachedb.store import payload as _payload
from cachedb.store.payload import STORED_LEVEL, TRAILER_BYTES, TRAILER_HEADER, pack, unpack, unpack_from


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=20_000), st.booleans())
def test_format2_round_trips_and_any_zstd_decoder_reads_it(data: bytes, full: bool) -> None:
    packed = pack(data)
    assert packed.checksum == hashlib.sha256(data).hexdigest()
    assert packed.size_bytes == len(data)
    assert packed.blob[-TRAILER_BYTES:] == TRAILER_HEADER + hashlib.sha256(data).digest()
    assert zstandard.get_frame_parameters(packed.blob).has_checksum
    assert unpack(packed.blob, len(data), packed.checksum, where="x", full=full) == data
    # the skippable frame is skipped by a plain zstd decoder: the content alone comes out
    assert zstandard.ZstdDecompressor().decompress(packed.blob, max_output_size=max(len(data), 1)) == data


def _format2_stored(data: bytes) -> bytes:
    """A guarded entry as cachedb stored one under 1 MiB before format 3: zstd's frame at
    level -1000 (raw blocks where zstd finds no match) and the SHA-256 trailer."""
    frame = zstandard.ZstdCompressor(level=-1000, write_content_size=True, write_checksum=True).compress(data)
    return frame + TRAILER_HEADER + hashlib.sha256(data).digest()


_BLOCK = 128 << 10  # zstd's largest block


@settings(max_examples=120, deadline=None)
@given(
    st.binary(max_size=512),
    st.sampled_from([0, 1, _BLOCK - 600, _BLOCK, _BLOCK + 1, 3 * _BLOCK - 17, 300_000]),
    st.booleans(),
)
def test_format3_round_trips_without_zstd_and_every_zstd_reader_reads_it(
    random_part: bytes, filler: int, full: bool
) -> None:
    """At the stored level ``pack`` writes format 3 for any content, empty to several raw
    blocks: ``unpack`` gives it back from the raw blocks and its XXH3-64 alone (the fast path
    answers), any zstd decoder gives it back checking the frame's XXH64 (what a cachedb of
    format 2 does), and the SHA-256 trailer still ends it."""
    data = random_part + bytes(range(256)) * (filler // 256) + random_part
    packed = pack(data, level=STORED_LEVEL)
    blob = packed.blob
    assert packed.checksum == hashlib.sha256(data).hexdigest() and packed.size_bytes == len(data)
    assert blob[-TRAILER_BYTES:] == TRAILER_HEADER + hashlib.sha256(data).digest()
    assert blob[-TRAILER_BYTES - 16 : -TRAILER_BYTES] == _payload.XXH3_HEADER + xxhash.xxh3_64_digest(data)
    assert len(blob) == 9 + 3 * max(1, -(-len(data) // _BLOCK)) + len(data) + 4 + 16 + TRAILER_BYTES
    assert _payload._stored_content(blob, len(data), packed.checksum) == data
    assert unpack(blob, len(data), packed.checksum, where="x", full=full) == data
    params = zstandard.get_frame_parameters(blob)
    assert params.has_checksum and params.content_size == len(data)
    assert zstandard.ZstdDecompressor().decompress(blob, max_output_size=max(len(data), 1)) == data
    assert pack(data, level=STORED_LEVEL).blob == blob  # deterministic


@pytest.mark.parametrize("size", [0, 255, 256, (1 << 32) - 1, 1 << 32, 1 << 40])
def test_format3_frame_headers_are_zstds_for_every_size(size: int) -> None:
    """The frame header format 3 writes (4-byte content size, 8 bytes from 4 GiB) is read by
    zstd's own parser as a single-segment frame of that content size with a checksum."""
    params = zstandard.get_frame_parameters(_payload._stored_header(size))
    assert params.content_size == size and params.has_checksum and params.dict_id == 0


@pytest.mark.parametrize("where", ["content", "xxh3", "xxh64", "block header", "size"])
def test_format3_damage_is_refused_or_read_through_zstd(where: str) -> None:
    """A flipped content byte fails the XXH3-64 and then zstd's XXH64: refused. A flipped
    XXH3-64 digest falls back to zstd, which finds the content intact and serves it; a flipped
    XXH64 is not read on the fast path (the content's XXH3-64 holds) and the content is
    served; a damaged block header leaves the content intact (served); a row whose size is
    not the payload's is refused."""
    data = random.Random(3).randbytes(200_000)
    packed = pack(data, level=STORED_LEVEL)
    blob, size = bytearray(packed.blob), len(data)
    tail = TRAILER_BYTES + 16  # the XXH3-64 frame and the trailer
    if where == "content":
        blob[100_000] ^= 0x04
    elif where == "xxh3":
        blob[-TRAILER_BYTES - 1] ^= 0x01
    elif where == "xxh64":
        blob[-tail - 1] ^= 0x01
    elif where == "block header":
        blob[9] ^= 0x01  # the first block's Last_Block bit
    else:
        size -= 1
    if where in ("content", "size"):
        with pytest.raises(CorruptPayloadError, match="x/y/z"):
            unpack(bytes(blob), size, packed.checksum, where="x/y/z")
    else:
        assert unpack(bytes(blob), size, packed.checksum, where="x/y/z") == data


@pytest.mark.parametrize("size", [-1, -(1 << 70), 1 << 64, 99_999, 100_001, None, "100000"])
def test_format3_under_a_row_of_another_size_is_refused_as_corrupt(size: object) -> None:
    """A row whose ``size_bytes`` is not its payload's (damaged, negative, past 64 bits, NULL,
    text) is refused with CorruptPayloadError naming the row, never another error."""
    data = random.Random(4).randbytes(100_000)
    packed = pack(data, level=STORED_LEVEL)
    with pytest.raises(CorruptPayloadError, match="row 7"):
        unpack(packed.blob, size, packed.checksum, where="row 7")  # type: ignore[arg-type]


def test_format2_stored_payloads_of_before_still_read() -> None:
    """A guarded entry stored at level -1000 by cachedb before format 3 (no XXH3-64 frame) is
    not taken for format 3 and reads through zstd, checked by its XXH64."""
    data = random.Random(5).randbytes(100_000)
    blob = _format2_stored(data)
    digest = hashlib.sha256(data).hexdigest()
    assert _payload._stored_content(blob, len(data), digest) is None
    assert unpack(blob, len(data), digest, where="x") == data
    damaged = bytearray(blob)
    damaged[50_000] ^= 0x01
    with pytest.raises(CorruptPayloadError, match="checksum"):
        unpack(bytes(damaged), len(data), digest, where="x")


def _format1(data: bytes, *, checksum: bool = False) -> bytes:
    """A payload as cachedb wrote it before format 2: the zstd frame alone."""
    return zstandard.ZstdCompressor(level=3, write_content_size=True, write_checksum=checksum).compress(data)


def test_format1_payloads_still_read_and_are_checked_by_sha256() -> None:
    data = b"an FX graph entry " * 500
    digest = hashlib.sha256(data).hexdigest()
    assert unpack(_format1(data), len(data), digest, where="old") == data
    other = b"another entry of the same size" * 300
    other = other[: len(data)].ljust(len(data), b".")
    with pytest.raises(CorruptPayloadError, match="SHA-256"):
        unpack(_format1(other), len(data), digest, where="old")


def test_a_frame_that_decodes_to_other_bytes_fails_zstds_content_checksum() -> None:
    # Incompressible bytes are stored in raw blocks: flipping one leaves a frame that decodes.
    data = random.Random(1).randbytes(4096)
    packed = pack(data)
    blob = bytearray(packed.blob)
    blob[len(blob) // 2] ^= 0x10
    with pytest.raises(CorruptPayloadError, match="checksum"):
        unpack(bytes(blob), len(data), packed.checksum, where="flipped")


def test_a_trailer_is_trusted_only_over_a_frame_with_a_content_checksum() -> None:
    # A frame without zstd's checksum, followed by the trailer of the expected content: the
    # trailer proves nothing about the frame, so the SHA-256 pass must run (and refuse it).
    expected = b"x" * 1000
    impostor = b"y" * 1000
    blob = _format1(impostor) + TRAILER_HEADER + hashlib.sha256(expected).digest()
    with pytest.raises(CorruptPayloadError, match="SHA-256"):
        unpack(blob, 1000, hashlib.sha256(expected).hexdigest(), where="impostor")


def test_a_damaged_trailer_falls_back_to_sha256_and_serves_intact_content() -> None:
    data = os.urandom(100) * 20
    packed = pack(data)
    blob = bytearray(packed.blob)
    blob[-1] ^= 1  # the digest in the trailer, not the content
    assert unpack(bytes(blob), len(data), packed.checksum, where="t") == data


def test_a_payload_moved_to_another_row_is_refused(tmp_path: Path) -> None:
    """Two stored variants of one size: the second row given the first row's payload (a
    self-consistent format-2 payload) is corrupt, though zstd's own checksum holds."""
    db = CacheDB(tmp_path / "c.db")
    a, b = b"A" * 5000 + b"guards a", b"B" * 5000 + b"guards b"
    with db.transaction() as repos:
        repos.guarded.put("fxgraph", "fkey_a", a, guards_expr=None)
        repos.guarded.put("fxgraph", "fkey_b", b, guards_expr=None)
    with db.engine.begin() as conn:
        conn.execute(text(
            "UPDATE guarded_entries SET payload = (SELECT payload FROM guarded_entries WHERE key = 'fkey_a') "
            "WHERE key = 'fkey_b'"
        ))
    with db.read() as repos:
        assert [p for _, p in repos.guarded.candidates("fxgraph", "fkey_a")] == [a]
        with pytest.raises(CorruptPayloadError, match="SHA-256"):
            repos.guarded.candidates("fxgraph", "fkey_b")
    db.close()


def _pack_in_child(data: bytes, queue: object) -> None:
    packed = pack(data)
    queue.put(unpack(packed.blob, packed.size_bytes, packed.checksum, where="child") == data)  # type: ignore[attr-defined]


def _thread_packs(data: bytes) -> None:
    pack(data)


def test_a_forked_child_compresses_large_payloads() -> None:
    """Payloads from LARGE_PAYLOAD_BYTES use a multi-threaded zstd context; a child forked
    after the parent used it gets its own (the parent's worker threads are not in the child:
    the inherited context waited for them for ever)."""
    import multiprocessing

    from cachedb.store.payload import LARGE_PAYLOAD_BYTES

    data = random.Random(2).randbytes(LARGE_PAYLOAD_BYTES) * 3
    assert unpack(pack(data).blob, len(data), hashlib.sha256(data).hexdigest(), where="parent") == data
    # and from another thread of the parent, which the child will not have
    import threading

    other = threading.Thread(target=_thread_packs, args=(data,))
    other.start()
    other.join()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_pack_in_child, args=(data, queue))
    child.start()
    child.join(60)
    if child.is_alive():
        child.kill()
        pytest.fail("the forked child hung compressing a large payload")
    assert child.exitcode == 0 and queue.get(timeout=10) is True


@settings(max_examples=30, deadline=None)
@given(st.binary(max_size=4096), st.integers(0, 3 << 20), st.sampled_from([1, 3, -1000]))
def test_packing_aside_writes_what_pack_writes(random_part: bytes, zeros: int, level: int) -> None:
    """PackingAside (the compression on a helper thread from LARGE_PAYLOAD_BYTES, on the
    caller's thread below) gives pack's bytes, whichever side of the threshold."""
    from cachedb.store.payload import PackingAside

    data = random_part + bytes(zeros) + random_part
    digest = hashlib.sha256(data).digest()
    with PackingAside(data, level) as aside:
        packed = aside.packed(digest)
    assert packed == pack(data, digest=digest, level=level)
    assert unpack(packed.blob, len(data), digest.hex(), where="x", full=True) == data


def test_packing_aside_raises_the_helpers_error_and_leaves_no_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A compression that fails on the helper thread raises from packed(); a block that raises
    before packed() still waits for the helper thread on its way out. (Two zstd workers, as on
    any host with two CPUs or more: on one CPU there is no helper thread.)"""
    import threading

    from cachedb.store import payload as _payload
    from cachedb.store.payload import LARGE_PAYLOAD_BYTES, PackingAside

    monkeypatch.setattr(_payload, "ZSTD_THREADS_LARGE", max(2, _payload.ZSTD_THREADS_LARGE))
    not_bytes = "x" * LARGE_PAYLOAD_BYTES  # zstd refuses a str: the helper thread's error
    with pytest.raises(TypeError):
        with PackingAside(not_bytes, 1) as aside:  # type: ignore[arg-type]
            aside.packed(b"\0" * 32)
    data = random.Random(5).randbytes(LARGE_PAYLOAD_BYTES) * 16  # tens of ms to compress
    with pytest.raises(RuntimeError, match="the caller's own error"):
        with PackingAside(data, 1):
            assert any(t.name == "cachedb-pack" for t in threading.enumerate())
            raise RuntimeError("the caller's own error")
    assert not any(t.name == "cachedb-pack" for t in threading.enumerate())


@pytest.mark.slow
def test_the_level_setting_changes_what_is_written_never_what_is_read(
    real_cache: tuple[Path, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without CACHEDB_COMPRESSION_LEVEL an import stores a real Inductor cache's FX graph and
    AOTAutograd entries (all under 1 MiB) as they are, in checked zstd frames: the same bytes
    as the setting -1000 writes. The setting sets the zstd level of every payload: 1 shrinks
    them to under half, 19 smaller still; a process without the setting reads all four
    databases back to the files' bytes."""
    from cachedb.store.payload import GUARDED_STORED_BELOW_BYTES, LEVEL_ENV
    from cachedb.layout.importer import Importer, scan
    from cachedb.tools.stats import collect

    cache_dir, _ = real_cache
    files = {
        (item.kind, item.path.parent.name, item.path.name): item.path.read_bytes()
        for item in scan(cache_dir)[0]
        if item.kind in ("fxgraph", "aotautograd")
    }
    assert files and max(len(b) for b in files.values()) < GUARDED_STORED_BELOW_BYTES
    stored: dict[str, dict[str, int]] = {}
    settings = ("", "-1000", "1", "19")
    for setting in settings:
        monkeypatch.setenv(LEVEL_ENV, setting)
        db = CacheDB(tmp_path / f"level{setting or 'default'}.db")
        assert Importer(db, workers=0).run(cache_dir).problems == []
        with db.read() as repos:
            rows = [r for r in collect(repos.session) if r["kind"] in ("fxgraph", "aotautograd")]
        stored[setting] = {"bytes": sum(r["bytes"] for r in rows), "stored": sum(r["stored_bytes"] for r in rows)}
        db.close()
    raw = stored[""]["bytes"]
    assert raw == sum(len(b) for b in files.values())
    assert stored["-1000"]["stored"] > 0.9 * raw  # next to stored as it is (runs still shrink)
    assert stored[""]["stored"] == stored["-1000"]["stored"]
    assert stored["1"]["stored"] < raw / 2
    assert stored["19"]["stored"] < stored["1"]["stored"]

    monkeypatch.delenv(LEVEL_ENV)
    for setting in settings:
        db = CacheDB(tmp_path / f"level{setting or 'default'}.db")
        with db.read() as repos:
            got = {(e.kind, e.key, e.variant): e.payload for e in repos.guarded.iter_all()}
        db.close()
        assert got == files


def test_guarded_entries_under_1_mib_are_stored_as_they_are(
    real_cache: tuple[Path, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By default a guarded entry under GUARDED_STORED_BELOW_BYTES is written in a zstd frame
    of raw blocks (STORED_LEVEL: its content as it is, with its size and content checksum),
    one from there at ZSTD_LEVEL; ``pack``'s own default (kernel files, CUTLASS op lists) is
    ZSTD_LEVEL whatever the size. Each reads back to its bytes; CACHEDB_COMPRESSION_LEVEL
    sets every level."""
    from cachedb.store import payload as _payload

    monkeypatch.delenv(_payload.LEVEL_ENV, raising=False)
    cache_dir, _ = real_cache
    real = next(
        p.read_bytes() for p in sorted(cache_dir.rglob("*")) if p.is_file() and p.relative_to(cache_dir).parts[0] == "fxgraph"
    )
    limit = _payload.GUARDED_STORED_BELOW_BYTES
    large = (real * (1 + limit // len(real)))[:limit]
    db = CacheDB(tmp_path / "levels.db")
    with db.transaction() as repos:
        for n, payload in enumerate((real, large)):
            repos.guarded.put("fxgraph", f"f{n}" + "0" * 50, payload, guards_expr=None)
    with db.read() as repos:
        stored = dict(repos.session.execute(text("SELECT size_bytes, payload FROM guarded_entries")).all())
        got = sorted(e.payload for e in repos.guarded.iter_all())
    db.close()
    assert got == sorted((real, large))

    def frame(data: bytes, level: int) -> bytes:
        return zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=True).compress(data)

    small = stored[len(real)]
    # format 3: any zstd decoder gives the content (checking the frame's XXH64), and the frame
    # holds it in raw blocks: header (9 bytes), a 3-byte header per 128 KiB, the XXH64 (4),
    # then the XXH3-64 frame (16) and the SHA-256 trailer (40)
    assert zstandard.ZstdDecompressor().decompress(small) == real
    blocks = -(-len(real) // (128 << 10))
    assert len(small) == 9 + 3 * blocks + len(real) + 4 + 16 + TRAILER_BYTES
    assert small[-TRAILER_BYTES - 16 : -TRAILER_BYTES] == (
        _payload.XXH3_HEADER + xxhash.xxh3_64_digest(real)
    )
    assert small[-TRAILER_BYTES:] == TRAILER_HEADER + hashlib.sha256(real).digest()
    assert len(stored[limit]) < limit / 2  # compressed
    assert zstandard.ZstdDecompressor().decompress(stored[limit][:-TRAILER_BYTES]) == large
    assert _payload.guarded_level(limit - 1) == _payload.STORED_LEVEL
    assert _payload.guarded_level(limit) == _payload.ZSTD_LEVEL
    monkeypatch.setenv(_payload.LEVEL_ENV, "3")
    assert _payload.guarded_level(limit - 1) == _payload.guarded_level(limit) == 3
    assert _payload.pack(real).blob[:-TRAILER_BYTES] == frame(real, 3)
    monkeypatch.delenv(_payload.LEVEL_ENV)
    assert _payload.pack(real).blob[:-TRAILER_BYTES] == frame(real, _payload.ZSTD_LEVEL)


def test_on_postgresql_every_guarded_entry_is_compressed(
    real_cache: tuple[Path, dict], db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same real cache imported (in-process and by worker processes) and put one by one
    into SQLite and PostgreSQL: SQLite holds the entries (all under 1 MiB) as they are,
    PostgreSQL at ZSTD_LEVEL (its TOAST would compress a stored frame itself); both read back
    the files' bytes."""
    from cachedb.store import payload as _payload
    from cachedb.layout.importer import Importer

    monkeypatch.delenv(_payload.LEVEL_ENV, raising=False)
    assert _payload.guarded_level(1000, "postgresql") == _payload.ZSTD_LEVEL
    assert _payload.guarded_level(1000, "sqlite") == _payload.STORED_LEVEL
    cache_dir, _ = real_cache
    files = {(p.relative_to(cache_dir).parts[0], p.parent.name, p.name): p.read_bytes()
             for p in sorted(cache_dir.rglob("*")) if p.is_file() and p.relative_to(cache_dir).parts[0] in ("fxgraph", "aotautograd")}
    with CacheDB(db_url) as db:
        dialect = db.engine.dialect.name
        level = _payload.STORED_LEVEL if dialect == "sqlite" else _payload.ZSTD_LEVEL
        for workers in (0, 2):
            with db.transaction() as repos:
                repos.session.execute(text("DELETE FROM guarded_entries"))
            assert Importer(db, workers=workers).run(cache_dir).problems == []
            with db.read() as repos:
                frames = {(k, key, v): bytes(blob) for k, key, v, blob in repos.session.execute(
                    text("SELECT kind, key, variant, payload FROM guarded_entries"))}
                got = {(e.kind, e.key, e.variant): e.payload for e in repos.guarded.iter_all()}
            assert got == files
            assert frames == {ident: _payload.pack(data, level=level).blob for ident, data in files.items()}, workers
        with db.transaction() as repos:
            repos.session.execute(text("DELETE FROM guarded_entries"))
            for (kind, key, _), data in files.items():
                repos.guarded.put(kind, key, data, guards_expr=None)
        with db.read() as repos:
            frames = {(k, key, v): bytes(blob) for k, key, v, blob in repos.session.execute(
                text("SELECT kind, key, variant, payload FROM guarded_entries"))}
        assert frames == {ident: _payload.pack(data, level=level).blob for ident, data in files.items()}


@pytest.mark.parametrize("value", ["fast", "23", "1.5", "-131073", "-" + "9" * 30])
def test_a_bad_level_setting_is_logged_once_and_the_default_is_used(
    value: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A CACHEDB_COMPRESSION_LEVEL that is not a zstd level never fails a write: one warning
    naming the variable and the value, then the default level (0 and unset mean it too)."""
    from cachedb.store import payload as _payload

    data = (Path(_payload.__file__).read_bytes() * 40)[:200_000]  # real text, below 1 MiB
    default = zstandard.ZstdCompressor(level=_payload.ZSTD_LEVEL, write_content_size=True, write_checksum=True)
    monkeypatch.setenv(_payload.LEVEL_ENV, value)
    with caplog.at_level("WARNING", logger="cachedb"):
        blobs = [pack(data).blob for _ in range(3)]
    warnings = [r.getMessage() for r in caplog.records if _payload.LEVEL_ENV in r.getMessage()]
    assert len(warnings) == 1 and repr(value) in warnings[0]
    assert all(b[:-TRAILER_BYTES] == default.compress(data) for b in blobs)
    monkeypatch.setenv(_payload.LEVEL_ENV, "0")
    assert _payload.compression_level() == _payload.ZSTD_LEVEL
    monkeypatch.setenv(_payload.LEVEL_ENV, str(_payload.MIN_COMPRESSION_LEVEL))
    assert _payload.compression_level() == _payload.MIN_COMPRESSION_LEVEL
    assert unpack(pack(data).blob, len(data), hashlib.sha256(data).hexdigest(), where="x") == data
    monkeypatch.setenv(_payload.LEVEL_ENV, "-7")
    assert _payload.compression_level() == -7
    fast = pack(data).blob
    assert fast[:-TRAILER_BYTES] == zstandard.ZstdCompressor(
        level=-7, write_content_size=True, write_checksum=True
    ).compress(data)
    assert unpack(fast, len(data), hashlib.sha256(data).hexdigest(), where="x") == data


def _stored_blob(tmp_path: Path, value: bytes) -> tuple[sqlite3.Connection, int]:
    """A real SQLite row holding ``value``: the connection and its rowid (for ``blobopen``)."""
    conn = sqlite3.connect(tmp_path / "blobs.db", isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, payload BLOB NOT NULL)")
    return conn, conn.execute("INSERT INTO t (payload) VALUES (?)", (value,)).lastrowid


@pytest.mark.skipif(not hasattr(sqlite3.Connection, "blobopen"), reason="sqlite3 reads in place from Python 3.11")
@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=4096), st.integers(0, 3 << 20), st.booleans())
def test_a_payload_read_in_place_is_the_payload(random_part: bytes, zeros: int, full: bool) -> None:
    """``unpack_from`` over SQLite's incremental blob I/O gives what ``unpack`` gives, for
    payloads from empty to 3 MiB (several stream reads), verified as ``unpack`` verifies."""
    import tempfile

    data = random_part + bytes(zeros) + random_part
    packed = pack(data)
    with tempfile.TemporaryDirectory() as tmp:
        conn, rowid = _stored_blob(Path(tmp), packed.blob)
        with conn.blobopen("t", "payload", rowid, readonly=True) as blob:
            assert unpack_from(blob, len(data), packed.checksum, where="x", full=full) == data
        conn.close()


@pytest.mark.skipif(not hasattr(sqlite3.Connection, "blobopen"), reason="sqlite3 reads in place from Python 3.11")
@pytest.mark.parametrize("where", ["literal", "checksum", "size", "truncated", "trailer", "format1"])
def test_a_damaged_payload_read_in_place_is_refused(tmp_path: Path, where: str) -> None:
    """Every damage ``unpack`` refuses, ``unpack_from`` refuses too: a flipped content byte or
    content checksum (zstd's XXH64 as the frame ends), a row whose size is not the frame's, a
    frame cut short, a trailer of another payload (then the SHA-256 of the content decides),
    and a format-1 frame of other bytes."""
    data = random.Random(7).randbytes(1 << 20) + bytes(2 << 20)
    packed = pack(data)
    blob, size, digest = bytearray(packed.blob), len(data), packed.checksum
    if where == "literal":
        blob[len(blob) // 3] ^= 0x01  # inside the random MiB: stored as raw literals
    elif where == "checksum":
        blob[-TRAILER_BYTES - 1] ^= 0x01  # the frame's last byte: its XXH64
    elif where == "size":
        size -= 1
    elif where == "truncated":
        blob = blob[: len(blob) // 2] + blob[-TRAILER_BYTES:]
    elif where == "trailer":
        other = bytearray(data)
        other[5] ^= 0x01
        blob = bytearray(pack(bytes(other)).blob)  # another payload, the row's digest
    else:
        other = bytearray(data)
        other[5] ^= 0x01
        blob = bytearray(_format1(bytes(other)))
    conn, rowid = _stored_blob(tmp_path, bytes(blob))
    with conn.blobopen("t", "payload", rowid, readonly=True) as source:
        with pytest.raises(CorruptPayloadError):
            unpack_from(source, size, digest, where="damaged")
    with pytest.raises(CorruptPayloadError):
        unpack(bytes(blob), size, digest, where="damaged")
    conn.close()


@settings(max_examples=80, deadline=None)
@given(
    st.binary(max_size=2048), st.integers(0, 1_300_000), st.sampled_from([1, 3, -5, -1000, "format 2"]),
    st.booleans(),
)
def test_repack_gives_this_versions_form_keeps_the_content_and_is_idempotent(
    random_part: bytes, zeros: int, written_at: int | str, format1: bool
) -> None:
    """Whatever level (or the older frame-only format, or the stored form before format 3) a
    guarded entry was written at,
    ``repacked_guarded`` gives a payload that reads back as the same content under the same
    SHA-256, is :func:`guarded_level`'s form where that level stores (the bytes ``pack`` gives
    at it), is kept from 1 MiB when its frame is under half the content (compressed, at any
    level), and is left alone by a second pass."""
    from cachedb.store.payload import STORED_LEVEL, guarded_level, repacked_guarded

    data = random_part + bytes(zeros) + random_part
    digest = hashlib.sha256(data).hexdigest()
    if format1:
        blob = _format1(data, checksum=True)
    elif isinstance(written_at, str):
        blob = _format2_stored(data)
    else:
        blob = pack(data, level=written_at).blob
    new = repacked_guarded(blob, len(data), digest, where="x")
    current = blob if new is None else new
    assert unpack(current, len(data), digest, where="x") == data
    if guarded_level(len(data)) == STORED_LEVEL:
        assert current == pack(data, level=STORED_LEVEL).blob
    elif len(blob) - TRAILER_BYTES < len(data) // 2:  # 1 MiB or more, compressed: kept (level not recorded)
        assert new is None
    assert repacked_guarded(current, len(data), digest, where="x") is None


def test_repack_refuses_a_damaged_payload_and_changes_nothing() -> None:
    """A flipped byte in a compressed small entry: ``repacked_guarded`` raises
    CorruptPayloadError naming the entry instead of re-encoding what it cannot verify."""
    from cachedb.store.payload import repacked_guarded

    data = os.urandom(3000) * 20
    packed = pack(data, level=1)
    damaged = bytearray(packed.blob)
    damaged[len(damaged) // 3] ^= 0x40
    with pytest.raises(CorruptPayloadError, match="fxgraph/fkey/v"):
        repacked_guarded(bytes(damaged), len(data), packed.checksum, where="fxgraph/fkey/v")


def test_repack_compresses_a_large_entry_written_as_it_is() -> None:
    """A 1.2 MB entry whose frame holds it as it is (a 200 KB random block six times: level
    -1000 finds no match 200 KB back, level 1 does) is compressed at the level this version
    writes from 1 MiB, reads back the same, and is kept on a second pass."""
    from cachedb.store.payload import TRAILER_BYTES, ZSTD_LEVEL, repacked_guarded

    data = random.Random(11).randbytes(200_000) * 6
    raw = pack(data, level=-1000)
    assert len(raw.blob) - TRAILER_BYTES >= len(data)
    new = repacked_guarded(raw.blob, len(data), raw.checksum, where="x")
    assert new == pack(data, level=ZSTD_LEVEL).blob and len(new) < len(data) // 4
    assert unpack(new, len(data), raw.checksum, where="x") == data
    assert repacked_guarded(new, len(data), raw.checksum, where="x") is None
