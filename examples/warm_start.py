"""Cold compile into a cachedb database, then a fresh process on a NEW cache dir served from it.

Usage::

    python examples/warm_start.py WORK_DIR [--device cuda|cpu] [--json]

Runs :func:`workload` three times, each time in a fresh interpreter started by ``cachedb run`` (so
Inductor reads and writes ``WORK_DIR/cache.db``), first with ``WORK_DIR/cold`` then with
``WORK_DIR/warm`` as ``TORCHINDUCTOR_CACHE_DIR``, then once more with the FX graph and
AOTAutograd caches off (every graph recompiled: GEMM autotuning must find its timings in the
database). Prints, per phase, the Inductor and
AOTAutograd counters, the wall time in seconds, and whether any of Inductor's cache files
(``fxgraph/``, ``aotautograd/``, ``cache/``, ``*.best_config``) appeared in the cache dir.

The workload (``mode="max-autotune"``): on CUDA a bf16 MLP (Triton/ATen GEMM autotuning,
coordinate descent best configs), a dynamic-shape function called with two sizes, and a
forward+backward; on CPU the same with the ATen/C++ GEMM backends.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def workload(device: str) -> dict:
    import torch
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if device == "cpu":
        torch._inductor.config.max_autotune_gemm_backends = "ATEN,CPP"
    torch._inductor.config.coordinate_descent_tuning = device == "cuda"

    mlp = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)
    ).to(device, dtype)
    with torch.no_grad():
        torch.compile(mlp, mode="max-autotune")(torch.randn(256, 512, device=device, dtype=dtype))

    def scaled(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(x @ w) * x.shape[0]

    f = torch.compile(scaled, dynamic=True)
    w = torch.randn(64, 64, device=device, dtype=dtype)
    for rows in (32, 96):
        f(torch.randn(rows, 64, device=device, dtype=dtype), w)

    train = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(device)
    torch.compile(train)(torch.randn(16, 64, device=device)).sum().backward()
    if device == "cuda":
        torch.cuda.synchronize()

    out = {k: v for k, v in counters["inductor"].items()}
    out.update({k: v for k, v in counters["aot_autograd"].items() if k.startswith("autograd_cache")})
    return out


def _phase(db: Path, cache_dir: Path, device: str, **env_extra: str) -> dict:
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    env.update(env_extra)
    code = (
        "import json, sys; sys.path.insert(0, %r); import warm_start; "
        "print(json.dumps(warm_start.workload(%r)))" % (str(Path(__file__).parent), device)
    )
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "cachedb", "--db", str(db), "run", "--", sys.executable, "-c", code],
        capture_output=True, text=True, env=env,
    )
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"phase failed ({cache_dir}):\n{proc.stderr[-5000:]}")
    leftovers = [k for k in ("fxgraph", "aotautograd", "cache") if (cache_dir / k).exists()]
    leftovers += [str(p.relative_to(cache_dir)) for p in cache_dir.rglob("*.best_config")]
    return {
        "seconds": round(seconds, 2),
        "counters": json.loads(proc.stdout.strip().splitlines()[-1]),
        "inductor_cache_files_left": leftovers,
        "cachedb_warnings": [l for l in proc.stderr.splitlines() if "cachedb" in l][:5],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work_dir", type=Path)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    db = args.work_dir / "cache.db"
    result = {
        "cold": _phase(db, args.work_dir / "cold", args.device),
        "warm": _phase(db, args.work_dir / "warm", args.device),
        # FX graph and AOTAutograd caches off: every graph is compiled again, so GEMM
        # autotuning asks the database for timings (on an FX hit Inductor replays the
        # counters of the original compile, benchmarking ones included).
        "warm_recompile": _phase(
            db, args.work_dir / "warm_recompile", args.device,
            TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0",
        ),
    }
    stats = subprocess.run(
        [sys.executable, "-m", "cachedb", "--db", str(db), "stats", "--format", "json"],
        capture_output=True, text=True, check=True,
    )
    result["db_stats"] = json.loads(stats.stdout)
    result["db_bytes"] = db.stat().st_size
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
