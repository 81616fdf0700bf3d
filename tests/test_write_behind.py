"""Write-behind of FX graph / AOTAutograd puts (cachedb/live/_writer.py): the INSERT runs on the
writer thread; the process reads its own puts at once; other processes see them after a flush
or the process's exit; a kill loses only whole queued entries; memory stays bounded."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import event

import cachedb
from cachedb.live._store import LiveStore
from cachedb.live._writer import ENV_WRITE_BEHIND, WriteBehind

from ._realcache import seeded

REPO = Path(__file__).resolve().parents[1]


def _key(i: int) -> str:
    return f"f{i:051d}"


def _entry(i: int, size: int = 20_000) -> bytes:
    return pickle.dumps({"i": i, "blob": os.urandom(16) * (size // 16)})


def _traced_sqlite(store: LiveStore, names: list[str]) -> None:
    """Record the thread of every INSERT the store's SQLite connections run (driver level)."""
    def trace(statement: str) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO GUARDED_ENTRIES"):
            names.append(threading.current_thread().name)

    @event.listens_for(store.db.engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
        dbapi_conn.set_trace_callback(trace)

    store.db.engine.dispose()  # connections opened from now on are traced
    store.db.kept._discard()


def test_put_is_written_by_the_writer_thread_and_read_back_at_once(tmp_path: Path) -> None:
    """The process's first put (it records the fingerprint) is written on the caller's thread,
    every later put's INSERT on the write-behind thread; a lookup of a key just put (still
    queued or being written) finds it, with its bytes, every time."""
    store = LiveStore(str(tmp_path / "c.db"))
    assert store.writer is not None
    names: list[str] = []
    _traced_sqlite(store, names)
    entries = [_entry(i) for i in range(40)]
    for i, data in enumerate(entries):
        store.guarded_put("fxgraph", _key(i), data)
        assert [content for _v, content in store.guarded_candidates("fxgraph", _key(i))] == [data]
    assert store.flush(30)
    assert len(names) == 40, names
    assert names[0] == threading.current_thread().name and set(names[1:]) == {"cachedb-write-behind"}, names
    assert store.writer.counts["written"] == 39
    assert not store._warned
    store.close()


def test_write_behind_off_writes_on_the_callers_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``CACHEDB_WRITE_BEHIND=0``: no writer; the INSERT runs before the put returns, on the
    caller's thread (another connection sees the row at once)."""
    monkeypatch.setenv(ENV_WRITE_BEHIND, "0")
    store = LiveStore(str(tmp_path / "c.db"))
    assert store.writer is None
    names: list[str] = []
    _traced_sqlite(store, names)
    store.guarded_put("fxgraph", _key(1), _entry(1))
    assert names == [threading.current_thread().name]
    with sqlite3.connect(tmp_path / "c.db") as other:
        assert other.execute("SELECT count(*) FROM guarded_entries").fetchone()[0] == 1
    store.close()


def test_other_processes_see_the_puts_after_a_flush(tmp_path: Path) -> None:
    """After ``flush()`` every put is committed: a fresh process reads them all."""
    path = tmp_path / "c.db"
    store = LiveStore(str(path))
    entries = {_key(i): _entry(i) for i in range(25)}
    for key, data in entries.items():
        store.guarded_put("fxgraph", key, data)
    assert store.flush(30)
    code = textwrap.dedent(f"""
        from cachedb.live._store import LiveStore
        s = LiveStore({str(path)!r}, write_behind=False)
        keys = [{", ".join(repr(k) for k in entries)}]
        print(sum(len(list(s.guarded_candidates("fxgraph", k))) for k in keys))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, check=True)
    assert out.stdout.strip() == "25"
    store.close()


def test_a_process_that_exits_writes_its_queue(tmp_path: Path) -> None:
    """A process that puts through ``cachedb.install`` and exits without flushing: cachedb's
    exit hook writes the queue before closing, so the database holds every entry, and the WAL
    is checkpointed into the file."""
    path = tmp_path / "c.db"
    code = textwrap.dedent(f"""
        import os, pickle, cachedb
        from torch._inductor.codecache import FxGraphCache
        store = cachedb.install({str(path)!r})
        for i in range(60):
            FxGraphCache._write_to_local_cache(f"f{{i:051d}}", pickle.dumps((i, os.urandom(200_000))))
        print(store.writer.counts["queued"])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "59", out.stdout  # all but the first went through the queue
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM guarded_entries").fetchone()[0] == 60
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def _put_forever(path: str, ready: str) -> None:
    """Child of the kill test: put entries of 50–300 KB under cachedb.install, forever."""
    from torch._inductor.codecache import FxGraphCache

    store = cachedb.install(path)
    assert store.writer is not None
    i = 0
    while True:
        FxGraphCache._write_to_local_cache(_key(i), pickle.dumps((i, os.urandom(50_000 + (i % 6) * 50_000))))
        if store.writer.counts["written"] >= 5 and not os.path.exists(ready):  # the writer is writing
            Path(ready).touch()
        i += 1


def test_kill_loses_whole_queued_entries_only(tmp_path: Path) -> None:
    """``kill -9`` of a process putting through the write-behind queue: the database passes
    ``PRAGMA integrity_check``, and every stored variant reads back whole (checksum verified)
    and unpickles to its key's number; what was queued is simply absent."""
    path = tmp_path / "c.db"
    stored_before: set[str] = set()
    for round_ in range(3):
        ready = tmp_path / f"ready{round_}"
        # a plain process (a multiprocessing child would write inline)
        code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from tests.test_write_behind import _put_forever; "
                f"_put_forever({str(path)!r}, {str(ready)!r})")
        proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)})
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the child did not start putting"
            time.sleep(0.02)
        time.sleep(0.05 + 0.1 * round_)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        with sqlite3.connect(path) as conn:
            keys = [k for (k,) in conn.execute("SELECT DISTINCT key FROM guarded_entries")]
        store = LiveStore(str(path), write_behind=False)
        assert stored_before <= set(keys), "an entry committed before this kill is gone"
        for key in keys:
            got = list(store.guarded_candidates("fxgraph", key))
            assert got and all(pickle.loads(content)[0] == int(key[1:]) for _v, content in got), key
        assert not store._warned, store._warned
        stored_before = set(keys)
        store.close()
    assert stored_before


def test_queued_bytes_stay_bounded(tmp_path: Path) -> None:
    """With room for 1 MB of queued payloads, puts of 300 KB wait for the writer rather than
    queue past it, and every entry is still written."""
    store = LiveStore(str(tmp_path / "c.db"))
    assert store.writer is not None
    store.writer.max_pending_bytes = 1_000_000
    high = 0
    for i in range(30):
        store.guarded_put("fxgraph", _key(i), _entry(i, 300_000))
        high = max(high, store.writer._bytes)
    assert high <= 1_000_000
    assert store.writer.counts["waited"] > 0
    assert store.flush(60)
    with store.db.read() as repos:
        assert sum(1 for i in range(30) if repos.guarded.candidates("fxgraph", _key(i))) == 30
    store.close()


def test_a_multiprocessing_child_writes_inline(tmp_path: Path) -> None:
    """A fork while the parent's writer is running a write (a 20 MB entry) waits for that write,
    and the child, a multiprocessing child (a compile worker, terminated without exit
    handlers), writes its puts before they return: its rows are there although it ends with
    ``os._exit``; the parent's queue is the parent's to write, once."""
    ctx = multiprocessing.get_context("fork")
    path = str(tmp_path / "c.db")
    parent = LiveStore(path)
    parent.guarded_put("fxgraph", _key(0), _entry(0))  # the first put: written inline
    parent.guarded_put("fxgraph", _key(1), _entry(1, 20_000_000))  # queued: running at the fork
    proc = ctx.Process(target=_child_put_and_exit, args=(path,))
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0
    assert parent.flush(30)
    with sqlite3.connect(path) as conn:
        keys = sorted(k for (k,) in conn.execute("SELECT key FROM guarded_entries"))
    assert keys == [_key(0), _key(1), _key(2), _key(3)]
    parent.close()


def _child_put_and_exit(path: str) -> None:
    store = LiveStore(path)
    store.guarded_put("fxgraph", _key(2), _entry(2))  # its first put
    store.guarded_put("fxgraph", _key(3), _entry(3))  # a later one: inline in a multiprocessing child
    os._exit(0 if store.writer is not None and store.writer.counts["queued"] == 0 else 3)


def test_a_failing_write_is_warned_once_and_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes that fail on the writer thread (another process holds the write lock past the
    store's timeout) warn once and lose only those entries: the puts never raise in the caller,
    and the entries written before stay. (The breaker's pause is 0 here, so that every write
    tries the lock: one warning all the same.)"""
    from cachedb.live import _store_base

    monkeypatch.setattr(_store_base, "LOCKED_RETRY_S", 0.0)
    path = tmp_path / "c.db"
    store = LiveStore(str(path), timeout_s=0.2)
    store.guarded_put("fxgraph", _key(0), _entry(0))
    assert store.flush(30)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with caplog.at_level("WARNING", logger="cachedb.live"):
            for i in range(1, 4):
                store.guarded_put("fxgraph", _key(i), _entry(i))
            assert store.flush(30)
        assert sum("stayed locked past CACHEDB_TIMEOUT" in r.getMessage() for r in caplog.records) == 1, caplog.records
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert [pickle.loads(c)["i"] for _v, c in store.guarded_candidates("fxgraph", _key(0))] == [0]
    assert not list(store.guarded_candidates("fxgraph", _key(1)))
    store.close()


def test_writer_flush_and_close_semantics() -> None:
    """The queue itself: jobs run in order on one thread; ``wait_for`` returns once the key's
    jobs ran; after ``close`` nothing is queued (the caller writes)."""
    writer = WriteBehind()
    ran: list[int] = []
    gate = threading.Event()
    assert writer.submit("a", 1, lambda: (gate.wait(10), ran.append(1)))
    assert writer.submit("b", 1, lambda: ran.append(2))
    assert writer.has_pending("a") and writer.has_pending("b")
    assert not writer.wait_for("b", 0.05)  # behind the gated job
    gate.set()
    assert writer.wait_for("b", 10) and ran == [1, 2]
    assert writer.flush(10) and writer.pending() == 0
    writer.close(10)
    assert not writer.submit("c", 1, lambda: ran.append(3))
    assert ran == [1, 2]


@pytest.mark.slow
def test_compile_twice_in_one_process_hits_its_own_queued_put(tmp_path: Path) -> None:
    """A real ``torch.compile`` under ``cachedb.installed``: the FX graph put goes through the
    queue, and the next compile of the same graph in the same process (after
    ``torch._dynamo.reset()``) is an FX graph cache hit; the result is right."""
    code = textwrap.dedent(f"""
        import torch, cachedb
        from torch._dynamo.utils import counters
        def f(x):
            return (x.sin() * 2 + x.cos()).sum(dim=0)
        x = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
        with cachedb.installed({str(tmp_path / "c.db")!r}) as store:
            a = torch.compile(f)(x)
            torch._dynamo.reset()
            counters.clear()
            b = torch.compile(f)(x)
            # A float32 sum of 64 terms in another order differs in its last bits, and near
            # zero by more than rtol alone allows: compare within float32 tolerance.
            close = lambda u, v: torch.allclose(u, v, rtol=1e-4, atol=1e-4)
            print(counters["inductor"]["fxgraph_cache_hit"], store.writer.counts["queued"] >= 1,
                  close(a, b) and close(a, f(x)))
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCHINDUCTOR_CACHE_DIR": seeded(tmp_path / "inductor"),
           "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}  # with torch's ISA probes: the test is about the queue
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-3:] == ["1", "True", "True"], out.stdout
