"""Every autotune choice described: name, description and ``info_dict()`` beside its hash.

The real thing: a CPU max-autotune tuning with freezing (packed linear; ``_mkl_linear`` against
``cpp_CppMicroGemmFP32Vec_0``) under ``cachedb.installed`` in its own process, on a database
that holds the real Inductor cache of ``real_cache`` imported from its files first (no
descriptions there). One compile for this file (the :func:`tuned` fixture): the imported
cache's GEMM is keyed as it is after another compile, so the child tunes the builder's GEMM,
its MLP and the GEMM again in one process. Triton templates cannot be tuned without a GPU:
their choices are torch's own ``TritonTemplateCaller`` objects, made as
``TritonTemplate.generate`` makes them, handed to torch's own ``PersistentCache.lookup``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from cachedb import CacheDB
from cachedb.fingerprint import Fingerprint
from cachedb.layout.importer import Importer
from cachedb.repositories.choices import describe

from ._realcache import seeded

#: Its module fixtures build real caches: one worker builds each once (xdist --dist loadgroup).
pytestmark = pytest.mark.xdist_group("choices")

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
CHILD = Path(__file__).with_name("_tuning_child.py")

MM_INPUTS = ("[('cuda', 'torch.bfloat16', 4096, 4096, 4096, 1, 0), "
             "('cuda', 'torch.bfloat16', 4096, 4096, 4096, 1, 0)]")


def _rows(location: str | Path, sql: str, **params: Any) -> list[dict[str, Any]]:
    db = CacheDB(location)
    try:
        with db.engine.connect() as conn:
            return [dict(r) for r in conn.execute(text(sql), params).mappings()]
    finally:
        db.close()


def triton_choice(name: str, block_m: int, block_n: int, block_k: int, stages: int, warps: int,
                  module_key: str) -> Any:
    """A ``TritonTemplateCaller`` (torch/_inductor/select_algorithm.py) as
    ``TritonTemplate.generate`` makes one for an mm template: its description (the template's
    kwargs), its benchmark request (a ``TritonGPUBenchmarkRequest``: never run here) and the
    ``log_info`` whose fields ``info_dict()`` returns."""
    from torch._inductor.autotune_process import TensorMeta, TritonGPUBenchmarkRequest
    from torch._inductor.select_algorithm import TritonTemplateCaller

    meta = TensorMeta(torch.device("cuda"), torch.bfloat16, (4096, 4096), (4096, 1), 0)
    bmreq = TritonGPUBenchmarkRequest(
        kernel_name="triton_mm", input_tensor_meta=[meta, meta], output_tensor_meta=meta, extra_args=[],
        module_path=f"/nonexistent/{module_key}.py", module_cache_key=module_key, num_stages=stages,
        num_warps=warps)
    kwargs = {"ACC_TYPE": "'tl.float32'", "ALLOW_TF32": False, "BLOCK_K": block_k, "BLOCK_M": block_m,
              "BLOCK_N": block_n, "EVEN_K": True, "GROUP_M": 8, "USE_FAST_ACCUM": False}
    description = ", ".join([*(f"{k}={v}" for k, v in kwargs.items()), f"num_stages={stages}",
                             f"num_warps={warps}"])
    log_info = {"tile_shape": str((block_m, block_k, block_n)), "num_stages": stages, "num_warps": warps,
                "GROUP_M": 8, "allow_tf32": "False", "acc_type": "tl.float32", "matrix_instr_nonkdim": 0,
                "waves_per_eu": 0, "kpack": 2, "epilogue_subtile": 0}
    return TritonTemplateCaller(name, [], None, None, description, bmreq, log_info=log_info)


def _mm_choices() -> list[Any]:
    return [triton_choice("triton_mm_3", 128, 128, 64, 3, 8, "cmodulea"),
            triton_choice("triton_mm_4", 64, 128, 32, 4, 4, "cmoduleb")]


# --------------------------------------------------------------------------- what is stored


def test_a_triton_template_choice_is_stored_with_its_config() -> None:
    from torch._inductor.select_algorithm import DataProcessorChoiceCallerWrapper

    from cachedb.live._choices import describe_choice

    choice = _mm_choices()[0]
    row = describe_choice(choice, choice.hash_key())
    assert row is not None and row["choice_hash"] == "triton_mm-cmodulea"
    assert (row["name"], row["backend"], row["kernel_name"]) == ("triton_mm_3", "Triton", "triton_mm")
    assert (row["tile_shape"], row["num_stages"], row["num_warps"], row["group_m"]) == ("(128, 64, 128)", 3, 8, 8)
    assert "BLOCK_M=128" in row["description"] and "num_warps=8" in row["description"]
    assert json.loads(row["info_json"]) == choice.info_dict()
    # a wrapped choice (as C++ templates' are) forwards what torch says of it
    wrapped = DataProcessorChoiceCallerWrapper(choice, None, None)
    forwarded = describe_choice(wrapped, wrapped.hash_key())
    assert forwarded is not None and forwarded.pop("created_at") and row.pop("created_at")
    assert forwarded == row


def test_a_choice_torch_cannot_describe_is_stored_with_what_it_gives() -> None:
    from cachedb.live._choices import describe_choice

    class Unnamed:  # what PersistentCache.lookup needs of a choice, and nothing else
        def hash_key(self) -> str:
            return "x"

    assert describe_choice(Unnamed(), "x") is None
    choice = _mm_choices()[0]
    for info in ({1: "keys JSON cannot sort", "a": "b"}, None):  # what info_dict() now returns
        choice.log_info = info
        row = describe_choice(choice, choice.hash_key())
        assert row is not None and row["name"] == "triton_mm_3" and row["info_json"] == "{}"
        assert row["backend"] is None and row["kernel_name"] == "triton_mm" and "BLOCK_M=128" in row["description"]


def _two_devices(db: CacheDB) -> tuple[int, int]:
    """Timings of one bf16 GEMM on an H100 and an H200, the same two Triton configs and an
    extern mm on both; the descriptions of the three choices."""
    choices = _mm_choices()
    with db.transaction() as repos:
        h100 = repos.fingerprints.ensure(Fingerprint(
            system={"device": {"name": "NVIDIA H100 80GB HBM3"}, "version": {"cuda": "13.0"}, "hash": "a" * 64},
            torch_version="2.13.0"))
        h200 = repos.fingerprints.ensure(Fingerprint(
            system={"device": {"name": "NVIDIA H200"}, "version": {"cuda": "13.0"}, "hash": "b" * 64},
            torch_version="2.13.0"))
        repos.timings.record(h100, "mm", MM_INPUTS, "high", {"triton_mm-cmodulea": 0.52, "triton_mm-cmoduleb": 0.58,
                                                             "mm-cextern": 0.61})
        repos.timings.record(h200, "mm", MM_INPUTS, "high", {"triton_mm-cmodulea": 0.47, "triton_mm-cmoduleb": 0.44,
                                                             "mm-cextern": 0.50})
        added = repos.choices.put_new(
            [describe(c.hash_key(), c.name, c.description, c.info_dict()) for c in choices]
            + [describe("mm-cextern", "mm", "", {"backend": "extern", "kernel_call_name": "extern_kernels.mm"})])
        assert added == 3
        assert repos.choices.put_new([describe("mm-cextern", "mm", "changed", {})]) == 0  # the first stays
    return h100, h200


def _documented_queries() -> list[str]:
    doc = (ROOT / "docs" / "schema.md").read_text()
    queries = re.findall(r"```sql\n(.*?)```", doc.split("## Queries", 1)[1], re.S)
    return [q for q in queries if "autotune_" in q]  # the tuning history's (the others: tests/test_misses.py)


def test_views_and_documented_queries_answer_in_words(db: CacheDB) -> None:
    """On SQLite and PostgreSQL: the tuning-history views name each choice and its config,
    the winners' view its runner-up, and the two queries of docs/schema.md answer which config
    won on each device and how each did across devices."""
    _two_devices(db)
    with db.engine.connect() as conn:
        winners = {r["device_name"]: r for r in conn.execute(text(
            "SELECT * FROM autotune_winners")).mappings()}
        history = conn.execute(text("SELECT choice_name, backend, tile_shape FROM autotune_history")).all()
        assert len(history) == 6 and all(name and backend for name, backend, _ in history)
        h100, h200 = winners["NVIDIA H100 80GB HBM3"], winners["NVIDIA H200"]
        assert (h100["choice_name"], h100["backend"], h100["tile_shape"], h100["num_stages"], h100["num_warps"],
                h100["group_m"]) == ("triton_mm_3", "Triton", "(128, 64, 128)", 3, 8, 8)
        assert (h100["runner_up_name"], h100["runner_up_ms"]) == ("triton_mm_4", 0.58)
        assert (h200["choice_name"], h200["runner_up_name"], h200["runner_up_ms"]) == ("triton_mm_4", "triton_mm_3",
                                                                                       0.47)
        from cachedb.store.migrate import HEAD_REVISION

        assert db.revision() == HEAD_REVISION
        by_winner, across = ([dict(r) for r in conn.execute(text(q)).mappings()] for q in _documented_queries())
    assert [(r["device_name"], r["winner"], r["backend"], r["num_warps"]) for r in by_winner] == [
        ("NVIDIA H100 80GB HBM3", "triton_mm_3", "Triton", 8), ("NVIDIA H200", "triton_mm_4", "Triton", 4)]
    assert "BLOCK_M=128" in by_winner[0]["description"]
    assert len(across) == 6
    config = [r for r in across if r["choice"] == "triton_mm_3"]
    assert [(r["device_name"], r["vs_winner"]) for r in config] == [
        ("NVIDIA H100 80GB HBM3", 1.0), ("NVIDIA H200", pytest.approx(0.47 / 0.44))]
    assert {r["choice"] for r in across if r["backend"] == "extern"} == {"mm"}


# --------------------------------------------------------------------------- torch's own lookup


def test_persistent_cache_lookup_describes_each_choice_once(tmp_path: Path) -> None:
    """Under ``cachedb.installed``, torch's own ``PersistentCache.lookup`` of Triton template
    choices records their timings and their descriptions; a second lookup of the same choices
    writes nothing; a new process (a new store) finds them stored (one read) and describes and
    writes nothing."""
    import cachedb
    from torch._inductor.codecache import PersistentCache

    path = tmp_path / "cache.db"
    choices = _mm_choices()
    timings = {choices[0]: 0.52, choices[1]: 0.58}
    with cachedb.installed(path) as store:
        log = PersistentCache.lookup.choice_log_for(store)
        got = PersistentCache().lookup(choices, "mm", MM_INPUTS, lambda cs: {c: timings[c] for c in cs})
        assert got == timings
        again = PersistentCache().lookup(_mm_choices(), "mm", MM_INPUTS, None)  # a hit: new objects, same hashes
        assert sorted(again.values()) == [0.52, 0.58]
        store.flush()
        assert (log.counts["described"], log.counts["written"], log.counts["known"]) == (2, 2, 0)
    rows = _rows(path, "SELECT choice_hash, choice_name, backend, tile_shape, num_stages, num_warps "
                       "FROM autotune_current ORDER BY choice_hash")
    assert [tuple(r.values()) for r in rows] == [
        ("triton_mm-cmodulea", "triton_mm_3", "Triton", "(128, 64, 128)", 3, 8),
        ("triton_mm-cmoduleb", "triton_mm_4", "Triton", "(64, 32, 128)", 4, 4)]
    with cachedb.installed(path) as store:
        log = PersistentCache.lookup.choice_log_for(store)
        PersistentCache().lookup(_mm_choices(), "mm", MM_INPUTS, None)
        store.flush()
        assert (log.counts["described"], log.counts["written"], log.counts["known"]) == (0, 0, 2)
    assert _rows(path, "SELECT COUNT(*) AS n FROM autotune_choices")[0]["n"] == 2


def test_a_failing_description_never_breaks_the_lookup(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A database that refuses the description's write costs one warning; torch's lookup
    answers as its own and the timings are stored."""
    import logging

    import cachedb
    from torch._inductor.codecache import PersistentCache

    path = tmp_path / "cache.db"
    with CacheDB(path) as db, db.engine.begin() as conn:  # a write the database refuses
        conn.execute(text("CREATE TRIGGER no_choices BEFORE INSERT ON autotune_choices "
                          "BEGIN SELECT RAISE(ABORT, 'refused'); END"))
    with caplog.at_level(logging.WARNING, logger="cachedb.live"), cachedb.installed(path, write_behind=False):
        for i in range(2):  # new choices each time: each lookup's write is refused
            choices = [triton_choice(f"triton_mm_{i}", 64, 64, 32, 2, 4, f"cfail{i}")]
            got = PersistentCache().lookup(choices, "mm", f"{MM_INPUTS}{i}", lambda cs: {c: 0.5 for c in cs})
            assert got == {choices[0]: 0.5}
    warned = [r for r in caplog.records if "autotune choice write" in r.getMessage()]
    assert len(warned) == 1
    assert len(_rows(path, "SELECT * FROM autotune_timings")) == 2
    assert _rows(path, "SELECT COUNT(*) AS n FROM autotune_choices")[0]["n"] == 0


def test_install_refuses_a_lookup_with_other_parameters(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Another torch's ``PersistentCache.lookup`` (other parameters): ``SeamMissingError``,
    nothing patched."""
    import cachedb
    from torch._inductor import codecache

    before = vars(codecache.PersistentCache)["lookup"]

    def lookup(self: Any, choices: Any, name: str, inputs: str, benchmark: Any) -> Any:  # the name of old torch
        return before(self, choices, name, inputs, benchmark)

    monkeypatch.setattr(codecache.PersistentCache, "lookup", lookup)
    with pytest.raises(cachedb.live.SeamMissingError, match="PersistentCache.lookup takes"):
        cachedb.install(tmp_path / "x.db")
    assert not cachedb.is_installed() and vars(codecache.PersistentCache)["lookup"] is lookup


# --------------------------------------------------------------------------- a real tuning


@pytest.fixture(scope="module")
def tuned(real_cache: tuple[Path, dict], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list]]:
    """The real cache imported into a new database (its timings as the files hold them), then
    one real tuning process under ``cachedb.installed`` on it (:data:`CHILD`). Yields the
    database and ``autotune_history`` as it was right after the import."""
    cache_dir, _ = real_cache
    root = tmp_path_factory.mktemp("choices")
    path = root / "cache.db"
    db = CacheDB(path)
    report = Importer(db).run(cache_dir)
    assert not report.problems and report.added["autotune_timings"] > 0
    db.close()
    imported = _rows(path, "SELECT choice_hash, choice_name, backend, description FROM autotune_history")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CACHEDB_", "TORCHINDUCTOR_"))}
    proc = subprocess.run([sys.executable, str(CHILD), str(path), seeded(root / "inductor")], capture_output=True,
                          text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["counters"].get("select_algorithm_autotune", 0) >= 1  # the packed linear was tuned
    yield path, imported


@pytest.mark.slow
def test_timings_imported_from_files_carry_no_description(tuned: tuple[Path, list]) -> None:
    _, imported = tuned
    assert imported and all(r["choice_name"] is None and r["backend"] is None and r["description"] is None
                            for r in imported)
    assert all(r["choice_hash"] for r in imported)


@pytest.mark.slow
def test_a_live_tuning_names_every_choice_and_fills_in_the_imported(tuned: tuple[Path, list]) -> None:
    path, imported = tuned
    history = _rows(path, "SELECT op, choice_hash, choice_name, backend, kernel_name, description "
                          "FROM autotune_history")
    assert history and all(r["choice_name"] and r["backend"] for r in history), history
    by_name = {r["choice_name"]: r for r in history}
    assert by_name["_mkl_linear"]["op"] == "packed_linear"
    assert (by_name["_mkl_linear"]["backend"], by_name["_mkl_linear"]["kernel_name"]) == (
        "extern", "extern_kernels._mkl_linear")
    assert by_name["cpp_CppMicroGemmFP32Vec_0"]["backend"] == "CPP"
    assert {r["op"] for r in history} >= {"packed_linear", "linear_unary"}
    # the imported timings' choices, tuned again live, are described now
    filled = {r["choice_hash"]: r for r in history}
    assert all(filled[r["choice_hash"]]["choice_name"] for r in imported)
    winners = _rows(path, "SELECT op, choice_name, backend, runner_up_name FROM autotune_winners")
    assert winners and all(w["choice_name"] and w["backend"] and w["runner_up_name"] for w in winners)


@pytest.mark.slow
def test_copy_and_merge_carry_the_descriptions(tuned: tuple[Path, list], tmp_path: Path, pg_url: str) -> None:
    """SQLite → PostgreSQL by copy, back by merge into a file holding the same timings
    without descriptions (a fresh import of the same cache): the descriptions are carried,
    none twice; a second merge adds nothing."""
    from cachedb.fleet.copy import copy_database, merge_databases

    path, _ = tuned
    source = _rows(path, "SELECT * FROM autotune_choices ORDER BY choice_hash")
    assert source
    report = copy_database(path, pg_url)
    assert report.tables["autotune_choices"].added == len(source)
    on_pg = _rows(pg_url, "SELECT * FROM autotune_choices ORDER BY choice_hash")
    drop = ("id", "created_at")
    assert [{k: v for k, v in r.items() if k not in drop} for r in on_pg] == [
        {k: v for k, v in r.items() if k not in drop} for r in source]
    plain = tmp_path / "plain.db"
    with CacheDB(plain) as db, db.transaction() as repos:
        fp = repos.fingerprints.ensure(Fingerprint(system={"hash": "c" * 64}))
        repos.timings.record(fp, "mm", MM_INPUTS, "high", {r["choice_hash"]: 1.0 for r in source})
    assert all(r["choice_name"] is None for r in _rows(plain, "SELECT choice_name FROM autotune_current"))
    merged = merge_databases([pg_url], plain)
    assert merged.tables["autotune_choices"].added == len(source)
    assert all(r["choice_name"] for r in _rows(plain, "SELECT choice_name FROM autotune_current"))
    again = merge_databases([pg_url], plain)
    assert again.tables["autotune_choices"].added == 0
    assert _rows(plain, "SELECT COUNT(*) AS n FROM autotune_choices")[0]["n"] == len(source)


def test_descriptions_of_timings_written_before_reach_the_remote(tmp_path: Path, pg_url: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A local file whose timings carry no description (as an import leaves them): a live
    lookup that hits them describes the choices and sends the descriptions alone to the remote
    tier (an entry of kind ``choices``); a second machine's file gets them with the timings."""
    import cachedb
    from torch._inductor.codecache import PersistentCache

    from cachedb.fingerprint import current as current_fingerprint

    monkeypatch.setenv("CACHEDB_REMOTE_TRUST", "1")
    a = tmp_path / "a.db"
    with CacheDB(a) as db, db.transaction() as repos:
        fp = repos.fingerprints.ensure(current_fingerprint())
        repos.timings.record(fp, "mm", MM_INPUTS, torch.get_float32_matmul_precision(),
                             {"triton_mm-cmodulea": 0.52, "triton_mm-cmoduleb": 0.58})
    with cachedb.installed(a, remote=pg_url):
        assert sorted(PersistentCache().lookup(_mm_choices(), "mm", MM_INPUTS, None).values()) == [0.52, 0.58]
    remote = _rows(pg_url, "SELECT choice_hash, name, tile_shape FROM autotune_choices ORDER BY choice_hash")
    assert [tuple(r.values()) for r in remote] == [("triton_mm-cmodulea", "triton_mm_3", "(128, 64, 128)"),
                                                   ("triton_mm-cmoduleb", "triton_mm_4", "(64, 32, 128)")]
    assert _rows(pg_url, "SELECT COUNT(*) AS n FROM autotune_timings")[0]["n"] == 0  # they were never sent

    # the timings reach the remote too (a lookup that benchmarks on A), then B pulls both
    with cachedb.installed(a, remote=pg_url):
        inputs = f"{MM_INPUTS} "
        PersistentCache().lookup(_mm_choices(), "mm", inputs, lambda cs: {c: 0.5 for c in cs})
    b = tmp_path / "b.db"
    with cachedb.installed(b, remote=pg_url) as store:
        log = PersistentCache.lookup.choice_log_for(store)
        assert len(PersistentCache().lookup(_mm_choices(), "mm", inputs, None)) == 2  # from the remote
        store.flush()
        assert (log.counts["known"], log.counts["written"]) == (2, 0)  # the pull brought the descriptions
    assert [r["choice_name"] for r in _rows(b, "SELECT choice_name FROM autotune_current ORDER BY choice_name")] == [
        "triton_mm_3", "triton_mm_4"]
