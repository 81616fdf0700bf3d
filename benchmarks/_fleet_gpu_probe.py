"""Two tiers on a GPU: machine B warm from a remote that machine A filled, Triton kernels included.

``python -m benchmarks._fleet_gpu_probe OUT_DIR [REMOTE]`` (the GPU machine; ~6 min on an H100).
§8 measures the same on CPU with PostgreSQL as the remote; the GPU machine has no PostgreSQL,
so the remote here is another SQLite file (default) or the URL given: the tier code is the
same (``cachedb.live._remote``), the wire is not. §1's GPU workloads, a fresh process each:

1. cold, files (gives the warm local dir);
2. machine A: cold, ``cachedb.installed(a.db, remote=REMOTE)`` (compile workers included);
3. twice, alternating: warm local files, and machine B (an empty dir, an empty local file,
   the same remote);
4. what B's local file holds afterwards (Triton keys, best configs, FX/AOTAutograd entries).

Writes ``OUT_DIR/fleet-gpu.json`` and prints a short table.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from .s1_warm_start import _sample

MODELS = "mlp_autotune,transformer,dynamic_gpu"


def _held(db: Path) -> dict[str, Any]:
    con = sqlite3.connect(db)
    try:
        return {
            "triton_keys": con.execute(
                "SELECT count(DISTINCT key) FROM kernel_artifacts WHERE kind = 'triton'").fetchone()[0],
            "triton_files": con.execute("SELECT count(*) FROM kernel_artifacts WHERE kind = 'triton'").fetchone()[0],
            "best_configs": con.execute("SELECT count(*) FROM best_configs").fetchone()[0],
            "guarded_entries": con.execute("SELECT count(*) FROM guarded_entries").fetchone()[0],
            "autotune_timings": con.execute("SELECT count(*) FROM autotune_timings").fetchone()[0],
        }
    finally:
        con.close()


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="fleetgpu"))
    remote = argv[1] if len(argv) > 1 else str(scratch / "remote.db")
    samples: dict[str, list[dict[str, Any]]] = {}

    def add(case: str, report: dict[str, Any]) -> None:
        samples.setdefault(case, []).append(report)
        c = report["counters"]
        print(f"{case}: first calls {report['first_call_s']:.1f}s, wall {report['wall_s']:.1f}s, "
              f"coordesc {c.get('coordesc_tuning_bench', 0)}, remote {report.get('remote_counts')}", flush=True)

    cold_dir = scratch / "cold" / "inductor"
    add("cold, files", _sample("files", cold_dir, MODELS, device="cuda"))
    a_db = scratch / "a.db"
    add("machine A: cold, local + remote",
        _sample("cachedb-cold", scratch / "adir" / "inductor", MODELS, device="cuda", db=str(a_db), remote=remote))
    held: dict[str, Any] = {"machine A local": _held(a_db)}
    if not remote.startswith(("postgresql", "mysql")):
        held["remote"] = _held(Path(remote))
    for r in range(2):
        for case in (["warm local files", "machine B"] if r == 0 else ["machine B", "warm local files"]):
            if case == "warm local files":
                add(case, _sample("files", cold_dir, MODELS, device="cuda"))
            else:
                b_db = scratch / f"b{r}.db"
                add(case, _sample("cachedb", scratch / f"bdir{r}" / "inductor", MODELS, device="cuda",
                                  db=str(b_db), remote=remote))
                held[f"machine B local after run {r}"] = _held(b_db)

    def med(case: str, field: str) -> float:
        return statistics.median(s[field] for s in samples[case])

    summary = {
        "remote": remote if remote.startswith(("postgresql", "mysql")) else "SQLite file",
        "first_call_s": {c: med(c, "first_call_s") for c in samples},
        "wall_s": {c: med(c, "wall_s") for c in samples},
        "coordesc_tuning_bench": {c: [s["counters"].get("coordesc_tuning_bench", 0) for s in ss]
                                  for c, ss in samples.items()},
        "remote_counts": {c: [s.get("remote_counts") for s in ss] for c, ss in samples.items()},
        "held": held,
        "machine_b_vs_warm_local_first_calls": med("machine B", "first_call_s") / med("warm local files", "first_call_s"),
        "samples": samples,
    }
    (out / "fleet-gpu.json").write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps({k: v for k, v in summary.items() if k != "samples"}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
