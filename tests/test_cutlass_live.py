"""CUTLASS op lists, live: torch's own ``maybe_fetch_ops`` served from the database, and
``cachedb cutlass generate`` running torch's own generator.

Real data: the corpus list ``configs_b15d29dd.json`` (torch 2.13.0 ``gen_ops`` + serializer,
arch 90, CUDA 12.8, level "0"; 21,268 ops). Torch-side checks run in subprocesses with their
own empty ``TORCHINDUCTOR_CACHE_DIR`` (``cache_dir()``, the CUTLASS import and the arch/version
are cached per process).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sqlalchemy import text

from cachedb import CacheDB
from cachedb.layout.importer import Importer

torch = pytest.importorskip("torch")
pytest.importorskip("cutlass_library")

#: The real op list, kept in the repository (tests/data/, 550 KB gzipped) so a plain clone passes.
CORPUS = Path(__file__).resolve().parent / "data" / "configs_b15d29dd.json.gz"
CORPUS_KEY = "b15d29dd"
CORPUS_OPS = 21_268
CORPUS_BYTES = 83_690_684
CORPUS_SHA256 = "2820f5b653beb44f49b2e14c485de48f4767efa288a3f8dabc7cafa8dd31218b"
#: The corpus key was computed by this torch (the key hashes codegen/cutlass/{serialization,utils}.py).
SAME_TORCH = torch.__version__.split("+")[0] == "2.13.0"

def _env(cache_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_")}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    return env


def _run_json(script: str, cache_dir: Path, *args: str, timeout: int = 300) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True, text=True, env=_env(cache_dir), timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def corpus_bytes() -> bytes:
    data = gzip.decompress(CORPUS.read_bytes())
    assert len(data) == CORPUS_BYTES and hashlib.sha256(data).hexdigest() == CORPUS_SHA256
    return data


@pytest.fixture(scope="module")
def corpus_db(tmp_path_factory: pytest.TempPathFactory, corpus_bytes: bytes) -> Path:
    """A database holding the real corpus list, imported as a cache directory would be."""
    root = tmp_path_factory.mktemp("cutlass_corpus")
    src = root / "src"
    src.mkdir()
    (src / f"configs_{CORPUS_KEY}.json").write_bytes(corpus_bytes)
    path = root / "corpus.db"
    db = CacheDB(path)
    try:
        report = Importer(db).run(src)
        assert report.problems == [] and report.added["cutlass_op_list"] == 1
        with db.read() as repos:
            assert repos.cutlass.get(CORPUS_KEY) == corpus_bytes
    finally:
        db.close()
    return path


# The child: torch's patched maybe_fetch_ops under arch 90 / CUDA 12.8 / level "0" and a CUTLASS
# root (the installed packages) whose cutlass_key() is sha256(b""), like the corpus key's.
_FETCH = """
import hashlib, json, os, sys
db_path, root_base = sys.argv[1], sys.argv[2]
cache_dir = os.path.realpath(os.environ["TORCHINDUCTOR_CACHE_DIR"])
opened = []
def audit(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.path.realpath(os.fsdecode(args[0]))
        if path.startswith(cache_dir + os.sep):
            opened.append(os.path.relpath(path, cache_dir))
sys.addaudithook(audit)

import torch
import torch._inductor.config as config
import cachedb
from cachedb.layout.cutlass_gen import _clear_caches, installed_cutlass_root
from torch._inductor.codecache import cutlass_key
from torch._inductor.codegen.cuda import cuda_env
from torch._inductor.codegen.cutlass import cache, serialization, utils

root = str(installed_cutlass_root(root_base))
patch = {"cuda.arch": "90", "cuda.version": "12.8", "cutlass.cutlass_instantiation_level": "0",
         "cutlass.cutlass_dir": root}
out = {}
with config.patch(patch):
    _clear_caches(cache, utils, serialization, cuda_env)
    out["cutlass_key_is_empty_sha256"] = cutlass_key() == hashlib.sha256(b"").digest()
    out["request_key"] = cache.get_config_request_key("90", "12.8", "0")
    with cachedb.installed(db_path):
        fetch = cache.maybe_fetch_ops
        out["patched"] = fetch.__module__.startswith("cachedb.")
        fetch.cache_clear()
        del opened[:]
        ops = fetch("cuda")
        out["opened_during_fetch"] = list(opened)
        out["count"] = None if ops is None else len(ops)
        out["types"] = sorted({type(op).__qualname__ for op in ops or []})
        ser = serialization.get_cutlass_operation_serializer()
        out["reserialized_sha256"] = hashlib.sha256(
            json.dumps([ser.serialize(op) for op in ops or []]).encode()).hexdigest()
        out["archs"] = sorted({op.arch for op in ops or []})
    # cachedb uninstalled: torch's own function again, and no configs_*.json in the cache dir.
    out["restored"] = not cache.maybe_fetch_ops.__module__.startswith("cachedb.")
    cache.maybe_fetch_ops.cache_clear()
    out["without_cachedb"] = cache.maybe_fetch_ops("cuda")
    _clear_caches(cache, utils, serialization, cuda_env)
out["cache_dir_files"] = sorted(
    os.path.relpath(os.path.join(d, f), cache_dir) for d, _, fs in os.walk(cache_dir) for f in fs)
print(json.dumps(out))
"""


def test_maybe_fetch_ops_served_from_db(corpus_db: Path, tmp_path: Path) -> None:
    cache_dir = tmp_path / "inductor"
    cache_dir.mkdir()
    out = _run_json(_FETCH, cache_dir, str(corpus_db), str(tmp_path / "cutlass_root_base"))
    assert out["cutlass_key_is_empty_sha256"] is True
    if SAME_TORCH:
        assert out["request_key"] == CORPUS_KEY
    assert out["patched"] is True and out["restored"] is True
    # 21,268 GemmOperation objects, deserialized by torch from the database's bytes ...
    assert out["count"] == CORPUS_OPS
    assert out["types"] == ["GemmOperation"]
    assert out["archs"] == [90]
    # ... that serialize back to the corpus list byte for byte (same order, same fields).
    assert out["reserialized_sha256"] == CORPUS_SHA256
    # Nothing was read from the cache directory, and no op list is in it.
    assert out["opened_during_fetch"] == []
    assert not [f for f in out["cache_dir_files"] if f.startswith("configs_")]
    # Without cachedb, torch's own maybe_fetch_ops finds nothing.
    assert out["without_cachedb"] is None


def test_generate_reproduces_corpus_ops(corpus_bytes: bytes, tmp_path: Path) -> None:
    """``cachedb cutlass generate --arch 90 --cuda 12.8`` runs torch's generator (~10 s on 2
    cores) and stores the list under the key ``get_config_request_key`` gives. The ops are the
    corpus ops; their order is not reproducible (cutlass_library puts identity-hashed
    ``TileDescription`` objects in a set), so the bytes are compared as a multiset of ops."""
    cache_dir = tmp_path / "inductor"
    cache_dir.mkdir()
    db_path = tmp_path / "gen.db"
    proc = subprocess.run(
        [sys.executable, "-m", "cachedb", "--db", str(db_path), "cutlass", "generate",
         "--arch", "90", "--cuda", "12.8"],
        capture_output=True, text=True, env=_env(cache_dir), timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines()[:3])
    key = lines["request key"]
    assert int(lines["ops"]) == CORPUS_OPS
    assert int(lines["bytes"]) == CORPUS_BYTES

    # The key is what torch's own get_config_request_key gives for this configuration.
    expected = _run_json(
        """
        import json, sys, torch._inductor.config as config
        from cachedb.layout.cutlass_gen import installed_cutlass_root
        from torch._inductor.codegen.cutlass.cache import get_config_request_key
        with config.patch({"cutlass.cutlass_dir": str(installed_cutlass_root(sys.argv[1]))}):
            print(json.dumps({"key": get_config_request_key("90", "12.8", "0")}))
        """,
        cache_dir, str(tmp_path / "root_base"),
    )["key"]
    assert key == expected
    if SAME_TORCH:
        assert key == CORPUS_KEY

    db = CacheDB(db_path)
    try:
        with db.read() as repos:
            data = repos.cutlass.get(key)
            row = repos.session.execute(
                text(
                    "SELECT arch, cuda_version, instantiation_level, op_count FROM cutlass_op_lists "
                    "WHERE request_key = :k"
                ),
                {"k": key},
            ).one()
            n_rows = repos.session.execute(
                text("SELECT count(*) FROM cutlass_ops")
            ).scalar()
    finally:
        db.close()
    assert tuple(row) == (90, "12.8", "0", CORPUS_OPS) and n_rows == CORPUS_OPS
    assert data is not None and len(data) == CORPUS_BYTES
    # The byte format is the corpus's (json.dumps of a list of strings, default separators).
    assert data[:3] == b'["{' and data.endswith(b'}"]') and b'", "' in data[:100_000]
    generated = json.loads(data)
    corpus = json.loads(corpus_bytes)
    assert json.dumps(generated).encode() == data
    if SAME_TORCH:
        assert sorted(generated) == sorted(corpus)  # the same 21,268 ops


def test_generate_without_cutlass_root_raises(tmp_path: Path) -> None:
    from cachedb.layout.cutlass_gen import CutlassUnavailableError, generate

    with pytest.raises(CutlassUnavailableError, match="not a CUTLASS root"):
        generate("90", "12.8", cutlass_dir=tmp_path)


def test_missing_cutlass_library_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from cachedb import CacheDBError
    from cachedb.layout import cutlass_gen

    real = importlib.util.find_spec
    monkeypatch.setattr(
        cutlass_gen.importlib.util, "find_spec", lambda name, *a: None if name == "cutlass_library" else real(name, *a)
    )
    with pytest.raises(cutlass_gen.CutlassUnavailableError, match="cutlass_library") as info:
        cutlass_gen.installed_cutlass_root(tmp_path)
    assert isinstance(info.value, CacheDBError)


def test_missing_torch_raises_torch_unavailable(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(
            """
            import sys
            sys.modules["torch"] = None  # import torch raises ImportError
            from cachedb import TorchUnavailableError
            from cachedb.layout.cutlass_gen import generate
            try:
                generate("90", "12.8")
            except TorchUnavailableError as exc:
                print("ok", exc)
            """
        )],
        capture_output=True, text=True, env=_env(tmp_path), timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("ok ")
