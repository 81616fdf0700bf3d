"""§10 Dynamo's own caches: PGO profiles and precompiled Dynamo packages, served from cachedb.

Every sample is a fresh process (``benchmarks._warm_child``). On the CPU (default) the
workloads are an MLP and a function called with 7, 33 and 1,024 rows (``rows``: compiled static
first, then recompiled dynamic, unless a PGO profile says so at once); with ``--device cuda``
they are §1's GPU workloads (:mod:`benchmarks._gpu_workloads`). Two settings, each side by
side in one run:

- **PGO on** (``TORCH_COMPILE_JOB_ID`` set, how PGO is turned on outside Meta; CPU only): a
  cold run fills a cache directory (files) and another an empty database
  (``cachedb.installed``); warm local files (the populated directory) against a fresh, empty
  directory served by the database: frames Dynamo compiled, and the compile time of the first
  calls.
- **precompile on** (torch's caching precompile, experimental): the files side sets
  ``TORCH_CACHING_PRECOMPILE=1`` and calls ``torch.compiler.save_cache_artifacts()`` (the only
  way torch writes the packages), the cachedb side ``cachedb.installed(db, precompile=True)``
  (cachedb stores them when the block ends); warm local files against a fresh directory from
  the database: ``dynamo_cache_hit`` (a hit skips Dynamo's tracing) and first calls. The same
  database also serves a warm start with precompile off (``cachedb.installed(db)``, no
  ``TORCH_CACHING_PRECOMPILE``): what precompile saves over cachedb's ordinary warm start, on
  the same entries. PGO stays off there, so the two settings are measured apart.

As in §1, warm local runs on the machine whose cold run filled its directory (its ``TMPDIR``,
C++ precompiled headers included) and every other sample on a new, empty ``TMPDIR``.
"""

from __future__ import annotations

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

NAME = "pgo"
TITLE = "Dynamo's caches: PGO profiles and precompiled packages (fresh process per sample)"

#: The workloads per device: CPU (``examples/build_cache.py``'s MLP and ``rows``) and GPU
#: (:mod:`benchmarks._gpu_workloads`, as §1 runs them).
MODELS = {"cpu": "mlp,rows", "cuda": "mlp_autotune,transformer,dynamic_gpu"}
JOB_ID = "bench"
#: cachedb's ordinary warm start (precompile off), the baseline of what precompile saves.
OFF = "warm cachedb, precompile off"


def _sample(device: str, models: str, mode: str, cache_dir: Path, machine_tmp: Path, env_extra: dict[str, str],
            *args: str) -> dict[str, Any]:
    """One ``benchmarks._warm_child`` process on ``device`` running ``models`` (comma-separated
    workloads) with ``env_extra``
    (PGO's job id, torch's precompile switch); its JSON report."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CACHEDB_", "TRITON_", "TORCH_"))}
    env.update(TMPDIR=str(machine_tmp), **env_extra)
    if device == "cpu":
        env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    machine_tmp.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "benchmarks._warm_child", mode, "--cache-dir", str(cache_dir), "--models",
           models, "--device", device, *args, "--t0", repr(time.time())]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"Dynamo child {mode} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    if not report.get("ok"):
        raise RuntimeError(f"Dynamo child {mode}: a workload gave wrong results: {report}")
    return report


def _models(ctx: Context) -> list[str]:
    """The workloads of each sample: ``MODELS`` of the device; in a quick run only the one PGO
    and precompile act on (its graphs see several shapes)."""
    if ctx.quick:
        return ["dynamic_gpu" if ctx.device == "cuda" else "rows"]
    return MODELS[ctx.device].split(",")


def _setting(ctx: Context, label: str, env: dict[str, str], n_warm: int, *, precompile: bool,
             off_samples: list[dict[str, Any]] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Cold files, cold cachedb, then ``n_warm`` rounds of warm local files and a fresh dir from
    the database (rotating which goes first). With ``precompile``, also cachedb's ordinary warm
    start (precompile off) on the same workloads: ``off_samples`` where §1 measured it in this
    run, else a database filled by a cold run with precompile off and a fresh dir from it each
    round."""
    samples: dict[str, list[dict[str, Any]]] = {}
    device = ctx.device
    models = ",".join(_models(ctx))

    def add(case: str, report: dict[str, Any]) -> None:
        samples.setdefault(case, []).append(report)
        ctx.log(f"{label}: {case}: first calls {report['first_call_s']:.2f}s, frames {report['frames']}, "
                f"dynamo_cache {report['dynamo_cache']}")

    files_dir = ctx.cache_dir("files")
    machine_a = ctx.machine("machine-a")
    db, db_off = ctx.tmpdir("db") / "cache.db", ctx.tmpdir("db-off") / "cache.db"
    files_args = ["--save-precompile"] if precompile else []
    db_args = ["--db", str(db)] + (["--precompile"] if precompile else [])
    add("cold files", _sample(device, models, "files", files_dir, machine_a, env, *files_args))
    add("cold cachedb", _sample(device, models, "cachedb-cold", ctx.cache_dir("dbcold"), ctx.machine(),
                                env, *db_args))
    cases = ["warm local", "warm cachedb"]
    if precompile and off_samples:
        samples[OFF] = list(off_samples)
    elif precompile:
        add("cold cachedb, precompile off", _sample(device, models, "cachedb-cold", ctx.cache_dir("dbcold"),
                                                    ctx.machine(), {}, "--db", str(db_off)))
        cases.append(OFF)
    for r in range(n_warm):
        for case in cases[r % len(cases):] + cases[:r % len(cases)]:
            if case == "warm local":
                report = _sample(device, models, "files", files_dir, machine_a, env, *files_args)
            elif case == "warm cachedb":
                report = _sample(device, models, "cachedb", ctx.cache_dir("dbwarm"), ctx.machine(), env,
                                 *db_args)
            else:
                report = _sample(device, models, "cachedb", ctx.cache_dir("dbwarm"), ctx.machine(), {},
                                 "--db", str(db_off))
            add(case, report)
    return samples


def run(ctx: Context) -> SectionResult:
    res = SectionResult(NAME, TITLE)
    gpu = ctx.device == "cuda"
    #: The workload PGO and precompile act on most: its graphs see several shapes.
    shapes_fn = "dynamic_gpu" if gpu else "rows"
    models = _models(ctx)
    n_warm = 1 if ctx.quick else (2 if gpu else 5)
    pgo: dict[str, list[dict[str, Any]]] = {}
    if gpu:
        res.notes.append("PGO is measured on the CPU only: the GPU workloads' only graphs that see several shapes "
                         "are compiled with dynamic=True, so a profile has nothing to decide there.")
    else:
        pgo = _setting(ctx, "PGO on", {"TORCH_COMPILE_JOB_ID": JOB_ID}, n_warm, precompile=False)
    # §1 in the same run (the GPU run) measured cachedb's ordinary warm start on these workloads.
    s1 = ctx.shared.get("warm_start_samples") or {}
    off = s1.get("warm cachedb (live-filled DB)") if s1.get("models") == models else None
    pre = _setting(ctx, "precompile on", {"TORCH_CACHING_PRECOMPILE": "1"}, n_warm, precompile=True,
                   off_samples=off)
    if off:
        res.notes.append("cachedb's warm start with precompile off: §1's live-filled database samples of this run "
                         "(same workloads, same machine).")

    def dist(samples: list[dict[str, Any]], key: str, unit: str) -> Any:
        return summarize([s[key] for s in samples], unit)

    def shapes(samples: list[dict[str, Any]]) -> Any:
        return summarize([s["seconds"][shapes_fn] for s in samples], "s")

    def hits(samples: list[dict[str, Any]]) -> Any:
        return summarize([s["dynamo_cache"].get("dynamo_cache_hit", 0) for s in samples], "hits")

    shapes_label = "the 7/33/1,024-row function" if not gpu else "the dynamic-shape graphs (dynamic_gpu)"

    def versus_local(label: str, samples: dict[str, list[dict[str, Any]]], counted: str, count: Any) -> Any:
        """The rows each setting shares: ``counted`` (``count(samples)``: what the setting
        saves, = warm local), first calls (≤ 1.0x) and the shapes workload's first calls, a
        fresh dir from cachedb against warm local files. Returns the first calls from cachedb."""
        c_db, c_local = count(samples["warm cachedb"]), count(samples["warm local"])
        res.rows.append(Row(f"{label}: {counted}, fresh dir from cachedb vs warm local files", c_db, c_local,
                            "warm local dir", target="= warm local", met=c_db.median == c_local.median))
        t_db = dist(samples["warm cachedb"], "first_call_s", "s")
        t_local = dist(samples["warm local"], "first_call_s", "s")
        res.rows.append(Row(f"{label}: first calls, fresh dir from cachedb vs warm local files", t_db, t_local,
                            "warm local dir", target="≤ 1.0x", met=t_db.median <= t_local.median))
        res.rows.append(Row(f"{label}: first calls of {shapes_label} alone, fresh dir from cachedb vs warm local "
                            "files", shapes(samples["warm cachedb"]), shapes(samples["warm local"]), "warm local dir"))
        return t_db

    def frames(samples: list[dict[str, Any]]) -> Any:
        return dist(samples, "frames", "frames")

    if pgo:
        versus_local("PGO on", pgo, "frames compiled", frames)
        res.rows.append(Row("PGO on: frames compiled, cold (no profile yet) vs warm local files (torch alone, for "
                            "scale)", frames(pgo["cold files"]), frames(pgo["warm local"]), "warm local dir",
                            note="not cachedb"))
    p_db = versus_local("precompile on", pre, "dynamo_cache_hit", hits)
    res.rows.append(Row("precompile on: frames compiled, fresh dir from cachedb vs warm local files",
                        frames(pre["warm cachedb"]), frames(pre["warm local"]), "warm local dir"))
    p_off = dist(pre[OFF], "first_call_s", "s")
    res.rows.append(Row("cachedb warm start with precompile vs without: first calls", p_db, p_off,
                        "cachedb, fresh dir, precompile off", target="≤ 0.8x" if gpu else "",
                        met=(p_db.median <= 0.8 * p_off.median) if gpu else None,
                        note="the Dynamo tracing a precompile hit skips"))
    res.rows.append(Row("cachedb warm start with precompile vs without: frames compiled", frames(pre["warm cachedb"]),
                        frames(pre[OFF]), "cachedb, fresh dir, precompile off"))
    settings = ([("PGO on", pgo)] if pgo else []) + [("precompile on", pre)]
    for label, samples in settings:
        res.rows.append(Row(f"{label}: cold compile writing to cachedb vs cold to files: first calls",
                            dist(samples["cold cachedb"], "first_call_s", "s"),
                            dist(samples["cold files"], "first_call_s", "s"), "cold compile"))
    breakdown: dict[str, Any] = {}
    for label, samples in (("pgo", pgo), ("precompile", pre)):
        for case, ss in samples.items():
            per_model = {m: round(sorted(s["seconds"][m] for s in ss)[len(ss) // 2], 3) for m in models}
            breakdown[f"{label}: {case}"] = {
                "first_call_s": [s["first_call_s"] for s in ss], "wall_s": [round(s["wall_s"], 2) for s in ss],
                "median_per_model_s": per_model, "frames": [s["frames"] for s in ss],
                "dynamo_cache": [s["dynamo_cache"] for s in ss],
            }
            res.notes.append(f"{label}, {case}: first calls {[s['first_call_s'] for s in ss]} s "
                             f"(median per workload {per_model}), frames {[s['frames'] for s in ss]}, "
                             f"dynamo_cache {ss[0]['dynamo_cache']}")
    res.extra = {"models": models, "device": ctx.device, "n_warm": n_warm, "breakdown": breakdown}
    return res
