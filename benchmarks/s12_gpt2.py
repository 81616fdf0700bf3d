"""§12 A real model: GPT-2 small from ``transformers`` on one GPU (``--device cuda``).

``GPT2LMHeadModel(GPT2Config())`` (no weights: random ones, dropout off) in bf16 under default
``torch.compile`` settings: a training step, then inference at 128 and 512 tokens
(:func:`benchmarks._gpu_workloads.gpt2`). Every sample is a fresh ``benchmarks._warm_child``
process with Inductor's compile workers (``TORCHINDUCTOR_COMPILE_THREADS``, :data:`WORKERS`).
Cases, as in §1: cold into files (which also saves the Mega-Cache blob), cold into an empty
database (``cachedb.installed``), warm local files (the cold run's directory and ``TMPDIR``),
Mega-Cache into a fresh directory, cachedb into a fresh directory from the live-filled
database; and torch's caching precompile through cachedb (``cachedb.installed(db,
precompile=True)``), cold and warm. Reported: first calls, the tuning calls each process ran
(:mod:`benchmarks._tuning_calls`), Dynamo's bytecode tracing and the compiler backend's time
(``_warm_child.NAMED_PHASES``: what no cache serves and what the caches serve), the database's
bytes against the cold directory's.

Without ``transformers`` the section reports one line and measures nothing; on the CPU too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ._context import REPO_ROOT, Context
from ._report import Row, SectionResult
from ._stats import summarize

NAME = "gpt2"
TITLE = "A real model: GPT-2 small (transformers) on one GPU (fresh process per sample)"
#: Compile workers per process (Inductor's default is one per core, up to 32).
WORKERS = 16


def skip_reason(device: str) -> str | None:
    """Why the section measures nothing here (one line), or None."""
    if device != "cuda":
        return "skipped: GPT-2 runs with --device cuda only (a GPU machine)"
    if importlib.util.find_spec("transformers") is None:
        return "skipped: transformers is not installed (pip install transformers)"
    return None


def child_env(machine_tmp: Path, workers: int) -> dict[str, str]:
    """A benchmark child's environment: none of cachedb's or Triton's variables, ``workers``
    compile workers, the repository first on ``PYTHONPATH``, ``machine_tmp`` as ``TMPDIR``;
    NVLink multicast stays off (NCCL, PyTorch, NVSHMEM)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CACHEDB_", "TRITON_"))}
    env["TORCHINDUCTOR_COMPILE_THREADS"] = str(workers)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["TMPDIR"] = str(machine_tmp)
    env.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    return env


def dir_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def db_bytes(db: Path) -> int:
    """The database's bytes on disk: the file and, if left, its WAL."""
    return sum(p.stat().st_size for p in (db, Path(f"{db}-wal")) if p.exists())


def _sample(ctx: Context, mode: str, cache_dir: Path, machine: Path, **opts: str | bool) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks._warm_child", mode, "--cache-dir", str(cache_dir), "--models", "gpt2",
           "--device", "cuda"]
    for key, value in opts.items():
        flag = f"--{key.replace('_', '-')}"
        cmd += [flag] if value is True else [flag, str(value)]
    t0 = time.time()
    proc = subprocess.run(cmd + ["--t0", repr(t0)], cwd=REPO_ROOT, env=child_env(machine, WORKERS),
                          capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"gpt2 child {mode} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    if not report.get("ok"):
        raise RuntimeError(f"gpt2 child {mode}: wrong results: {report}")
    return report


def tuning_rows(res: SectionResult, label: str, samples: dict[str, list[dict[str, Any]]], db_case: str,
                per: str = "process", target: str = "0") -> None:
    """Rows of the tuning calls ``db_case`` ran against warm local files: coordinate descent
    (kernels tuned) and GPU benchmarks."""
    for key, what in (("coordesc_calls", "coordinate-descent runs (CoordescTuner.autotune calls)"),
                      ("benchmark_gpu_calls", "GPU benchmarks (InductorBenchmarker.benchmark_gpu calls)")):
        ours = summarize([s["tuning_calls"][key] for s in samples[db_case]], "calls")
        local = summarize([s["tuning_calls"][key] for s in samples["warm local"]], "calls")
        res.rows.append(Row(f"{label}: {what} per {per} at run time", ours, local, "warm local dir",
                            target=target, met=(ours.max == 0) if target == "0" else None))


def run(ctx: Context) -> SectionResult:
    res = SectionResult(NAME, TITLE)
    reason = skip_reason(ctx.device)
    if reason:
        res.notes.append(reason)
        return res
    n_warm = 1 if ctx.quick else 2
    samples: dict[str, list[dict[str, Any]]] = {}

    def add(case: str, report: dict[str, Any]) -> None:
        samples.setdefault(case, []).append(report)
        ctx.log(f"gpt2: {case}: first calls {report['first_call_s']:.1f}s, wall {report['wall_s']:.1f}s, "
                f"tuning calls {report['tuning_calls'].get('coordesc_calls')}/{report['tuning_calls'].get('benchmark_gpu_calls')}")

    machine_a = ctx.machine("machine-a")
    cold_dir = ctx.cache_dir("cold")
    mega = ctx.tmpdir("mega") / "artifacts.bin"
    add("cold", _sample(ctx, "files", cold_dir, machine_a, save_mega=str(mega)))
    live_db = ctx.tmpdir("colddb") / "live.db"
    add("cold, cachedb installed", _sample(ctx, "cachedb-cold", ctx.cache_dir("dbcold"),
                                           ctx.machine(), db=str(live_db)))
    pre_db = ctx.tmpdir("predb") / "pre.db"
    cases = ["warm local", "warm Mega-Cache", "warm cachedb", "warm cachedb precompile"]
    try:  # torch's caching precompile is experimental: its failure must not lose the other cases
        add("cold, cachedb precompile", _sample(ctx, "cachedb-cold", ctx.cache_dir("precold"),
                                                ctx.machine(), db=str(pre_db), precompile=True))
    except RuntimeError as exc:
        res.notes.append(f"precompile=True, cold: FAILED: {str(exc)[-1500:]}")
        cases.remove("warm cachedb precompile")
    for r in range(n_warm):
        for case in cases[r % len(cases):] + cases[: r % len(cases)]:
            if case == "warm local":
                add(case, _sample(ctx, "files", cold_dir, machine_a))
            elif case == "warm Mega-Cache":
                add(case, _sample(ctx, "mega", ctx.cache_dir("megarun"), ctx.machine(), mega=str(mega)))
            elif case == "warm cachedb":
                add(case, _sample(ctx, "cachedb", ctx.cache_dir("dbrun"), ctx.machine(), db=str(live_db)))
            elif r == 0:  # precompile: one warm sample
                try:
                    add(case, _sample(ctx, "cachedb", ctx.cache_dir("prerun"), ctx.machine(),
                                      db=str(pre_db), precompile=True))
                except RuntimeError as exc:
                    res.notes.append(f"precompile=True, warm: FAILED: {str(exc)[-1500:]}")

    first = {case: summarize([s["first_call_s"] for s in ss], "s") for case, ss in samples.items()}
    local = first["warm local"]
    res.rows.append(Row("GPT-2 warm cachedb (live-filled DB), fresh dir: first calls vs warm local files",
                        first["warm cachedb"], local, "warm local dir", target="≤ 1.0x",
                        met=first["warm cachedb"].median <= local.median))
    res.rows.append(Row("GPT-2 warm cachedb (live-filled DB), fresh dir: first calls vs Mega-Cache",
                        first["warm cachedb"], first["warm Mega-Cache"], "Mega-Cache blob, fresh dir"))
    res.rows.append(Row("GPT-2 warm Mega-Cache vs warm local (torch alone, for scale): first calls",
                        first["warm Mega-Cache"], local, "warm local dir", note="not cachedb: both torch"))
    res.rows.append(Row("GPT-2 warm local vs cold (torch alone, for scale): first calls", local, first["cold"],
                        "cold compile", note="not cachedb: both torch"))
    res.rows.append(Row("GPT-2 cold compile writing to cachedb vs cold to files: first calls",
                        first["cold, cachedb installed"], first["cold"], "cold compile"))
    phase = {case: {k: summarize([s.get("named_phases_s", {}).get(k, 0.0) for s in ss], "s")
                    for k in ("bytecode_tracing", "OutputGraph.call_user_compiler")} for case, ss in samples.items()}
    res.rows.append(Row("GPT-2 warm cachedb, fresh dir: time in torch's compiler backend (AOTAutograd and Inductor: "
                        "what the FX graph and AOTAutograd caches serve) vs warm local files",
                        phase["warm cachedb"]["OutputGraph.call_user_compiler"],
                        phase["warm local"]["OutputGraph.call_user_compiler"], "warm local dir"))
    res.rows.append(Row("GPT-2 warm cachedb, fresh dir: Dynamo's bytecode tracing (no cache serves it; precompile "
                        "skips it) vs warm local files, for scale", phase["warm cachedb"]["bytecode_tracing"],
                        phase["warm local"]["bytecode_tracing"], "warm local dir", note="the same work on both sides"))
    tuning_rows(res, "GPT-2 warm cachedb", samples, "warm cachedb", target="")
    if "warm cachedb precompile" in first:
        res.rows.append(Row("GPT-2 precompile=True through cachedb, fresh dir: first calls vs warm local files",
                            first["warm cachedb precompile"], local, "warm local dir",
                            note="compiles and runs (ok); torch's caching precompile is experimental"))
        res.rows.append(Row("GPT-2 precompile=True through cachedb, fresh dir: Dynamo's bytecode tracing vs cachedb "
                            "with precompile off", phase["warm cachedb precompile"]["bytecode_tracing"],
                            phase["warm cachedb"]["bytecode_tracing"], "cachedb, precompile off"))
    if "cold, cachedb precompile" in first:
        res.rows.append(Row("GPT-2 precompile=True, cold into cachedb vs cold to files: first calls",
                            first["cold, cachedb precompile"], first["cold"], "cold compile"))
    res.rows.append(Row("GPT-2 database bytes vs the cold run's cache directory", summarize([db_bytes(live_db)], "bytes"),
                        summarize([dir_bytes(cold_dir)], "bytes"), "directory bytes"))

    for case, ss in samples.items():
        calls = [(s["tuning_calls"]["coordesc_calls"], s["tuning_calls"]["benchmark_gpu_calls"]) for s in ss]
        hits = {k: v for k, v in ss[0]["counters"].items() if k.endswith(("_hit", "_miss"))}
        res.notes.append(f"{case}: first calls {[round(s['first_call_s'], 2) for s in ss]} s, wall "
                         f"{[round(s['wall_s'], 1) for s in ss]} s; Dynamo tracing "
                         f"{[s.get('named_phases_s', {}).get('bytecode_tracing') for s in ss]} s, compiler backend "
                         f"{[s.get('named_phases_s', {}).get('OutputGraph.call_user_compiler') for s in ss]} s; "
                         "tuning calls (coordinate descent, GPU benchmarks) "
                         f"{calls}; cache counters (first sample) {json.dumps(hits, sort_keys=True)}")
    benchmarked = sorted({k for ss in samples.values() for s in ss for k in s["tuning_calls"].get("benchmarked", [])})
    res.notes.append(f"Compile workers: TORCHINDUCTOR_COMPILE_THREADS={WORKERS} in every process; default torch.compile "
                     "settings. Torch stores no winner for a reduction with one heuristic config and coordinate descent "
                     "off (check_autotune_cache creates no autotune cache for it), so a halved-RBLOCK launcher that "
                     "_dynamic_scale_rblock adds to one is benchmarked in every process, whatever the cache"
                     + (f"; kernels autotune_to_one_config benchmarked: {benchmarked}" if benchmarked else "") + ".")
    res.extra = {"samples": samples}
    return res
