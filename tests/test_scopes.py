"""torch's own cache isolation under cachedb: ``fresh_cache()`` blocks, ``clear()``,
``temporary_cache_dir()`` and ``standalone_compile``'s artifacts behave as with torch alone.

One program (tests/_scopes_child.py) runs every case and prints its counters; it runs with
torch alone and under cachedb (real compiles, CPU), and both must report the same. Then what
cachedb stored is checked: a fresh block's entries in its own directory, never in the
database in use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from cachedb import CacheDB

from ._realcache import seeded

#: Its module fixtures build real caches: one worker builds each once (xdist --dist loadgroup).
pytestmark = pytest.mark.xdist_group("scopes")

torch = pytest.importorskip("torch")

CHILD = Path(__file__).with_name("_scopes_child.py")


def _start(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], Path]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_")}
    env["TORCHINDUCTOR_CACHE_DIR"] = seeded(tmp_path / f"ind-{mode}")
    # The fresh and kept directories its children start in would each build torch's ISA probes
    # again (~6 s a child); what these cases count is FX graph hits, so both runs skip them.
    env["TORCHINDUCTOR_VEC_ISA_OK"] = "1"
    env["TMPDIR"] = str(tmp_path / f"tmp-{mode}")
    os.makedirs(env["TMPDIR"])
    out = tmp_path / f"{mode}.json"
    args = [sys.executable, str(CHILD), str(out)] + ([str(tmp_path / "cache.db")] if mode == "cachedb" else [])
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), out


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, Path]:
    """The child's report with torch alone and under cachedb (run side by side), and the
    cachedb run's directory."""
    tmp_path = tmp_path_factory.mktemp("scopes")
    runs = {mode: _start(tmp_path, mode) for mode in ("torch", "cachedb")}
    found = {}
    for mode, (proc, out) in runs.items():
        log, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, f"{mode}:\n{log[-4000:]}"
        found[mode] = json.loads(out.read_text())
    return found["torch"], found["cachedb"], tmp_path


@pytest.mark.slow
def test_every_case_counts_as_with_torch_alone(reports: tuple[dict, dict, Path]) -> None:
    alone, under, _ = reports
    assert under == alone
    # and torch alone does what these cases say (hits, misses)
    assert alone["h outside"] == [0, 1] and alone["fresh: first"] == [0, 1] and alone["fresh: again"] == [1, 0]
    assert alone["fresh: child"] == [0, 1] and alone["fresh: second child"] == [1, 0]
    assert alone["fresh: child elsewhere"] == [0, 1] and alone["fresh: child elsewhere again"] == [1, 0]
    assert alone["after fresh"] == [1, 0]
    assert alone["kept: child there"] == [1, 0]
    assert alone["k: again"] == [1, 0] and alone["k: after clear"] == [0, 1]
    assert {"aotautograd", "fxgraph"} <= set(alone["standalone unpacked"][0])  # and its kernels' dirs
    assert alone["standalone binary"][1:] == [True, 1] and alone["standalone unpacked"][1:] == [True, 1]


@pytest.mark.slow
def test_fresh_blocks_store_in_their_own_directory(reports: tuple[dict, dict, Path]) -> None:
    """The database in use holds what was compiled outside the blocks since the clear (``k``'s
    FX graph and AOTAutograd entries: ``f``'s went with the clear) and nothing of theirs; a kept block's directory holds its own database;
    nothing was written into the cache dir as files."""
    _, _, tmp_path = reports
    db = CacheDB(tmp_path / "cache.db")
    with db.read() as repos:
        rows = dict(repos.session.execute(text("SELECT kind, count(*) FROM guarded_entries GROUP BY kind")).all())
    db.close()
    assert rows == {"fxgraph": 1, "aotautograd": 1}
    assert not (tmp_path / "ind-cachedb" / "fxgraph").exists()
    kept = [p for p in (tmp_path / "tmp-cachedb").rglob(".cachedb-fresh-cache")]
    assert len(kept) == 1, kept  # the delete=False block's; the others went with their directories
    kept_db = CacheDB(kept[0].parent / "cachedb.db")
    with kept_db.read() as repos:
        kept_rows = repos.session.execute(text("SELECT count(*) FROM guarded_entries WHERE kind = 'fxgraph'")).scalar()
    kept_db.close()
    assert kept_rows == 1


def test_clear_removes_the_kind_from_the_database_that_serves(tmp_path: Path) -> None:
    """``FxGraphCache.clear()`` and ``AOTAutogradCache.clear()`` remove every entry of their
    kind from the database in use (one log line says so), and nothing of the other kind."""
    code = f"""
import logging, sys, cachedb
logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
store = cachedb.install({str(tmp_path / 'c.db')!r})
import pickle
store.guarded_put("fxgraph", "fkey", pickle.dumps({{"graph": 1}}))
store.guarded_put("aotautograd", "akey", pickle.dumps({{"graph": 2}}))
store.flush()
from torch._inductor.codecache import FxGraphCache
from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache
FxGraphCache.clear()
print([v for v, _ in store.guarded_candidates("fxgraph", "fkey")], [v for v, _ in store.guarded_candidates("aotautograd", "akey")] != [])
AOTAutogradCache.clear()
print([v for v, _ in store.guarded_candidates("aotautograd", "akey")])
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_")}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "ind")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["[] True", "[]"]
    lines = [line for line in proc.stderr.splitlines() if "cleared" in line]
    assert lines == [f"cachedb.live INFO cachedb: cleared 1 fxgraph entry from {tmp_path / 'c.db'}",
                     f"cachedb.live INFO cachedb: cleared 1 aotautograd entry from {tmp_path / 'c.db'}"]
