"""One rank of §13's DDP training workload, started by ``torch.distributed.run``.

``python -m torch.distributed.run --standalone --nproc-per-node N -m benchmarks._ddp_child MODE
--cache-dir DIR --out DIR --t0 EPOCH [--db PATH] [--mega-dir DIR] [--save-mega]`` where
``MODE`` is ``files`` (``TORCHINDUCTOR_CACHE_DIR=DIR``, shared by the ranks as on one host),
``mega`` (``torch.compiler.load_cache_artifacts`` of this rank's blob from ``--mega-dir``
first), ``cachedb`` (``cachedb.installed(db)``, one database for every rank) or
``cachedb-cold`` (the same, with an empty database the ranks fill). Each rank compiles
:func:`benchmarks._gpu_workloads.ddp_training` on its own GPU (NCCL) and writes
``rank<R>.json`` under ``--out``: its first calls, the tuning calls it ran
(:mod:`benchmarks._tuning_calls`) and Inductor's cache counters. ``--save-mega`` writes this
rank's Mega-Cache blob (``torch.compiler.save_cache_artifacts``, after the timing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks._ddp_child")
    parser.add_argument("mode", choices=["files", "mega", "cachedb", "cachedb-cold"])
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--t0", type=float, required=True)
    parser.add_argument("--db")
    parser.add_argument("--mega-dir")
    parser.add_argument("--save-mega", action="store_true")
    parser.add_argument("--without-winner-seams", action="store_true",
                        help="cachedb: put back torch's own Config.__setstate__, _dynamic_scale_rblock and "
                             "_load_cached_autotuning in this rank (what cachedb served before it kept winners)")
    return parser.parse_args(argv)


def without_winner_seams() -> None:
    """Undo, in this process, the seams that keep a served winner the winner
    (:mod:`cachedb.live._autotune`); the best-config backend and ``recheck_autotune_cache``
    stay. Compile workers keep theirs."""
    from torch._inductor.runtime import autotune_cache, triton_heuristics

    for owner, name in ((triton_heuristics.Config, "__setstate__"),
                        (triton_heuristics.CachingAutotuner, "_dynamic_scale_rblock"),
                        (autotune_cache, "_load_cached_autotuning")):
        inner = getattr(vars(owner).get(name), "__wrapped__", None)
        if inner is not None:
            setattr(owner, name, inner)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.abspath(args.cache_dir)
    seconds: dict[str, Any] = {}
    t = time.perf_counter()
    import torch
    import torch.distributed as dist
    from torch._dynamo.utils import counters

    seconds["import_torch"] = time.perf_counter() - t
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))

    from benchmarks._gpu_workloads import ddp_training
    from benchmarks._tuning_calls import count_tuning_calls

    calls = count_tuning_calls()
    scope: AbstractContextManager[Any] = nullcontext()
    t = time.perf_counter()
    if args.mode == "mega":
        blob = Path(args.mega_dir) / f"rank{rank}.bin"
        assert torch.compiler.load_cache_artifacts(blob.read_bytes()) is not None, "load_cache_artifacts loaded nothing"
    elif args.mode in ("cachedb", "cachedb-cold"):
        import cachedb

        scope = cachedb.installed(args.db)
    seconds["setup"] = time.perf_counter() - t
    dist.barrier()  # the ranks start their first calls together, as a job does
    with scope:
        if args.without_winner_seams:
            without_winner_seams()
        parts = ddp_training(torch, local_rank)
    ok = bool(parts.pop("ok"))
    wall = time.time() - args.t0
    if args.save_mega:
        saved = torch.compiler.save_cache_artifacts()
        assert saved is not None, "save_cache_artifacts returned nothing"
        Path(args.mega_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.mega_dir) / f"rank{rank}.bin").write_bytes(saved[0])
    flat = {k: int(v) for k, v in counters["inductor"].items()
            if any(w in k for w in ("cache", "autotune", "coordesc", "benchmark"))}
    # AOTAutograd's cache: torch bypasses it for the graphs DDPOptimizer splits off
    flat.update({k: int(v) for k, v in counters["aot_autograd"].items() if k.startswith("autograd_cache")})
    report = {
        "rank": rank,
        "wall_s": wall,
        "first_call_s": round(parts["ddp_step"] + parts["mlp_autotune"], 4),
        "seconds": {**{k: round(v, 4) for k, v in seconds.items()}, **{k: round(v, 4) for k, v in parts.items()}},
        "tuning_calls": calls,
        "counters": flat,
        "ok": ok,
    }
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
