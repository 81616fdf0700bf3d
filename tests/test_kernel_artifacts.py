"""Kernel artifacts: Triton's cache and C++ kernel libraries in the database.

Real input throughout: Triton compiles real SM90 cubins on this CPU machine
(``triton.compile(..., target=GPUTarget("cuda", 90, 32))``) in child processes with cachedb's
cache manager; ``torch.compile`` builds real C++ kernel libraries; repositories run on SQLite
and PostgreSQL.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text, update

from cachedb import CacheDB
from cachedb.store.models import KernelBlob

from ._realcache import probe_files, seeded

#: Its module fixtures build real caches: one worker builds each once (xdist --dist loadgroup).
pytestmark = pytest.mark.xdist_group("kernel_artifacts")

ROOT = Path(__file__).resolve().parents[1]
TRITON_CHILD = Path(__file__).resolve().parent / "_triton_child.py"


# -- repository (SQLite and PostgreSQL) ---------------------------------------------------------


def test_put_files_stores_shared_bytes_once(db: CacheDB) -> None:
    cubin = os.urandom(4096)
    with db.transaction() as repos:
        assert repos.artifacts.put_files("triton", "KEYA", [("k.cubin", cubin), ("k.json", b"{}")]) == 2
        assert repos.artifacts.put_files("triton", "KEYB", [("k.cubin", cubin), ("k.json", b"[1]")]) == 2
        assert repos.artifacts.put_files("triton", "KEYA", [("k.cubin", cubin)]) == 0  # already there
    with db.read() as repos:
        assert repos.artifacts.key_files("triton", "KEYA") == {"k.cubin": cubin, "k.json": b"{}"}
        assert repos.artifacts.key_files("triton", "KEYB")["k.json"] == b"[1]"
        assert repos.artifacts.key_files("triton", "NOPE") == {}
        blobs = repos.session.execute(text("SELECT COUNT(*) FROM kernel_blobs")).scalar_one()
        assert blobs == 3  # one cubin, two json
        rows = {r.key: r for r in repos.session.execute(text("SELECT * FROM kernels")).mappings()}
        assert rows["KEYA"]["files"] == 2 and rows["KEYA"]["shared_files"] == 1
        assert rows["KEYA"]["size_bytes"] == 4096 + 2
        totals = repos.artifacts.totals()
        assert totals == [{"kind": "triton", "keys": 2, "files": 4, "blobs": 3,
                           "size_bytes": 2 * 4096 + 5, "stored_bytes": totals[0]["stored_bytes"]}]


def test_a_rewritten_file_is_repointed_and_its_old_blob_dropped(db: CacheDB) -> None:
    with db.transaction() as repos:
        repos.artifacts.put_files("cpp", "cabc", [("cabc.main.so", b"old" * 100)], host_key="h1")
    with db.transaction() as repos:
        assert repos.artifacts.put_files("cpp", "cabc", [("cabc.main.so", b"new" * 100)], host_key="h1") == 1
    with db.read() as repos:
        assert repos.artifacts.get_file("cpp", "cabc", "cabc.main.so", host_key="h1") == b"new" * 100
        assert repos.artifacts.get_file("cpp", "cabc", "cabc.main.so", host_key="h2") is None
        assert repos.session.execute(text("SELECT COUNT(*) FROM kernel_blobs")).scalar_one() == 1


def test_evict_takes_whole_key_directories_lru_and_keeps_shared_blobs(db: CacheDB) -> None:
    shared = os.urandom(20_000)
    with db.transaction() as repos:
        for i, key in enumerate(["OLD", "MID", "NEW"]):
            repos.artifacts.put_files("triton", key, [("a.cubin", shared), ("a.ptx", os.urandom(20_000 + i))])
    old = dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc)
    with db.transaction() as repos:
        from cachedb.store.models import KernelArtifact

        repos.session.execute(update(KernelArtifact).where(KernelArtifact.key == "OLD").values(last_used_at=old))
        repos.session.execute(update(KernelArtifact).where(KernelArtifact.key == "MID")
                              .values(last_used_at=old + dt.timedelta(days=1)))
    with db.transaction() as repos:
        files, freed = repos.artifacts.evict(older_than=old + dt.timedelta(hours=1))
    assert files == 2 and freed > 15_000  # OLD's own .ptx blob; the shared cubin stays
    with db.read() as repos:
        assert repos.artifacts.key_files("triton", "OLD") == {}
        assert repos.artifacts.key_files("triton", "MID")["a.cubin"] == shared
        total = repos.session.execute(text("SELECT SUM(stored_bytes) FROM kernel_blobs")).scalar_one()
    with db.transaction() as repos:
        files, freed = repos.artifacts.evict(max_bytes=total - 1)
    assert files == 2  # MID (least recently used) went whole
    with db.read() as repos:
        assert repos.artifacts.key_files("triton", "MID") == {}
        assert set(repos.artifacts.key_files("triton", "NEW")) == {"a.cubin", "a.ptx"}
        assert repos.session.execute(text("SELECT COUNT(*) FROM kernel_blobs")).scalar_one() == 2


def test_quarantine_blob_removes_every_key_that_uses_it(db: CacheDB) -> None:
    bad = os.urandom(1000)
    with db.transaction() as repos:
        repos.artifacts.put_files("triton", "K1", [("x.cubin", bad), ("x.json", b"1")])
        repos.artifacts.put_files("triton", "K2", [("x.cubin", bad), ("x.json", b"2")])
        repos.artifacts.put_files("triton", "K3", [("x.cubin", b"fine"), ("x.json", b"3")])
    digest = hashlib.sha256(bad).hexdigest()
    with db.transaction() as repos:
        assert repos.artifacts.quarantine_blob(digest, "test") == 4
    with db.read() as repos:
        assert repos.artifacts.key_files("triton", "K1") == {} == repos.artifacts.key_files("triton", "K2")
        assert repos.artifacts.key_files("triton", "K3") == {"x.cubin": b"fine", "x.json": b"3"}
        q = repos.session.execute(text("SELECT kind, key FROM quarantined_entries")).all()
        assert [tuple(r) for r in q] == [("kernel_blob", digest)]


def test_verify_finds_and_quarantines_a_damaged_blob(db: CacheDB) -> None:
    from cachedb.tools.verify import verify

    with db.transaction() as repos:
        repos.artifacts.put_files("triton", "K1", [("x.cubin", b"a" * 5000)])
        repos.artifacts.put_files("triton", "K2", [("y.cubin", b"b" * 5000)])
    with db.transaction() as repos:
        import zstandard

        repos.session.execute(update(KernelBlob).where(KernelBlob.sha256 == hashlib.sha256(b"a" * 5000).hexdigest())
                              .values(payload=zstandard.ZstdCompressor().compress(b"c" * 5000)))
    problems, checked = verify(db)
    assert checked >= 2
    assert [p["what"] for p in problems] == ["kernel_blob"]
    assert "checksum" in problems[0]["problem"]
    with db.read() as repos:
        assert repos.artifacts.key_files("triton", "K1") == {}
        assert repos.artifacts.key_files("triton", "K2") == {"y.cubin": b"b" * 5000}
    problems, _ = verify(db)
    assert [p["what"] for p in problems] == ["quarantined kernel_blob"]


def test_upgrade_from_0002_keeps_data_and_adds_kernel_tables(tmp_path: Path) -> None:
    from cachedb.store import migrate as _migrate

    db = CacheDB(tmp_path / "c.db")
    with db.transaction() as repos:
        repos.best_configs.put("ab/x.best_config", '{"XBLOCK": 64, "num_warps": 4, "num_stages": 1}')
    _migrate.downgrade(db.engine, "0002")
    assert "kernel_blobs" not in db.table_names()
    db.close()
    db = CacheDB(tmp_path / "c.db")
    assert {"kernel_blobs", "kernel_artifacts"} <= set(db.table_names())
    with db.read() as repos:
        assert repos.best_configs.get("ab/x.best_config") is not None
    db.close()


# -- Triton's cache through TRITON_CACHE_MANAGER (real SM90 compiles) ---------------------------

triton_needed = pytest.mark.skipif(
    __import__("importlib").util.find_spec("triton") is None, reason="triton is not installed"
)


def _triton(cache_dir: Path, n: int, db: Path | str | None, extra_env: dict[str, str] | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CACHEDB_", "TRITON_"))}
    env.update(extra_env or {})
    args = [sys.executable, str(TRITON_CHILD), str(cache_dir), str(n)] + ([str(db)] if db is not None else [])
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "stderr": proc.stderr}


@pytest.fixture(scope="module")
def triton_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A DB filled by a cold process compiling 3 kernels with cachedb installed."""
    pytest.importorskip("torch")
    if __import__("importlib").util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    root = tmp_path_factory.mktemp("triton")
    db = root / "kernels.db"
    cold = _triton(root / "cold", 3, db)
    assert cold["hits"] == [False, False, False]
    return db, cold


@triton_needed
def test_triton_kernels_are_served_into_an_empty_cache_dir(triton_db: tuple[Path, dict], tmp_path: Path) -> None:
    db, cold = triton_db
    warm = _triton(tmp_path / "fresh", 3, db)
    assert warm["hits"] == [True, True, True]  # triton.compile found every kernel: nothing compiled
    assert warm["hashes"] == cold["hashes"] and warm["cubin_sha256"] == cold["cubin_sha256"]
    assert warm["dirs"] == cold["dirs"]
    for key in warm["dirs"]:
        d = tmp_path / "fresh" / key
        names = sorted(p.name for p in d.iterdir())
        assert not [n for n in names if n.startswith(".") or n.startswith("tmp")]
        group = json.loads(next(d.glob("__grp__*.json")).read_text())
        assert all(Path(p).parent == d for p in group["child_paths"].values())
        assert set(group["child_paths"]) | {next(d.glob("__grp__*.json")).name} == set(names)
    # Without cachedb the same empty directory layout means compiling again.
    plain = _triton(tmp_path / "plain", 3, None)
    assert plain["hits"] == [False, False, False]


@triton_needed
def test_triton_kernels_are_served_before_inductor_is_imported(triton_db: tuple[Path, dict], tmp_path: Path) -> None:
    """Under ``CACHEDB_ENABLE=1`` a process that imported torch, not Inductor, and compiles
    Triton kernels of its own: Triton's cache manager asks for the store, which activates
    cachedb then and there (the deferred activation) and serves every kernel."""
    from cachedb.live import child_environment

    db, cold = triton_db
    env = child_environment(str(db), base={k: v for k, v in os.environ.items()
                                           if not k.startswith(("CACHEDB_", "TRITON_"))})
    code = (
        "import runpy, sys, torch\n"
        f"sys.argv = [{str(TRITON_CHILD)!r}, {str(tmp_path / 'fresh')!r}, '3']\n"
        f"runpy.run_path({str(TRITON_CHILD)!r}, run_name='__main__')\n"
        "import cachedb\n"
        "print(cachedb.is_installed(), 'torch._inductor.codecache' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result, state = proc.stdout.strip().splitlines()[-2:]
    warm = json.loads(result)
    assert warm["hits"] == [True, True, True]
    assert warm["cubin_sha256"] == cold["cubin_sha256"]
    assert state.split() == ["True", "False"]


@triton_needed
def test_triton_kernel_with_a_damaged_blob_is_compiled_again_and_quarantined(
    triton_db: tuple[Path, dict], tmp_path: Path
) -> None:
    db_path = tmp_path / "copy.db"
    shutil.copy(triton_db[0], db_path)
    db = CacheDB(db_path)
    with db.transaction() as repos:
        (digest,) = repos.session.execute(text(
            "SELECT b.sha256 FROM kernel_blobs b JOIN kernel_artifacts a ON a.blob_id = b.id "
            "WHERE a.name LIKE '%.cubin' ORDER BY a.key LIMIT 1")).one()
        import zstandard

        repos.session.execute(update(KernelBlob).where(KernelBlob.sha256 == digest)
                              .values(payload=zstandard.ZstdCompressor().compress(b"\0" * 100)))
    db.close()
    warm = _triton(tmp_path / "fresh", 3, db_path)
    assert sorted(warm["hits"]) == [False, True, True]
    assert warm["cubin_sha256"] == triton_db[1]["cubin_sha256"]  # the recompiled one is right
    assert "corrupt payload" in warm["stderr"] and warm["stderr"].count("kernel payload check failed") == 1
    db = CacheDB(db_path)
    with db.read() as repos:
        q = repos.session.execute(text("SELECT kind, key FROM quarantined_entries")).all()
        assert [tuple(r) for r in q] == [("kernel_blob", digest)]
        assert repos.artifacts.totals()[0]["keys"] == 3  # stored again by the recompile
    db.close()
    again = _triton(tmp_path / "fresh2", 3, db_path)
    assert again["hits"] == [True, True, True]


@triton_needed
def test_triton_compiles_when_the_database_cannot_be_opened(tmp_path: Path) -> None:
    bad = tmp_path / "not-a-db"
    bad.write_bytes(b"this is not SQLite" * 100)
    run = _triton(tmp_path / "dir", 2, bad)
    assert run["hits"] == [False, False]
    assert run["stderr"].count("cachedb:") == 1 and "opening the database failed" in run["stderr"]
    assert bad.read_bytes() == b"this is not SQLite" * 100


# -- C++ kernel libraries (real torch.compile on CPU) --------------------------------------------

_CPP_CHILD = r"""
import os, sys, json
os.environ["TORCHINDUCTOR_CACHE_DIR"] = sys.argv[1]
import torch
import cachedb
cachedb.install(sys.argv[2])
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU())  # one C++ kernel (the GELU)
x = torch.randn(8, 16)
out = torch.compile(m)(x)
f = torch.compile(lambda t: (t.sin() * 2).cumsum(0))
out2 = f(torch.randn(11))
from torch._dynamo.utils import counters
print(json.dumps({"out": out.detach().tolist(), "counters": dict(counters["inductor"])}))
"""


def _cpp_run(cache_dir: Path, db: Path, log: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CACHEDB_", "TRITON_"))}
    env["CACHEDB_LOG_FILE"] = str(log)
    proc = subprocess.run([sys.executable, "-c", _CPP_CHILD, seeded(cache_dir), str(db)],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _trace(log: Path, marker: str) -> list[str]:
    return [line for line in log.read_text().splitlines() if marker in line] if log.exists() else []


@pytest.mark.slow
def test_cpp_kernel_libraries_are_served_into_an_empty_cache_dir(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    db = tmp_path / "cpu.db"
    cold = _cpp_run(tmp_path / "cold", db, tmp_path / "cold.log")

    def libraries(cache_dir: Path) -> dict[str, bytes]:
        """The kernel libraries in ``cache_dir`` (not torch's ISA probes, seeded there)."""
        probes = probe_files()
        return {p.name: p.read_bytes() for p in cache_dir.rglob("*.so")
                if p.relative_to(cache_dir).as_posix() not in probes}

    cold_libs = libraries(tmp_path / "cold")
    assert cold_libs, "the cold compile built no C++ library"
    assert len(_trace(tmp_path / "cold.log", "cpp kernel write")) >= len(cold_libs)

    warm = _cpp_run(tmp_path / "warm", db, tmp_path / "warm.log")
    assert warm["out"] == cold["out"]
    assert warm["counters"].get("fxgraph_cache_hit", 0) >= 2
    warm_libs = libraries(tmp_path / "warm")
    assert warm_libs == cold_libs  # every library came from the database, byte for byte
    assert _trace(tmp_path / "warm.log", "cpp kernel write") == []  # nothing was built
    assert len(_trace(tmp_path / "warm.log", "cpp kernel file lookup")) == len(cold_libs)
    assert not list((tmp_path / "warm").rglob("*.o"))

    # Another host (other CPU flags or compiler) never gets these binaries: it builds its own.
    cdb = CacheDB(db)
    with cdb.transaction() as repos:
        repos.session.execute(text("UPDATE kernel_artifacts SET host_key = 'another-host' WHERE kind = 'cpp'"))
    cdb.close()
    other = _cpp_run(tmp_path / "other", db, tmp_path / "other.log")
    assert other["out"] == cold["out"]
    assert len(_trace(tmp_path / "other.log", "cpp kernel write")) == len(cold_libs)


# -- import / export ----------------------------------------------------------------------------


@triton_needed
@pytest.mark.slow
def test_import_export_round_trip_includes_triton_and_cpp(real_cache: tuple[Path, dict], tmp_path: Path) -> None:
    from cachedb.layout.exporter import export_cache_dir
    from cachedb.fingerprint import cpp_host_key
    from cachedb.layout.importer import Importer
    from cachedb.tools.verify import verify

    src = tmp_path / "inductor"
    shutil.copytree(real_cache[0], src)
    _triton(src / "triton" / "0", 2, None)  # Triton's own FileCacheManager, as Inductor runs it
    originals = {p.relative_to(src).as_posix(): p.read_bytes()
                 for p in src.rglob("*") if p.is_file() and (p.suffix == ".so" or "triton" in p.parts)}
    assert any(k.endswith(".cubin") for k in originals) and any(k.endswith(".so") for k in originals)

    db = CacheDB(tmp_path / "c.db")
    report = Importer(db, host_key=cpp_host_key()).run(src)
    assert report.problems == []
    assert report.added["triton_kernel_file"] == sum(1 for k in originals if k.startswith("triton/"))
    assert report.added["cpp_kernel"] == sum(1 for k in originals if k.endswith(".so"))
    again = Importer(db, host_key=cpp_host_key()).run(src)
    assert again.added["triton_kernel_file"] == 0 and again.added["cpp_kernel"] == 0

    src.rename(tmp_path / "moved")
    export_cache_dir(db, src, prefer_host=cpp_host_key())
    exported = {p.relative_to(src).as_posix(): p.read_bytes()
                for p in src.rglob("*") if p.is_file() and (p.suffix == ".so" or "triton" in p.parts)}
    assert exported == originals  # byte-identical, group files included

    elsewhere = tmp_path / "elsewhere"
    export_cache_dir(db, elsewhere)
    for grp in elsewhere.glob("triton/0/*/__grp__*.json"):
        paths = json.loads(grp.read_text())["child_paths"].values()
        assert all(Path(p).parent == grp.parent and Path(p).is_file() for p in paths)

    problems, _ = verify(db)
    assert problems == []
    from cachedb.tools.stats import collect

    with db.read() as repos:
        kinds = {r["kind"]: r for r in collect(repos.session)}
    assert kinds["triton_kernel"]["entries"] == 2
    assert kinds["cpp_kernel"]["stored_bytes"] < kinds["cpp_kernel"]["bytes"]
    db.close()
