"""Dynamo's own caches in the database: PGO profiles and precompiled Dynamo packages, their
repository, import and export, Mega-Cache, copy/merge, the remote tier's point sync,
stats/verify, and real ``torch.compile`` processes served from the database."""

from __future__ import annotations

import datetime as dt
import json
import os
import pickle
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from cachedb import CacheDB
from cachedb.cli import main
from cachedb.fleet import tier_sync as sync
from cachedb.fleet.copy import copy_database, merge_databases
from cachedb.layout.exporter import export_cache_dir
from cachedb.layout.importer import Importer
from cachedb.repositories.dynamo import pgo_key
from cachedb.store.signing import Signer
from cachedb.tools.stats import collect
from cachedb.tools.verify import verify

from ._realcache import seeded

#: Its module fixtures build real caches: one worker builds each once (xdist --dist loadgroup).
pytestmark = pytest.mark.xdist_group("dynamo_caches")

ROOT = Path(__file__).resolve().parents[1]
CHILD = ROOT / "tests" / "_dynamo_child.py"
UTC = dt.timezone.utc
#: Stand-ins for the pickles torch writes (cachedb never loads them).
OLD, NEW = pickle.dumps({"profile": 1}), pickle.dumps({"profile": 2, "dynamic": ["L['x']"]})


def _at(day: int) -> dt.datetime:
    return dt.datetime(2026, 1, day, tzinfo=UTC)


# -- the repository -------------------------------------------------------------------------------


def test_pgo_key_is_the_file_names_key() -> None:
    # code_state_path (torch/_dynamo/pgo.py) makes <>:"/\|?* into _; so does the key, idempotently
    assert pgo_key("job1:None:") == "job1_None_"
    assert pgo_key('a<b>c:d"e/f\\g|h?i*j') == "a_b_c_d_e_f_g_h_i_j"
    assert pgo_key(pgo_key("mast:x:1:0:")) == pgo_key("mast:x:1:0:")


def test_pgo_profiles_newer_wins_and_same_bytes_change_nothing(db: CacheDB) -> None:
    with db.transaction() as repos:
        assert repos.pgo.put("job1_None_", OLD, updated_at=_at(2)) is True
        assert repos.pgo.put("job1_None_", OLD, updated_at=_at(5)) is False  # the same bytes
        assert repos.pgo.put("job1_None_", NEW, updated_at=_at(1)) is False  # older: dropped
        assert repos.pgo.put("job1_None_", NEW, updated_at=_at(2)) is False  # a tie keeps the stored
    with db.read() as repos:
        assert repos.pgo.get("job1_None_") == OLD
    with db.transaction() as repos:
        assert repos.pgo.put("job1_None_", NEW, updated_at=_at(3)) is True
    with db.read() as repos:
        assert repos.pgo.get("job1_None_") == NEW and repos.pgo.get("other") is None
        [(key, data, when)] = list(repos.pgo.iter_all())
        assert (key, data, when) == ("job1_None_", NEW, _at(3))
        assert repos.pgo.count() == 1


def test_pgo_keys_torch_cannot_name_a_file_by_are_refused(db: CacheDB) -> None:
    from cachedb import BadInputError

    for bad in ("", "job1:None:", "a/b", "x" * 513, "a\nb"):
        with pytest.raises(BadInputError), db.transaction() as repos:
            repos.pgo.put(bad, OLD)


def test_a_profile_that_fails_its_checks_is_refused_verified_and_quarantined(tmp_path: Path) -> None:
    from cachedb import CorruptPayloadError

    db = CacheDB(tmp_path / "c.db")
    with db.transaction() as repos:
        repos.pgo.put("job1_None_", NEW)
    with db.engine.begin() as conn:  # one flipped byte in the stored frame
        blob = bytearray(conn.execute(text("SELECT payload FROM pgo_profiles")).scalar_one())
        blob[12] ^= 0xFF
        conn.execute(text("UPDATE pgo_profiles SET payload = :p"), {"p": bytes(blob)})
    with db.read() as repos, pytest.raises(CorruptPayloadError):
        repos.pgo.get("job1_None_")
    problems, checked = verify(db)
    assert checked >= 1
    assert [(p["what"], p["where"]) for p in problems] == [("pgo", "pgo/job1_None_")]
    with db.read() as repos:
        assert repos.pgo.count() == 0
        kinds = repos.session.execute(text("SELECT kind, key FROM quarantined_entries")).all()
    assert kinds == [("pgo", "job1_None_")]
    # listed as quarantined from then on
    problems, _ = verify(db)
    assert [p["what"] for p in problems] == ["quarantined pgo"]
    db.close()


def test_signed_profiles_verify_and_unsigned_ones_are_refused(tmp_path: Path) -> None:
    from cachedb import CorruptPayloadError

    unsigned = CacheDB(tmp_path / "c.db")
    with unsigned.transaction() as repos:
        repos.pgo.put("job1_None_", NEW)
    unsigned.close()
    signed = CacheDB(tmp_path / "c.db", signer=Signer(b"team"))
    with signed.read() as repos, pytest.raises(CorruptPayloadError):
        repos.pgo.get("job1_None_")
    with signed.transaction() as repos:
        repos.pgo.put("job2_None_", NEW)
    with signed.read() as repos:
        assert repos.pgo.get("job2_None_") == NEW
    signed.close()


def test_stats_count_profiles(db: CacheDB) -> None:
    with db.transaction() as repos:
        repos.pgo.put("a_None_", OLD)
        repos.pgo.put("b_None_", NEW)
    with db.read() as repos:
        rows = [r for r in collect(repos.session) if r["kind"] == "pgo_profile"]
    assert [(r["entries"], r["bytes"]) for r in rows] == [(2, len(OLD) + len(NEW))]
    assert rows[0]["stored_bytes"] > 0


def test_evict_goes_by_last_use(db: CacheDB) -> None:
    with db.transaction() as repos:
        repos.pgo.put("old_None_", OLD)
        repos.pgo.put("new_None_", NEW)
        repos.session.execute(text("UPDATE pgo_profiles SET last_used_at = :t WHERE key = 'old_None_'"),
                              {"t": _at(1)})
        n, freed = repos.pgo.evict(older_than=_at(2))
    assert n == 1 and freed > 0
    with db.read() as repos:
        assert repos.pgo.keys() == ["new_None_"]


# -- the cache directory: import, export, Mega-Cache ------------------------------------------------


def test_import_and_export_of_code_state_files(tmp_path: Path) -> None:
    cache = tmp_path / "inductor"
    (cache / "dynamo").mkdir(parents=True)
    profile = cache / "dynamo" / "code_state_job1_None_.pkl"
    profile.write_bytes(NEW)
    (cache / "dynamo" / "code_state_job1_None_.pkl.lock").write_bytes(b"")  # torch's FileLock: not imported
    db = CacheDB(tmp_path / "c.db")
    report = Importer(db).run(cache)
    assert report.added["pgo_profile"] == 1 and report.problems == []
    assert Importer(db).run(cache).unchanged["pgo_profile"] == 1  # idempotent
    # a file older than the stored profile does not replace it; a newer one does
    profile.write_bytes(OLD)
    os.utime(profile, (0, 0))
    assert Importer(db).run(cache).unchanged["pgo_profile"] == 1
    with db.read() as repos:
        assert repos.pgo.get("job1_None_") == NEW
    os.utime(profile, None)
    assert Importer(db).run(cache).added["pgo_profile"] == 1
    out = tmp_path / "exported"
    exported = export_cache_dir(db, out)
    assert exported.written["pgo_profile"] == 1
    assert (out / "dynamo" / "code_state_job1_None_.pkl").read_bytes() == OLD
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "dynamo/code_state_job1_None_.pkl"]
    db.close()


def test_import_and_export_of_precompiled_packages(tmp_path: Path) -> None:
    source_id = "7b34ed35ce067a1d3f5743b069f13d5cc469076a895c4ee98e5eb5b2eb87b619"
    cache = tmp_path / "inductor"
    (cache / "dynamo" / source_id).mkdir(parents=True)
    (cache / "dynamo" / source_id / "entry").write_bytes(NEW)
    (cache / "dynamo" / source_id / ".entry.tmp").write_bytes(b"half")  # write_atomic's temporary
    with CacheDB(tmp_path / "c.db") as db:
        report = Importer(db).run(cache)
        assert report.added == {"dynamo_package": 1} and report.problems == []
        with db.read() as repos:
            assert repos.dynamo("precompile").get(source_id) == NEW
        out = tmp_path / "exported"
        assert export_cache_dir(db, out).written == {"dynamo_package": 1}
    assert (out / "dynamo" / source_id / "entry").read_bytes() == NEW


def test_package_keys_are_one_directory_name(db: CacheDB) -> None:
    from cachedb import BadInputError

    for bad in ("..", "a/b", "", "x" * 129):
        with pytest.raises(BadInputError), db.transaction() as repos:
            repos.dynamo("precompile").put(bad, OLD)


#: A refusal as :mod:`cachedb.live._precompile_fallback` records it, under a package key.
REFUSAL_KEY = "7b34ed35ce067a1d3f5743b069f13d5cc469076a895c4ee98e5eb5b2eb87b619.0123456789abcdef"
REFUSAL = json.dumps({"code": "fedcba9876543210", "error": "PackageError: no name", "function": "m.f"}).encode()


def test_precompile_refusals_go_with_the_database_not_into_torch_s_files(tmp_path: Path, db_url: str) -> None:
    """A refusal is cachedb's own row: counted, verified, merged and copied like a package,
    never exported as one of torch's files."""
    source_id = REFUSAL_KEY.split(".")[0]
    a = CacheDB(tmp_path / "a.db")
    with a.transaction() as repos:
        repos.dynamo("precompile").put(source_id, NEW)
        repos.dynamo("precompile_refusal").put(REFUSAL_KEY, REFUSAL)
    with a.read() as repos:
        assert [r["entries"] for r in collect(repos.session) if r["kind"] == "precompile_refusal"] == [1]
    problems, checked = verify(a)
    assert problems == [] and checked >= 2
    out = tmp_path / "exported"
    assert export_cache_dir(a, out).written == {"dynamo_package": 1}
    assert [p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()] == [f"dynamo/{source_id}/entry"]
    a.close()
    b = CacheDB(db_url)
    report = merge_databases([tmp_path / "a.db"], b)
    assert report.tables["precompile_refusals"].added == 1
    with b.read() as repos:
        assert repos.dynamo("precompile_refusal").get(REFUSAL_KEY) == REFUSAL
    b.close()


def test_code_identity_follows_the_bytecode_not_where_it_lies() -> None:
    from cachedb.live._precompile_fallback import code_identity

    def load(source: str, filename: str) -> object:
        namespace: dict[str, object] = {"__name__": "somelib.models"}
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - the function under test
        return namespace["f"]

    body = "def f(x):\n    def g(y):\n        return y * 2\n    return g(x) + 1\n"
    here, moved = load(body, "/a/site-packages/m.py"), load("\n\n" + body, "/b/venv/m.py")
    inner_changed = load(body.replace("y * 2", "y * 3"), "/a/site-packages/m.py")
    assert code_identity(here) == code_identity(moved) != code_identity(inner_changed)
    assert len(code_identity(here) or "") == 16 and code_identity(42) is None

    class M:
        def forward(self, x: int) -> int:
            return x

    assert code_identity(M().forward) == code_identity(M.forward)


def test_code_identity_is_the_same_in_every_process() -> None:
    """A ``frozenset`` constant's ``repr`` follows string hashing, which differs per process."""
    script = ("from cachedb.live._precompile_fallback import code_identity\n"
              "def f(x):\n    return x in {'alpha', 'beta', 'gamma', 'delta', 'epsilon'}\n"
              "print(repr(f.__code__.co_consts), code_identity(f))\n")
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout.rsplit(" ", 1) for seed in "123"]
    reprs, outs = [r for r, _ in runs], [i.strip() for _, i in runs]
    assert len(set(reprs)) > 1  # the constant's repr differs between these processes
    assert len(set(outs)) == 1 and len(outs[0]) == 16, outs


def test_a_directory_holding_only_a_profile_is_a_cache(tmp_path: Path) -> None:
    cache = tmp_path / "inductor"
    (cache / "dynamo").mkdir(parents=True)
    (cache / "dynamo" / "code_state_j_0_tag.pkl").write_bytes(OLD)
    with CacheDB(tmp_path / "c.db") as db:
        assert Importer(db).run(cache).added == {"pgo_profile": 1}


@pytest.mark.torch
def test_mega_cache_pgo_artifacts_round_trip_through_torch(tmp_path: Path) -> None:
    """A blob with a ``pgo`` artifact (keyed by torch's cache key) is stored under the file
    name's key; the blob cachedb builds loads into torch, which writes the same file name."""
    pytest.importorskip("torch")
    from cachedb.layout.mega_cache import build_artifacts, import_artifacts

    code = f"""
import os, sys, torch
from torch.compiler._cache import CacheArtifactManager, CacheArtifactFactory
from torch.utils._appending_byte_serializer import AppendingByteSerializer
from torch.compiler import _cache
CacheArtifactManager._ensure_cache_artifacts_registered()
s = AppendingByteSerializer(serialize_fn=_cache._serialize_single_cache)
s.extend([("pgo", [CacheArtifactFactory.create("pgo", "job1:None:", {NEW!r})])])
sys.stdout.buffer.write(s.to_bytes())
"""
    blob = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, timeout=300).stdout
    with CacheDB(tmp_path / "c.db") as db:
        report = import_artifacts(db, blob)
        assert report.added == {"pgo_profile": 1} and not report.skipped
        with db.read() as repos:
            assert repos.pgo.get("job1_None_") == NEW
        exported = build_artifacts(db)
    assert exported.counts == {"pgo": 1}
    load = """
import sys, torch
torch.compiler.load_cache_artifacts(sys.stdin.buffer.read())
"""
    cache = tmp_path / "loaded"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "TORCH_COMPILE_JOB_ID": "job1"}
    subprocess.run([sys.executable, "-c", load], input=exported.data, check=True, env=env, timeout=300,
                   capture_output=True)
    assert (cache / "dynamo" / "code_state_job1_None_.pkl").read_bytes() == NEW


# -- between databases ------------------------------------------------------------------------------


def test_merge_and_copy_keep_the_newer_profile(tmp_path: Path, db_url: str) -> None:
    a, b = CacheDB(tmp_path / "a.db"), CacheDB(db_url)
    with a.transaction() as repos:
        repos.pgo.put("job1_None_", NEW, updated_at=_at(5))
        repos.pgo.put("only_a_None_", OLD, updated_at=_at(1))
    with b.transaction() as repos:
        repos.pgo.put("job1_None_", OLD, updated_at=_at(3))
        repos.pgo.put("only_b_None_", NEW, updated_at=_at(9))
    a.close()
    report = merge_databases([tmp_path / "a.db"], b)
    assert (report.tables["pgo_profiles"].added, report.tables["pgo_profiles"].replaced) == (1, 1)
    with b.read() as repos:
        got = {k: (d, w) for k, d, w in repos.pgo.iter_all()}
    assert got == {"job1_None_": (NEW, _at(5)), "only_a_None_": (OLD, _at(1)), "only_b_None_": (NEW, _at(9))}
    again = merge_databases([tmp_path / "a.db"], b)  # idempotent
    assert again.tables["pgo_profiles"].added == again.tables["pgo_profiles"].replaced == 0
    b.close()
    copy_database(db_url, tmp_path / "copy.db")
    with CacheDB(tmp_path / "copy.db") as c, c.read() as repos:
        assert {k: d for k, d, _ in repos.pgo.iter_all()} == {k: d for k, (d, _) in got.items()}


def test_point_sync_moves_a_profile_and_the_newer_wins(tmp_path: Path) -> None:
    local, remote = CacheDB(tmp_path / "local.db"), CacheDB(tmp_path / "remote.db")
    with remote.transaction() as repos:
        repos.pgo.put("job1_None_", NEW, updated_at=_at(4))
    entry = sync.dynamo("pgo", "job1_None_")
    with remote.engine.connect() as conn:
        bundle = sync.fetch(conn, entry)
    assert len(bundle.rows) == 1
    with local.engine.begin() as conn:
        assert sync.store(conn, bundle) == 1
        assert sync.store(conn, bundle) == 0
    with local.read() as repos:
        assert repos.pgo.get("job1_None_") == NEW
    with remote.transaction() as repos:  # an older one does not replace it
        repos.session.execute(text("DELETE FROM pgo_profiles"))
        repos.pgo.put("job1_None_", OLD, updated_at=_at(2))
    with remote.engine.connect() as conn, local.engine.begin() as w:
        assert sync.store(w, sync.fetch(conn, entry)) == 0
    local.close()
    remote.close()


def test_live_store_pushes_to_and_pulls_from_the_remote_tier(tmp_path: Path, pg_url: str) -> None:
    """Machine A's writes reach the shared PostgreSQL; machine B, with a new empty local file,
    is served from it on its local miss (one pull, copied into its file)."""
    from cachedb.live._remote import RemoteTier
    from cachedb.live._store import LiveStore

    from cachedb.fleet.trust import TrustPolicy

    a = LiveStore(str(tmp_path / "a.db"), remote=RemoteTier(pg_url, trust=TrustPolicy(accept_unsigned=True)))
    assert a.dynamo_put("pgo", "job1_None_", NEW) and a.dynamo_put("precompile", "c" * 64, OLD)
    a.close()  # flushes the remote queue
    assert a.remote.counts["failures"] == 0
    b = LiveStore(str(tmp_path / "b.db"), remote=RemoteTier(pg_url, trust=TrustPolicy(accept_unsigned=True)))
    try:
        assert b.dynamo_get("pgo", "job1_None_") == NEW
        assert b.dynamo_get("precompile", "c" * 64) == OLD
        assert b.dynamo_get("pgo", "other_None_") is None
    finally:
        b.close()
    with CacheDB(tmp_path / "b.db") as db, db.read() as repos:  # copied into B's own file, hits counted
        assert repos.pgo.get("job1_None_") == NEW
        assert repos.session.execute(text("SELECT hit_count FROM pgo_profiles")).scalar_one() == 1


# -- real torch.compile -----------------------------------------------------------------------------


#: ``(cache dir, database)`` holding the workloads' FX graphs, AOTAutograd entries and kernels and
#: nothing of Dynamo's own (:func:`dynamo_seed`), or ``None`` before it is built.
_SEED: list[Path] | None = None
#: Every flag of tests/_dynamo_child.py that adds a workload.
_WORKLOADS = ("--unpackageable", "--late-class", "--guard-assert")


def _seed_new(mode: str, cache_dir: Path, args: tuple[str, ...]) -> None:
    """A cache dir or database the child is the first to use starts with :data:`_SEED`'s
    Inductor entries: these tests are about PGO profiles and Dynamo packages, which the seed has
    none of; the C++ compiles of the FX graphs beneath them (~10 s a process) add nothing. A new
    cache dir served by the database starts with torch's ISA probes (``seeded``), as the
    seed's directory holds them."""
    import shutil

    if _SEED is None:
        return
    if mode == "files" and not cache_dir.exists():
        shutil.copytree(_SEED[0], cache_dir)
    elif mode == "cachedb" and "--db" in args:
        if not cache_dir.exists():
            seeded(cache_dir)
        db = Path(args[args.index("--db") + 1])
        if not db.exists():
            shutil.copy(_SEED[1], db)


def _build_seed(root: Path) -> list[str]:
    files, db = root / "files", root / "cache.db"
    for mode, extra in (("files", ()), ("cachedb", ("--db", str(db)))):
        proc = _run_child(mode, files if mode == "files" else root / "dir", *extra, *_WORKLOADS)
        assert proc.returncode == 0, proc.stderr[-4000:]
    import shutil

    shutil.rmtree(files / "dynamo")  # the PGO profile (precompile was off: no packages)
    with CacheDB(db) as database, database.engine.begin() as conn:
        for table in ("pgo_profiles", "dynamo_packages", "precompile_refusals"):
            conn.execute(text(f"DELETE FROM {table}"))  # noqa: S608 - the names above
    return [str(files), str(db)]


@pytest.fixture(scope="session")
def dynamo_seed(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The workloads compiled once per test run by torch alone into a cache dir and by cachedb
    into a database, Dynamo's own caches removed from both: what :func:`_seed_new` starts each
    child's new cache dir or database with."""
    global _SEED
    pytest.importorskip("torch")
    from .conftest import _built_once

    _SEED = [Path(p) for p in _built_once(tmp_path_factory, "dynamo_seed", _build_seed)]
    return _SEED


@pytest.fixture(autouse=True)
def _seeded(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("slow") is not None:
        request.getfixturevalue("dynamo_seed")


def _run_child(mode: str, cache_dir: Path, *args: str, **env_extra: str) -> subprocess.CompletedProcess[str]:
    _seed_new(mode, cache_dir, args)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CACHEDB_", "TORCH_"))}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(cache_dir), TORCHINDUCTOR_COMPILE_THREADS="1",
               TORCH_COMPILE_JOB_ID="job1", PYTHONPATH=str(ROOT), **env_extra)
    return subprocess.run([sys.executable, str(CHILD), mode, *args], capture_output=True, text=True, env=env,
                          timeout=900, cwd=ROOT)


def _child(mode: str, cache_dir: Path, *args: str, **env_extra: str) -> tuple[dict, str]:
    proc = _run_child(mode, cache_dir, *args, **env_extra)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ok"], out
    return out, proc.stderr


def _cachedb_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "cachedb" in line]


@pytest.fixture(scope="module")
def pgo_runs(tmp_path_factory: pytest.TempPathFactory, dynamo_seed: list[Path]) -> dict:
    """Warm local files against a fresh cache dir served by cachedb, PGO on (job id set)."""
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("pgo")
    files = root / "files"
    db = root / "cache.db"
    runs = {
        "files cold": _child("files", files),
        "files warm": _child("files", files),
        "cachedb cold": _child("cachedb", root / "cold", "--db", str(db), "--list-dir"),
        "cachedb warm": _child("cachedb", root / "warm", "--db", str(db), "--list-dir"),
    }
    return {"root": root, "db": db, "runs": runs}


@pytest.mark.slow
def test_pgo_profile_from_the_db_compiles_as_few_frames_as_warm_local_files(pgo_runs: dict) -> None:
    runs = pgo_runs["runs"]
    frames = {case: out["frames"].get("total", 0) for case, (out, _) in runs.items()}
    # the function called with 7, 33 and 1,024 rows: static, then a recompile, without a profile
    assert frames["files cold"] == frames["cachedb cold"] == 3, frames
    assert frames["files warm"] == 2, frames
    assert frames["cachedb warm"] == frames["files warm"], frames
    assert runs["cachedb warm"][0]["unique_graphs"] == runs["files warm"][0]["unique_graphs"]
    for case in ("cachedb cold", "cachedb warm"):
        out, stderr = runs[case]
        assert not any(f.startswith("dynamo/") for f in out["files"]), out["files"]  # in the DB only
        assert _cachedb_lines(stderr) == [], stderr[-3000:]
    with CacheDB(pgo_runs["db"]) as db, db.read() as repos:
        rows = repos.session.execute(text("SELECT key, hit_count FROM pgo_profiles")).all()
    assert rows == [("job1_None_", 1)]


@pytest.mark.slow
def test_a_damaged_profile_is_quarantined_and_the_compile_goes_on(pgo_runs: dict, tmp_path: Path) -> None:
    import shutil

    db_path = tmp_path / "damaged.db"
    shutil.copy(pgo_runs["db"], db_path)
    with CacheDB(db_path) as db, db.engine.begin() as conn:
        blob = bytearray(conn.execute(text("SELECT payload FROM pgo_profiles")).scalar_one())
        blob[len(blob) // 2] ^= 0xFF
        conn.execute(text("UPDATE pgo_profiles SET payload = :p"), {"p": bytes(blob)})
    out, stderr = _child("cachedb", tmp_path / "dir", "--db", str(db_path))
    assert out["frames"]["total"] == 3  # as without a profile
    assert out["corrupt"] == 1
    warnings = _cachedb_lines(stderr)
    assert len(warnings) == 1 and "pgo payload check" in warnings[0], stderr[-3000:]
    with CacheDB(db_path) as db, db.read() as repos:
        quarantined = repos.session.execute(text("SELECT kind, key FROM quarantined_entries")).all()
        assert quarantined == [("pgo", "job1_None_")]
        assert repos.pgo.get("job1_None_") is not None  # the process wrote its own profile after


@pytest.fixture(scope="module")
def precompile_runs(tmp_path_factory: pytest.TempPathFactory, dynamo_seed: list[Path]) -> dict:
    """Warm local files (torch alone: ``TORCH_CACHING_PRECOMPILE=1`` and an explicit
    ``save_cache_artifacts()``) against a fresh cache dir served by cachedb
    (``install(precompile=True)``, no save call: cachedb saves at exit); PGO on as well."""
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("precompile")
    files = root / "files"
    db = root / "cache.db"
    runs = {
        "files cold": _child("files", files, "--save", TORCH_CACHING_PRECOMPILE="1"),
        "files warm": _child("files", files, "--save", TORCH_CACHING_PRECOMPILE="1"),
        "cachedb cold": _child("cachedb", root / "cold", "--db", str(db), "--precompile"),
        "cachedb warm": _child("cachedb", root / "warm", "--db", str(db), "--precompile", "--list-dir"),
    }
    return {"root": root, "db": db, "runs": runs}


@pytest.mark.slow
def test_a_mixed_fleet_keeps_a_package_per_system_and_hits_on_every_machine(tmp_path: Path) -> None:
    """Two machines of different systems share one database: A (this Python) and B, which
    reports Python 3.99.0 in torch's ``SystemInfo.current()`` (the field torch checks first
    when it loads a package). B's cold start does not take A's packages (torch would refuse
    them), stores its own beside them, and each machine's warm start then hits every function."""
    pytest.importorskip("torch")
    db = str(tmp_path / "fleet.db")
    b = ("--python-version", "3.99.0")
    runs = {
        "a cold": _child("cachedb", tmp_path / "a1", "--db", db, "--precompile"),
        "b cold": _child("cachedb", tmp_path / "b1", "--db", db, "--precompile", *b),
        "a warm": _child("cachedb", tmp_path / "a2", "--db", db, "--precompile"),
        "b warm": _child("cachedb", tmp_path / "b2", "--db", db, "--precompile", *b),
    }
    cache = {case: out["dynamo_cache"] for case, (out, _) in runs.items()}
    assert cache["a cold"] == cache["b cold"] == {"dynamo_cache_miss": 2}, cache
    assert cache["a warm"] == cache["b warm"] == {"dynamo_cache_hit": 2}, cache
    assert runs["a warm"][0]["frames"] == runs["b warm"][0]["frames"] == {}  # installed: no frame traced
    assert all(out["ok"] for out, _ in runs.values())
    with CacheDB(db) as database, database.read() as repos:
        keys = repos.dynamo("precompile").keys()
    assert len(keys) == 4 and len({k.split(".")[0] for k in keys}) == 2 and len({k.split(".")[1] for k in keys}) == 2
    assert all(_cachedb_lines(stderr) == [] for _, stderr in runs.values())
    # Why B's cold start missed: each function's package is stored for A's system, which differs
    # in its tag and its Python version alone; A's cold start had nothing near.
    res = CliRunner().invoke(main, ["--db", db, "misses", "--kind", "precompile", "--format", "json"])
    assert res.exit_code == 0, res.output
    misses = json.loads(res.stdout)
    b_misses, a_misses = misses[:2], misses[2:]  # newest first
    assert len(a_misses) == 2 and all(m["nearest"] is None for m in a_misses)
    for miss in b_misses:
        source = miss["key"].split(".")[0]
        assert miss["outcome"] == "no_entry" and miss["nearest"] in keys and miss["nearest"].startswith(source + ".")
        assert [d["factor"] for d in miss["differs"]] == ["system", "system.python_version"]
        assert miss["differs"][1]["wanted"] == "3.99.0" and miss["differs"][1]["stored"] == platform.python_version()


@pytest.mark.slow
def test_precompiled_packages_from_the_db_hit_for_every_function_warm_local_files_hit(
        precompile_runs: dict) -> None:
    runs = precompile_runs["runs"]
    cache = {case: out["dynamo_cache"] for case, (out, _) in runs.items()}
    assert cache["files cold"] == cache["cachedb cold"] == {"dynamo_cache_miss": 2}, cache
    assert cache["files warm"] == {"dynamo_cache_hit": 2}, cache
    assert cache["cachedb warm"] == cache["files warm"], cache
    # a hit skips Dynamo's tracing: no frame compiled
    assert runs["cachedb warm"][0]["frames"] == runs["files warm"][0]["frames"] == {}
    # cachedb saved the packages at exit, without a save_cache_artifacts() call
    with CacheDB(precompile_runs["db"]) as db, db.read() as repos:
        rows = repos.session.execute(text("SELECT key, hit_count FROM dynamo_packages ORDER BY key")).all()
    assert len(rows) == 2 and all(hits == 1 for _, hits in rows), rows
    assert _cachedb_lines(runs["cachedb warm"][1]) == []


@pytest.mark.slow
def test_a_warm_start_from_the_db_leaves_only_what_the_loaders_need_on_disk(precompile_runs: dict) -> None:
    """After a warm start from the database into an empty cache dir, PGO and precompile on, the
    directory holds what Inductor's loaders read from a path and nothing torch reads back as a
    cache: the generated Python modules it imports (``<k[1:3]>/<k>.py``), the C++ kernels it
    builds or loads (``.cpp`` source, ``.so`` library, ``.main.*`` of the wrapper; the libraries
    come from the database), their file locks, and on a GPU Triton's cache directory (filled
    from the database). No ``fxgraph/``, ``aotautograd/``, ``cache/``, ``dynamo/``, best config
    or CUTLASS op list."""
    import re

    out, _ = precompile_runs["runs"]["cachedb warm"]
    loader_files = re.compile(
        r"[a-z0-9]{2}/c[a-z0-9]{51}(\.main)?\.(cpp|so)|[a-z0-9]{2}/c[a-z0-9]{51}\.py|locks/c[a-z0-9]{51}\.lock"
        r"|triton/\d+/[A-Z0-9]{52}/[^/]+")
    others = [f for f in out["files"] if not loader_files.fullmatch(f)]
    assert others == [], others
    assert any(f.endswith(".so") for f in out["files"])  # the kernels, from the database
    with CacheDB(precompile_runs["db"]) as db, db.read() as repos:
        profiles = repos.pgo.keys()
    assert profiles == ["job1_None_"]


@pytest.mark.slow
def test_a_damaged_package_is_quarantined_and_the_compile_goes_on(precompile_runs: dict, tmp_path: Path) -> None:
    import shutil

    db_path = tmp_path / "damaged.db"
    shutil.copy(precompile_runs["db"], db_path)
    with CacheDB(db_path) as db, db.engine.begin() as conn:
        key, blob = conn.execute(text("SELECT key, payload FROM dynamo_packages ORDER BY key")).first()
        blob = bytearray(blob)
        blob[len(blob) // 2] ^= 0xFF
        conn.execute(text("UPDATE dynamo_packages SET payload = :p WHERE key = :k"), {"p": bytes(blob), "k": key})
    out, stderr = _child("cachedb", tmp_path / "dir", "--db", str(db_path), "--precompile")
    assert out["dynamo_cache"] == {"dynamo_cache_hit": 1, "dynamo_cache_miss": 1}, out
    assert out["corrupt"] == 1
    warnings = _cachedb_lines(stderr)
    assert len(warnings) == 1 and "precompile payload check" in warnings[0], stderr[-3000:]
    with CacheDB(db_path) as db, db.read() as repos:
        assert repos.session.execute(text("SELECT kind, key FROM quarantined_entries")).all() == [("precompile", key)]
        assert repos.dynamo("precompile").get(key) is not None  # saved again at exit


@pytest.mark.slow
def test_cachedb_run_serves_both_with_torch_s_own_switches(tmp_path: Path) -> None:
    """Under ``cachedb run`` (cachedb activates itself in the program), torch's own switches
    are enough: ``TORCH_COMPILE_JOB_ID`` and ``TORCH_CACHING_PRECOMPILE=1``; the packages are
    stored at exit (the program never calls ``save_cache_artifacts``)."""
    pytest.importorskip("torch")
    db = tmp_path / "cache.db"

    _seed_new("cachedb", tmp_path / "cold", ("--db", str(db)))

    def run(cache_dir: Path) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CACHEDB_", "TORCH_"))}
        env.update(TORCHINDUCTOR_CACHE_DIR=seeded(cache_dir), TORCHINDUCTOR_COMPILE_THREADS="1",
                   TORCH_COMPILE_JOB_ID="job1", TORCH_CACHING_PRECOMPILE="1")
        proc = subprocess.run([sys.executable, "-m", "cachedb", "--db", str(db), "run", "--", sys.executable,
                               str(CHILD), "files", "--list-dir"], capture_output=True, text=True, env=env,
                              timeout=900, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert _cachedb_lines(proc.stderr) == [], proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    cold, warm = run(tmp_path / "cold"), run(tmp_path / "warm")
    assert cold["dynamo_cache"] == {"dynamo_cache_miss": 2} and cold["frames"]["total"] == 3
    assert warm["dynamo_cache"] == {"dynamo_cache_hit": 2} and warm["frames"] == {}
    assert not [f for out in (cold, warm) for f in out["files"] if f.startswith("dynamo/")]
    with CacheDB(db) as c, c.read() as repos:
        assert repos.pgo.keys() == ["job1_None_"] and repos.dynamo("precompile").count() == 2


# -- functions torch cannot package, packages torch cannot load --------------------------------------

#: What the warnings name: the model torch cannot package (its ``forward``), the function whose
#: package cannot be loaded where it is wrapped (tests/_dynamo_child.py).
UNPACKAGEABLE, LATE_CLASS = "__main__._Model.forward", "__main__._scaled"


@pytest.fixture(scope="module")
def fallback_runs(tmp_path_factory: pytest.TempPathFactory, dynamo_seed: list[Path]) -> dict:
    """The workloads plus ``--unpackageable`` and ``--late-class``: with cachedb, precompile off
    (the frames to match) and on (cold, then warm from the same database)."""
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("fallback")
    db = root / "cache.db"
    both = ("--unpackageable", "--late-class")
    runs = {
        "off": _child("cachedb", root / "off", "--db", str(root / "off.db"), *both),
        "cold": _child("cachedb", root / "cold", "--db", str(db), "--precompile", *both),
        "warm": _child("cachedb", root / "warm", "--db", str(db), "--precompile", *both),
    }
    return {"root": root, "db": db, "runs": runs}


def _naming(stderr: str, name: str) -> list[str]:
    return [line for line in _cachedb_lines(stderr) if name in line]


@pytest.mark.slow
def test_torch_alone_fails_the_compile_of_a_function_it_cannot_package(tmp_path: Path) -> None:
    """torch 2.13 alone, ``TORCH_CACHING_PRECOMPILE=1``: ``CompilePackage.code_context`` ->
    ``_get_code_source`` (torch/_dynamo/package.py) raises ``PackageError`` for the property's
    frame and the user's call fails; what the fallback below exists for."""
    pytest.importorskip("torch")
    proc = _run_child("files", tmp_path / "dir", "--unpackageable", TORCH_CACHING_PRECOMPILE="1")
    assert proc.returncode != 0
    assert "PackageError: Cannot resolve a fully qualified name for <code object loss_function" in proc.stderr


@pytest.mark.slow
def test_a_function_torch_cannot_package_compiles_without_a_package(fallback_runs: dict) -> None:
    """With cachedb's precompile on, the model torch cannot package compiles as with precompile
    off (the same frames), with one warning naming it, in every process (the warm one's from
    the recorded refusal); the other functions' packages are saved and hit."""
    runs = fallback_runs["runs"]
    (off, _), (cold, cold_err), (warm, warm_err) = runs["off"], runs["cold"], runs["warm"]
    assert cold["ok"] and warm["ok"]
    assert cold["frames"] == off["frames"], (cold["frames"], off["frames"])
    # warm: the MLP's frame and the row function's two are served by their packages
    assert warm["frames"]["total"] == off["frames"]["total"] - 3, (warm["frames"], off["frames"])
    assert cold["dynamo_cache"] == {"dynamo_cache_miss": 4}, cold["dynamo_cache"]
    assert warm["dynamo_cache"]["dynamo_cache_hit"] == 2 and warm["dynamo_cache"]["dynamo_cache_miss"] == 1
    for stderr in (cold_err, warm_err):
        warnings = _naming(stderr, UNPACKAGEABLE)
        assert len(warnings) == 1 and "PackageError" in warnings[0], _cachedb_lines(stderr)
    assert "recorded" not in _naming(cold_err, UNPACKAGEABLE)[0] and "recorded" in _naming(warm_err, UNPACKAGEABLE)[0]
    assert _cachedb_lines(cold_err) == _naming(cold_err, UNPACKAGEABLE)
    with CacheDB(fallback_runs["db"]) as db, db.read() as repos:
        rows = repos.session.execute(text("SELECT key, hit_count FROM dynamo_packages ORDER BY key")).all()
    # the MLP, the row function and _scaled (read warm, refused, rewritten at exit): not the model
    assert len(rows) == 3 and all(hits == 1 for _, hits in rows), rows


@pytest.mark.slow
def test_a_package_whose_guards_cannot_be_loaded_compiles_afresh(fallback_runs: dict, tmp_path: Path) -> None:
    """A package whose guards name a class not yet defined when ``torch.compile`` wraps the
    function: torch alone fails the warm start (``CompilePackage.install`` ->
    ``load_guards_state``, an ``AttributeError`` its ``RuntimeError`` fallback lets through);
    cachedb compiles the function afresh, with one warning naming it."""
    late = ("--late-class", "--save")
    _child("files", tmp_path / "files", *late, TORCH_CACHING_PRECOMPILE="1")
    proc = _run_child("files", tmp_path / "files", *late, TORCH_CACHING_PRECOMPILE="1")
    assert proc.returncode != 0 and "AttributeError: Can't get attribute '_Scale'" in proc.stderr, proc.stderr[-3000:]

    warm, stderr = fallback_runs["runs"]["warm"]
    assert warm["ok"] and warm["dynamo_cache"]["dynamo_cache_error"] == 1, warm["dynamo_cache"]
    warnings = _naming(stderr, LATE_CLASS)
    assert len(warnings) == 1 and "could not be loaded" in warnings[0], _cachedb_lines(stderr)
    assert len(_cachedb_lines(stderr)) == 2  # and the unpackageable model's


@pytest.mark.slow
def test_a_package_that_fails_its_system_check_compiles_afresh(fallback_runs: dict, tmp_path: Path) -> None:
    """Packages stored without a system (as imported from torch's files) loaded on another
    system (``--python-version``): ``_DynamoCacheEntry.check_versions`` refuses each; every
    function compiles afresh with one warning naming it, and its package for this system is
    stored beside the other."""
    import shutil

    db_path = tmp_path / "imported.db"
    shutil.copy(fallback_runs["db"], db_path)
    with CacheDB(db_path) as db, db.engine.begin() as conn:  # keyed by source id alone
        conn.execute(text("UPDATE dynamo_packages SET key = substr(key, 1, 64)"))
    out, stderr = _child("cachedb", tmp_path / "dir", "--db", str(db_path), "--precompile",
                         "--python-version", "3.99.0")
    assert out["ok"] and out["dynamo_cache"] == {"dynamo_cache_error": 2}, out["dynamo_cache"]
    assert out["frames"]["total"] == 2  # as a cold start with the stored profile: the rows dynamic at once
    warnings = _cachedb_lines(stderr)
    assert len(warnings) == 2 and all("different Python version" in w for w in warnings), warnings
    assert any("Sequential.forward" in w for w in warnings) and any("_rows" in w for w in warnings)
    with CacheDB(db_path) as db, db.read() as repos:
        keys = repos.dynamo("precompile").keys()
    assert len(keys) == 5 and sum("." in k for k in keys) == 2, keys


@pytest.mark.slow
def test_a_package_whose_guards_fail_an_assertion_compiles_without_it(tmp_path: Path) -> None:
    """torch 2.11 fails GPT-2's compile under precompile with an ``AssertionError`` where it
    builds a frame's guards twice under ``caching_precompile`` (``Guard.set_export_info``),
    package or not; injected here (``--guard-assert``). torch alone fails the call; under
    cachedb the function compiles as without precompile, with one one-line warning naming it,
    and the other functions keep their packages. The refusal is recorded: the next process
    compiles the function once, without trying its package again."""
    proc = _run_child("files", tmp_path / "files", "--guard-assert", TORCH_CACHING_PRECOMPILE="1")
    assert proc.returncode != 0 and "AssertionError: Guarded object must be identical" in proc.stderr, proc.stderr[-3000:]
    out, stderr = _child("cachedb", tmp_path / "dir", "--db", str(tmp_path / "cache.db"), "--precompile", "--guard-assert")
    assert out["ok"] and out["dynamo_cache"] == {"dynamo_cache_miss": 3}, out["dynamo_cache"]
    warnings = _cachedb_lines(stderr)
    assert len(warnings) == 1 and "__main__._asserting" in warnings[0] and "AssertionError" in warnings[0], warnings
    assert "without a package" in warnings[0]  # the whole warning, the assertion's text on its line
    assert out["asserting_guard_builds"] == 2  # with the package (failed), then without
    with CacheDB(tmp_path / "cache.db") as db, db.read() as repos:
        assert repos.dynamo("precompile").count() == 2  # the MLP's and the row function's
        refusals = list(repos.dynamo("precompile_refusal").iter_all())
    assert len(refusals) == 1, refusals
    record = json.loads(refusals[0][1])
    assert record["function"] == "__main__._asserting" and record["error"].startswith("AssertionError: Guarded")

    again, stderr = _child("cachedb", tmp_path / "again", "--db", str(tmp_path / "cache.db"), "--precompile",
                           "--guard-assert")
    assert again["ok"] and again["asserting_guard_builds"] == 1, again
    assert again["dynamo_cache"] == {"dynamo_cache_hit": 2, "dynamo_cache_miss": 1}, again["dynamo_cache"]
    warnings = _cachedb_lines(stderr)
    assert len(warnings) == 1 and "__main__._asserting" in warnings[0] and "recorded" in warnings[0], warnings
    with CacheDB(tmp_path / "cache.db") as db, db.read() as repos:
        (hits,) = repos.session.execute(text("SELECT hit_count FROM precompile_refusals")).one()
    assert hits == 1


@pytest.mark.slow
def test_cachedb_run_with_torch_s_switch_falls_back_too(tmp_path: Path) -> None:
    """``TORCH_CACHING_PRECOMPILE=1`` under ``cachedb run`` (cachedb's seams active, precompile
    turned on by the user): the model torch cannot package compiles too."""
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CACHEDB_", "TORCH_"))}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "dir"), TORCHINDUCTOR_COMPILE_THREADS="1",
               TORCH_CACHING_PRECOMPILE="1")
    _seed_new("cachedb", tmp_path / "dir", ("--db", str(tmp_path / "cache.db")))
    proc = subprocess.run([sys.executable, "-m", "cachedb", "--db", str(tmp_path / "cache.db"), "run", "--",
                           sys.executable, str(CHILD), "files", "--unpackageable"], capture_output=True, text=True,
                          env=env, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ok"] and out["dynamo_cache"] == {"dynamo_cache_miss": 3}, out
    warnings = _cachedb_lines(proc.stderr)
    assert len(warnings) == 1 and UNPACKAGEABLE in warnings[0], proc.stderr[-3000:]
    with CacheDB(tmp_path / "cache.db") as c, c.read() as repos:
        assert repos.dynamo("precompile").count() == 2
