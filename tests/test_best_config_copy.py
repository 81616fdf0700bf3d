"""The process-local copy of every best config (cachedb/live/_best_configs.py): served while
no other connection commits, dropped the moment one does, never serving a stale config."""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from cachedb import CacheDB
from cachedb.store.signing import ENV_KEY, Signer
from cachedb.live import _best_configs
from cachedb.live._store import LiveStore

ROOT = Path(__file__).resolve().parents[1]


def _config(i: int) -> bytes:
    return b'{"num_warps": %d, "num_stages": 2, "XBLOCK": 128}' % i


def _other_process(code: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(ENV_KEY, None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def _filled(path: Path, n: int) -> LiveStore:
    """A store whose database holds best configs ``k0``..``k{n-1}``, written by this process's
    pooled connections (so the kept connection's token moves once, before any get)."""
    with CacheDB(path) as db, db.transaction() as repos:
        for i in range(n):
            repos.best_configs.put(f"ab/k{i}.best_config", _config(i).decode())
    return LiveStore(str(path))


def _loaded(store: LiveStore, n: int) -> None:
    """Get every config until the copy is loaded; each get is right on the way."""
    for i in range(n):
        assert store.best_config_get(f"ab/k{i}.best_config") == _config(i)
    assert store.best_configs.loads == 1


def _selects(store: LiveStore) -> list[str]:
    """The SQL the kept connection runs from now on (the driver's trace callback)."""
    seen: list[str] = []
    store.db.kept._driver().set_trace_callback(seen.append)
    return seen


def test_gets_are_served_from_the_copy_once_loaded(tmp_path: Path) -> None:
    store = _filled(tmp_path / "c.db", 40)
    _loaded(store, 40)
    seen = _selects(store)
    for i in range(40):
        assert store.best_config_get(f"ab/k{i}.best_config") == _config(i)
    assert store.best_config_get("ab/absent.best_config") is None
    if sys.platform.startswith("linux"):  # the wal-index header read stands in for the PRAGMA
        assert seen == [], seen
    else:  # one data_version read per get, no SELECT of best configs
        assert seen and all(s.strip().upper() == "PRAGMA DATA_VERSION" for s in seen), seen
    store.close()


@pytest.mark.parametrize("change", ["insert", "replace", "delete"])
def test_another_process_commit_is_seen_at_once(tmp_path: Path, change: str) -> None:
    path = tmp_path / "c.db"
    store = _filled(path, 20)
    _loaded(store, 20)
    statement = {
        "insert": "r.best_configs.put('ab/new.best_config', '{\"num_warps\": 99}')",
        "replace": "r.best_configs.put('ab/k3.best_config', '{\"num_warps\": 99}')",
        "delete": "r.session.execute(text(\"DELETE FROM best_configs WHERE key = 'ab/k3.best_config'\"))",
    }[change]
    _other_process(
        "from sqlalchemy import text\n"
        "from cachedb import CacheDB\n"
        f"with CacheDB({str(path)!r}) as db, db.transaction() as r:\n"
        f"    {statement}\n"
    )
    key = "ab/new.best_config" if change == "insert" else "ab/k3.best_config"
    expected = None if change == "delete" else b'{"num_warps": 99}'
    assert store.best_config_get(key) == expected
    # the others are still right, read per key and then from a reloaded copy
    for _ in range(3):
        for i in (0, 1, 19):
            assert store.best_config_get(f"ab/k{i}.best_config") == _config(i)
    store.close()


def test_a_pooled_commit_of_this_process_is_seen(tmp_path: Path) -> None:
    """The remote tier and ORM transactions write through pooled connections: the kept
    connection's token moves with them."""
    path = tmp_path / "c.db"
    store = _filled(path, 10)
    _loaded(store, 10)
    with store.db.transaction() as repos:
        repos.best_configs.put("ab/k2.best_config", '{"num_warps": 77}')
    assert store.best_config_get("ab/k2.best_config") == b'{"num_warps": 77}'
    store.close()


def test_own_puts_are_in_the_copy(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    store = _filled(path, 10)
    store.best_config_put("ab/first.best_config", _config(1))  # records the fingerprint (ORM)
    _loaded(store, 10)
    seen = _selects(store)
    store.best_config_put("ab/k4.best_config", b'{"num_warps": 55}')  # kept connection upsert
    store.best_config_put("ab/added.best_config", b'{"num_warps": 56}')
    assert store.best_config_get("ab/k4.best_config") == b'{"num_warps": 55}'
    assert store.best_config_get("ab/added.best_config") == b'{"num_warps": 56}'
    assert not any("FROM best_configs" in s for s in seen if s.lstrip().upper().startswith("SELECT"))
    assert store.best_configs.loads == 1
    # and what the copy says is what the database holds
    with CacheDB(path) as db, db.read() as repos:
        assert repos.best_configs.get("ab/k4.best_config") == '{"num_warps": 55}'
        assert repos.best_configs.get("ab/added.best_config") == '{"num_warps": 56}'
    store.close()


def test_a_load_that_overlaps_an_own_put_is_not_kept(tmp_path: Path) -> None:
    """A put committed after the load read the table must not be lost from the copy."""
    path = tmp_path / "c.db"
    store = _filled(path, 5)
    store.best_config_put("ab/first.best_config", _config(1))
    copy = store.best_configs
    kept = store.db.kept
    read = kept.fetch_versioned

    def read_then_put(stmt, params):  # type: ignore[no-untyped-def]
        rows = read(stmt, params)
        store.best_config_put("ab/k0.best_config", b'{"num_warps": 42}')  # after the read
        return rows

    kept.fetch_versioned = read_then_put  # type: ignore[method-assign]
    copy.load(store.db)
    del kept.fetch_versioned
    assert copy.loads == 0
    for _ in range(8):
        assert store.best_config_get("ab/k0.best_config") == b'{"num_warps": 42}'
    assert copy.loads == 1
    store.close()


def test_a_new_connection_never_matches_an_old_token(tmp_path: Path) -> None:
    """PRAGMA data_version counts per connection: a reopened kept connection (after a driver
    error, or in a forked child) starts a new token."""
    store = _filled(tmp_path / "c.db", 5)
    _loaded(store, 5)
    before = store.db.kept.version()
    store.db.kept._discard()
    after = store.db.kept.version()
    assert before is not None and after is not None and before[0] != after[0]
    assert store.best_configs.lookup(after, "ab/k1.best_config") is False
    assert store.best_config_get("ab/k1.best_config") == _config(1)
    store.close()


def test_too_many_rows_are_read_per_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_best_configs, "MAX_ROWS", 8)
    store = _filled(tmp_path / "c.db", 9)
    for _ in range(3):
        for i in range(9):
            assert store.best_config_get(f"ab/k{i}.best_config") == _config(i)
    assert store.best_configs.too_large and store.best_configs.loads == 0
    store.close()


def test_a_config_whose_signature_fails_is_a_miss_in_the_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "c.db"
    team = Signer(b"team secret")
    with CacheDB(path, signer=team) as db, db.transaction() as repos:
        for i in range(6):
            repos.best_configs.put(f"ab/k{i}.best_config", _config(i).decode())
    with CacheDB(path, signer=Signer(b"someone else")) as db, db.transaction() as repos:
        repos.best_configs.put("ab/k5.best_config", '{"num_warps": 666}')  # signed with another key
    monkeypatch.setenv(ENV_KEY, "team secret")
    store = LiveStore(str(path))
    with caplog.at_level(logging.WARNING, logger="cachedb.live"):
        for _ in range(3):
            for i in range(5):
                assert store.best_config_get(f"ab/k{i}.best_config") == _config(i)
            assert store.best_config_get("ab/k5.best_config") is None
    assert store.best_configs.loads == 1
    assert "signature does not verify" in caplog.text
    store.close()


def test_postgresql_reads_per_key(pg_url: str) -> None:
    store = LiveStore(pg_url)
    store.best_config_put("ab/p.best_config", _config(3))
    for _ in range(10):
        assert store.best_config_get("ab/p.best_config") == _config(3)
    assert store.db.kept.version() is None and store.best_configs.loads == 0
    with store.db.transaction() as repos:
        repos.best_configs.put("ab/p.best_config", '{"num_warps": 5}')
    assert store.best_config_get("ab/p.best_config") == b'{"num_warps": 5}'
    store.close()


_WRITER = """
import sys
from cachedb.live._store import LiveStore
store = LiveStore(sys.argv[1])
for line in sys.stdin:
    i = int(line)
    if i % 3 == 2:  # now and then through an ORM transaction (a pooled connection)
        with store.db.transaction() as r:
            r.best_configs.put("ab/k3.best_config", '{"num_warps": %d}' % i)
    else:  # the put torch makes: the kept connection's upsert
        store.best_config_put("ab/k3.best_config", b'{"num_warps": %d}' % i)
    print(i, flush=True)
store.close()
"""


def test_every_commit_of_another_process_is_seen_by_the_next_get(tmp_path: Path) -> None:
    """Between commits a loaded copy answers without running a statement (on Linux the
    wal-index header, cachedb/store/wal_index.py, stands in for PRAGMA data_version); each of 30
    commits another process makes, each acknowledged before the get, is seen by that get, and
    the copy is loaded again after it."""
    path = tmp_path / "c.db"
    store = _filled(path, 10)
    _loaded(store, 10)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(ENV_KEY, None)
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    assert writer.stdin is not None and writer.stdout is not None
    try:
        for i in range(30):
            writer.stdin.write(f"{i}\n")
            writer.stdin.flush()
            assert writer.stdout.readline().strip() == str(i)
            assert store.best_config_get("ab/k3.best_config") == b'{"num_warps": %d}' % i
            for _ in range(_best_configs.LOAD_AFTER_GETS + 1):  # the copy is loaded again
                assert store.best_config_get("ab/k1.best_config") == _config(1)
            seen = _selects(store)
            assert store.best_config_get("ab/k3.best_config") == b'{"num_warps": %d}' % i
            assert store.best_config_get("ab/k2.best_config") == _config(2)
            if sys.platform.startswith("linux"):
                assert seen == [], (i, seen)
            store.db.kept._driver().set_trace_callback(None)
        assert store.best_configs.loads == 31
    finally:
        writer.stdin.close()
        assert writer.wait(60) == 0
    store.close()


def test_own_writes_and_checkpoints_keep_the_token_right(tmp_path: Path) -> None:
    """This connection's own upsert and a checkpoint that restarts the log both move the
    wal-index header: the next token is asked of SQLite again (one PRAGMA), and an own write
    leaves it as it was, so the copy stays loaded."""
    path = tmp_path / "c.db"
    store = _filled(path, 6)
    store.best_config_put("ab/first.best_config", _config(1))  # records the fingerprint (ORM)
    _loaded(store, 6)
    kept = store.db.kept
    token = kept.version()
    seen = _selects(store)
    assert kept.version() == token and seen == []
    store.best_config_put("ab/k2.best_config", b'{"num_warps": 21}')
    seen.clear()
    assert kept.version() == token and kept.version() == token
    pragmas = [s for s in seen if "DATA_VERSION" in s.upper()]
    if sys.platform.startswith("linux"):
        assert len(pragmas) == 1, seen
    assert store.best_config_get("ab/k2.best_config") == b'{"num_warps": 21}'
    assert store.best_configs.loads == 1
    other = sqlite3.connect(path)
    other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    other.close()
    assert kept.version() is not None
    assert store.best_config_get("ab/k2.best_config") == b'{"num_warps": 21}'
    assert store.best_config_get("ab/k4.best_config") == _config(4)
    store.close()


_FORK_STORE: LiveStore | None = None


def _child_gets(conn) -> None:  # type: ignore[no-untyped-def]
    """In a forked child of a process with a loaded copy: the inherited header check is
    dropped; the child's own connection sees the parent's later commit."""
    store = _FORK_STORE
    assert store is not None
    inherited = store.db.kept._wal
    first = store.best_config_get("ab/k1.best_config")
    token = store.db.kept.version()
    conn.send((inherited, first, token, store.db.kept._wal is not None))
    assert conn.recv() == "committed"
    conn.send(store.best_config_get("ab/k1.best_config"))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_checks_its_own_connection(tmp_path: Path) -> None:
    import multiprocessing

    global _FORK_STORE
    path = tmp_path / "c.db"
    store = _FORK_STORE = _filled(path, 6)
    _loaded(store, 6)
    parent_token = store.db.kept.version()
    ctx = multiprocessing.get_context("fork")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_child_gets, args=(theirs,))
    child.start()
    try:
        assert ours.poll(120)
        inherited, first, token, watching = ours.recv()
        assert inherited is None and first == _config(1)
        assert watching == sys.platform.startswith("linux")  # its own -shm descriptor found
        assert token is not None and parent_token is not None and token[0] != parent_token[0]
        with CacheDB(path) as db, db.transaction() as repos:
            repos.best_configs.put("ab/k1.best_config", '{"num_warps": 64}')
        ours.send("committed")
        assert ours.poll(120)
        assert ours.recv() == b'{"num_warps": 64}'
    finally:
        child.join(60)
        _FORK_STORE = None
    assert child.exitcode == 0
    assert store.best_config_get("ab/k1.best_config") == b'{"num_warps": 64}'
    store.close()
