"""torch.compile served by cachedb: real compiles, fresh processes, concurrent writers, faults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text

from cachedb import CacheDB

from ._realcache import MACHINES
from ._realcache import seeded

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
BUILDER = ROOT / "examples" / "build_cache.py"


@pytest.fixture(scope="module")
def warm_db(live_cache: tuple[Path, dict, dict]) -> tuple[Path, dict, dict]:
    """The session's :func:`~tests.conftest.live_cache`: (db path, cold summary, warm summary)."""
    return live_cache


@pytest.mark.slow
def test_compile_writes_only_to_the_db(warm_db: tuple[Path, dict, dict]) -> None:
    db_path, cold, _ = warm_db
    c = cold["counters"]
    assert c["fxgraph_cache_miss"] == 5 and c["autograd_cache_miss"] == 4
    assert c.get("select_algorithm_autotune", 0) == 1
    db = CacheDB(db_path)
    with db.read() as repos:
        kinds = dict(repos.session.execute(text("SELECT kind, count(*) FROM guarded_entries GROUP BY kind")).all())
        timings = repos.session.execute(text("SELECT count(*) FROM autotune_timings")).scalar()
        configs = repos.session.execute(text("SELECT key FROM best_configs")).scalars().all()
        fingerprints = repos.session.execute(
            text("SELECT torch_version, torch_key, cpu_model FROM system_fingerprints")
        ).all()
        # The dynamic-shape key gained a second guarded variant on the guard miss.
        variants = repos.session.execute(
            text("SELECT kind, count(*) FROM guarded_entries GROUP BY kind, key HAVING count(*) = 2")
        ).all()
        # every choice the GEMM was tuned between is named, with its backend
        choices = repos.session.execute(text("SELECT choice_name, backend FROM autotune_history")).all()
    db.close()
    assert choices and all(name and backend for name, backend in choices), choices
    assert {backend for _, backend in choices} == {"CPP", "extern"}
    assert kinds == {"fxgraph": 5, "aotautograd": 4}
    assert timings >= 2
    assert configs == [cold["workloads"]["best_config"]["best_config"]]
    assert len(fingerprints) == 1 and fingerprints[0][0] == torch.__version__ and fingerprints[0][1]
    assert sorted(k for k, _ in variants) == ["aotautograd", "fxgraph"]


@pytest.mark.slow
def test_fresh_process_on_a_new_cache_dir_is_served_from_the_db(warm_db: tuple[Path, dict, dict]) -> None:
    _, _, warm = warm_db
    c = warm["counters"]
    assert c["fxgraph_cache_hit"] == 5 and c.get("fxgraph_cache_miss", 0) == 0
    assert c["autograd_cache_hit"] == 4 and c.get("autograd_cache_miss", 0) == 0
    assert c.get("autograd_cache_guard_miss", 0) == 0
    assert "select_algorithm_autotune" not in c, "autotuning must be served from the DB"
    assert not any(k.startswith("benchmarking.") for k in c)
    best = warm["workloads"]["best_config"]
    assert best["read_before_save"] == {"kwargs": {"XBLOCK": 512}, "num_warps": 2}


@pytest.mark.slow
def test_compiling_processes_load_no_orm(warm_db: tuple[Path, dict, dict]) -> None:
    """The live path runs Core statements on Core tables (:mod:`cachedb.store.tables`): neither the
    cold run (which writes the fingerprint, FX graph and AOTAutograd entries, timings, best
    configs and kernel libraries) nor the warm one (hits, hit counts written at exit) imports
    ``sqlalchemy.orm`` or the ORM models, which cost a compiling process ~0.1 s (2-core VM).
    Both did import cachedb and SQLAlchemy's Core: the check sees the runs' imports."""
    _, cold, warm = warm_db
    for run in (cold, warm):
        assert {"cachedb.live._store", "cachedb.store.tables", "sqlalchemy.engine"} <= set(run["imported"])
        assert [m for m in run["imported"] if m.startswith("sqlalchemy.orm") or m == "cachedb.store.models"] == []


def _precompiled_headers(machine_tmp: Path) -> tuple[list[str], list[str]]:
    """Suffixes of the files in ``machine_tmp``'s ``torchinductor_*/precompiled_headers``:
    (torch's own, ``<hash>.h*``; cachedb's aliases, ``cachedb-<hash>.h*``)."""
    files = sorted(machine_tmp.glob("torchinductor_*/precompiled_headers/*.h*"))
    return (sorted(p.suffix for p in files if not p.name.startswith("cachedb-")),
            sorted(p.suffix for p in files if p.name.startswith("cachedb-")))


def _alias_points_to_torchs_header(machine_tmp: Path) -> bool:
    """The alias's ``.gch`` is a link to the ``.gch`` torch built (the one a compile uses)."""
    (alias,) = machine_tmp.glob("torchinductor_*/precompiled_headers/cachedb-*.h.gch")
    (real,) = [p for p in alias.parent.glob("*.h.gch") if not p.name.startswith("cachedb-")]
    return alias.is_symlink() and alias.resolve() == real.resolve()


@pytest.mark.slow
def test_fresh_machine_builds_no_precompiled_header(warm_db: tuple[Path, dict, dict]) -> None:
    """Inductor preprocesses ``cpp_prefix.h`` (to hash it) and precompiles it (a ~150 MB
    ``.gch`` outside the cache directory, seconds of g++) before it looks for a CPU kernel
    library. The cold run compiled libraries, so torch's ``_precompile_header`` ran and built
    its header, and cachedb's alias links to it; the warm run on a fresh machine got every
    library from the database: torch's ``_precompile_header`` never ran (no ``<hash>.h``) and
    only the alias's plain text is there. Both runs' workloads gave the right results
    (``tests._realcache.cachedb_run`` checks the exit status)."""
    root = warm_db[0].parent
    assert _precompiled_headers(root / MACHINES[0]) == ([".gch", ".h"], [".gch", ".h"])
    assert _alias_points_to_torchs_header(root / MACHINES[0])
    assert _precompiled_headers(root / MACHINES[1]) == ([], [".h"])


@pytest.mark.slow
def test_precompiled_header_with_a_compile_thread_pool(warm_db: tuple[Path, dict, dict]) -> None:
    """The session's runs, whose headers the test above checks, use two compile threads: C++
    libraries built in Inductor's thread pool, each waiting for the header the first one
    builds; the warm run on a fresh machine hit every FX graph."""
    _, cold, warm = warm_db
    assert cold["compile_threads"] == warm["compile_threads"] == 2
    assert cold["counters"]["fxgraph_cache_miss"] == 5 and warm["counters"]["fxgraph_cache_hit"] == 5


def _run_python(code: str, env_extra: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=timeout)


_TIMINGS_WORKER = """
    import sys, cachedb, torch
    from torch._inductor.codecache import PersistentCache
    db, worker, n_ops = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cachedb.install(db)

    class Choice:  # what PersistentCache.lookup needs of a ChoiceCaller
        def __init__(self, name): self.name = name
        def hash_key(self): return self.name

    choices = [Choice("aten"), Choice("cpp")]
    for i in range(n_ops):
        op = f"mm_w{worker}_{i}"
        got = PersistentCache().lookup(choices, op, "[('cpu', 'torch.float32', 8, 8, 8, 1, 0)]",
                                       lambda cs: {c: worker + i / 1000 + (c.name == 'cpp') for c in cs})
        assert len(got) == 2
"""


@pytest.mark.slow
def test_concurrent_processes_never_lose_timings(tmp_path: Path) -> None:
    db = tmp_path / "timings.db"
    CacheDB(db).close()
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(_TIMINGS_WORKER))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_")}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")
    workers, n_ops = 4, 15
    procs = [
        subprocess.Popen([sys.executable, str(script), str(db), str(w), str(n_ops)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for w in range(workers)
    ]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
    assert not (tmp_path / "inductor" / "cache").exists()
    database = CacheDB(db)
    with database.read() as repos:
        rows = repos.session.execute(text("SELECT op, choice_hash, timing_ms FROM autotune_timings")).all()
    database.close()
    assert len(rows) == workers * n_ops * 2
    expected = {
        (f"mm_w{w}_{i}", c, w + i / 1000 + (c == "cpp")) for w in range(workers) for i in range(n_ops) for c in ("aten", "cpp")
    }
    assert set(map(tuple, rows)) == expected


def test_rebenchmark_adds_history_and_lookup_sees_the_latest(tmp_path: Path) -> None:
    db = tmp_path / "h.db"
    result = _run_python(
        f"""
        import cachedb
        from torch._inductor.codecache import PersistentCache
        cachedb.install({str(db)!r})
        class C:
            def __init__(s, n): s.n = n
            def hash_key(s): return s.n
        inputs = "[('cpu', 'torch.float32', 4, 4, 4, 1, 0)]"
        first = PersistentCache().lookup([C("a"), C("b")], "mm", inputs, lambda cs: {{c: 1.0 for c in cs}})
        # A new choice misses, so Inductor re-benchmarks every choice and writes them all.
        second = PersistentCache().lookup([C("a"), C("b"), C("c")], "mm", inputs,
                                          lambda cs: {{c: 0.5 for c in cs}})
        served = PersistentCache().lookup([C("a"), C("b"), C("c")], "mm", inputs, None)
        print({{c.n: t for c, t in served.items()}})
        """,
        {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind")},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "{'a': 0.5, 'b': 0.5, 'c': 0.5}"
    database = CacheDB(db)
    with database.read() as repos:
        history = repos.session.execute(
            text("SELECT choice_hash, count(*) FROM autotune_history GROUP BY choice_hash ORDER BY choice_hash")
        ).all()
    database.close()
    assert [tuple(r) for r in history] == [("a", 2), ("b", 2), ("c", 1)]


def test_local_cache_answers_as_torchs_files_do(tmp_path: Path) -> None:
    """``LocalCache`` (pad_mm's and the scheduler's cache) under cachedb gives the answers
    torch's own file gives, its multi-key ``lookup`` included (which tests each key against the
    top level: torch's own behaviour, kept), and the values live in the database."""
    code = """
        import sys, cachedb
        from torch._inductor.codecache import LocalCache
        if sys.argv[1] == "cachedb":
            cachedb.install(sys.argv[2])
        LocalCache().set_value("pad_mm", "shape_key", value=True)
        LocalCache().set_value("pad_mm", "other", value=[1, 2])
        print(LocalCache().lookup("pad_mm", "shape_key"), LocalCache().lookup("pad_mm", "other"),
              LocalCache().lookup("pad_mm", "missing"), LocalCache().lookup("pad_mm"),
              LocalCache().lookup("shape_key"), LocalCache().lookup("absent"))
        """
    answers = {}
    for mode in ("files", "cachedb"):
        script = tmp_path / "lc.py"
        script.write_text(textwrap.dedent(code))
        env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_")}
        env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / f"ind-{mode}")
        result = subprocess.run([sys.executable, str(script), mode, str(tmp_path / "lc.db")],
                                capture_output=True, text=True, env=env, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        answers[mode] = result.stdout.strip().splitlines()[-1]
    assert answers["cachedb"] == answers["files"] == "None None None {'shape_key': True, 'other': [1, 2]} None None"
    assert not (tmp_path / "ind-cachedb" / "cache").exists()  # stored in the database, not the file
    db = CacheDB(tmp_path / "lc.db")
    with db.read() as repos:
        stored = repos.session.execute(text("SELECT count(*) FROM local_cache_values")).scalar()
    db.close()
    assert stored == 2


_COMPILE = """
    import logging, sys, cachedb, torch
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
    from torch._dynamo.utils import counters
    cachedb.install(sys.argv[1], timeout_s=float(sys.argv[2]))
    def f(x):
        return torch.sin(x) * 2 + 1
    for n in (4, 5):
        torch._dynamo.reset()
        out = torch.compile(f)(torch.ones(n))
        assert torch.allclose(out, torch.sin(torch.ones(n)) * 2 + 1)
    print(dict(counters["inductor"]))
"""


def _compile_with(db: str, tmp_path: Path, timeout_s: float = 1.0) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "compile.py"
    script.write_text(textwrap.dedent(_COMPILE))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_")}
    env["TORCHINDUCTOR_CACHE_DIR"] = seeded(tmp_path / "ind")
    return subprocess.run([sys.executable, str(script), db, str(timeout_s)], capture_output=True, text=True,
                          env=env, timeout=600)


@pytest.mark.slow
def test_unopenable_db_warns_once_and_compiles(tmp_path: Path) -> None:
    notes = tmp_path / "notes.db"
    notes.write_bytes(b"not a database at all" * 10)
    result = _compile_with(str(notes), tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [l for l in result.stderr.splitlines() if l.startswith("cachedb.live WARNING")]
    assert len(warnings) == 1 and "not an SQLite database" in warnings[0]
    assert notes.read_bytes() == b"not a database at all" * 10
    assert "fxgraph_cache_miss" in result.stdout


@pytest.mark.slow
def test_locked_db_past_timeout_is_a_miss(tmp_path: Path) -> None:
    db = tmp_path / "locked.db"
    CacheDB(db).close()
    import sqlite3

    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        result = _compile_with(str(db), tmp_path, timeout_s=0.2)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert result.returncode == 0, result.stderr[-3000:]
    warned = [l for l in result.stderr.splitlines() if l.startswith("cachedb.live WARNING")]
    assert warned and all("locked" in l for l in warned)
    assert len(warned) == len(set(l.split(" failed")[0] for l in warned)), "one warning per kind"


@pytest.mark.slow
def test_corrupt_payload_is_a_miss(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    first = _compile_with(str(db), tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    database = CacheDB(db)
    with database.engine.begin() as conn:
        n = conn.execute(text("UPDATE guarded_entries SET checksum = 'bad'")).rowcount
    database.close()
    assert n > 0
    second = _compile_with(str(db), tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "fxgraph_cache_hit" not in second.stdout
    assert any("payload check failed" in l and "checksum" in l for l in second.stderr.splitlines())


def test_missing_seam_refuses_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import cachedb
    from torch._inductor import codecache
    # defined in remote_cache.py from torch 2.13 on, in runtime/autotune_cache.py before; the
    # latter has the name on every release
    from torch._inductor.runtime.autotune_cache import LocalAutotuneCache

    before = (vars(codecache.FxGraphCache)["_write_to_local_cache"], LocalAutotuneCache.backend_override_cls)
    # Another torch version without this seam: install must refuse and patch nothing.
    monkeypatch.delattr(codecache.CacheBase, "update_local_cache")
    with pytest.raises(cachedb.live.SeamMissingError, match="CacheBase"):
        cachedb.install(tmp_path / "x.db")
    assert not cachedb.is_installed()
    assert (vars(codecache.FxGraphCache)["_write_to_local_cache"], LocalAutotuneCache.backend_override_cls) == before


def test_installed_restores_seams_and_environment(tmp_path: Path) -> None:
    import cachedb
    from torch._inductor import codecache

    before = codecache.FxGraphCache.iterate_over_candidates.__func__  # inherited from GuardedCache
    env_before = {k: os.environ.get(k) for k in ("CACHEDB_ENABLE", "PYTHONPATH", "CACHEDB_PATH")}
    with cachedb.installed(tmp_path / "ctx.db"):
        assert cachedb.is_installed()
        assert codecache.FxGraphCache.iterate_over_candidates.__func__ is not before
        assert os.environ["CACHEDB_ENABLE"] == "1"
        assert os.environ["CACHEDB_PATH"] == str(tmp_path / "ctx.db")
        assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == cachedb.live.BOOTSTRAP_DIR
    assert not cachedb.is_installed()
    assert codecache.FxGraphCache.iterate_over_candidates.__func__ is before
    assert "iterate_over_candidates" not in vars(codecache.FxGraphCache)
    assert {k: os.environ.get(k) for k in env_before} == env_before


def _env_child(tmp_path: Path, code: str, db: str = "env.db", *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``python -c code`` under the environment ``cachedb run`` gives its program."""
    from cachedb.live import child_environment

    env = child_environment(str(tmp_path / db), base={k: v for k, v in os.environ.items()
                                                       if not k.startswith("CACHEDB_")})
    env["TORCHINDUCTOR_CACHE_DIR"] = seeded(tmp_path / "ind")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, check=check, timeout=300)


def test_environment_variable_activates_child_processes(tmp_path: Path) -> None:
    """What compile workers get: CACHEDB_ENABLE=1 and the bootstrap on PYTHONPATH. cachedb
    is activated when torch imports its first cache module, not at ``import torch`` nor at
    ``import torch._dynamo``."""
    from cachedb.live import child_environment

    out = _env_child(tmp_path, """
        import sys, torch
        print(sorted(m for m in ("cachedb", "sqlalchemy", "torch._inductor") if m in sys.modules))
        import torch._dynamo  # imports torch._inductor.cpp_builder, patched at the activation
        print(sorted(m for m in ("cachedb", "sqlalchemy") if m in sys.modules))
        import torch._inductor.codecache  # the FX graph cache's module: activates cachedb
        import cachedb
        s = cachedb.live.active_store()
        print(cachedb.is_installed(), s and s.location)
        from torch._inductor.codecache import FxGraphCache
        print("_write_to_local_cache" in vars(FxGraphCache), FxGraphCache._write_to_local_cache.__module__)
    """)
    lines = out.stdout.splitlines()
    # a process that imports torch and never compiles (a spawn DataLoader worker) pays nothing
    assert lines[0] == "[]"
    assert lines[1] == "[]", "importing Dynamo alone does not activate cachedb"
    assert lines[2].split() == ["True", str(tmp_path / "env.db")]
    assert lines[3].split() == ["True", "cachedb.live._seams"]
    assert out.stderr == ""
    out = _env_child(tmp_path, "import sys, cachedb; print('torch' in sys.modules, cachedb.is_installed())")
    assert out.stdout.split() == ["False", "False"], "nothing is imported until the process imports torch"
    # Python processes a compile starts that never import torch (Inductor's CPU ISA probe)
    # do not pay for importing cachedb and SQLAlchemy either
    out = _env_child(tmp_path, "import sys; print(sorted(m for m in ('cachedb', 'sqlalchemy', 'torch') if m in sys.modules))")
    assert out.stdout.strip() == "[]" and out.stderr == ""
    with_remote = child_environment(str(tmp_path / "env.db"), base={}, remote="postgresql+psycopg://h/db")
    assert with_remote["CACHEDB_REMOTE_URL"] == "postgresql+psycopg://h/db"


def test_activation_runs_no_garbage_collection_and_restores_the_setting(tmp_path: Path) -> None:
    """The activation (importing cachedb and SQLAlchemy, opening the database, patching) runs
    with Python's automatic garbage collection off: in a process holding torch, a collection it
    started would walk torch's objects too. Afterwards the setting is the program's again: on
    where it was on, off where the program had turned it off."""
    code = """
        import gc, sys, torch
        %s
        watch = next(f for f in sys.meta_path if getattr(f, "cachedb_seam_watch", False))
        loaded, during, activations = watch._loaded, [], []
        def timed(name):
            activations.append(name)
            during.append(0)
            try:
                loaded(name)
            finally:
                during.append(1)
        watch._loaded = timed
        collections = []
        gc.callbacks.append(lambda phase, info: phase == "start" and collections.append(len(during)))
        allocated = [[i] for i in range(100_000)]  # collections do run outside the activation
        import torch._dynamo
        import torch._inductor.codecache
        import cachedb
        print(cachedb.is_installed(), activations, gc.isenabled())
        print(sum(1 for n in collections if n %% 2 == 1), sum(1 for n in collections if n %% 2 == 0) > 0)
    """
    out = _env_child(tmp_path, code % "")
    installed, collected = out.stdout.splitlines()
    # codecache imports LocalAutotuneCache's module, which completes first and activates;
    # torch._dynamo's C++ builder is patched then, with no callback of its own
    first = "['torch._inductor.runtime.autotune_cache', 'torch._inductor.codecache']"
    assert installed == f"True {first} True", out.stdout + out.stderr
    assert collected == "0 True", "collections during the activation (odd marks) / outside it"
    out = _env_child(tmp_path, code % "gc.disable()")
    assert out.stdout.splitlines() == [f"True {first} False", "0 False"], out.stdout + out.stderr


def test_importing_dynamo_alone_does_not_activate_and_a_compile_after_it_builds_through_cachedb(
    tmp_path: Path,
) -> None:
    """``torch._dynamo`` imports the C++ builder, a seam module, half-way through its own
    import; a process may import Dynamo (some libraries built on torch import it at their
    own import) and never compile. Under cachedb's environment such a process imports neither
    cachedb nor SQLAlchemy. When the same process then compiles, importing Inductor's cache
    module activates cachedb and patches the C++ builder imported before it: a real CPU
    compile's kernel library is built through cachedb's seam and stored in the database."""
    out = _env_child(tmp_path, """
        import sys, torch
        import torch._dynamo
        from torch._inductor.cpp_builder import CppBuilder
        print(sorted(m for m in ("cachedb", "sqlalchemy", "torch._inductor.codecache") if m in sys.modules),
              hasattr(CppBuilder.build, "__wrapped__"))
        f = torch.compile(lambda x: (x.sin() + 1).sum())
        print(round(float(f(torch.zeros(16))), 3))
        import cachedb
        print(cachedb.is_installed(), hasattr(CppBuilder.build, "__wrapped__"),
              sorted(p.owner.__name__ + "." + p.name for p in cachedb.live._active[1]).count("CppBuilder.build"))
    """)  # the exit hook writes what is queued before the database is read below
    before, result, after = out.stdout.splitlines()[:3]
    assert before == "[] False", out.stdout + out.stderr
    assert result == "16.0"
    assert after == "True True 1", out.stdout + out.stderr
    assert not [line for line in out.stderr.splitlines() if "cachedb" in line], out.stderr
    from cachedb import CacheDB

    with CacheDB(tmp_path / "env.db") as db, db.read() as repos:
        kinds = {t["kind"] for t in repos.artifacts.totals()}
    assert "cpp" in kinds, kinds


def test_bootstrap_imports_nothing_start_up_has_not(tmp_path: Path) -> None:
    """Every Python process started under cachedb runs the bootstrap, Inductor's ISA probes
    (one interpreter per ISA on every compiling process) included: it adds no module to what
    the interpreter imports anyway but ``sitecustomize`` (``logging``, ``threading``, ``typing`` and
    ``importlib.abc`` cost such a process ~20 ms, 2x a bare ``python -c pass``)."""
    code = "import sys; print(' '.join(sorted(sys.modules)))"
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                           env={k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_")})
    under = _env_child(tmp_path, code)
    added = set(under.stdout.split()) - set(plain.stdout.split())
    assert added <= {"sitecustomize"}, added  # the hook itself is loaded by path, not as a module
    assert under.stderr == ""


def test_a_process_on_sqlite_imports_no_postgresql_nor_copy_machinery(tmp_path: Path) -> None:
    """What every compiling process imports: the live store on an SQLite file, through its
    hot-path writes and reads (FX graph put and get, best config put and get), loads neither
    SQLAlchemy's PostgreSQL dialect nor ``cachedb copy``'s machinery (~30 ms of a ~0.4 s
    ``import cachedb``); a PostgreSQL URL still gets its statements (tests/test_hot_path.py).
    The database exists, at head, as on any start but the first (creating one runs Alembic,
    which imports every dialect it supports)."""
    from cachedb import CacheDB

    CacheDB(tmp_path / "env.db").close()
    out = _env_child(tmp_path, """
        import os, sys, pickle, torch
        from torch._inductor.codecache import FxGraphCache
        from torch._inductor.remote_cache import LocalAutotuneCache
        import cachedb
        assert cachedb.is_installed()
        FxGraphCache._write_to_local_cache("fabcdefgh", pickle.dumps({"x": 1}))
        print(len(list(FxGraphCache.iterate_over_candidates(True, None, "fabcdefgh"))))
        cache = LocalAutotuneCache("test")
        path = os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "ab", "k.best_config")
        cache.put(path, {"XBLOCK": 8, "num_warps": 2})
        print(cache.get(path)["XBLOCK"])
        print(sorted(m for m in ("sqlalchemy.dialects.postgresql", "cachedb.fleet.copy", "psycopg") if m in sys.modules))
    """, check=False)
    assert out.stdout.split("\n")[:3] == ["1", "8", "[]"], out.stdout + out.stderr


def test_deferred_activation_patches_every_seam_module_once(tmp_path: Path) -> None:
    """The seams patched as their modules finish importing are the ones ``install()`` patches,
    each once; an explicit ``install()`` after it replaces it (one layer of patches), and
    ``uninstall()`` restores torch's own methods and disarms the watch."""
    out = _env_child(tmp_path, """
        import json, torch
        import torch._inductor.compile_fx  # what a first torch.compile imports: every seam module
        import cachedb
        from cachedb.live import _autoload, _seams
        from torch._inductor.codecache import FxGraphCache
        from torch._inductor.cpp_builder import CppBuilder
        deferred = sorted(p.owner.__name__ + "." + p.name for p in cachedb.live._active[1])
        print(json.dumps(deferred))
        own_build = CppBuilder.build.__wrapped__
        from torch._inductor.codegen.cutlass import cache, gemm_template
        print(gemm_template.maybe_fetch_ops is cache.maybe_fetch_ops,
              cache.maybe_fetch_ops.__module__)
        cachedb.install(%r)
        explicit = sorted(p.owner.__name__ + "." + p.name for p in cachedb.live._active[1]
                          if isinstance(p, _seams._Patch))
        print(json.dumps(explicit))
        print(CppBuilder.build.__wrapped__ is own_build, cachedb.live.active_store().location)
        cachedb.uninstall()
        print(_autoload.find_watch() is None, FxGraphCache._write_to_local_cache.__module__,
              CppBuilder.build is own_build)
    """ % str(tmp_path / "other.db"))
    deferred, cutlass, explicit, layered, after = out.stdout.splitlines()
    deferred_names = json.loads(deferred)
    assert len(deferred_names) == len(set(deferred_names)), "a seam patched twice"
    assert "FxGraphCache._write_to_local_cache" in deferred_names
    assert "AOTAutogradCache.iterate_over_candidates" in deferred_names
    assert "CppBuilder.build" in deferred_names and "LocalAutotuneCache.backend_override_cls" in deferred_names
    # gemm_template imports maybe_fetch_ops after its module was patched, so it has cachedb's;
    # install() finds both imported and patches both names
    assert cutlass.split() == ["True", "cachedb.live._seams"]
    gemm_name = "torch._inductor.codegen.cutlass.gemm_template.maybe_fetch_ops"
    assert [n for n in json.loads(explicit) if n != gemm_name] == deferred_names
    assert layered.split() == ["True", str(tmp_path / "other.db")]
    assert after.split() == ["True", "torch._inductor.codecache", "True"]
    assert out.stderr == ""


def test_spawn_dataloader_workers_do_not_import_cachedb(tmp_path: Path) -> None:
    """A training script's DataLoader workers started with ``spawn`` import torch, not
    Inductor: under ``cachedb run`` they import neither cachedb nor Dynamo."""
    script = tmp_path / "loader.py"
    script.write_text(textwrap.dedent("""
        import os, sys, torch
        from torch.utils.data import DataLoader, TensorDataset

        def init(i):
            # One write(2) per line: the two workers share the pipe, and a write of at most
            # PIPE_BUF bytes is not interleaved with another (print() may write in pieces).
            seen = sorted(m for m in ("cachedb", "sqlalchemy", "torch._dynamo") if m in sys.modules)
            os.write(1, f"worker {i} {seen}\\n".encode())

        if __name__ == "__main__":
            data = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4, num_workers=2,
                              multiprocessing_context="spawn", worker_init_fn=init)
            total = float(sum(b[0].sum() for b in data))
            os.write(1, f"sum {total}\\n".encode())
    """))
    from cachedb.live import child_environment

    env = child_environment(str(tmp_path / "env.db"), base={k: v for k, v in os.environ.items()
                                                             if not k.startswith("CACHEDB_")})
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                         check=True, timeout=300)
    lines = sorted(out.stdout.splitlines())
    assert lines == ["sum 28.0", "worker 0 []", "worker 1 []"], out.stdout + out.stderr


def test_fork_while_another_thread_holds_the_seam_watch_lock(tmp_path: Path) -> None:
    """A process forked while another of its threads holds the watch's lock (a thread
    importing a seam module at that moment): the child, where that thread does not exist,
    still activates cachedb when it imports a seam module, instead of waiting on the lock for
    ever. Real fork, real import of Inductor in the child."""
    out = _env_child(tmp_path, """
        import os, sys, threading, torch
        watch = next(f for f in sys.meta_path if getattr(f, "cachedb_seam_watch", False))
        assert "cachedb" not in sys.modules
        held, done = threading.Event(), threading.Event()
        def hold():
            with watch._lock:
                held.set()
                done.wait(60)
        threading.Thread(target=hold, daemon=True).start()
        held.wait()
        pid = os.fork()
        if pid == 0:
            import signal
            signal.alarm(60)  # a child that waits on the lock dies here (the parent sees -14)
            try:
                import torch._inductor.codecache  # a seam module: activates cachedb here
                import cachedb
                os.write(1, f"child {cachedb.is_installed()} {sorted(watch.executing())}\\n".encode())
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        done.set()
        print("parent", os.waitstatus_to_exitcode(status))
    """, check=False)
    assert out.stdout.split("\n")[:2] == ["child True []", "parent 0"], out.stdout + out.stderr[-3000:]


def test_seam_modules_are_the_modules_install_patches() -> None:
    """The watch's list (stdlib-only, read before cachedb is imported) names every module
    whose attributes ``_seams`` patches, and nothing else."""
    from cachedb.live import _autoload, _autotune, _seams

    assert set(_autoload.SEAM_MODULES) == {
        _seams.CODECACHE, _seams.AOT_CACHE, _seams.AUTOTUNE_CACHE, _seams.CPP_BUILDER,
        _seams.TRITON_HEURISTICS, _seams.PGO, _seams.PACKAGE, _seams.UTILS, _seams.CACHE_DIR_UTILS,
        _seams.COMPILE_FX, _seams.AOT_AUTOGRAD,
        *(m[0] for m in _seams._CUTLASS_MODULES),
    }
    assert _autotune._MODULE == _seams.TRITON_HEURISTICS


def test_deferred_activation_with_a_missing_seam_patches_nothing(tmp_path: Path) -> None:
    """A torch whose codecache lacks a seam (stripped here as its module finishes importing):
    one warning, cachedb inactive, and the seams already patched (the C++ builder, imported
    before codecache) are restored."""
    out = _env_child(tmp_path, """
        import importlib.machinery, sys, torch

        class Strip:
            def find_spec(self, name, path, target=None):
                if name != "torch._inductor.codecache":
                    return None
                spec = importlib.machinery.PathFinder.find_spec(name, path)
                run = spec.loader.exec_module
                def exec_module(module):
                    run(module)
                    del module.CacheBase.update_local_cache
                spec.loader.exec_module = exec_module
                return spec

        sys.meta_path.insert(1, Strip())  # behind cachedb's watch: it runs first
        import torch._inductor.codecache as codecache
        import cachedb
        from torch._inductor.cpp_builder import CppBuilder
        print(cachedb.is_installed(), codecache.FxGraphCache._write_to_local_cache.__module__,
              hasattr(CppBuilder.build, "__wrapped__"))
        f = torch.compile(lambda x: x.cos() * 2)
        print(f(torch.zeros(4)).tolist())
    """)
    assert out.stdout.splitlines()[0].split() == ["False", "torch._inductor.codecache", "False"]
    assert out.stdout.splitlines()[1] == "[2.0, 2.0, 2.0, 2.0]"
    warnings = [l for l in out.stderr.splitlines() if "cachedb" in l]
    assert len(warnings) == 1 and "CacheBase.update_local_cache" in warnings[0], out.stderr


def test_best_config_key_is_relative_to_whichever_cache_dir_wrote_it() -> None:
    from cachedb.live._seams import best_config_key

    # Inductor pickles the absolute path into compiled graphs; a fresh process on another
    # cache dir asks for the old one. Both must find the same row.
    assert best_config_key("/tmp/cold/s5/e22b29.best_config") == "s5/e22b29.best_config"
    assert best_config_key("/home/u/.cache/ind/s5/e22b29.best_config") == "s5/e22b29.best_config"


_PATH_PARTS = st.sampled_from(["", ".", "..", "s5", ".cache", "e22b29.best_config", "a.b", "x\\y"])


@given(st.lists(_PATH_PARTS, min_size=1, max_size=6), st.booleans())
def test_best_config_key_fast_path_agrees_with_normpath(parts: list[str], absolute: bool) -> None:
    """The split on the last two ``/`` gives what ``os.path.normpath`` and the last two parts
    give, for paths with empty, ``.`` and ``..`` parts anywhere."""
    from cachedb.live._seams import best_config_key

    path = ("/" if absolute else "") + "/".join(parts)
    expected = "/".join(os.path.normpath(path).replace(os.sep, "/").split("/")[-2:])
    assert best_config_key(path) == expected
