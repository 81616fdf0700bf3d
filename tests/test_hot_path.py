"""Hot-path reads: the connection kept per process, point lookups of timings,
busy waits without 100 ms steps. SQLite files (the live backend's database)."""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import multiprocessing
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import DateTime
from sqlalchemy.dialects.sqlite import dialect as sqlite_dialect

from cachedb import CacheDB
from cachedb.store.engine import begin_immediate
from cachedb.store.prebuilt import _sqlite_datetime
from cachedb.fingerprint import current as current_fingerprint
from cachedb.live._store import LazyOpTimings, LiveStore
from cachedb.store.models import BestConfig
from cachedb.repositories import best_configs as best_configs_repo

ROOT = Path(__file__).resolve().parents[1]
CONFIG = b'{"num_warps": 4, "num_stages": 1, "XBLOCK": 64}'


def _write_in_other_process(db_path: Path, code: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_hot_read_sees_another_process_write(tmp_path: Path) -> None:
    """The kept connection holds no snapshot between reads: a write committed by another
    process after this process's first read is seen by the next read."""
    db_path = tmp_path / "hot.db"
    store = LiveStore(str(db_path))
    assert store.best_config_get("ab/k.best_config") is None  # opens and keeps the connection
    system_hash = current_fingerprint().system_hash
    assert store.local_cache(system_hash).get("mm", {}).get("[(1,)]") is None
    _write_in_other_process(
        db_path,
        "from cachedb.live._store import LiveStore\n"
        "from cachedb.fingerprint import current\n"
        f"s = LiveStore({str(db_path)!r})\n"
        f"s.best_config_put('ab/k.best_config', {CONFIG!r})\n"
        "c = s.local_cache(current().system_hash)\n"
        "c.setdefault('mm', {}).setdefault('[(1,)]', {}).setdefault('high', {})['choice'] = 0.5\n"
        "s.write_changes(c, c.served)\n"
        "s.close()\n",
    )
    assert store.best_config_get("ab/k.best_config") == CONFIG
    assert store.local_cache(system_hash).get("mm", {}).get("[(1,)]") == {"high": {"choice": 0.5}}
    # and CacheDB.lookup() on the same kept connection
    with store.db.lookup() as repos:
        assert repos.best_configs.get("ab/k.best_config") == CONFIG.decode()
    # a second write after reads on the kept connection: still seen
    _write_in_other_process(
        db_path,
        "from cachedb.live._store import LiveStore\n"
        f"s = LiveStore({str(db_path)!r})\n"
        "s.best_config_put('ab/k.best_config', b'{\"num_warps\": 8}')\n"
        "s.close()\n",
    )
    assert store.best_config_get("ab/k.best_config") == b'{"num_warps": 8}'
    # CacheDB.read() (an ORM session on the same kept connection): no snapshot kept either
    with store.db.read() as repos:
        assert repos.session.connection() is store.db.kept._conn
        assert repos.best_configs.get("ab/k.best_config") == '{"num_warps": 8}'
    _write_in_other_process(
        db_path,
        "from cachedb.live._store import LiveStore\n"
        f"s = LiveStore({str(db_path)!r})\n"
        "s.best_config_put('ab/k.best_config', b'{\"num_warps\": 2}')\n"
        "s.close()\n",
    )
    with store.db.read() as repos:
        assert repos.best_configs.get("ab/k.best_config") == '{"num_warps": 2}'
    store.close()


def test_kept_connection_is_kept_and_threads_fall_back(tmp_path: Path) -> None:
    db = CacheDB(tmp_path / "k.db")
    stmt = best_configs_repo.GET_BY_KEY
    assert db.kept.fetch(stmt, {"key": "x"}) == []
    first = db.kept._conn
    assert db.kept.fetch(stmt, {"key": "x"}) == [] and db.kept._conn is first
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            for _ in range(200):
                db.kept.fetch(stmt, {"key": "x"})
                with db.lookup() as repos:
                    repos.best_configs.get("x")
                with db.read() as repos:
                    repos.best_configs.get("x")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    with db.lookup() as outer:  # nested: the inner block gets a pooled connection
        with db.lookup() as inner:
            assert inner.session is not outer.session
        with db.read() as inner:  # so does a read() inside it
            assert inner.session.connection() is not outer.session
        assert db.kept.fetch(stmt, {"key": "x"}) == []
    with db.read() as outer:  # read() takes the kept connection when it is free
        assert outer.session.connection() is first
        with db.lookup() as inner:
            assert inner.session is not first
    db.close()


def _child_reads(db_path: str, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    store = _PARENT_STORE
    assert store is not None
    queue.put((store.best_config_get("ab/f.best_config"), store.db.kept._pid == os.getpid()))


_PARENT_STORE: LiveStore | None = None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def _in_forked_child(target: Any, db_path: str) -> Any:
    """What ``target(db_path, queue)`` puts in the queue, run in a forked child (which must
    exit 0 within two minutes)."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=target, args=(db_path, queue))
    child.start()
    got = queue.get(timeout=120)
    child.join(60)
    assert child.exitcode == 0
    return got


def test_forked_child_opens_its_own_connection(tmp_path: Path) -> None:
    global _PARENT_STORE
    db_path = tmp_path / "fork.db"
    store = _PARENT_STORE = LiveStore(str(db_path))
    store.best_config_put("ab/f.best_config", CONFIG)
    assert store.best_config_get("ab/f.best_config") == CONFIG
    parent_conn = store.db.kept._conn
    got, own = _in_forked_child(_child_reads, str(db_path))
    assert got == CONFIG and own
    # the parent's connection is untouched and still works
    assert store.db.kept._conn is parent_conn
    assert store.best_config_get("ab/f.best_config") == CONFIG
    store.close()
    _PARENT_STORE = None


class _CountingStore(LiveStore):
    def __init__(self, location: str) -> None:
        super().__init__(location)
        self.point = self.whole = 0

    def load_inputs_key(self, *args):  # type: ignore[no-untyped-def]
        self.point += 1
        return super().load_inputs_key(*args)

    def load_op(self, *args):  # type: ignore[no-untyped-def]
        self.whole += 1
        return super().load_op(*args)


def test_timings_lookup_reads_one_inputs_key(tmp_path: Path) -> None:
    store = _CountingStore(str(tmp_path / "t.db"))
    system_hash = current_fingerprint().system_hash
    cache = store.local_cache(system_hash)
    for i in range(50):
        cache.setdefault("mm", {}).setdefault(f"[({i},)]", {}).setdefault("high", {})["c"] = float(i)
    cache.setdefault("mm", {}).setdefault("[(7,)]_3", {}).setdefault("high", {})["c"] = 70.0
    store.write_changes(cache, cache.served)

    cache = store.local_cache(system_hash)
    op = cache.get("mm", {})
    assert isinstance(op, LazyOpTimings)
    assert op.get("[(7,)]", {}).get("high", {}) == {"c": 7.0}
    assert op["[(7,)]_3"] == {"high": {"c": 70.0}}
    assert "[(99,)]" not in op
    assert (store.point, store.whole) == (3, 0)
    # a record writes only what changed, without reading the op's other timings
    op.setdefault("[(99,)]", {}).setdefault("high", {})["c"] = 99.0
    op["[(7,)]"]["high"]["c"] = 7.5
    store.write_changes(cache, cache.served)
    cache.mark_written()
    assert store.whole == 0
    assert op.changes() == ({}, {})
    # whole-op access loads the rest, in document order
    fresh = store.local_cache(system_hash)["mm"]
    assert len(fresh) == 52 and store.whole == 1
    assert list(fresh)[:3] == ["[(0,)]", "[(1,)]", "[(2,)]"]
    assert fresh["[(7,)]"] == {"high": {"c": 7.5}} and fresh["[(99,)]"] == {"high": {"c": 99.0}}
    with store.db.read() as repos:
        rows = repos.timings.current_paths(repos.fingerprints.ids_for_system_hash(system_hash))
    assert len(rows) == 52
    store.close()


def test_begin_immediate_waits_in_short_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer queued behind another's write retries in steps of 0.5 ms doubling to at most
    8 ms (with jitter), never in SQLite's own 100 ms busy steps, and starts once the other
    commits. (How soon, in milliseconds, is the benchmarks' to say.)"""
    from cachedb.store import engine

    db = CacheDB(tmp_path / "b.db")
    db.close()
    holder = sqlite3.connect(tmp_path / "b.db", isolation_level=None, check_same_thread=False)
    waiter = sqlite3.connect(tmp_path / "b.db", isolation_level=None)
    waiter.execute("PRAGMA busy_timeout = 5000")
    holder.execute("BEGIN IMMEDIATE")
    sleeps: list[float] = []
    real_sleep = time.sleep

    def recorded(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 5:
            holder.execute("COMMIT")  # the other writer commits while this one is waiting
        real_sleep(seconds)

    monkeypatch.setattr(engine.time, "sleep", recorded)
    begin_immediate(waiter, 5.0)
    monkeypatch.setattr(engine.time, "sleep", real_sleep)
    waiter.execute("COMMIT")
    assert len(sleeps) == 5, sleeps  # it began at the first try after the commit
    assert all(s <= engine.BUSY_MAX_SLEEP_S * 1.5 for s in sleeps), sleeps
    assert sleeps[0] <= engine.BUSY_FIRST_SLEEP_S * 1.5, sleeps
    assert waiter.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
    # still locked past the timeout: "database is locked"
    holder.execute("BEGIN IMMEDIATE")
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        begin_immediate(waiter, 0.05)
    holder.execute("ROLLBACK")
    holder.close()
    waiter.close()


def _best_config_rows(db: CacheDB) -> list[tuple]:  # type: ignore[type-arg]
    """Every best config as the ORM reads it (its DateTime processing included)."""
    from sqlalchemy import select

    from cachedb.store.models import BestConfig

    with db.read() as repos:
        return [
            (b.key, b.content, b.num_warps, b.fingerprint_id, b.created_at, b.updated_at)
            for b in repos.session.scalars(select(BestConfig).order_by(BestConfig.key))
        ]


def test_hot_write_upserts_one_best_config(db: CacheDB) -> None:
    """``KeptConnection.write`` with the best-config upsert (SQLite and PostgreSQL): a new key
    is inserted, the same content changes nothing, new content replaces the content and its
    columns but keeps the creation time and the fingerprint that first wrote it; timestamps
    read back through the ORM as the ORM writes them."""
    with db.transaction() as repos:
        fp_id = repos.fingerprints.ensure(current_fingerprint())
        repos.best_configs.put("ab/orm.best_config", '{"num_warps": 2}', fingerprint_id=fp_id)
    upsert = best_configs_repo.upsert_for(db.engine.dialect.name)

    def params(key: str, content: str, fp: int | None) -> dict:  # type: ignore[type-arg]
        columns = best_configs_repo.prepare_columns(db.signer, key, content)
        return best_configs_repo.upsert_params(key, content, columns, fp)

    assert db.kept.write(upsert, params("ab/k.best_config", '{"num_warps": 4}', fp_id)) == 1
    first = {r[0]: r for r in _best_config_rows(db)}
    assert first["ab/k.best_config"][1:4] == ('{"num_warps": 4}', 4, fp_id)
    assert first["ab/k.best_config"][4] == first["ab/k.best_config"][5]
    time.sleep(0.01)
    assert db.kept.write(upsert, params("ab/k.best_config", '{"num_warps": 4}', None)) == 0  # same content
    assert {r[0]: r for r in _best_config_rows(db)} == first
    assert db.kept.write(upsert, params("ab/k.best_config", '{"num_warps": 8}', None)) == 1
    now = {r[0]: r for r in _best_config_rows(db)}
    assert now["ab/k.best_config"][1:5] == ('{"num_warps": 8}', 8, fp_id, first["ab/k.best_config"][4])
    assert now["ab/k.best_config"][5] > first["ab/k.best_config"][5]
    assert now["ab/orm.best_config"] == first["ab/orm.best_config"]  # the other row untouched
    with db.lookup() as repos:
        assert repos.best_configs.get("ab/k.best_config") == '{"num_warps": 8}'
    if db.path is not None:  # SQLite keeps DateTime as text: the same format as the ORM's
        import re

        raw = sqlite3.connect(db.path)
        stamps = raw.execute("SELECT key, created_at, updated_at FROM best_configs").fetchall()
        raw.close()
        assert {k for k, *_ in stamps} == {"ab/orm.best_config", "ab/k.best_config"}
        assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}", t) for _, *ts in stamps for t in ts), stamps
    db.close()


def test_hot_write_waits_for_the_lock_and_fails_clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hot write queued behind another writer's transaction goes in once it commits; one
    still locked out past the busy timeout raises HotWriteError and stores nothing; the live
    store then logs and carries on (the put is dropped, the next put works once the breaker's
    pause, 0 here, is over)."""
    from cachedb.live import _store_base
    from cachedb.store.engine import HotWriteError

    monkeypatch.setattr(_store_base, "LOCKED_RETRY_S", 0.0)
    path = tmp_path / "w.db"
    # 1 s of busy timeout against a 50 ms hold: a late timer thread still commits in time
    store = LiveStore(str(path), timeout_s=1.0)
    store.best_config_put("ab/first.best_config", CONFIG)  # records the fingerprint (ORM path)
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    threading.Timer(0.05, lambda: holder.execute("COMMIT")).start()
    store.best_config_put("ab/queued.best_config", CONFIG)
    assert store.best_config_get("ab/queued.best_config") == CONFIG
    holder.execute("BEGIN IMMEDIATE")
    upsert = best_configs_repo.upsert_for("sqlite")
    columns = best_configs_repo.prepare_columns(None, "ab/locked.best_config", CONFIG.decode())
    with pytest.raises(HotWriteError, match="locked"):
        store.db.kept.write(upsert, best_configs_repo.upsert_params("ab/locked.best_config", CONFIG.decode(), columns, None))
    store.best_config_put("ab/locked.best_config", CONFIG)  # logged, dropped
    holder.execute("ROLLBACK")
    assert store.best_config_get("ab/locked.best_config") is None
    assert store._warned_locked
    store.best_config_put("ab/after.best_config", CONFIG)
    assert store.best_config_get("ab/after.best_config") == CONFIG
    holder.close()
    store.close()


def test_hot_writes_from_threads_all_land(tmp_path: Path) -> None:
    """Threads putting at once: the one holding the kept connection writes on it, the others
    on pooled connections; every put is stored."""
    store = LiveStore(str(tmp_path / "t.db"))
    store.best_config_put("ab/first.best_config", CONFIG)

    def writer(t: int) -> None:
        for i in range(50):
            store.best_config_put(f"t{t}/{i}.best_config", b'{"num_warps": %d}' % i)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not store._warned
    with store.db.read() as repos:
        assert sum(1 for _ in repos.best_configs.iter_all()) == 201
    assert store.best_config_get("t3/49.best_config") == b'{"num_warps": 49}'
    store.close()


def test_hot_guarded_put_inserts_each_variant_once(real_cache: tuple[Path, dict], db_url: str) -> None:
    """Live FX graph puts after the first (SQLite and PostgreSQL): one INSERT ... ON CONFLICT DO
    NOTHING on the kept connection stores the real entry with its scanned guards and this
    process's fingerprint; the same variant again adds nothing; pending hit counts go in with
    the next put (the ORM path) rather than waiting for exit."""
    from sqlalchemy import select

    from cachedb.formats.pickle_scan import read_entry_fields
    from cachedb.store.models import GuardedEntry

    cache_dir, _ = real_cache
    entries = [(p.parent.name, p.name, p.read_bytes()) for p in sorted((cache_dir / "fxgraph").glob("*/*/*"))]
    assert len(entries) >= 2, "the real cache has two FX graph entries"
    (k0, v0, d0), (k1, v1, d1) = entries[:2]
    store = LiveStore(db_url)
    store.guarded_put("fxgraph", k0, d0)  # first write: records the fingerprint (ORM)
    store.guarded_put("fxgraph", k1, d1)  # the one-statement path
    store.guarded_put("fxgraph", k1, d1)  # stored already: nothing new
    assert store.flush(60)  # written by the write-behind thread (cachedb/live/_writer.py)
    assert dict(store.guarded_candidates("fxgraph", k1)) == {v1: d1}
    with store.db.read() as repos:
        rows = {(g.key, g.variant): g for g in repos.session.scalars(select(GuardedEntry))}
    assert set(rows) == {(k0, v0), (k1, v1)}
    fields = read_entry_fields(d1)
    row = rows[(k1, v1)]
    assert (row.guards_expr, row.time_taken_ns, row.size_bytes) == (fields.guards_expr, fields.time_taken_ns, len(d1))
    assert row.fingerprint_id == rows[(k0, v0)].fingerprint_id is not None
    assert row.created_at == row.last_used_at and row.hit_count == 0
    store.note_hit("fxgraph", k1, v1)
    store.guarded_put("fxgraph", k0, d0)  # with a pending hit: written in the same transaction
    assert store.flush(60)
    with store.db.read() as repos:
        assert repos.session.scalars(select(GuardedEntry.hit_count).where(GuardedEntry.key == k1)).one() == 1
    assert not store._warned
    store.close()


def test_large_payloads_are_compressed_by_zstd_workers(real_cache: tuple[Path, dict]) -> None:
    """Payloads of 1 MiB and more are compressed at ZSTD_LEVEL by ZSTD_THREADS_LARGE zstd
    workers (the process's one multi-threaded context, made on first use), smaller ones by a
    single-threaded one; both are one frame recording the content size, and unpack to the same
    bytes under their checksum."""
    import hashlib

    import zstandard

    from cachedb.store import payload as _payload

    cache_dir, _ = real_cache
    real = b"".join(p.read_bytes() for p in sorted(cache_dir.rglob("*")) if p.is_file() and p.suffix in (".so", ".py"))
    small = real[: _payload.LARGE_PAYLOAD_BYTES - 1]
    large = (real * (1 + _payload.LARGE_PAYLOAD_BYTES // max(len(real), 1)))[: _payload.LARGE_PAYLOAD_BYTES]
    _payload._LARGE._compressor = None  # as in a fresh process: no multi-threaded context yet
    for data, level, threads in (
        (small, _payload.ZSTD_LEVEL, 0), (large, _payload.ZSTD_LEVEL, _payload.ZSTD_THREADS_LARGE)
    ):
        packed = _payload.pack(data)
        # The multi-threaded context exists once, and only once, a large payload was packed.
        assert (_payload._LARGE._compressor is not None) == (threads > 0)
        assert zstandard.get_frame_parameters(packed.blob).content_size == len(data)
        frame = zstandard.ZstdCompressor(
            level=level, write_content_size=True, write_checksum=True, threads=threads
        ).compress(data)
        assert packed.blob == frame + _payload.TRAILER_HEADER + hashlib.sha256(data).digest()
        assert _payload.unpack(packed.blob, packed.size_bytes, packed.checksum, where="t") == data


def test_a_refused_hot_write_rolls_back_and_frees_the_lock(db: CacheDB) -> None:
    """A hot write the database refuses after BEGIN (a NOT NULL column left NULL) raises
    HotWriteError, stores nothing, and leaves no transaction open on the kept connection: the
    next hot write and another connection's write both go through (SQLite and PostgreSQL)."""
    from cachedb.store.engine import HotWriteError

    upsert = best_configs_repo.upsert_for(db.engine.dialect.name)
    content = CONFIG.decode()
    good = best_configs_repo.upsert_params(
        "ab/ok.best_config", content, best_configs_repo.prepare_columns(None, "ab/ok.best_config", content), None
    )
    bad = {**good, "key": "ab/bad.best_config", "content": None}  # content is NOT NULL
    with pytest.raises(HotWriteError):
        db.kept.write(upsert, bad)
    driver = db.kept._dbapi
    if db.path is not None:
        assert not driver.in_transaction
    else:
        from psycopg import pq

        assert driver.info.transaction_status == pq.TransactionStatus.IDLE
    assert db.kept.write(upsert, good) == 1
    with db.transaction() as repos:  # another connection takes the write lock at once
        repos.best_configs.put("ab/other.best_config", content)
    with db.read() as repos:
        assert sorted(k for k, _ in repos.best_configs.iter_all()) == ["ab/ok.best_config", "ab/other.best_config"]
    db.close()


def test_hot_paths_reopen_after_sqlalchemy_dropped_the_lent_connection(db: CacheDB) -> None:
    """``KeptConnection`` reuses its driver connection between calls; when a block that
    borrowed the kept connection (``CacheDB.lookup``) leaves it invalidated, the next read and
    write open a new one instead of using the dropped driver connection."""
    with db.transaction() as repos:
        repos.best_configs.put("ab/k.best_config", CONFIG.decode())
    assert db.kept.fetch(best_configs_repo.GET_BY_KEY, {"key": "ab/k.best_config"})[0][0] == CONFIG.decode()
    with db.kept.snapshot() as conn:
        assert conn is not None
        conn.invalidate()  # what SQLAlchemy does to a connection after a disconnect error
    rows = db.kept.fetch(best_configs_repo.GET_BY_KEY, {"key": "ab/k.best_config"})
    assert rows[0][0] == CONFIG.decode()
    columns = best_configs_repo.prepare_columns(db.signer, "cd/k.best_config", CONFIG.decode())
    with db.transaction() as repos:
        fp_id = repos.fingerprints.ensure(current_fingerprint())
    upsert = best_configs_repo.upsert_for(db.engine.dialect.name)
    assert db.kept.write(upsert, best_configs_repo.upsert_params("cd/k.best_config", CONFIG.decode(), columns, fp_id)) == 1
    with db.read() as repos:
        assert repos.best_configs.get("cd/k.best_config") == CONFIG.decode()


def _big_entry(i: int) -> bytes:
    """A pickled entry of ~3 MB that zstd cannot shrink (so each put adds ~3 MB to the WAL)."""
    import pickle
    import random

    return pickle.dumps({"guards_expr": None, "n": i, "blob": random.Random(i).randbytes(3_000_000)})


def _wait_for_checkpoints(store: LiveStore, n: int) -> int:
    checkpointer = store.db.kept.checkpointer
    assert checkpointer is not None
    deadline = time.monotonic() + 30
    while checkpointer.checkpoints < n and time.monotonic() < deadline:
        time.sleep(0.02)
    return checkpointer.checkpoints


def _rows_in_main_file(db_path: Path, tmp_path: Path) -> int:
    """Rows of guarded_entries in the ``.db`` file alone (what a checkpoint has copied there)."""
    import shutil

    alone = tmp_path / f"alone-{time.monotonic_ns()}.db"
    shutil.copyfile(db_path, alone)
    conn = sqlite3.connect(alone)
    try:
        return int(conn.execute("SELECT count(*) FROM guarded_entries").fetchone()[0])
    finally:
        conn.close()


def test_kept_writes_leave_wal_checkpoints_to_a_background_thread(tmp_path: Path) -> None:
    """The kept connection runs without SQLite's automatic checkpoint; once its writes have
    grown the WAL past the threshold, the checkpointer's thread copies them into the ``.db``
    file. Closing puts the connection back into the pool with the automatic checkpoint."""
    db_path = tmp_path / "wal.db"
    store = LiveStore(str(db_path), trust=True)
    for i in range(3):
        store.guarded_put("fxgraph", f"fbig{i}", _big_entry(i))
    assert store.flush(60)  # the write-behind thread's writes go through the kept connection
    assert not store._warned
    kept = store.db.kept
    assert kept._dbapi.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    assert _wait_for_checkpoints(store, 1) >= 1
    assert _rows_in_main_file(db_path, tmp_path) == 3
    assert [len(p) for _, p in store.guarded_candidates("fxgraph", "fbig2")] == [len(_big_entry(2))]
    db = store.db
    kept.close()
    pooled = [db.engine.connect() for _ in range(db.engine.pool.checkedin())]
    assert pooled and all(c.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 1000 for c in pooled)
    for c in pooled:
        c.close()
    store.close()


def _child_puts_big_entries(db_path: str, queue: Any) -> None:
    try:
        store = _PARENT_STORE
        assert store is not None
        for i in range(10, 13):
            store.guarded_put("fxgraph", f"fbig{i}", _big_entry(i))
        queue.put((_wait_for_checkpoints(store, 1), sorted(store._warned)))
    except BaseException as exc:  # the parent sees it in the queue
        queue.put((-1, [repr(exc)]))


def test_a_forked_child_checkpoints_on_its_own_thread(tmp_path: Path) -> None:
    global _PARENT_STORE
    db_path = tmp_path / "forkwal.db"
    store = _PARENT_STORE = LiveStore(str(db_path), trust=True)
    for i in range(3):
        store.guarded_put("fxgraph", f"fbig{i}", _big_entry(i))
    assert _wait_for_checkpoints(store, 1) >= 1
    checkpoints, warned = _in_forked_child(_child_puts_big_entries, str(db_path))
    assert warned == [] and checkpoints >= 1
    assert _rows_in_main_file(db_path, tmp_path) == 6
    store.close()
    _PARENT_STORE = None


def test_a_statement_is_compiled_once_per_process_and_dialect(tmp_path: Path, pg_url: str) -> None:
    """Every kept connection of a process reuses a hot-path statement's compiled form for its
    dialect (SQLAlchemy's compile of the FX graph lookup takes 1-2 ms): a second SQLite
    database's first lookup compiles nothing, and reads its own rows; PostgreSQL gets a
    compiled form of its own (its parameter style) and reads its rows too."""
    from cachedb.store import prebuilt as _prebuilt
    from cachedb.repositories import guarded as guarded_repo

    stores = [LiveStore(str(tmp_path / f"c{i}.db"), trust=True, write_behind=False) for i in range(2)]
    stores.append(LiveStore(pg_url, trust=True, write_behind=False))
    import pickle

    entries = [pickle.dumps({"guards_expr": None, "n": i}) for i in range(len(stores))]
    for store, entry in zip(stores, entries):
        store.guarded_put("fxgraph", "fcompiled", entry)
    sqlite_a, sqlite_b, pg = (store.db.kept for store in stores)
    first = sqlite_a._compile(guarded_repo.FIRST_VARIANT)
    sqlite_variants = sqlite_a._compile(guarded_repo.VARIANTS)
    before = dict(_prebuilt._COMPILED)
    assert sqlite_b._compile(guarded_repo.FIRST_VARIANT) is first
    for store, entry in zip(stores, entries):
        assert [c for _, c in store.guarded_candidates("fxgraph", "fcompiled")] == [entry]
    pg_compiled = pg._compile(guarded_repo.VARIANTS)
    assert "%(kind)s" in pg_compiled.sql and "?" in sqlite_variants.sql
    added = set(_prebuilt._COMPILED) - set(before)
    assert all(key[1] is type(pg._engine.dialect) for key in added)  # SQLite compiled nothing new
    for store in stores:
        store.close()


def _wal_frames(db_path: str) -> tuple[int, int]:
    """``(mxFrame, nBackfill)`` of the database's wal-index, read from the ``-shm`` file's bytes
    (no SQLite call): the WAL's last valid frame and how many frames a checkpoint has copied
    into the ``.db`` file (sqlite/src/wal.c: ``WalIndexHdr.mxFrame`` at byte 16,
    ``WalCkptInfo.nBackfill`` at byte 96, native byte order)."""
    with open(db_path + "-shm", "rb") as f:
        head = f.read(100)
    return int.from_bytes(head[16:20], sys.byteorder), int.from_bytes(head[96:100], sys.byteorder)


def _child_forked_during_a_checkpoint(db_path: str, queue: Any) -> None:
    try:
        frames = _wal_frames(db_path)  # as the fork left it, before this process touches SQLite
        conn = sqlite3.connect(db_path, timeout=10, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("UPDATE guarded_entries SET hit_count = hit_count + 1")
        conn.execute("COMMIT")
        conn.close()
        queue.put(frames)
    except BaseException as exc:  # the parent sees it in the queue
        queue.put(repr(exc))


def test_a_fork_waits_for_the_checkpoint_under_way(tmp_path: Path) -> None:
    """A fork while the checkpointer's thread copies the WAL waits for the copy to end (the
    child would otherwise inherit SQLite's mutexes held by that thread): the child finds every
    WAL frame checkpointed, and writes to the database itself."""
    db_path = tmp_path / "forkckpt.db"
    store = LiveStore(str(db_path), trust=True, write_behind=False)
    checkpointer = store.db.kept.checkpointer
    assert checkpointer is not None
    checkpointer._wal_bytes = 1 << 40  # no checkpoint until this test wakes the thread
    for i in range(6):  # ~18 MB in the WAL
        store.guarded_put("fxgraph", f"fbig{i}", _big_entry(i))
    mx_frame, backfilled = _wal_frames(str(db_path))
    assert mx_frame > 1000 and backfilled == 0
    assert checkpointer._running()
    checkpointer._wake.set()
    deadline = time.monotonic() + 10
    while not checkpointer._busy.locked():  # the checkpoint is under way
        assert time.monotonic() < deadline
    frames = _in_forked_child(_child_forked_during_a_checkpoint, str(db_path))
    assert frames == (mx_frame, mx_frame)
    assert checkpointer.checkpoints == 1
    store.close()


_SQLITE_DATETIME = DateTime().dialect_impl(sqlite_dialect()).bind_processor(sqlite_dialect())


@given(
    value=st.one_of(
        st.datetimes(),
        st.datetimes(timezones=st.timezones()),
        st.dates(),
    )
)
@settings(max_examples=300, deadline=None)
def test_hot_path_timestamps_are_sqlalchemys_text(value: dt.date) -> None:
    """The kept connection's SQLite ``DateTime`` binds (``_sqlite_datetime``) give exactly the
    text SQLAlchemy's own processor stores, for naive, aware (any zone) and date values, and
    for the same object bound twice in a row."""
    process = _sqlite_datetime(_SQLITE_DATETIME)
    assert process(value) == _SQLITE_DATETIME(value)
    assert process(value) == _SQLITE_DATETIME(value)


def test_hot_path_write_stores_the_orm_timestamp_text(tmp_path: Path) -> None:
    """A best config written through the kept connection and one written through the ORM at
    the same instant store the same timestamp text, and it reads back as that instant."""
    db = CacheDB(tmp_path / "ts.db")
    now = dt.datetime(2026, 11, 24, 23, 5, 7, 120, tzinfo=dt.timezone.utc)
    content = CONFIG.decode()
    columns = best_configs_repo.prepare_columns(None, "ab/hot.best_config", content)
    params = {**best_configs_repo.upsert_params("ab/hot.best_config", content, columns, None),
              "created_at": now, "updated_at": now}
    assert db.kept.write(best_configs_repo.upsert_for("sqlite"), params) == 1
    with db.transaction() as repos:
        repos.session.add(BestConfig(key="cd/orm.best_config", content=content, created_at=now, updated_at=now))
    with db.engine.connect() as conn:
        stored = conn.exec_driver_sql("SELECT key, created_at, updated_at FROM best_configs ORDER BY key").all()
    assert [tuple(r) for r in stored] == [
        ("ab/hot.best_config", "2026-11-24 23:05:07.000120", "2026-11-24 23:05:07.000120"),
        ("cd/orm.best_config", "2026-11-24 23:05:07.000120", "2026-11-24 23:05:07.000120"),
    ]
    with db.read() as repos:
        row = repos.session.get(BestConfig, 1)
        assert row is not None and row.created_at.replace(tzinfo=dt.timezone.utc) == now
    db.close()


def test_variants_after_the_hit_are_never_decompressed(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Torch's own ``find_guarded_entry`` stops at the first variant whose guards hold, as its
    file loop stops reading there: the live store decompresses (and checks) a variant only
    when Inductor reaches it. A damaged variant after the hit is not even looked at; a lookup
    that reaches it skips it, warns and quarantines it, and still serves the intact one."""
    import pickle
    from types import SimpleNamespace

    import cachedb
    from cachedb.keys import sha256_hash
    from sqlalchemy import text
    from torch._dynamo.utils import counters
    from torch._inductor.codecache import FxGraphCache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    key = "flazyvariants" + "0" * 39
    contents = [pickle.dumps(SimpleNamespace(guards_expr=f"s0 < {n}", n=n)) for n in (8, 64)]
    first, second = sorted(contents, key=sha256_hash)  # Inductor's order: sorted variant names
    with cachedb.installed(db_url):
        for content in contents:
            FxGraphCache._write_to_local_cache(key, content)
    db = CacheDB(db_url)
    with db.engine.begin() as conn:  # a damaged payload for the variant Inductor reaches second
        conn.execute(text("UPDATE guarded_entries SET payload = :p WHERE variant = :v"),
                     {"p": b"not a zstd frame", "v": sha256_hash(second)})

    def quarantined() -> int:
        with db.engine.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM quarantined_entries")).scalar_one()

    counters.clear()
    with cachedb.installed(db_url):
        graph, content, info = FxGraphCache.find_guarded_entry(key, True, None, lambda expr, hints: True, [])
        assert content == first and info["cache_status_detailed"] == "hit"
        assert quarantined() == 0 and counters["inductor"]["cachedb_corrupt_payload"] == 0
        # guards that hold for no variant: Inductor reaches the damaged one
        graph, content, info = FxGraphCache.find_guarded_entry(key, True, None, lambda expr, hints: False, [])
        assert graph is None and info["cache_status_detailed"] == "guard_miss"
        assert quarantined() == 1 and counters["inductor"]["cachedb_corrupt_payload"] == 1
        assert [c for _, c, _ in FxGraphCache.iterate_over_candidates(True, None, key)] == [first]
    db.close()


def test_a_served_variant_is_not_held_compressed_while_inductor_unpickles_it(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the live lookup hands Inductor a variant, it no longer holds that variant's
    compressed row: while torch unpickles and runs the entry, the process holds the payload
    and what it unpickles to, as with Inductor's own files, not the stored frame as well (which
    kept a 20 MB graph's lookup over glibc's trim threshold: each lookup then faulted its memory
    in again, §4). Measured with ``tracemalloc`` around torch's ``iterate_over_candidates``."""
    import pickle
    import tracemalloc
    from types import SimpleNamespace

    import cachedb
    from sqlalchemy import text
    from torch._inductor.codecache import FxGraphCache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    key = "fheldcompressed" + "0" * 37
    # 4 MiB that zstd stores in ~1 MiB: the random MiB does not compress, the zeros do
    payload = pickle.dumps(SimpleNamespace(guards_expr="s0 < 8", blob=os.urandom(1 << 20) + bytes(3 << 20)))
    with cachedb.installed(db_url) as store:
        FxGraphCache._write_to_local_cache(key, payload)
        assert store.flush(60)  # written (write-behind) before another connection looks
        assert list(FxGraphCache.iterate_over_candidates(True, None, "fabsent" + "0" * 45)) == []  # opened
        db = CacheDB(db_url)
        with db.engine.connect() as conn:
            stored = conn.execute(text("SELECT length(payload) FROM guarded_entries")).scalar_one()
        db.close()
        assert stored > 1 << 20
        tracemalloc.start()
        try:
            candidates = FxGraphCache.iterate_over_candidates(True, None, key)
            entry, content, _ = next(candidates)
            held, _peak = tracemalloc.get_traced_memory()
            candidates.close()
        finally:
            tracemalloc.stop()
    assert content == payload and entry.guards_expr == "s0 < 8" and len(entry.blob) == 4 << 20
    # the payload and its unpickled copy; the compressed row would add ``stored`` bytes more
    assert held < 2 * len(payload) + stored // 2, (held, len(payload), stored)


def _large_entry(n: int) -> bytes:
    """An FX graph entry pickle of ~2 MiB (from 1 MiB the live lookup reads it in place)."""
    import pickle
    from types import SimpleNamespace

    return pickle.dumps(SimpleNamespace(guards_expr=f"s0 < {n}", n=n, blob=os.urandom(1 << 19) + bytes(3 << 19)))


@pytest.mark.skipif(not hasattr(sqlite3.Connection, "blobopen"), reason="sqlite3 reads in place from Python 3.11")
def test_a_large_variant_is_read_in_place_and_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On SQLite the live lookup leaves a variant of 1 MiB or more in the database and
    decompresses it as it reads it (incremental blob I/O): torch gets the same bytes, and a
    damaged frame is refused, quarantined and counted as a small one is."""
    import cachedb
    from cachedb.keys import sha256_hash
    from torch._dynamo.utils import counters
    from torch._inductor.codecache import FxGraphCache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    db_path = tmp_path / "large.db"
    key = "flargeinplace" + "0" * 39
    payloads = sorted((_large_entry(8), _large_entry(64)), key=sha256_hash)  # Inductor's order
    with cachedb.installed(db_path):
        for payload in payloads:
            FxGraphCache._write_to_local_cache(key, payload)
        served = [content for _, content, _ in FxGraphCache.iterate_over_candidates(True, None, key)]
        assert served == payloads
        from cachedb.live import _seams

        store = _seams._active_store()
        with store.db.kept.snapshot() as held:  # another thread's use: the lookup takes a pooled connection
            assert held is not None
            assert [content for _, content in store.guarded_candidates("fxgraph", key)] == payloads
    raw = sqlite3.connect(db_path)
    (stored,) = raw.execute("SELECT payload FROM guarded_entries WHERE variant = ?", (sha256_hash(payloads[1]),)).fetchone()
    damaged = bytearray(stored)
    damaged[len(damaged) // 8] ^= 0x01  # inside the random part: raw literals, zstd's checksum catches it
    with raw:
        raw.execute("UPDATE guarded_entries SET payload = ? WHERE variant = ?", (bytes(damaged), sha256_hash(payloads[1])))
    raw.close()
    counters.clear()
    with cachedb.installed(db_path):
        served = [content for _, content, _ in FxGraphCache.iterate_over_candidates(True, None, key)]
    assert served == payloads[:1]
    assert counters["inductor"]["cachedb_corrupt_payload"] == 1
    db = CacheDB(db_path)
    with db.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT variant FROM quarantined_entries").scalars().all() == [sha256_hash(payloads[1])]
    db.close()


def _small_entry(n: int) -> bytes:
    """An FX graph entry pickle of ~100 KB (stored as it is, under 1 MiB)."""
    import pickle
    from types import SimpleNamespace

    return pickle.dumps(SimpleNamespace(guards_expr=f"s0 < {n}", n=n, blob=os.urandom(50_000) + bytes(50_000)))


@pytest.mark.skipif(not hasattr(sqlite3.Connection, "blobopen"), reason="sqlite3 reads in place from Python 3.11")
def test_the_lookup_reads_the_first_variant_and_lists_the_others_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On SQLite the live lookup's first query (FIRST_VARIANT) copies the payload of a key's
    first variant in Inductor's order, when it is under 1 MiB, and no other row; it counts the
    key's variants. When Inductor's guards hold for that one (find_guarded_entry stops), no
    other statement runs; when it asks for more, one index query (LATER_VARIANTS) lists the
    others, read in place as Inductor reaches them. torch gets every variant's bytes, in its
    order, and a large first variant comes without its payload or size."""
    import cachedb
    from cachedb.keys import sha256_hash
    from cachedb.live import _seams
    from cachedb.repositories import guarded as guarded_repo
    from torch._inductor.codecache import FxGraphCache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    db_path = tmp_path / "first.db"
    key, large_first = "ffirstvariant" + "0" * 39, "flargefirst" + "0" * 41
    small = [_small_entry(n) for n in (8, 16, 32)]
    large = _large_entry(64)
    while sha256_hash(large) < min(map(sha256_hash, small)):  # a small one first in Inductor's order
        large = _large_entry(64)
    payloads = sorted([*small, large], key=sha256_hash)
    with cachedb.installed(db_path):
        for payload in payloads:
            FxGraphCache._write_to_local_cache(key, payload)
        FxGraphCache._write_to_local_cache(large_first, large)
        store = _seams._active_store()
        assert store.flush(60)  # written (write-behind) before the statements are run by hand
        kept = store.db.kept
        params = {"kind": "fxgraph", "key": key}
        ((variant, blob, size, digest, _, _, variants),) = kept.fetch(guarded_repo.FIRST_VARIANT, params)
        assert (variant, variants, size) == (sha256_hash(payloads[0]), 4, len(payloads[0]))
        assert blob is not None and digest == hashlib.sha256(payloads[0]).hexdigest()
        later = kept.fetch(guarded_repo.LATER_VARIANTS, {**params, "after": variant})
        assert [row[0] for row in later] == [sha256_hash(p) for p in payloads[1:]]
        assert all(row[1:5] == (None,) * 4 for row in later)
        ((_, blob, size, digest, _, _, variants),) = kept.fetch(
            guarded_repo.FIRST_VARIANT, {"kind": "fxgraph", "key": large_first}
        )
        assert (blob, size, digest, variants) == (None, None, None, 1)

        seen: list[str] = []
        kept._driver().set_trace_callback(seen.append)
        try:
            candidates = FxGraphCache.iterate_over_candidates(True, None, key)
            assert next(candidates)[1] == payloads[0]
            candidates.close()  # as find_guarded_entry stops at the variant whose guards hold
            assert len(seen) == 1 and "LIMIT 1" in seen[0], seen
            served = [content for _, content, _ in FxGraphCache.iterate_over_candidates(True, None, key)]
            assert served == payloads
            assert sum("guarded_entries.variant >" in sql for sql in seen) == 1
            assert [content for _, content, _ in FxGraphCache.iterate_over_candidates(True, None, large_first)] == [large]
        finally:
            kept._driver().set_trace_callback(None)


@pytest.mark.skipif(not hasattr(sqlite3.Connection, "blobopen"), reason="sqlite3 reads in place from Python 3.11")
@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("then", ["deleted", "id_reused"])
def test_a_variant_read_in_place_gone_before_inductor_reaches_it_is_absent_not_corrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, then: str, size: str
) -> None:
    """The lookup's one query reads a key's rows; the payload of a variant after the first (or
    of a large one) is read when Inductor reaches it. Evicted meanwhile by another process, or
    its id taken by a new row, it is skipped as absent: nothing is quarantined, nothing is
    warned about, nothing else is served in its place."""
    import cachedb
    from cachedb.keys import sha256_hash
    from cachedb.live import _seams
    from torch._inductor.codecache import FxGraphCache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    db_path = tmp_path / "gone.db"
    key = "fgoneinplace" + "0" * 40
    entry = _small_entry if size == "small" else _large_entry
    first, second = sorted((entry(8), entry(64)), key=sha256_hash)
    with cachedb.installed(db_path):
        FxGraphCache._write_to_local_cache(key, first)
        FxGraphCache._write_to_local_cache(key, second)
        candidates = _seams._active_store().guarded_candidates("fxgraph", key)
        assert next(candidates) == (sha256_hash(first), first)
        other = sqlite3.connect(db_path, isolation_level=None)  # another process's eviction
        (gone_id,) = other.execute("SELECT id FROM guarded_entries WHERE variant = ?", (sha256_hash(second),)).fetchone()
        other.execute("DELETE FROM guarded_entries WHERE id = ?", (gone_id,))
        if then == "id_reused":  # SQLite gives the next row the largest id again
            FxGraphCache._write_to_local_cache("fanotherkey" + "0" * 41, _large_entry(99))
            assert _seams._active_store().flush(60)
            assert other.execute("SELECT key FROM guarded_entries WHERE id = ?", (gone_id,)).fetchone() == (
                "fanotherkey" + "0" * 41,
            )
        other.close()
        with caplog.at_level(logging.WARNING, logger="cachedb"):
            assert list(candidates) == []
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    db = CacheDB(db_path)
    with db.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM quarantined_entries").scalar_one() == 0
    db.close()


def test_a_corrupt_first_variant_is_quarantined_and_the_later_ones_still_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The live lookup reads and checks a key's first variant when it is called: damaged, it is
    warned about once, quarantined and skipped, and the key's later variants still follow, in
    Inductor's order, each read when asked for; the next lookup serves the later ones alone."""
    from cachedb.keys import sha256_hash

    path = tmp_path / "firstbad.db"
    key = "ffirstbad" + "0" * 43
    entries = sorted((_small_entry(n) for n in (1, 2, 3)), key=sha256_hash)
    store = LiveStore(str(path), trust=True, write_behind=False)
    for entry in entries:
        store.guarded_put("fxgraph", key, entry)
    raw = sqlite3.connect(path, isolation_level=None)
    (payload,) = raw.execute("SELECT payload FROM guarded_entries WHERE variant = ?", (sha256_hash(entries[0]),)).fetchone()
    damaged = bytearray(payload)
    damaged[5000] ^= 1  # one content byte (format 3 stores the content as it is)
    raw.execute("UPDATE guarded_entries SET payload = ? WHERE variant = ?", (bytes(damaged), sha256_hash(entries[0])))
    raw.close()
    with caplog.at_level(logging.WARNING, logger="cachedb"):
        served = store.guarded_candidates("fxgraph", key)
        assert next(served) == (sha256_hash(entries[1]), entries[1])
        assert list(served) == [(sha256_hash(entries[2]), entries[2])]
    assert [r for r in caplog.records if "payload check failed" in r.getMessage()]
    assert [c for _, c in store.guarded_candidates("fxgraph", key)] == entries[1:]
    quarantined = store.db.kept._dbapi.execute("SELECT variant FROM quarantined_entries").fetchall()
    assert quarantined == [(sha256_hash(entries[0]),)]
    store.close()


def test_new_databases_take_16_kib_pages_and_old_ones_keep_theirs(tmp_path: Path) -> None:
    """A database cachedb creates has PAGE_SIZE pages (a 100 KB payload is then 7 page reads,
    not 25); one made at SQLite's default 4 KiB keeps its pages, serves and stores entries as
    before, and its kept connection's checkpointer counts a write's overhead in its pages."""
    import pickle
    from types import SimpleNamespace

    from cachedb.store.checkpoint import WRITE_OVERHEAD_PAGES
    from cachedb.store.engine import PAGE_SIZE

    payload = pickle.dumps(SimpleNamespace(guards_expr="s0 < 8", blob=os.urandom(100_000)))
    sizes = {}
    for name, convert in (("new", False), ("old", True)):
        path = tmp_path / f"{name}.db"
        CacheDB(path).close()  # created at the head revision
        if convert:  # as a database made before: SQLite's default page size
            raw = sqlite3.connect(path, isolation_level=None)
            raw.execute("PRAGMA journal_mode = DELETE")
            raw.execute("PRAGMA page_size = 4096")
            raw.execute("VACUUM")
            raw.execute("PRAGMA journal_mode = WAL")
            raw.close()
        store = LiveStore(str(path), trust=True)
        store.guarded_put("fxgraph", "fpages" + "0" * 46, payload)
        assert [content for _, content in store.guarded_candidates("fxgraph", "fpages" + "0" * 46)] == [payload]
        page_size = store.db.kept._dbapi.execute("PRAGMA page_size").fetchone()[0]
        checkpointer = store.db.kept.checkpointer
        assert checkpointer is not None and checkpointer._overhead == WRITE_OVERHEAD_PAGES * page_size
        assert not store._warned
        store.close()
        sizes[name] = page_size
    assert sizes == {"new": PAGE_SIZE, "old": 4096}
