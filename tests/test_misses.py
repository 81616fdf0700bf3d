"""Every miss explained: the factors of FX graph and AOTAutograd keys kept with their entries,
each miss in a bounded log, ``cachedb misses`` naming the factors that differ (against the
database's own entries or a shared tier's), the factors carried by copy, merge and the remote
tier, and ``stats``' seconds saved.

One child process (tests/_misses_child.py) compiles, under cachedb, a function and then one
perturbation of it after another (real ``torch.compile``, CPU), asking ``cachedb misses``
after each, its entries also written to a PostgreSQL shared tier (machine A); the tests check
its report, the database it leaves and the shared tier (no test compiles anything else)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from cachedb import CacheDB
from cachedb.cli import main
from cachedb.fleet.copy import copy_database, merge_databases
from cachedb.fleet.trust import TrustPolicy
from cachedb.keys.factors import Factor, differences, equal_count, parse_debug_lines, readable
from cachedb.live._remote import RemoteTier
from cachedb.live._store import LiveStore
from cachedb.settings import SettingError, read

from .conftest import _PG
from ._realcache import seeded

#: Its module fixtures build real caches: one worker builds each once (xdist --dist loadgroup).
pytestmark = pytest.mark.xdist_group("misses")

torch = pytest.importorskip("torch")

CHILD = Path(__file__).with_name("_misses_child.py")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> tuple[dict[str, dict], Path]:
    """The child's report by step, and its database; its entries also in the shared tier of
    ``module_pg_url`` where PostgreSQL is reachable."""
    tmp = tmp_path_factory.mktemp("misses")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_")}
    # TMPDIR stays the suite's: torch's precompiled C++ header (seconds of g++) is the machine's.
    env["TORCHINDUCTOR_CACHE_DIR"] = seeded(tmp / "inductor")
    out, db = tmp / "report.json", tmp / "cache.db"
    remote = [request.getfixturevalue("module_pg_url")] if _PG else []
    proc = subprocess.run([sys.executable, str(CHILD), str(out), str(db), *remote], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {s["step"]: s for s in json.loads(out.read_text())}, db


def _only(report: dict[str, dict], step: str) -> dict:
    (miss,) = report[step]["misses"]
    assert set(miss) >= {"kind", "key", "outcome", "nearest", "differs"}
    return miss


def _factors(miss: dict) -> list[str]:
    return [d["factor"] for d in miss["differs"]]


def _aot(report: dict[str, dict], step: str) -> dict:
    (miss,) = report[step]["aot"]
    assert miss["kind"] == "aotautograd"
    return miss


def test_first_compile_has_nothing_near(run) -> None:
    miss = _only(run[0], "base")
    assert (miss["kind"], miss["outcome"], miss["nearest"], miss["differs"]) == ("fxgraph", "no_entry", None, [])


def test_input_dtype_named(run) -> None:
    miss = _only(run[0], "dtype")
    base = _only(run[0], "base")
    assert miss["nearest"] == base["key"] and miss["key"] != base["key"]
    assert miss["differs"] == [{"factor": "example_inputs[0]", "stored": "float32[64]", "wanted": "float64[64]"}]


def test_input_shape_named_with_static_shapes(run) -> None:
    miss = _only(run[0], "shape")
    assert _factors(miss) == ["example_inputs[0]"]
    assert miss["differs"][0]["wanted"] == "float32[32]"


def test_inductor_config_named(run) -> None:
    miss = _only(run[0], "inductor_config")
    assert miss["nearest"] == _only(run[0], "base")["key"]
    assert miss["differs"] == [
        {"factor": "inductor_config.max_autotune_pointwise", "stored": "False", "wanted": "True"}]


def test_changed_user_function_names_the_graph_only(run) -> None:
    miss = _only(run[0], "function")
    assert _factors(miss) == ["gm"]
    assert "sin" in miss["differs"][0]["stored"] and "cos" in miss["differs"][0]["wanted"]


def test_dynamo_config_names_the_graph_and_its_symbolic_inputs(run) -> None:
    """``assume_static_by_default=False`` makes the input's size a graph input: the graph's
    code and the inputs differ, nothing else (no config of Inductor's, no torch key)."""
    miss = _only(run[0], "dynamo_config")
    assert set(_factors(miss)) == {"gm", "example_inputs[0]", "example_inputs[1]"}
    wanted = {d["factor"]: d["wanted"] for d in miss["differs"]}
    assert wanted["example_inputs[1]"].startswith("float32[s")


def test_a_guard_failing_on_a_dynamic_size(run) -> None:
    """The same graph for ``val`` 6 and 4 (one key), stored with the guard ``6 <= val``: the
    second lookup finds the key and its guards fail."""
    miss = _only(run[0], "guard")
    assert miss["key"] == _only(run[0], "guard_base")["key"]
    assert (miss["outcome"], miss["nearest"], miss["differs"]) == ("guards_failed", miss["key"], [])
    (guards,) = miss["guards"]
    assert "6 <= " in guards


def test_aotautograd_misses_name_their_factors(run) -> None:
    """The AOTAutograd key of each step has factors of its own (torch's debug lines of
    ``AOTAutogradCacheDetails``): the first has nothing near, another dtype names the input."""
    base = _aot(run[0], "base")
    assert (base["outcome"], base["nearest"], base["differs"]) == ("no_entry", None, [])
    assert base["key"].startswith("a")
    miss = _aot(run[0], "dtype")
    assert miss["nearest"] == base["key"]
    assert miss["differs"] == [{"factor": "example_inputs[0]", "stored": "float32[64]", "wanted": "float64[64]"}]
    assert _factors(_aot(run[0], "inductor_config")) == ["inductor_config.max_autotune_pointwise"]


def test_a_functorch_config_names_the_aotautograd_factor_alone(run) -> None:
    """functorch's ``activation_memory_budget`` is in the AOTAutograd key, not the FX graphs':
    they hit, and the one miss names the config (torch hashes functorch's config as one pickle;
    cachedb lists it per name)."""
    assert run[0]["aot_config"]["misses"] == run[0]["hit"]["misses"]  # no FX graph miss since
    miss = _aot(run[0], "aot_config")
    assert miss["nearest"] == _aot(run[0], "base")["key"]
    assert miss["differs"] == [{"factor": "autograd_config.activation_memory_budget", "stored": "1.0", "wanted": "0.5"}]


def test_an_aotautograd_guard_miss(run) -> None:
    miss = _aot(run[0], "guard")
    assert miss["key"] == _aot(run[0], "guard_base")["key"]
    assert (miss["outcome"], miss["nearest"]) == ("guards_failed", miss["key"])


def test_an_aotautograd_bypass_is_recorded_with_its_reason(run) -> None:
    """torch's AOTAutograd cache bypasses a graph compiled with freezing on (``try_load``
    catches ``BypassAOTAutogradCache``): a ``bypass`` without a key, torch's words its reason."""
    report, _ = run
    miss = _aot(report, "aot_bypass")
    assert miss["outcome"] == "bypass" and miss["key"] == "" and miss["nearest"] is None
    assert "freezing" in miss["reason"]


def test_torch_key_named(run) -> None:
    """Another torch build (``torch_key``, the digest of torch's sources): that factor alone."""
    miss = _only(run[0], "torch_key")
    assert miss["nearest"] == _only(run[0], "base")["key"]
    assert _factors(miss) == ["torch_version"]


def test_system_fingerprint_named(run) -> None:
    """Another machine (``CacheBase.get_system``: an H200 with CUDA 13.0 where this CPU machine
    has no device): only ``system_info`` factors, naming the device."""
    miss = _only(run[0], "system")
    assert miss["nearest"] == _only(run[0], "base")["key"]
    factors = _factors(miss)
    assert factors and all(name.startswith("system_info") for name in factors), factors
    assert any("H200" in d["wanted"] for d in miss["differs"]), miss["differs"]


def test_a_hit_records_no_miss(run) -> None:
    assert run[0]["hit"]["misses"] == run[0]["dynamo_config"]["misses"]


def test_table_output_in_words(run) -> None:
    res = CliRunner().invoke(main, ["--db", str(run[1]), "misses", "-n", "50"], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    assert "inductor_config.max_autotune_pointwise: False -> True" in res.stdout
    assert "example_inputs[0]: float32[64] -> float64[64]" in res.stdout


def _library(report: dict[str, dict], step: str) -> dict:
    (miss,) = report[step]["cpp"]
    assert (miss["kind"], miss["outcome"]) == ("cpp", "no_entry")
    return miss


def test_a_new_graph_s_library_differs_from_the_nearest_in_source_alone(run) -> None:
    """Each step that compiles a new graph compiles its C++ kernel library: a miss whose
    nearest library (another graph's, this host's) differs in its source alone."""
    base, dtype = _library(run[0], "base"), _library(run[0], "dtype")
    assert base["key"] != dtype["key"]
    assert dtype["nearest"].split("@")[0] != dtype["key"]
    assert _factors(dtype) == ["source"] and dtype["differs"][0]["wanted"] == dtype["key"]


def test_a_library_stored_for_another_host_names_the_host_factors_that_differ(run) -> None:
    """The first step's graph again (an FX graph hit) on a host with another compiler version
    and other CPU flags, its library files gone: the library is stored, but for the first host;
    the miss names the host key, the compiler version and the CPU flags, in words."""
    miss = _library(run[0], "cpp_host")
    base = _library(run[0], "base")
    assert miss["key"] == base["key"] and miss["nearest"].startswith(base["key"] + "@")
    assert _factors(miss) == ["host", "host.compiler_version", "host.cpu_flags"]
    by = {d["factor"]: d for d in miss["differs"]}
    assert by["host.compiler_version"]["wanted"] == "gcc version 99.1.0 (another host)"
    assert "version" in by["host.compiler_version"]["stored"]
    assert "amx_tile" in by["host.cpu_flags"]["wanted"] and "amx_tile" not in by["host.cpu_flags"]["stored"]
    res = CliRunner().invoke(main, ["--db", str(run[1]), "misses", "--kind", "cpp", "-n", "1"],
                             env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    assert "host.compiler_version: " in res.stdout and "-> gcc version 99.1.0 (another host)" in res.stdout


def _best(report: dict[str, dict], step: str) -> dict:
    miss = _only(report, step)
    assert miss["kind"] == "best_config"
    return miss


def test_best_config_misses_name_their_factor(run) -> None:
    """torch's own ``AutotuneCache`` of a kernel: the first lookup has nothing near; the best
    config it saved then hits (no miss); other candidate configs find it stored for the old
    ones (``configs_changed``, nearest its own key); another torch key and another kernel each
    name their factor alone."""
    report = run[0]
    base = _best(report, "b_base")
    assert (base["outcome"], base["nearest"], base["differs"]) == ("no_entry", None, [])
    assert report["b_hit"]["misses"] == report["b_base"]["misses"] and report["b_hit"]["found"] == {"XBLOCK": 128}
    changed = _best(report, "b_configs")
    assert (changed["outcome"], changed["key"], changed["nearest"]) == ("configs_changed", base["key"], base["key"])
    assert changed["differs"] == [{"factor": "configs_hash", "stored": "h1" * 32, "wanted": "h2" * 32}]
    other_torch = _best(report, "b_torch_key")
    assert other_torch["key"] != base["key"] and other_torch["nearest"] == base["key"]
    assert _factors(other_torch) == ["torch_key"]
    kernel = _best(report, "b_kernel")
    assert kernel["nearest"] == base["key"]
    assert kernel["differs"] == [{"factor": "kernel", "stored": "ckaernel0a.py", "wanted": "ckbernel0b.py"}]


def _timing(report: dict[str, dict], step: str) -> dict:
    miss = _only(report, step)
    assert miss["kind"] == "timings"
    return miss


def test_a_first_timings_lookup_has_nothing_near(run) -> None:
    miss = _timing(run[0], "t_base")
    assert (miss["outcome"], miss["nearest"], miss["differs"]) == ("no_entry", None, [])
    assert miss["key"].startswith("mm:")


def test_a_timings_hit_records_no_miss(run) -> None:
    assert run[0]["t_hit"]["misses"] == run[0]["t_base"]["misses"]


def test_timings_misses_name_their_factor(run) -> None:
    """Each perturbation of the first lookup (``PersistentCache.lookup``, torch's own) names
    what changed, and nothing else: the first input's size, a choice without a timing (the
    lookup's own key: its other choices were timed), the float32 matmul precision, the system."""
    base = _timing(run[0], "t_base")["key"]
    shape = _timing(run[0], "t_shape")
    assert shape["nearest"] == base and shape["outcome"] == "no_entry"
    assert shape["differs"] == [{"factor": "inputs[0]", "stored": "('cpu', 'torch.float32', 64, 32, 32, 1, 0)",
                                 "wanted": "('cpu', 'torch.float32', 128, 32, 32, 1, 0)"}]
    choice = _timing(run[0], "t_choice")
    assert (choice["key"], choice["nearest"], choice["outcome"]) == (base, base, "new_choices")
    assert choice["differs"] == [{"factor": "choice[triton]", "stored": None, "wanted": "triton choice"}]
    precision = _timing(run[0], "t_precision")
    assert precision["nearest"] == base
    assert precision["differs"] == [{"factor": "precision", "stored": "highest", "wanted": "high"}]
    system = _timing(run[0], "t_system")
    assert system["nearest"] == base and _factors(system) == ["system"]
    assert system["differs"][0]["wanted"].startswith("NVIDIA H200 / CUDA 13.0")
    assert system["differs"][0]["stored"].startswith("no GPU")


def test_a_cold_compile_s_gemm_autotune_is_a_timings_miss(live_cache: tuple[Path, dict, dict]) -> None:
    """``cachedb run`` of examples/build_cache.py (its GEMM compiled with max-autotune, CPU) into
    an empty database: each timings lookup it benchmarked is a ``no_entry`` miss with nothing
    near, naming the op and inputs that were then stored; the warm run on a fresh machine
    benchmarked nothing and recorded no timings miss."""
    db, _cold, _warm = live_cache
    misses = _misses_json(db, "--kind", "timings")
    with CacheDB(str(db), upgrade=False) as database, database.read() as repos:
        stored = repos.session.execute(text("SELECT op, inputs FROM autotune_keys")).all()
        recent = repos.misses.recent(50, "timings")
    assert stored and len(misses) == len(stored) == len(recent)
    assert all((m["outcome"], m["nearest"], m["differs"]) == ("no_entry", None, []) for m in misses)
    wanted = {(r["factors"]["op"][1], r["factors"]["inputs[0]"][1]) for r in recent}
    assert wanted == {(op, repr(ast.literal_eval(inputs)[0])) for op, inputs in stored}


def test_seconds_saved_is_compile_time_times_hits(run) -> None:
    rows = {r["kind"]: r for r in run[0]["stats"]["rows"]}
    db = CacheDB(str(run[1]))
    try:
        with db.engine.connect() as conn:
            want = {k: n / 1e9 for k, n in conn.execute(text(
                "SELECT kind, sum(coalesce(time_taken_ns, 0) * hit_count) FROM guarded_entries GROUP BY kind"))}
    finally:
        db.close()
    assert want["aotautograd"] > 0  # the last step hit the first step's entries
    for kind in ("fxgraph", "aotautograd"):
        assert rows[kind]["seconds_saved"] == pytest.approx(want[kind], abs=1e-3)
    assert rows["total"]["seconds_saved"] == pytest.approx(sum(want.values()), abs=2e-3)


def test_factors_stored_compactly_and_cleared_with_their_entries(run, tmp_path: Path) -> None:
    path = tmp_path / "copy.db"
    shutil.copy(run[1], path)
    db = CacheDB(str(path))
    try:
        with db.engine.connect() as conn:
            entries = dict(conn.execute(text("SELECT kind, count(*) FROM entry_factors GROUP BY kind")).all())
            shared = conn.execute(text("SELECT count(*) FROM key_factors")).scalar_one()
            # SQL over the factors: the dtype of the first input of every stored FX graph entry
            dtypes = set(conn.execute(text(
                "SELECT f.value FROM entry_factors e, json_each(e.factor_ids) j JOIN key_factors f ON f.id = j.value "
                "WHERE e.kind = 'fxgraph' AND f.factor = 'example_inputs[0]'")).scalars())
        # one per key compiled (the guard step's second variant shares its key's; the freezing
        # step's graph has FX graph factors, its AOTAutograd bypass none); ~600 factors a key,
        # nearly all shared, by the AOTAutograd keys too (the same Inductor config)
        # and one per C++ host its libraries were stored for: this one and the other host's
        assert entries == {"fxgraph": 10, "aotautograd": 10, "cpp_host": 2, "best_config": 1} and shared < 2 * 600
        assert {"float32[64]", "float64[64]", "float32[32]"} <= dtypes
        with db.transaction() as repos:
            repos.guarded.clear("fxgraph")
            repos.guarded.clear("aotautograd")
        with db.engine.connect() as conn:  # a host's factors stay while it has libraries
            assert dict(conn.execute(text("SELECT kind, count(*) FROM entry_factors GROUP BY kind")).all()) == {
                "cpp_host": 2, "best_config": 1}
        with db.transaction() as repos:
            repos.artifacts.evict(max_bytes=0)  # and its hosts' factors
            repos.session.execute(text("DELETE FROM best_configs"))
            repos.key_factors.delete_orphans()
        with db.engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM entry_factors")).scalar_one() == 0
    finally:
        db.close()
    res = CliRunner().invoke(main, ["--db", str(path), "misses", "--format", "json"])
    assert res.exit_code == 0, res.output
    # no stored entry has factors left (a guard miss names its own key, whose guards failed)
    assert all(m["nearest"] is None for m in json.loads(res.stdout)
               if m["outcome"] not in ("guards_failed", "configs_changed") and m["kind"] != "timings")


def _without_entries(source: Path, target: Path) -> Path:
    """A copy of ``source`` with its miss log and without its entries (nor their factors) or
    autotune timings."""
    shutil.copy(source, target)
    db = CacheDB(str(target))
    try:
        with db.transaction() as repos:
            repos.guarded.clear("fxgraph")
            repos.guarded.clear("aotautograd")
            for table in ("autotune_run_timings", "autotune_runs", "autotune_keys"):
                repos.session.execute(text(f"DELETE FROM {table}"))
            repos.artifacts.evict(max_bytes=0)  # and its hosts' factors
            repos.session.execute(text("DELETE FROM best_configs"))
            repos.key_factors.delete_orphans()
    finally:
        db.close()
    return target


def _misses_json(db: Path, *options: str) -> list[dict]:
    res = CliRunner().invoke(main, ["--db", str(db), "misses", "-n", "50", "--format", "json", *options])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_misses_against_the_shared_tier(run, module_pg_url: str, tmp_path: Path) -> None:
    """Machine A (the child) wrote its entries with their factors to the shared tier; machine
    B holds the same misses and no entry: against its own database nothing is near, against
    the shared tier each miss names A's nearest key and the factors that differ."""
    report, db = run
    b = _without_entries(db, tmp_path / "b.db")
    stored_for_the_key = ("guards_failed", "configs_changed")  # what the miss itself saw stored
    assert all(m["nearest"] is None for m in _misses_json(b) if m["outcome"] not in stored_for_the_key)
    shared: dict[tuple[str, str], dict] = {}
    for m in _misses_json(b, "--remote", module_pg_url):  # newest first: a key's newest miss
        shared.setdefault((m["kind"], m["key"]), m)
    dtype = shared[("fxgraph", _only(report, "dtype")["key"])]
    assert dtype["nearest"] == _only(report, "base")["key"]
    assert dtype["differs"] == [{"factor": "example_inputs[0]", "stored": "float32[64]", "wanted": "float64[64]"}]
    aot = shared[("aotautograd", _aot(report, "aot_config")["key"])]
    assert aot["nearest"] == _aot(report, "base")["key"]
    assert _factors(aot) == ["autograd_config.activation_memory_budget"]
    guard = shared[("fxgraph", _only(report, "guard")["key"])]  # A holds variants of the key: their guards failed
    assert guard["nearest"] == guard["key"] and "6 <= " in guard["guards"][0]
    shape = shared[("timings", _timing(report, "t_shape")["key"])]  # A's timings went to the shared tier
    # A's C++ libraries went there too (by host key; their host's factors stay in A's file)
    library = shared[("cpp", _library(report, "dtype")["key"])]
    assert library["nearest"].split("@")[0] == _library(report, "base")["key"] and _factors(library) == ["source"]
    assert shape["nearest"] == _timing(report, "t_base")["key"] and _factors(shape) == ["inputs[0]"]
    # every entry A wrote took its factors to the shared tier
    remote = CacheDB(module_pg_url, upgrade=False)
    try:
        with remote.engine.connect() as conn:
            counts = dict(conn.execute(text("SELECT kind, count(*) FROM entry_factors GROUP BY kind")).all())
    finally:
        remote.close()
    assert counts == {"fxgraph": 10, "aotautograd": 10}


def test_misses_remote_that_is_no_database(run, tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["--db", str(run[1]), "misses", "--remote", str(tmp_path / "none.db")])
    assert res.exit_code == 1
    assert str(tmp_path / "none.db") in res.output and len(res.output.strip().splitlines()) == 1


def _all_factors(location: str) -> dict[tuple[str, str], dict[str, tuple[str, str]]]:
    """``{(kind, key): {factor: (hash, value)}}`` of every entry of the database at ``location``."""
    db = CacheDB(location, upgrade=False)
    try:
        with db.read() as repos:
            return {(kind, key): f for kind in ("fxgraph", "aotautograd")
                    for key, (_at, f) in repos.key_factors.all_of_kind(kind).items()}
    finally:
        db.close()


def test_copy_and_merge_carry_factors(run, pg_url: str, tmp_path: Path) -> None:
    """SQLite -> PostgreSQL -> SQLite keeps every entry's factors; a merge into a database
    whose ids differ remaps them, keeps its own, and adds nothing the second time."""
    want = _all_factors(str(run[1]))
    assert len(want) == 20
    report = copy_database(run[1], pg_url)
    # and the factors of the two C++ hosts of its libraries and of its best config
    assert report.tables["entry_factors"].added == 23 and report.tables["key_factors"].added > 600
    assert _all_factors(pg_url) == want
    back = tmp_path / "back.db"
    copy_database(pg_url, back)
    assert _all_factors(str(back)) == want
    other = tmp_path / "other.db"
    with CacheDB(other) as db, db.transaction() as repos:  # other ids: rows of its own first
        repos.key_factors.ids([Factor(f"own{i}", "h", "v") for i in range(50)])
        repos.guarded.put("fxgraph", "fown", b"\x80\x04N.", guards_expr=None)
        repos.key_factors.put("fxgraph", "fown", [Factor("gm", "hown", "own code")])
    merged = merge_databases([run[1]], other)
    assert merged.tables["entry_factors"].added == 23
    assert _all_factors(str(other)) == {**want, ("fxgraph", "fown"): {"gm": ("hown", "own code")}}
    again = merge_databases([run[1]], other)
    assert (again.tables["entry_factors"].added, again.tables["key_factors"].added) == (0, 0)


def test_remote_pull_carries_factors(run, module_pg_url: str, tmp_path: Path) -> None:
    """Machine B pulls A's entries from the shared tier in one query each; their factors land
    in B's file (the factor rows B had not seen looked up after the pull)."""
    report, db = run
    want = _all_factors(str(db))
    tier = RemoteTier(module_pg_url, trust=TrustPolicy(accept_unsigned=True))
    b = LiveStore(str(tmp_path / "b.db"), remote=tier)
    keys = [("fxgraph", _only(report, "base")["key"]), ("aotautograd", _aot(report, "base")["key"]),
            ("fxgraph", _only(report, "dtype")["key"])]
    try:
        for kind, key in keys:
            before = tier.counts["lookup_statements"]
            assert list(b.guarded_candidates(kind, key))
            assert tier.counts["lookup_statements"] - before == 1
            assert tier.flush(30)
    finally:
        b.close()
    assert tier.counts["failures"] == 0
    assert _all_factors(str(tmp_path / "b.db")) == {k: want[k] for k in keys}


def test_csv_output(run) -> None:
    res = CliRunner().invoke(main, ["--db", str(run[1]), "misses", "-n", "2", "--format", "csv"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].startswith("missed_at,kind,key,outcome,nearest,differs") and len(lines) == 3


def test_miss_log_is_a_ring(tmp_path: Path) -> None:
    db = CacheDB(str(tmp_path / "ring.db"))
    try:
        for i in range(7):
            with db.transaction() as repos:
                repos.misses.add("fxgraph", f"k{i}", "no_entry", [Factor("gm", f"h{i}", f"v{i}")], keep=3)
        with db.read() as repos:
            recent = repos.misses.recent(10)
            assert [m["key"] for m in recent] == ["k6", "k5", "k4"]
            assert recent[0]["factors"] == {"gm": ("h6", "v6")}
    finally:
        db.close()


def test_miss_log_setting() -> None:
    assert read("CACHEDB_MISS_LOG", {}) == 1000
    assert read("CACHEDB_MISS_LOG", {"CACHEDB_MISS_LOG": "0"}) == 0
    with pytest.raises(SettingError):
        read("CACHEDB_MISS_LOG", {"CACHEDB_MISS_LOG": "-1"})


def test_factors_of_torchs_own_hash() -> None:
    """``compiled_fx_graph_hash`` (torch/_inductor/codecache.py) on a traced graph: one factor
    per debug line, and another input dtype changes that input's factor alone."""
    from torch._inductor.codecache import compiled_fx_graph_hash

    gm = torch.fx.symbolic_trace(lambda x: torch.sin(x) + 1)
    _, lines = compiled_fx_graph_hash(gm, [torch.randn(4)], {}, [])
    _, other = compiled_fx_graph_hash(gm, [torch.randn(4, dtype=torch.float64)], {}, [])
    a = {f.factor: (f.hash, f.value) for f in parse_debug_lines(lines)}
    b = {f.factor: (f.hash, f.value) for f in parse_debug_lines(other)}
    assert len(a) == sum(1 for line in lines if line.startswith("["))
    assert a["example_inputs[0]"][1] == "float32[4]"
    assert "inductor_config.max_autotune_pointwise" in a
    assert [(d.factor, d.stored, d.wanted) for d in differences(a, b)] == [
        ("example_inputs[0]", "float32[4]", "float64[4]")]


_names = st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True)
_values = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=300)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_names, st.none() | st.integers(0, 9) | _names,
                          st.from_regex(r"[a-z2-7]{52}", fullmatch=True), _values), max_size=30))
def test_parse_debug_lines_property(items) -> None:
    """Lines in ``FxGraphCachePickler.debug_lines``' form parse back to their names, hash
    prefixes and (folded, cut) values; a name met twice keeps its first value."""
    lines, expected = [], {}
    for name, item, h, value in items:
        shown = name if item is None else f"{name}[{item}]"
        lines.append(f"[{h}] {shown}: {value}")
        factor = name if item is None else f"{name}[{item}]" if isinstance(item, int) else f"{name}.{item}"
        expected.setdefault(factor, (h[:16], readable(value, h[:16])))
    got = {f.factor: (f.hash, f.value) for f in parse_debug_lines(lines)}
    assert got == expected
    assert all(len(v) <= 200 for _h, v in got.values())
    assert equal_count(got, got) == len(got) and differences(got, got) == []
