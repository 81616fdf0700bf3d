"""Kernel artifacts under SIGKILL: a child stores key directories and materializes them into
Triton-style cache directories in a loop; it is killed at seeded random moments.

After every kill: ``verify`` finds no problem (no partial blob: a blob row exists only with its
whole frame, and every file row points at one); every file present in a materialized directory
has exactly the stored bytes (no half-written file a compiler could load); the only leftovers of
a killed write are dot-temporaries outside the key directories.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
import time
from pathlib import Path
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event

from cachedb import CacheDB
from cachedb.tools.verify import verify

SEED = 20261123
KILLS = 8
FILES = {f"k.{ext}": 1 for ext in ("source", "ttir", "ttgir", "llir", "ptx", "cubin", "json")}


def _content(key: int, name: str) -> bytes:
    """Deterministic bytes of file ``name`` of key ``key`` (large enough to take a while)."""
    seed = hashlib.sha256(f"{key}/{name}".encode()).digest()
    return seed * (20_000 + key % 7 * 3_000)


def _child(db_path: str, root: str, start: int, go: Event) -> None:
    """Writes key after key from ``start`` once ``go`` is set. First it computes what a
    compiling process holds already (the store's first write records the system fingerprint:
    ``torch_key()`` and ``get_system()``, cached per process), so the parent can start it while
    it checks the last child's leftovers."""
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        from torch._inductor.codecache import CacheBase, torch_key

        torch_key()
        CacheBase.get_system()

    from cachedb.live._artifacts import KernelArtifacts
    from cachedb.live._store import LiveStore

    store = KernelArtifacts(LiveStore(db_path))
    go.wait()
    key = start
    while True:
        files = [(name, _content(key, name)) for name in sorted(FILES)]
        store.put_files("triton", f"K{key:06d}", files)
        store.materialize_key("triton", f"K{key:06d}", os.path.join(root, f"K{key:06d}"), require="k.json")
        key += 1


def test_sigkill_never_leaves_partial_blobs_or_files(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    db_path = tmp_path / "kernels.db"
    CacheDB(db_path).close()
    root = tmp_path / "triton"
    root.mkdir()
    ctx = multiprocessing.get_context("spawn")

    def started(start: int) -> tuple[BaseProcess, Event]:
        go = ctx.Event()
        proc = ctx.Process(target=_child, args=(str(db_path), str(root), start, go), daemon=True)
        proc.start()
        return proc, go

    start = 0
    upcoming = started(start)
    for kill in range(KILLS):
        proc, go = upcoming
        go.set()
        before = len(list(root.iterdir()))
        deadline = time.monotonic() + 120
        while proc.exitcode is None and len(list(root.iterdir())) == before:  # it got going
            assert time.monotonic() < deadline, "child never got going"
            time.sleep(0.01)
        if kill + 1 < KILLS:  # the next one gets ready (imports) while this one runs and is checked
            upcoming = started(start + 1000)
        proc.join(rng.uniform(0.0, 1.5))
        assert proc.exitcode is None, "child stopped by itself"
        proc.kill()
        proc.join(30)
        start += 1000
        db = CacheDB(db_path)
        problems, checked = verify(db)
        assert problems == [] and checked > 0
        with db.read() as repos:
            for key_dir in root.iterdir():
                if key_dir.name.startswith(".cachedb.") and key_dir.is_file():
                    continue  # a killed write's temporary: outside every key directory
                assert key_dir.is_dir() and key_dir.name.startswith("K"), key_dir
                stored = repos.artifacts.key_files("triton", key_dir.name)
                for f in key_dir.iterdir():
                    assert not f.name.startswith("."), f"temporary inside a key directory: {f}"
                    key = int(key_dir.name[1:])
                    assert f.read_bytes() == _content(key, f.name) == stored[f.name]
        db.close()
    leftovers = [p.name for p in root.iterdir() if p.is_file()]
    assert all(n.startswith(".cachedb.") for n in leftovers)
    db = CacheDB(db_path)
    with db.read() as repos:
        assert repos.artifacts.count("triton") >= KILLS * len(FILES)
    db.close()
