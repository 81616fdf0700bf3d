"""Smoke test of ``python -m benchmarks``: a quick run of cheap sections into a temp dir.

Checks that the command completes and writes valid JSON (and the Markdown table) with the
expected keys; it is not a speed judgement.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO_ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ["best_configs", "disk"]


@pytest.mark.torch
def test_quick_benchmark_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", ",".join(SECTIONS), "--out", str(out),
         "--scratch", str(tmp_path), "--quiet"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
    assert "| § | case |" in proc.stdout  # the Markdown table is printed

    # A quick run of some sections never overwrites the full run's cpu.md / cpu.json.
    assert sorted(p.name for p in out.iterdir()) == ["cpu-best_configs-disk-quick.json", "cpu-best_configs-disk-quick.md"]
    doc = json.loads((out / "cpu-best_configs-disk-quick.json").read_text())
    assert doc["schema"] == 1
    assert doc["quick"] is True
    for key in ("created", "machine", "sections", "sections_run", "total_seconds", "command"):
        assert key in doc, key
    assert set(doc["machine"]) >= {"cpu", "cores", "python", "torch", "sqlite"}
    assert sorted(doc["sections"]) == sorted(SECTIONS)
    for name in SECTIONS:
        section = doc["sections"][name]
        assert section["error"] is None, section["error"]
        assert section["rows"], name
        for row in section["rows"]:
            assert set(row) >= {"case", "unit", "cachedb", "baseline", "baseline_name", "ratio", "target", "met"}
            assert row["cachedb"]["n"] >= 1
            # every case of these sections measures a time or a size: a measured one is > 0
            assert 0 < row["cachedb"]["p10"] <= row["cachedb"]["median"] <= row["cachedb"]["p90"], row
            if row["baseline"] is not None:
                assert row["ratio"] is not None and row["ratio"] > 0
                assert set(row["baseline"]) >= {"n", "median", "p10", "p90", "q1", "q3"}

    md = (out / "cpu-best_configs-disk-quick.md").read_text()
    assert md.startswith("# cachedb benchmarks")
    assert "best_configs" in md and "disk" in md
    # Nothing was left in the scratch area: the run removes its own scratch directory.
    assert [p.name for p in tmp_path.iterdir()] == ["results"]


def test_importing_the_benchmarks_changes_no_environment() -> None:
    """``python -m benchmarks`` runs its children with one compile thread, set in ``main()``:
    a process that imports the package (as these tests do, in a pytest worker whose later
    tests start children) keeps its environment."""
    code = ("import os; before = dict(os.environ); import benchmarks.__main__, benchmarks.s13_ddp; "
            "print(sorted(set(os.environ.items()) ^ set(before.items())))")
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_COMPILE_THREADS"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"


def test_interleaved_runs_each_block_of_an_op_inside_its_scope() -> None:
    """``interleaved(..., scopes=...)``: every call of a scoped op (its warm-up included) runs
    inside a scope entered for its block, never inside another op's; blocks alternate."""
    from contextlib import contextmanager

    from benchmarks._stats import interleaved

    inside: list[bool] = [False]
    entered = [0]
    calls: list[tuple[str, int, bool]] = []

    @contextmanager
    def scope():  # type: ignore[no-untyped-def]
        inside[0] = True
        entered[0] += 1
        try:
            yield
        finally:
            inside[0] = False

    ops = {name: (lambda i, name=name: calls.append((name, i, inside[0]))) for name in ("files", "live")}
    out = interleaved(ops, 6, rounds=3, warmup=1, scopes={"live": scope})
    assert [len(v) for v in out.values()] == [6, 6]
    assert all(flag == (name == "live") for name, _i, flag in calls)
    assert entered[0] == 1 + 3  # the warm-up, then one scope per block
    order = [name for name, i, _ in calls if i < 6]
    assert order == ["files"] * 2 + ["live"] * 4 + ["files"] * 4 + ["live"] * 2


def test_quick_herd_serves_every_process_from_the_remote(tmp_path: Path) -> None:
    """``--quick --only disk,herd``: 24 processes (3 machines of 8) on the local PostgreSQL, through a
    PgBouncer it starts, and on torch's Redis remote cache: every lookup served, one remote query
    per entry per machine, one write per machine, no process falling back to its local cache.
    The two sections are in different lanes of a quick run: each ran in its own process, at
    once, and both are in the one document written."""
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", "disk,herd", "--out", str(out),
         "--scratch", str(tmp_path), "--quiet"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
    doc = json.loads((out / "cpu-disk-herd-quick.json").read_text())
    assert doc["lanes"] == [["disk"], ["herd"]]
    assert doc["sections"]["disk"]["error"] is None and doc["sections"]["disk"]["rows"]
    assert "in lanes run at once (disk; herd)" in (out / "cpu-disk-herd-quick.md").read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["results"]  # the lanes' scratch went with the run's
    section = doc["sections"]["herd"]
    assert section["error"] is None and not [n for n in section["notes"] if "skipped" in n], section["notes"]
    herds = section["extra"]["herds"]
    assert sorted(herds) == ["direct", "pgbouncer", "redis"]
    for mode, herd in herds.items():
        assert herd["served"] == herd["lookups"] == 24 * 2, (mode, herd)
        assert herd["fell_back"] == 0, (mode, herd)
        if mode != "redis":
            assert max(herd["pulls_per_entry_machine"]) == 1 and max(herd["pushes_per_machine"]) == 1, (mode, herd)
    assert herds["pgbouncer"]["peak_connections"] <= 10


def test_model_sections_skip_with_one_line_off_the_gpu(tmp_path: Path) -> None:
    """``--only gpt2,ddp --nproc 2`` on a machine without CUDA: each section says in one line
    why it measured nothing (no rows, no error), and the run succeeds."""
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--only", "gpt2,ddp", "--nproc", "2", "--out", str(out),
         "--scratch", str(tmp_path), "--quiet"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    sections = json.loads((out / "cpu-gpt2-ddp.json").read_text())["sections"]
    for name in ("gpt2", "ddp"):
        assert sections[name]["error"] is None and sections[name]["rows"] == []
        assert len(sections[name]["notes"]) == 1 and sections[name]["notes"][0].startswith("skipped: ")


def test_gpt2_skips_without_transformers_and_ddp_without_enough_gpus() -> None:
    import importlib.util

    from benchmarks import s12_gpt2, s13_ddp

    if importlib.util.find_spec("transformers") is None:
        assert s12_gpt2.skip_reason("cuda") == "skipped: transformers is not installed (pip install transformers)"
    assert s12_gpt2.skip_reason("cpu") is not None
    assert s13_ddp.skip_reason("cuda", 0, 8) == "skipped: --nproc N (N >= 1) runs the DDP workload on N GPUs"
    assert s13_ddp.skip_reason("cuda", 4, 2) == "skipped: --nproc 4 needs 4 GPUs, this machine has 2"
    assert s13_ddp.skip_reason("cuda", 2, 2) is None


def test_nproc_starts_the_ranks_through_torch_distributed_run(tmp_path: Path) -> None:
    from benchmarks.__main__ import parse_args
    from benchmarks.s13_ddp import launch_command, workers

    assert parse_args(["--device", "cuda", "--nproc", "2"]).nproc == 2
    assert parse_args([]).nproc == 0
    with pytest.raises(SystemExit):
        parse_args(["--nproc", "-1"])
    cmd = launch_command(2, "cachedb", tmp_path / "c", tmp_path / "o", 1.5, db=str(tmp_path / "d.db"), save_mega=True)
    assert cmd[1:8] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
                        "benchmarks._ddp_child"]
    assert cmd[8:] == ["cachedb", "--cache-dir", str(tmp_path / "c"), "--out", str(tmp_path / "o"), "--t0", "1.5",
                       "--db", str(tmp_path / "d.db"), "--save-mega"]
    assert 1 <= workers(2) <= 16
    from benchmarks._ddp_child import parse_args as child_args  # each rank parses what the command passes

    parsed = child_args(cmd[8:])
    assert (parsed.mode, parsed.db, parsed.save_mega, parsed.t0) == ("cachedb", str(tmp_path / "d.db"), True, 1.5)


def test_merge_keeps_the_sections_a_run_did_not_measure(tmp_path: Path) -> None:
    """``--merge``: a section this run measured replaces its old figures; the others stay,
    each noting the run it came from."""
    from benchmarks._report import Row, SectionResult, merged, write
    from benchmarks._stats import summarize

    meta = {"created": "then", "command": "python -m benchmarks --only warm_start", "quick": False, "partial": True,
            "sections_run": ["warm_start", "ddp"], "machine": {"cpu": "c", "cores": 1, "gpu": "NVIDIA H200",
                                                              "python": "3", "torch": "2.11", "sqlite": "3"}}
    old = [SectionResult("warm_start", "W", rows=[Row("a", summarize([1.0, 2.0], "s"), summarize([2.0], "s"), "b")]),
           SectionResult("ddp", "D", notes=["old ddp"])]
    write(tmp_path, old, meta, "gpu")
    new = [SectionResult("ddp", "D", notes=["new ddp"])]
    ordered, merged_meta = merged(tmp_path / "gpu.json", new, {**meta, "created": "now"}, ["warm_start", "ddp"])
    assert [r.name for r in ordered] == ["warm_start", "ddp"]
    assert ordered[1].notes == ["new ddp"]
    assert ordered[0].notes[0].startswith("measured in the run of then")
    assert ordered[0].rows[0].cachedb is not None and ordered[0].rows[0].ratio == 0.75
    assert merged_meta["earlier_runs"][0]["sections"] == ["warm_start"]
    _, md_path, md = write(tmp_path, ordered, merged_meta, "gpu")
    assert "Sections warm_start come from the run of then" in md
    # a third run: each kept section stays attributed to the run that measured it
    third = [SectionResult("gpt2", "G", notes=["gpt2"])]
    ordered, meta3 = merged(tmp_path / "gpu.json", third, {**meta, "created": "later"}, ["warm_start", "ddp", "gpt2"])
    assert [r.name for r in ordered] == ["warm_start", "ddp", "gpt2"]
    assert [(run["created"], run["sections"]) for run in meta3["earlier_runs"]] == [("then", ["warm_start"]),
                                                                                   ("now", ["ddp"])]
