"""A real CPU max-autotune tuning under ``cachedb.installed(DB)``, run as its own process.

``python tests/_tuning_child.py DB CACHE_DIR`` runs examples/build_cache.py's workloads
``gemm_autotune`` (a ``torch.nn.Linear`` under ``torch.no_grad()`` with ``max_autotune``,
``max_autotune_gemm_backends="ATEN,CPP"`` and ``freezing``: in a fresh process Inductor tunes a
``packed_linear`` between ``cpp_CppMicroGemmFP32Vec_0`` and ``_mkl_linear``), ``mlp`` and
``gemm_autotune`` again (after another compile the same Linear is a ``linear_unary`` between
``cpp_CppMicroGemmFP32Vec_0`` and ``_linear_pointwise``, as in the builder's full run). Prints
one JSON line: Inductor's counters and the workloads' results.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    db, cache_dir = sys.argv[1], sys.argv[2]
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    sys.path.insert(0, str(ROOT / "examples"))
    import build_cache
    import torch
    from torch._dynamo.utils import counters

    import cachedb

    results = {}
    with cachedb.installed(db):
        for i, name in enumerate(("gemm_autotune", "mlp", "gemm_autotune")):
            results[f"{i}_{name}"] = getattr(build_cache, f"_workload_{name}")(torch)
    print(json.dumps({"counters": dict(counters["inductor"]), "workloads": results}, sort_keys=True))
    return 0 if all(r.get("ok") for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
