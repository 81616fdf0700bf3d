"""The wal-index header check (cachedb/store/wal_index.py) on real SQLite databases."""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cachedb.store import wal_index as _wal_index

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")


def _wal_database(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE t (x)")
    conn.execute("INSERT INTO t VALUES (1)")
    return conn


@linux_only
def test_find_returns_sqlites_own_descriptor_of_the_shm_file(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    conn = _wal_database(path)
    descriptor = _wal_index.find(str(path))
    assert descriptor is not None
    shm = os.stat(f"{path}-shm")
    mine = os.fstat(descriptor)
    assert (mine.st_dev, mine.st_ino) == (shm.st_dev, shm.st_ino)
    header = _wal_index.read(descriptor)
    assert header is not None and _wal_index.header_ok(header)
    # every commit moves it, another connection's or this one's
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("INSERT INTO t VALUES (2)")
    moved = _wal_index.read(descriptor)
    assert moved is not None and moved != header
    conn.execute("INSERT INTO t VALUES (3)")
    assert _wal_index.read(descriptor) not in (None, header, moved)
    # and a read does not
    still = _wal_index.read(descriptor)
    conn.execute("SELECT count(*) FROM t").fetchall()
    assert _wal_index.read(descriptor) == still
    other.close()
    conn.close()


@linux_only
def test_no_descriptor_off_wal(tmp_path: Path) -> None:
    rollback = tmp_path / "r.db"
    conn = sqlite3.connect(rollback, isolation_level=None)
    conn.execute("CREATE TABLE t (x)")
    assert _wal_index.find(str(rollback)) is None and _wal_index.find_for(conn) is None
    conn.close()
    assert _wal_index.find(str(tmp_path / "absent.db")) is None
    assert _wal_index.find_for(sqlite3.connect(":memory:")) is None


@linux_only
def test_find_for_uses_the_file_sqlite_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative path, then a chdir, and a symbolic link: the descriptor is still the one of
    the database the connection reads."""
    (tmp_path / "real").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "real")
    conn = _wal_database(Path("w.db"))
    decoy = _wal_database(tmp_path / "elsewhere" / "w.db")  # same relative name in the next cwd
    monkeypatch.chdir(tmp_path / "elsewhere")
    (tmp_path / "link.db").symlink_to(tmp_path / "real" / "w.db")
    linked = sqlite3.connect(tmp_path / "link.db", isolation_level=None)
    shm = os.stat(tmp_path / "real" / "w.db-shm")
    for connection in (conn, linked):
        descriptor = _wal_index.find_for(connection)
        assert descriptor is not None
        assert (os.fstat(descriptor).st_ino, os.fstat(descriptor).st_dev) == (shm.st_ino, shm.st_dev)
    for c in (conn, decoy, linked):
        c.close()


def _real_header(tmp_path: Path) -> bytes:
    path = tmp_path / "h.db"
    conn = _wal_database(path)
    with open(f"{path}-shm", "rb") as f:  # a test may open its own: no lock matters here
        header = f.read(_wal_index.HEADER_BYTES)
    conn.close()
    return header


def test_header_ok_accepts_only_a_whole_initialized_header(tmp_path: Path) -> None:
    header = _real_header(tmp_path)
    assert _wal_index.header_ok(header)
    assert not _wal_index.header_ok(header[:48])
    torn = header[:60] + bytes([header[60] ^ 1]) + header[61:]  # the second copy being written
    assert not _wal_index.header_ok(torn)
    uninitialized = bytearray(header)
    uninitialized[12] = uninitialized[60] = 0  # isInit
    assert not _wal_index.header_ok(bytes(uninitialized))
    other_version = (1).to_bytes(4, sys.byteorder) + header[4:48]
    assert not _wal_index.header_ok(other_version * 2)


@given(st.binary(min_size=48, max_size=48), st.binary(min_size=48, max_size=48))
def test_header_ok_refuses_copies_that_differ(first: bytes, second: bytes) -> None:
    if first != second:
        assert not _wal_index.header_ok(first + second)


@given(st.binary(min_size=48, max_size=48), st.booleans(), st.booleans())
def test_header_ok_wants_the_version_and_the_init_flag(body: bytes, versioned: bool, initialized: bool) -> None:
    copy = bytearray(body)
    if versioned:
        copy[0:4] = _wal_index.WALINDEX_VERSION.to_bytes(4, sys.byteorder)
    if initialized:
        copy[12] = 1
    expected = (
        int.from_bytes(copy[0:4], sys.byteorder) == _wal_index.WALINDEX_VERSION and copy[12] == 1
    )
    assert _wal_index.header_ok(bytes(copy) * 2) == expected
