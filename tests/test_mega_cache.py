"""Mega-Cache interop on real artifacts: ``torch.compiler.save_cache_artifacts()`` blobs into the
database (``cachedb import-artifacts``), back out (``cachedb export-artifacts``) into
``torch.compiler.load_cache_artifacts``, and ``load_cache_artifacts`` under the live backend.

The compiles run in subprocesses, each with its own empty ``TORCHINDUCTOR_CACHE_DIR``
(torch caches ``cache_dir()`` and compiled modules per process).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
import zlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from cachedb import BadInputError, CacheDB
from cachedb.cli import main as cli

from ._realcache import probe_files, seeded

#: Its module fixtures build real caches: one worker builds each once (xdist --dist loadgroup).
pytestmark = pytest.mark.xdist_group("mega_cache")

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

# The compiles (a) and (b) share: an MLP forward under no_grad, and a forward + backward.
_WORKLOADS = """
def run_workloads(torch):
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert torch.allclose(torch.compile(mlp)(x), mlp(x), atol=1e-5, rtol=1e-4)
    train = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    torch.compile(train)(torch.randn(4, 8)).pow(2).mean().backward()
    assert all(p.grad is not None for p in train.parameters())

def counter_groups():
    from torch._dynamo.utils import counters
    return {g: {k: int(v) for k, v in counters[g].items()} for g in ("inductor", "aot_autograd")}

def tree(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)
"""

# Cold: compile, save a best config through torch's AutotuneCache next to the MLP's generated
# module (examples/build_cache.py, workload e), then save_cache_artifacts().
_COLD = """
import json, os, sys
sys.path.insert(0, sys.argv[2])
import build_cache as bc
import torch
root = os.path.realpath(os.environ["TORCHINDUCTOR_CACHE_DIR"])
""" + _WORKLOADS + """
before = bc._loaded_module_files()
run_workloads(torch)
kernel_py = next(m for m in sorted(bc._loaded_module_files() - before) if m.startswith(root + os.sep))
best = bc._workload_best_config(torch, kernel_py)
assert best["ok"], best
blob, info = torch.compiler.save_cache_artifacts()
with open(sys.argv[1], "wb") as f:
    f.write(blob)
print(json.dumps({"artifacts": {t: len(k) for t, k in info.artifacts.items()},
                  "keys": {t: list(k) for t, k in info.artifacts.items()},
                  "best_config": best["best_config"], "counters": counter_groups()}))
"""

# Warm: a new empty cache dir, load_cache_artifacts(blob), the same compiles.
_WARM = """
import json, os, sys
import torch
root = os.path.realpath(os.environ["TORCHINDUCTOR_CACHE_DIR"])
""" + _WORKLOADS + """
with open(sys.argv[1], "rb") as f:
    info = torch.compiler.load_cache_artifacts(f.read())
loaded = {t: len(k) for t, k in info.artifacts.items()}
best = {p: open(os.path.join(root, p)).read() for p in tree(root) if p.endswith(".best_config")}
from torch._dynamo.utils import counters
counters.clear()
run_workloads(torch)
print(json.dumps({"loaded": loaded, "best_configs": best, "counters": counter_groups()}))
"""

# Live: cachedb installed, load_cache_artifacts(blob) lands in the database; then the same
# compiles are served from it.
_LIVE = """
import json, os, sys
import torch
import cachedb
root = os.path.realpath(os.environ["TORCHINDUCTOR_CACHE_DIR"])
""" + _WORKLOADS + """
with cachedb.installed(sys.argv[1]):
    with open(sys.argv[2], "rb") as f:
        info = torch.compiler.load_cache_artifacts(f.read())
    after_load = tree(root)
    from torch._dynamo.utils import counters
    counters.clear()
    run_workloads(torch)
print(json.dumps({"loaded": {t: len(k) for t, k in info.artifacts.items()}, "after_load": after_load,
                  "after_compile": tree(root), "counters": counter_groups()}))
"""


def _run(script: str, cache_dir: Path, *args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_")}
    env["TORCHINDUCTOR_CACHE_DIR"] = seeded(cache_dir)  # torch's ISA probes: not what is checked
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    proc = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _kind_counts(db_path: Path) -> dict[str, int]:
    db = CacheDB(db_path)
    try:
        with db.read() as repos:
            counts = dict(
                repos.session.execute(text("SELECT kind, count(*) FROM guarded_entries GROUP BY kind")).all()
            )
            counts["best_config"] = repos.session.execute(text("SELECT count(*) FROM best_configs")).scalar()
    finally:
        db.close()
    return counts


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A real Mega-Cache blob from a cold process: (blob file, summary)."""
    root = tmp_path_factory.mktemp("mega_cold")
    blob = root / "cold.bin"
    summary = _run(_COLD, root / "inductor", str(blob), str(EXAMPLES))
    assert summary["counters"]["inductor"].get("fxgraph_cache_miss", 0) >= 3
    assert summary["artifacts"]["inductor"] >= 3 and summary["artifacts"]["aot_autograd"] >= 2
    assert summary["artifacts"]["autotune"] == 1
    return blob, summary


@pytest.fixture(scope="module")
def imported(cold: tuple[Path, dict], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """(a) ``cachedb import-artifacts`` of the cold blob into a new database."""
    blob, _ = cold
    db_path = tmp_path_factory.mktemp("mega_db") / "cache.db"
    result = CliRunner().invoke(cli, ["--db", str(db_path), "import-artifacts", str(blob)])
    assert result.exit_code == 0, result.output
    return db_path


def test_import_artifacts_stores_every_entry(cold: tuple[Path, dict], imported: Path) -> None:
    blob, summary = cold
    counts = _kind_counts(imported)
    assert counts["fxgraph"] == summary["artifacts"]["inductor"]
    assert counts["aotautograd"] == summary["artifacts"]["aot_autograd"]
    assert counts["best_config"] == 1
    db = CacheDB(imported)
    try:
        with db.read() as repos:
            keys = set(repos.session.execute(text("SELECT key FROM guarded_entries")).scalars())
            best = repos.best_configs.iter_all()
            best_keys = [k for k, _ in best]
            guards = repos.session.execute(
                text("SELECT count(*) FROM guarded_entries WHERE guards_known AND time_taken_ns > 0")
            ).scalar()
    finally:
        db.close()
    assert keys == set(summary["keys"]["inductor"]) | set(summary["keys"]["aot_autograd"])
    assert best_keys == [summary["best_config"]]
    assert guards == len(keys)  # read from the opcode stream, never unpickled
    # Idempotent: a second import adds nothing.
    again = CliRunner().invoke(cli, ["--db", str(imported), "import-artifacts", str(blob)])
    assert again.exit_code == 0, again.output
    assert _kind_counts(imported) == counts


def test_exported_blob_warms_a_fresh_cache_dir(imported: Path, cold: tuple[Path, dict], tmp_path: Path) -> None:
    """(b) ``cachedb export-artifacts``, then load_cache_artifacts in a fresh process with an
    empty cache dir: the same compiles are FX graph and AOTAutograd cache hits only."""
    _, summary = cold
    blob = tmp_path / "exported.bin"
    result = CliRunner().invoke(cli, ["--db", str(imported), "export-artifacts", str(blob)])
    assert result.exit_code == 0, result.output
    out = _run(_WARM, tmp_path / "warm", str(blob))
    assert out["loaded"] == summary["artifacts"]
    inductor, aot = out["counters"]["inductor"], out["counters"]["aot_autograd"]
    assert inductor.get("fxgraph_cache_hit", 0) > 0 and inductor.get("fxgraph_cache_miss", 0) == 0
    assert aot.get("autograd_cache_hit", 0) > 0 and aot.get("autograd_cache_miss", 0) == 0
    db = CacheDB(imported)
    try:
        with db.read() as repos:
            stored = dict(repos.best_configs.iter_all())
    finally:
        db.close()
    assert out["best_configs"] == stored  # written at <cache dir>/<k[1:3]>/<name>.best_config


def test_load_cache_artifacts_under_cachedb_lands_in_db(cold: tuple[Path, dict], tmp_path: Path) -> None:
    """(c) ``cachedb.installed``: load_cache_artifacts writes FX/AOT entries and the best config
    to the database (patched ``_write_to_local_cache`` / ``AutotuneCacheArtifact.populate_cache``),
    nothing to the cache dir; the same compiles are then served from the database."""
    blob, summary = cold
    db_path = tmp_path / "live.db"
    CacheDB(db_path).close()
    cache_dir = tmp_path / "live"
    out = _run(_LIVE, cache_dir, str(db_path), str(blob))
    assert out["loaded"] == summary["artifacts"]
    probes = probe_files()
    assert [p for p in out["after_load"] if p not in probes] == []
    assert _kind_counts(db_path) == {
        "fxgraph": summary["artifacts"]["inductor"],
        "aotautograd": summary["artifacts"]["aot_autograd"],
        "best_config": 1,
    }
    leftovers = [p for p in out["after_compile"] if p.split("/")[0] in ("fxgraph", "aotautograd") or p.endswith(".best_config")]
    assert leftovers == []
    assert not (cache_dir / "fxgraph").exists() and not (cache_dir / "aotautograd").exists()
    inductor, aot = out["counters"]["inductor"], out["counters"]["aot_autograd"]
    assert inductor.get("fxgraph_cache_hit", 0) > 0 and inductor.get("fxgraph_cache_miss", 0) == 0
    assert aot.get("autograd_cache_hit", 0) > 0 and aot.get("autograd_cache_miss", 0) == 0


# --------------------------------------------------------------------------- synthetic blobs


class _Entry:
    """Stands in for a pickled CompiledFxGraph: an object whose state has the fields cachedb reads."""

    def __init__(self, guards_expr: str | None, ns: int) -> None:
        self.guards_expr = guards_expr
        self._time_taken_ns = ns


def _blob(chunks: list[tuple[str, list[tuple[str, bytes]]]]) -> bytes:
    """A blob written by torch's own serializer (unregistered types included)."""
    from torch.compiler._cache import CacheArtifactManager, _serialize_single_cache
    from torch.utils._appending_byte_serializer import AppendingByteSerializer

    CacheArtifactManager._ensure_cache_artifacts_registered()
    ser = AppendingByteSerializer(serialize_fn=_serialize_single_cache)
    ser.extend((t, [SimpleNamespace(key=k, content=c) for k, c in arts]) for t, arts in chunks)
    return ser.to_bytes()


def _with_crc(body: bytes) -> bytes:
    return zlib.crc32(body).to_bytes(4, "big") + body


@pytest.fixture
def db(tmp_path: Path) -> Iterator[CacheDB]:
    database = CacheDB(tmp_path / "synthetic.db")
    try:
        yield database
    finally:
        database.close()


def test_import_keeps_every_chunk_and_skips_other_types(db: CacheDB) -> None:
    from cachedb.layout.mega_cache import import_artifacts

    e1, e2 = pickle.dumps(_Entry(None, 5)), pickle.dumps(_Entry("2 <= L['t0']", 7))
    data = _blob([
        ("inductor", [("fa" + "a" * 51, e1)]),
        ("pgo", [("mast:x", b"\x00pgo")]),
        ("no_such_type", [("k", b"v")]),
        ("inductor", [("fb" + "b" * 51, e2), ("fa" + "a" * 51, e2)]),  # a second chunk: kept
        ("autotune", [("ab/abc.best_config", b'{"XBLOCK": 128, "num_warps": 4}')]),
    ])
    # torch's own deserializer fails on a type it does not register, and keeps only the last
    # chunk of a type (a dict of the chunk list): cachedb keeps every chunk.
    from torch.compiler._cache import CacheArtifactManager

    assert CacheArtifactManager.deserialize(data) is None
    two_chunks = _blob([("inductor", [("fa" + "a" * 51, e1)]), ("inductor", [("fb" + "b" * 51, e2)])])
    assert [a.key for a in CacheArtifactManager.deserialize(two_chunks)["inductor"]] == ["fb" + "b" * 51]
    report = import_artifacts(db, data)
    assert report.artifacts == {"inductor": 3, "pgo": 1, "no_such_type": 1, "autotune": 1}
    assert report.added == {"fxgraph": 3, "best_config": 1, "pgo_profile": 1} and report.problems == []
    assert report.skipped == {"no_such_type": 1}
    assert {n.path for n in report.notes} == {"no_such_type"}
    with db.read() as repos:
        variants = repos.guarded.candidates("fxgraph", "fa" + "a" * 51)
        assert len(variants) == 2
        guards = set(repos.session.execute(text("SELECT guards_expr FROM guarded_entries")).scalars())
        assert guards == {None, "2 <= L['t0']"}
        # a PGO profile is kept under its file name's key, its pickle as it came (never loaded)
        assert repos.pgo.get("mast_x") == b"\x00pgo"
    # Export writes both variants of the key back; torch reads the blob.
    from cachedb.layout.mega_cache import build_artifacts

    exported = build_artifacts(db)
    assert exported.counts == {"inductor": 3, "autotune": 1, "pgo": 1}
    back = CacheArtifactManager.deserialize(exported.data)
    assert sorted(a.key for a in back["inductor"]) == ["fa" + "a" * 51] * 2 + ["fb" + "b" * 51]
    assert back["autotune"][0].content == b'{"XBLOCK": 128, "num_warps": 4}'


def test_bad_artifacts_are_listed_and_the_rest_stored(db: CacheDB) -> None:
    from cachedb.layout.mega_cache import import_artifacts

    good = pickle.dumps(_Entry(None, 1))
    data = _blob([
        ("inductor", [("fc" + "c" * 51, good[:-3]), ("../../etc", good), ("fd" + "d" * 51, good)]),
        ("aot_autograd", [("f-not-an-aot-key", good)]),
        ("autotune", [("/abs/ab/x.best_config", b"{}"), ("ab/y.best_config", b"[1]")]),
    ])
    report = import_artifacts(db, data, where="x.bin")
    assert report.added == {"fxgraph": 1}
    problems = {p.path: p.reason for p in report.problems}
    assert set(problems) == {
        "inductor:fc" + "c" * 51, "inductor:../../etc", "aot_autograd:f-not-an-aot-key",
        "autotune:/abs/ab/x.best_config", "autotune:ab/y.best_config",
    }
    assert "JSON object" in problems["autotune:ab/y.best_config"]


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"", "not a Mega-Cache blob"),
        (b"\x00\x00\x00\x00" + (1).to_bytes(8, "big"), "checksum"),
        (_with_crc((2).to_bytes(8, "big")), "encoding version 2"),
        (_with_crc((1).to_bytes(8, "big") + (2**60).to_bytes(8, "big")), "truncated"),
        # A valid checksum and a count far beyond the data: bounded, not an endless loop.
        (_with_crc((1).to_bytes(8, "big") + (4).to_bytes(8, "big") + b"cGdv" + (2**62).to_bytes(8, "big")), "truncated"),
        (_with_crc((1).to_bytes(8, "big") + (4).to_bytes(8, "big") + b"//4="), "bad string"),
    ],
)
def test_bad_blobs_raise_bad_input(db: CacheDB, data: bytes, reason: str) -> None:
    from cachedb.layout.mega_cache import import_artifacts

    with pytest.raises(BadInputError, match=reason) as info:
        import_artifacts(db, data, where="blob.bin")
    assert info.value.where == "blob.bin"


def test_cli_errors_and_empty_export(tmp_path: Path) -> None:
    db_path = tmp_path / "empty.db"
    missing = CliRunner().invoke(cli, ["--db", str(db_path), "import-artifacts", str(tmp_path / "nope.bin")])
    assert missing.exit_code == 1 and "nope.bin" in missing.output and "cannot read" in missing.output
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a blob at all")
    bad = CliRunner().invoke(cli, ["--db", str(db_path), "import-artifacts", str(junk)])
    assert bad.exit_code == 1 and "junk.bin" in bad.output and "checksum" in bad.output
    out = tmp_path / "empty.bin"
    empty = CliRunner().invoke(cli, ["--db", str(db_path), "export-artifacts", str(out)])
    assert empty.exit_code == 0, empty.output
    from torch.compiler._cache import CacheArtifactManager

    assert CacheArtifactManager.deserialize(out.read_bytes()) == {}
    for command in ("import-artifacts", "export-artifacts"):
        help_text = CliRunner().invoke(cli, [command, "--help"]).output
        assert "Example:" in help_text


def test_missing_torch_raises_torch_unavailable(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None
        from cachedb import CacheDB, TorchUnavailableError
        from cachedb.layout.mega_cache import export_artifacts, import_artifacts
        db = CacheDB(sys.argv[1])
        for call in (lambda: export_artifacts(db), lambda: import_artifacts(db, b"")):
            try:
                call()
            except TorchUnavailableError:
                print("ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "t.db")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["ok", "ok"]
