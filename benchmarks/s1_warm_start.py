"""§1 Warm start with real ``torch.compile`` (CPU): every sample is a fresh subprocess.

Models (``examples/build_cache.py``'s workloads): an MLP, a dynamic-shape function (three
sizes, two guarded variants) and, in full runs, a CPU max-autotune GEMM (ATEN vs C++ micro-GEMM
choices; its autotune timings live in ``cache/<system hash>``). One compile worker
(``TORCHINDUCTOR_COMPILE_THREADS=1``).

Cases (wall time of a fresh process: interpreter start, imports, cache setup, compiles):

- **cold**: empty ``TORCHINDUCTOR_CACHE_DIR``; the first cold run also saves a Mega-Cache blob
  (``torch.compiler.save_cache_artifacts``, not timed) and its directory is the warm one;
- **warm local**: the populated directory of the first cold run (kernels' ``.so`` included);
- **warm Mega-Cache**: a fresh empty dir, ``torch.compiler.load_cache_artifacts(blob)``, compile;
- **warm cachedb**: a fresh empty dir, ``with cachedb.installed(db):`` compile — the database
  was filled by ``Importer`` from the first cold run's directory (see :data:`CACHEDB_VIA`);
- full runs also: **cold with cachedb installed** (writes go to an empty database) and
  **warm cachedb export** (``export_cache_dir`` into a fresh dir, then compile from files).

C++ precompiled headers live outside ``TORCHINDUCTOR_CACHE_DIR`` (``_HEADER_DIR``,
torch/_inductor/codecache.py), so every case, "cold" included, finds them warm. Units: s.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ._context import REPO_ROOT, Context
from ._report import Row, SectionResult
from ._stats import summarize

NAME = "warm_start"
TITLE = "Warm start with real torch.compile (fresh process per sample)"

#: How the "warm cachedb" case reads the database: "installed" (``cachedb.installed(db)``,
#: the live backend) or "export" (``export_cache_dir`` into the fresh dir, then compile).
CACHEDB_VIA = "installed"


def _sample(mode: str, cache_dir: Path, models: str, **opts: str) -> dict[str, Any]:
    """Run one ``benchmarks._warm_child`` process; returns its JSON report."""
    cmd = [sys.executable, "-m", "benchmarks._warm_child", mode, "--cache-dir", str(cache_dir), "--models", models]
    for key, value in opts.items():
        cmd += [f"--{key.replace('_', '-')}", value]
    env = dict(os.environ)
    env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    t0 = time.time()
    proc = subprocess.run(cmd + ["--t0", repr(t0)], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"warm-start child {mode} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    if not report.get("ok"):
        raise RuntimeError(f"warm-start child {mode}: a workload gave wrong results: {report}")
    return report


def _describe(samples: list[dict[str, Any]], models: list[str]) -> dict[str, Any]:
    """Median breakdown of a case's samples (seconds). Derived parts (compiles, imports,
    other) are computed per sample first, so the medians add up approximately."""
    def med(values: list[float]) -> float:
        return round(statistics.median(values), 3)

    def parts(s: dict[str, Any]) -> dict[str, float]:
        sec = s["seconds"]
        compiles = sum(sec.get(m, 0.0) for m in models)
        imports = sec.get("import_torch", 0.0) + sec.get("import_cachedb", 0.0)
        setup = sec.get("setup", 0.0)
        return {
            "cpp_build_s": s["cpp_build_s"],
            "compiles_s": compiles,
            "compiles_without_cpp_s": compiles - s["cpp_build_s"],
            "imports_s": imports,
            "setup_s": setup,
            "other_s": s["wall_s"] - compiles - imports - setup,
        }

    keys = sorted({k for s in samples for k in s["seconds"]})
    per = [parts(s) for s in samples]
    return {
        "wall_s": med([s["wall_s"] for s in samples]),
        "cpp_builds": med([s["cpp_builds"] for s in samples]),
        **{k: med([p[k] for p in per]) for k in per[0]},
        "seconds": {k: med([s["seconds"].get(k, 0.0) for s in samples]) for k in keys},
        "counters": samples[0]["counters"],
        "phases_s": samples[0]["phases_s"],
    }


def run(ctx: Context) -> SectionResult:
    from cachedb import CacheDB
    from cachedb.importer import Importer

    res = SectionResult(NAME, TITLE)
    models = "mlp,dynamic" if ctx.quick else "mlp,dynamic,gemm"
    n_cold = 1 if ctx.quick else 3
    n_warm = 1 if ctx.quick else 4
    n_extra = 0 if ctx.quick else 2
    samples: dict[str, list[dict[str, Any]]] = {}

    def add(case: str, report: dict[str, Any]) -> None:
        samples.setdefault(case, []).append(report)
        ctx.log(f"warm start: {case}: {report['wall_s']:.1f}s (C++ builds {report['cpp_build_s']:.1f}s)")

    mega = ctx.tmpdir("mega") / "artifacts.bin"
    first_cold: Path | None = None
    for i in range(n_cold):
        d = ctx.tmpdir("cold") / "inductor"
        add("cold", _sample("files", d, models, **({"save_mega": str(mega)} if i == 0 else {})))
        first_cold = first_cold or d
    assert first_cold is not None
    ctx.shared["real_cache_dir"] = first_cold

    db_path = ctx.tmpdir("warmdb") / "warm.db"
    with CacheDB(db_path) as db:
        Importer(db).run(first_cold)

    cases = ["warm local", "warm Mega-Cache", "warm cachedb"]
    if n_extra:
        cases += ["cold, cachedb installed", "warm cachedb export"]
    for r in range(max(n_warm, n_extra)):
        order = cases[r % len(cases):] + cases[: r % len(cases)]  # rotate: drift hits all alike
        for case in order:
            if case == "warm local" and r < n_warm:
                add(case, _sample("files", first_cold, models))
            elif case == "warm Mega-Cache" and r < n_warm:
                add(case, _sample("mega", ctx.tmpdir("megarun") / "inductor", models, mega=str(mega)))
            elif case == "warm cachedb" and r < n_warm:
                add(case, _sample("cachedb", ctx.tmpdir("dbrun") / "inductor", models, db=str(db_path),
                                  cachedb_via=CACHEDB_VIA))
            elif case == "warm cachedb export" and r < n_extra:
                add(case, _sample("cachedb", ctx.tmpdir("exportrun") / "inductor", models, db=str(db_path),
                                  cachedb_via="export"))
            elif case == "cold, cachedb installed" and r < n_extra:
                add(case, _sample("cachedb-cold", ctx.tmpdir("dbcold") / "inductor", models,
                                  db=str(ctx.tmpdir("colddb") / "cold.db")))

    dist = {case: summarize([s["wall_s"] for s in ss], "s") for case, ss in samples.items()}
    via = "cachedb.installed" if CACHEDB_VIA == "installed" else "cachedb export into a fresh dir"
    res.rows += [
        Row(f"warm from cachedb ({via}) vs Mega-Cache", dist["warm cachedb"], dist["warm Mega-Cache"],
            "Mega-Cache blob, fresh dir"),
        Row(f"warm from cachedb ({via}) vs local files", dist["warm cachedb"], dist["warm local"],
            "warm local dir (with .so)"),
        Row(f"warm from cachedb ({via}) vs cold", dist["warm cachedb"], dist["cold"], "cold compile"),
        Row("warm Mega-Cache vs cold (torch alone, for scale)", dist["warm Mega-Cache"], dist["cold"],
            "cold compile", note="not cachedb: both torch"),
        Row("warm local vs cold (torch alone, for scale)", dist["warm local"], dist["cold"], "cold compile",
            note="not cachedb: both torch"),
    ]
    if "warm cachedb export" in dist:
        res.rows.append(Row("warm from cachedb export into a fresh dir vs Mega-Cache", dist["warm cachedb export"],
                            dist["warm Mega-Cache"], "Mega-Cache blob, fresh dir"))
    if "cold, cachedb installed" in dist:
        res.rows.append(Row("cold compile writing to cachedb (installed) vs cold to files",
                            dist["cold, cachedb installed"], dist["cold"], "cold compile"))

    model_list = models.split(",")
    breakdown = {case: _describe(ss, model_list) for case, ss in samples.items()}
    res.extra = {"models": model_list, "cachedb_via": CACHEDB_VIA, "breakdown": breakdown}
    for case, b in breakdown.items():
        s = b["seconds"]
        hits = {k: v for k, v in b["counters"].items() if k.endswith(("_hit", "_miss", "_guard_miss", "autotune"))}
        res.notes.append(
            f"{case} (medians): {b['wall_s']:.1f} s; imports {b['imports_s']:.1f} s (torch {s.get('import_torch', 0):.1f}"
            + (f", cachedb {s['import_cachedb']:.2f}" if "import_cachedb" in s else "")
            + f"), setup {b['setup_s']:.2f} s, compiles {b['compiles_s']:.1f} s of which C++ builds "
            f"{b['cpp_build_s']:.1f} s ({int(b['cpp_builds'])} builds), interpreter start/other {b['other_s']:.1f} s; "
            f"counters {json.dumps(hits, sort_keys=True)}"
        )
    w = breakdown["warm cachedb"]
    parts = {
        "C++ compilation of kernels (CppBuilder.build)": w["cpp_build_s"],
        "rest of the compiles (Dynamo tracing, AOTAutograd, Inductor, cache lookups)": w["compiles_without_cpp_s"],
        "imports (torch, cachedb)": w["imports_s"],
        "setup (cachedb.installed / export)": w["setup_s"],
        "interpreter start and other": w["other_s"],
    }
    top = max(parts, key=lambda k: parts[k])
    res.extra["warm_cachedb_parts_s"] = {k: round(v, 3) for k, v in parts.items()}
    res.extra["warm_cachedb_dominant"] = top
    res.notes.append(
        f"What dominates warm-from-cachedb time ({w['wall_s']:.1f} s, median): {top} "
        f"({parts[top] / w['wall_s']:.0%}); all parts (medians): "
        + ", ".join(f"{k} {v:.1f} s" for k, v in parts.items())
        + ". An FX/AOT cache hit still builds every C++ kernel's .so again "
        "(`PyCodeCache.load_by_key_path` → `compile_file`): neither the database nor a Mega-Cache "
        "blob carries .so files; the warm local directory has them."
    )
    if "gemm" in model_list:
        res.notes.append(
            "The Mega-Cache blob carries no autotune timings (`cache/<system hash>`), so the max-autotune "
            "GEMM is benchmarked again there (`select_algorithm_autotune` in its counters); cachedb and "
            "the warm local dir serve them."
        )
    return res
