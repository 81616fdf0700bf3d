"""Smoke test of ``python -m benchmarks``: a quick run of cheap sections into a temp dir.

Checks that the command completes and writes valid JSON (and the Markdown table) with the
expected keys; it is not a speed judgement.
"""

from __future__ import annotations

import json
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
            assert row["cachedb"]["median"] >= 0
            if row["baseline"] is not None:
                assert row["ratio"] is not None and row["ratio"] > 0
                assert set(row["baseline"]) >= {"n", "median", "p10", "p90", "q1", "q3"}

    md = (out / "cpu-best_configs-disk-quick.md").read_text()
    assert md.startswith("# cachedb benchmarks")
    assert "best_configs" in md and "disk" in md
    # Nothing was left in the scratch area: the run removes its own scratch directory.
    assert [p.name for p in tmp_path.iterdir()] == ["results"]


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
    """``--quick --only herd``: 24 processes (3 machines of 8) on the local PostgreSQL, through a
    PgBouncer it starts, and on torch's Redis remote cache: every lookup served, one remote query
    per entry per machine, one write per machine, no process falling back to its local cache."""
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", "herd", "--out", str(out),
         "--scratch", str(tmp_path), "--quiet"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
    section = json.loads((out / "cpu-herd-quick.json").read_text())["sections"]["herd"]
    assert section["error"] is None and not [n for n in section["notes"] if "skipped" in n], section["notes"]
    herds = section["extra"]["herds"]
    assert sorted(herds) == ["direct", "pgbouncer", "redis"]
    for mode, herd in herds.items():
        assert herd["served"] == herd["lookups"] == 24 * 2, (mode, herd)
        assert herd["fell_back"] == 0, (mode, herd)
        if mode != "redis":
            assert max(herd["pulls_per_entry_machine"]) == 1 and max(herd["pushes_per_machine"]) == 1, (mode, herd)
    assert herds["pgbouncer"]["peak_connections"] <= 10
