"""§9 Start-up: what an active cachedb adds to a Python process that imports torch.

Under ``cachedb run`` (and in every process started under an active cachedb) the environment
carries ``CACHEDB_ENABLE=1`` and cachedb's bootstrap on ``PYTHONPATH``. Most of those processes
never compile: DataLoader workers started with ``spawn``, ``torchrun``'s launcher, data-prep
scripts. cachedb is activated when torch imports its first seam module
(:mod:`cachedb.live._autoload`), so they should start as fast as without cachedb.

Each sample is a fresh ``python -c`` process, wall time from ``subprocess.run`` to its exit;
cachedb (``child_environment(db)``, the environment ``cachedb run`` gives its program) and the
baseline (the same environment without cachedb's variables and bootstrap) alternate, so drift in
the machine's speed hits both. Cases:

- ``import torch``: a process that never compiles (target ≤ 1.05x);
- ``import torch._dynamo``: a library that imports Dynamo at import time (it imports
  ``torch._inductor.cpp_builder``, a seam module patched when cachedb activates, which does not
  activate it by itself: cachedb is not imported);
- ``import torch._inductor.codecache``: what a compile imports before its first lookup, every
  seam module's patches included.

Units: s per process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from ._context import Context
from ._report import Row, SectionResult
from ._stats import seconds_to

NAME = "startup"
TITLE = "Start-up of a process that imports torch under an active cachedb"

#: (label, code run by ``python -c``, target ratio or None)
CASES: list[tuple[str, str, float | None]] = [
    ("import torch (never compiles)", "import torch", 1.05),
    ("import torch._dynamo", "import torch._dynamo", None),
    ("import torch._inductor.codecache", "import torch._inductor.codecache", None),
]


def _plain_environment() -> dict[str, str]:
    from cachedb.live import BOOTSTRAP_DIR

    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_") and k != "TRITON_CACHE_MANAGER"}
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOTSTRAP_DIR]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def _run_once(code: str, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, timeout=300)
    return time.perf_counter() - t0


def run(ctx: Context) -> SectionResult:
    from cachedb import CacheDB
    from cachedb.live import child_environment

    res = SectionResult(NAME, TITLE)
    reps = 1 if ctx.quick else 9
    db_path = ctx.tmpdir("startup") / "startup.db"
    CacheDB(db_path).close()  # created and migrated, as a database a user already has
    plain = _plain_environment()
    active = child_environment(str(db_path), base=plain)
    for env in (plain, active):
        env["TORCHINDUCTOR_CACHE_DIR"] = str(ctx.tmpdir("startup-inductor"))
    for label, code, limit in CASES:
        ctx.log(f"startup: {label}, {reps} pairs")
        if not ctx.quick:
            _run_once(code, plain)  # page cache warm for both
            _run_once(code, active)
        base_s: list[float] = []
        db_s: list[float] = []
        for i in range(reps):
            pair = [(plain, base_s), (active, db_s)]
            for env, out in pair if i % 2 == 0 else reversed(pair):
                out.append(_run_once(code, env))
        row = Row(label, seconds_to("s", db_s), seconds_to("s", base_s), "the same process without cachedb")
        if limit is not None:
            row.target = f"≤ {limit}x"
            row.met = row.ratio is not None and row.ratio <= limit
        res.rows.append(row)
    res.notes.append(
        "Each sample is a fresh `python -c` process (interpreter start and exit included); cachedb's "
        "environment is `child_environment(db)`, what `cachedb run` gives its program; pairs alternate "
        "which runs first. `import torch` alone imports neither cachedb nor Inductor; `torch._dynamo` "
        "imports `torch._inductor.cpp_builder`, a seam module that does not activate cachedb by itself "
        "(patched when a cache module does); `torch._inductor.codecache` activates it, so that row pays "
        "for importing cachedb and opening the database."
    )
    return res
