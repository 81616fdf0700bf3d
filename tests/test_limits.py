"""cachedb never waits past its timeout and never runs SQLite where it is unsafe: a locked
local database trips a breaker (torch's files serve meanwhile), a database behind the code's
revision is not migrated under another process's lock, and a database on a network file
system (a real FUSE mount here) is not opened. Each costs one warning; the compile runs."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from filelock import FileLock

from cachedb import CacheDB
from cachedb.store import migrate
from cachedb.store.filesystems import network_filesystem

from ._realcache import seeded

torch = pytest.importorskip("torch")

#: Compiles a function for two shapes; prints how long the compiles took (s), how long of it
#: was spent in the live store's database work (s: every ``LiveStore.safely`` call, where a
#: lookup or write runs and waits), and the counters.
_COMPILE = """
    import json, logging, sys, time
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
    import cachedb, torch
    from cachedb.live import _store
    from torch._dynamo.utils import counters
    spent = [0.0]
    safely = _store.LiveStore.safely
    def timed(self, what, default, fn):
        start = time.perf_counter()
        try:
            return safely(self, what, default, fn)
        finally:
            spent[0] += time.perf_counter() - start
    _store.LiveStore.safely = timed
    cachedb.install(sys.argv[1], timeout_s=float(sys.argv[2]))
    def f(x):
        return torch.sin(x) * 2 + 1
    start = time.perf_counter()
    for n in (4, 5):
        torch._dynamo.reset()
        out = torch.compile(f)(torch.ones(n))
        assert torch.allclose(out, torch.sin(torch.ones(n)) * 2 + 1)
    print(json.dumps({"seconds": time.perf_counter() - start, "in_cachedb": spent[0],
                      "counters": dict(counters["inductor"])}))
"""


def _compile(db: Path, cache_dir: Path, timeout_s: float) -> tuple[dict, list[str]]:
    """Run :data:`_COMPILE`; its report and the warnings cachedb logged."""
    script = cache_dir.parent / "compile.py"
    script.write_text(textwrap.dedent(_COMPILE))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_")}
    env["TORCHINDUCTOR_CACHE_DIR"] = seeded(cache_dir)
    proc = subprocess.run([sys.executable, str(script), str(db), str(timeout_s)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1]), [l for l in proc.stderr.splitlines() if l.startswith("cachedb")]


@pytest.mark.slow
def test_a_locked_database_costs_one_wait_and_one_warning(tmp_path: Path) -> None:
    """Another process holds the write lock for the whole compile: the first write waits the
    timeout, then torch's files serve (no further wait): cachedb's part of the compiles is
    within the timeout plus 1 s."""
    timeout_s = 2.0
    db = tmp_path / "locked.db"
    CacheDB(db).close()
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        locked, warned = _compile(db, tmp_path / "ind-locked", timeout_s)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert len(warned) == 1 and "stayed locked past CACHEDB_TIMEOUT (2 s)" in warned[0], warned
    assert "torch's own files serve" in warned[0]
    assert timeout_s <= locked["in_cachedb"] <= timeout_s + 1, locked  # one wait, no second
    assert (tmp_path / "ind-locked" / "fxgraph").is_dir()  # what torch wrote meanwhile: its files
    assert locked["counters"].get("fxgraph_cache_miss") == 2


@pytest.mark.slow
def test_a_database_behind_the_code_is_not_migrated_under_anothers_lock(tmp_path: Path) -> None:
    """A database at an older revision whose upgrade lock another process holds: the compile
    waits the timeout at most, warns once, runs on torch's files; the database is left as it
    was, for ``cachedb upgrade``."""
    db_path = tmp_path / "old.db"
    db = CacheDB(db_path)
    migrate.downgrade(db.engine, "0009")
    db.close()
    with FileLock(str(db_path) + ".lock"):
        report, warned = _compile(db_path, tmp_path / "ind", timeout_s=1.0)
    assert len(warned) == 1 and "upgrade lock" in warned[0], warned
    assert (tmp_path / "ind" / "fxgraph").is_dir()
    assert report["counters"].get("fxgraph_cache_miss")
    assert CacheDB(db_path, upgrade=False).stamped_revision == "0009"


def test_local_file_systems_are_not_network_ones(tmp_path: Path) -> None:
    assert network_filesystem(tmp_path) is None
    assert network_filesystem(tmp_path / "not" / "made" / "yet.db") is None
    if os.path.isdir("/dev/shm"):
        assert network_filesystem("/dev/shm") is None


@pytest.fixture
def fuse_mount(tmp_path: Path):
    """A real FUSE file system (bindfs, Debian's package: .ci/test installs it) over a
    directory, unmounted afterwards."""
    bindfs = shutil.which("bindfs")
    if bindfs is None or not os.path.exists("/dev/fuse"):
        pytest.skip("bindfs or /dev/fuse is not available")
    source, mount = tmp_path / "source", tmp_path / "mnt"
    source.mkdir()
    mount.mkdir()
    done = subprocess.run([bindfs, str(source), str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"bindfs cannot mount here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        for cmd in (["fusermount", "-u", str(mount)], ["umount", str(mount)]):
            if shutil.which(cmd[0]) and subprocess.run(cmd, capture_output=True).returncode == 0:
                break


def test_a_fuse_mount_is_told_apart(fuse_mount: Path) -> None:
    found = network_filesystem(fuse_mount / "cache.db")
    assert found is not None and found.startswith("fuse") and str(fuse_mount) in found


@pytest.mark.slow
def test_a_database_on_a_network_file_system_is_not_opened(fuse_mount: Path, tmp_path: Path) -> None:
    report, warned = _compile(fuse_mount / "cache.db", tmp_path / "ind", timeout_s=1.0)
    assert len(warned) == 1 and "network file system" in warned[0] and str(fuse_mount) in warned[0], warned
    assert not (fuse_mount / "cache.db").exists()
    assert (tmp_path / "ind" / "fxgraph").is_dir()  # torch's own files served
    assert report["counters"].get("fxgraph_cache_miss")
