"""§13 Several GPUs: a DDP training step compiled by N ranks into one database (``--nproc N``).

``python -m benchmarks --device cuda --only ddp --nproc N`` starts every sample as
``python -m torch.distributed.run --standalone --nproc-per-node N -m benchmarks._ddp_child``:
N ranks, one GPU each (NCCL), each compiling :func:`benchmarks._gpu_workloads.ddp_training`
(a DDP-wrapped two-block transformer training step in bf16 with coordinate-descent tuning,
then a max-autotune MLP) with Inductor's compile workers (:data:`WORKERS` per rank's share of
the cores). The ranks of a sample share one cache directory, as on one host, and in the
cachedb cases one database. Cases: cold into files (each rank also saves its Mega-Cache
blob), cold into an empty database (``cachedb.installed``, the live-filled database), warm
local files (the cold run's directory and ``TMPDIR``), Mega-Cache into a fresh directory
(each rank loads its blob), cachedb into a fresh directory from the live-filled database.
Reported per rank: first calls, the tuning calls it ran (:mod:`benchmarks._tuning_calls`:
calls of ``CoordescTuner.autotune`` and ``InductorBenchmarker.benchmark_gpu``), and the
database's bytes against the cold directory's.

Without ``--nproc`` (or with fewer GPUs than N) the section reports one line.
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
from .s12_gpt2 import child_env, db_bytes, dir_bytes, tuning_rows

NAME = "ddp"
TITLE = "Several GPUs: a DDP training step compiled by N ranks into one database (fresh processes per sample)"


def skip_reason(device: str, nproc: int, gpus: int | None) -> str | None:
    """Why the section measures nothing here (one line), or None. ``gpus``: how many the
    machine has (None: not asked)."""
    if device != "cuda":
        return "skipped: the DDP workload runs with --device cuda only (a GPU machine)"
    if nproc < 1:
        return "skipped: --nproc N (N >= 1) runs the DDP workload on N GPUs"
    if gpus is not None and gpus < nproc:
        return f"skipped: --nproc {nproc} needs {nproc} GPUs, this machine has {gpus}"
    return None


def workers(nproc: int) -> int:
    """Compile workers per rank: the rank's share of the cores, 1 to 16."""
    return max(1, min(16, (os.cpu_count() or 1) // nproc))


def launch_command(nproc: int, mode: str, cache_dir: Path, out: Path, t0: float, **opts: str | bool) -> list[str]:
    """``torch.distributed.run`` starting ``nproc`` ranks of ``benchmarks._ddp_child``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "-m", "benchmarks._ddp_child", mode, "--cache-dir", str(cache_dir), "--out", str(out), "--t0", repr(t0)]
    for key, value in opts.items():
        flag = f"--{key.replace('_', '-')}"
        cmd += [flag] if value is True else [flag, str(value)]
    return cmd


def _sample(ctx: Context, nproc: int, mode: str, cache_dir: Path, machine: Path,
            **opts: str | bool) -> list[dict[str, Any]]:
    out = ctx.tmpdir("ranks")
    env = child_env(machine, workers(nproc))
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(launch_command(nproc, mode, cache_dir, out, time.time(), **opts), cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"ddp {mode} failed ({proc.returncode}): {proc.stderr[-4000:]}")
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]
    if not all(r["ok"] for r in reports):
        raise RuntimeError(f"ddp {mode}: wrong results: {reports}")
    return reports


def run(ctx: Context) -> SectionResult:
    res = SectionResult(NAME, TITLE)
    nproc = ctx.nproc
    gpus = None
    if ctx.device == "cuda" and nproc >= 1:
        import torch

        gpus = torch.cuda.device_count()
    reason = skip_reason(ctx.device, nproc, gpus)
    if reason:
        res.notes.append(reason)
        return res
    n_warm = 1 if ctx.quick else 2
    ranks: dict[str, list[dict[str, Any]]] = {}  # case -> every rank of every sample

    def add(case: str, reports: list[dict[str, Any]]) -> None:
        ranks.setdefault(case, []).extend(reports)
        ctx.log(f"ddp: {case}: first calls per rank {[round(r['first_call_s'], 1) for r in reports]} s, tuning calls "
                f"{[(r['tuning_calls']['coordesc_calls'], r['tuning_calls']['benchmark_gpu_calls']) for r in reports]}")

    machine_a = ctx.machine("machine-a")
    cold_dir = ctx.cache_dir("cold")
    mega_dir = ctx.tmpdir("mega")
    add("cold", _sample(ctx, nproc, "files", cold_dir, machine_a, mega_dir=str(mega_dir), save_mega=True))
    live_db = ctx.tmpdir("colddb") / "live.db"
    add("cold, cachedb installed", _sample(ctx, nproc, "cachedb-cold", ctx.cache_dir("dbcold"),
                                           ctx.machine(), db=str(live_db)))
    cases = ["warm local", "warm Mega-Cache", "warm cachedb"]
    for r in range(n_warm):
        for case in cases[r % len(cases):] + cases[: r % len(cases)]:
            if case == "warm local":
                add(case, _sample(ctx, nproc, "files", cold_dir, machine_a))
            elif case == "warm Mega-Cache":
                add(case, _sample(ctx, nproc, "mega", ctx.cache_dir("megarun"), ctx.machine(),
                                  mega_dir=str(mega_dir)))
            else:
                add(case, _sample(ctx, nproc, "cachedb", ctx.cache_dir("dbrun"), ctx.machine(),
                                  db=str(live_db)))

    # For scale: the same warm start with the seams that keep a served winner the winner undone
    # in the ranks (cachedb before them: recheck_autotune_cache and the best configs alone).
    add("warm cachedb, winner seams off", _sample(ctx, nproc, "cachedb", ctx.cache_dir("offrun"),
                                                  ctx.machine(), db=str(live_db), without_winner_seams=True))

    first = {case: summarize([r["first_call_s"] for r in rs], "s") for case, rs in ranks.items()}
    local = first["warm local"]
    label = f"DDP on {nproc} GPUs"
    res.rows.append(Row(f"{label}, warm cachedb (live-filled DB), fresh dir: first calls per rank vs warm local files",
                        first["warm cachedb"], local, "warm local dir", target="≤ 0.25x",
                        met=first["warm cachedb"].median <= 0.25 * local.median))
    res.rows.append(Row(f"{label}, warm cachedb (live-filled DB), fresh dir: first calls per rank vs Mega-Cache",
                        first["warm cachedb"], first["warm Mega-Cache"], "Mega-Cache blob, fresh dir"))
    res.rows.append(Row(f"{label}, warm Mega-Cache vs warm local (torch alone, for scale): first calls per rank",
                        first["warm Mega-Cache"], local, "warm local dir", note="not cachedb: both torch"))
    res.rows.append(Row(f"{label}, warm local vs cold (torch alone, for scale): first calls per rank", local,
                        first["cold"], "cold compile", note="not cachedb: both torch"))
    res.rows.append(Row(f"{label}, cold compile writing to one cachedb vs cold to files: first calls per rank",
                        first["cold, cachedb installed"], first["cold"], "cold compile"))
    tuning_rows(res, f"{label}, warm cachedb", ranks, "warm cachedb", per="rank")
    off = "warm cachedb, winner seams off"
    res.rows.append(Row(f"{label}, warm cachedb vs the same with the winner-keeping seams off in the ranks: first calls "
                        "per rank", first["warm cachedb"], first[off], off))
    for key, what in (("coordesc_calls", "coordinate-descent runs"), ("benchmark_gpu_calls", "GPU benchmarks")):
        res.rows.append(Row(f"{label}, {off}: {what} per rank (for scale)",
                            summarize([r["tuning_calls"][key] for r in ranks[off]], "calls"),
                            summarize([r["tuning_calls"][key] for r in ranks["warm cachedb"]], "calls"),
                            "warm cachedb", note="Config pickling, RBLOCK scaling and 2.11's winner lookup as torch has them"))
    for case in ("cold", "warm Mega-Cache"):
        for key, what in (("coordesc_calls", "coordinate-descent runs"), ("benchmark_gpu_calls", "GPU benchmarks")):
            res.rows.append(Row(f"{label}, {case}: {what} per rank (torch alone, for scale)",
                                summarize([r["tuning_calls"][key] for r in ranks[case]], "calls"),
                                summarize([r["tuning_calls"][key] for r in ranks["warm local"]], "calls"),
                                "warm local dir", note="not cachedb"))
    res.rows.append(Row(f"{label}: database bytes vs the cold run's cache directory", summarize([db_bytes(live_db)], "bytes"),
                        summarize([dir_bytes(cold_dir)], "bytes"), "directory bytes"))
    for case, rs in ranks.items():
        res.notes.append(
            f"{case}: per rank (rank, first calls s, DDP step s (forward, backward), MLP s, coordinate descent, "
            "GPU benchmarks, AOTAutograd cache hits/bypasses): "
            + "; ".join(f"({r['rank']}, {r['first_call_s']:.2f}, {r['seconds']['ddp_step']:.2f} "
                        f"({r['seconds'].get('ddp_forward', 0.0):.2f}, {r['seconds'].get('ddp_backward', 0.0):.2f}), "
                        f"{r['seconds']['mlp_autotune']:.2f}, {r['tuning_calls']['coordesc_calls']}, "
                        f"{r['tuning_calls']['benchmark_gpu_calls']}, "
                        f"{r['counters'].get('autograd_cache_hit', 0)}/{r['counters'].get('autograd_cache_bypass', 0)})"
                        for r in rs)
            + (f"; kernels tuned: {sorted({k for r in rs for k in r['tuning_calls']['kernels']})}"
               if any(r["tuning_calls"]["kernels"] for r in rs) and case != "cold" else "")
            + (f"; launchers benchmarked by autotune_to_one_config: "
               f"{sorted({k for r in rs for k in r['tuning_calls'].get('benchmarked', [])})}"
               if any(r["tuning_calls"].get("benchmarked") for r in rs) and case != "cold" else ""))
    res.notes.append(f"{nproc} ranks through torch.distributed.run --standalone, NCCL, {workers(nproc)} compile "
                     "workers per rank (TORCHINDUCTOR_COMPILE_THREADS); one cache directory per sample shared by its "
                     "ranks, one database shared by the ranks of the cachedb cases.")
    res.extra = {"nproc": nproc, "ranks": ranks}
    return res
