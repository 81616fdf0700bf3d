"""§6 Concurrency: 8 processes (4 in a quick run) record autotune timings for distinct ops at once.

Each process records N new (op, inputs) pairs (10 choices each) for its own op, starting
together (every process is set up first, then released at once). Afterwards the store is
read back and every pair that does not have its 10 timings counts as a lost update.

Baseline: torch's ``PersistentCache`` on one shared cache dir — each record reads the whole
``cache/<system hash>`` JSON and rewrites it (no lock), so concurrent writers overwrite each
other's updates. cachedb: one ``CacheDB.transaction()`` per ``repos.timings.record``; and
(full runs) the same ``PersistentCache`` calls with ``cachedb.install(db)`` in each process.
Both stores start with the same 1,000 timings. Units: lost updates (count), latency ms.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import _payloads as P
from ._concurrency_child import op_name, pair_id
from ._context import REPO_ROOT, Context, fresh_torch_cache
from ._report import Row, SectionResult
from ._stats import seconds_to, summarize

NAME = "concurrency"
TITLE = "Concurrency: writer processes at once, lost updates and latency"
#: Writer processes (a quick run: :data:`QUICK_PROCS`).
PROCS = 8
QUICK_PROCS = 4
PRELOAD_TIMINGS = 1_000


def _run_writers(mode: str, n_procs: int, n: int, env: dict[str, str], db: Path | None) -> dict[str, Any]:
    """Start ``n_procs`` children, release them together, collect latencies and errors."""
    procs = []
    for p in range(n_procs):
        cmd = [sys.executable, "-m", "benchmarks._concurrency_child", mode, str(p), str(n)]
        if db is not None:
            cmd += ["--db", str(db)]
        procs.append(
            subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        )
    for proc in procs:
        line = proc.stdout.readline() if proc.stdout else ""
        if line.strip() != "ready":
            err = proc.stderr.read() if proc.stderr else ""
            for other in procs:
                other.kill()
            raise RuntimeError(f"{mode} writer failed to start: {line!r} {err[-2000:]}")
    t0 = time.perf_counter()
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    latencies: list[float] = []
    errors: list[str] = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"{mode} writer exited {proc.returncode}: {err[-2000:]}")
        data = json.loads(out.strip().splitlines()[-1])
        latencies += data["latencies_s"]
        errors += data["errors"]
    return {"latencies": latencies, "errors": errors, "wall_s": wall}


def _count_files(cache_file: Path, n_procs: int, n: int) -> int:
    cache = json.loads(cache_file.read_text())["cache"]
    found = 0
    for p in range(n_procs):
        per_op = cache.get(op_name(p), {})
        for i in range(n):
            if len(per_op.get(P.inputs_key(pair_id(p, i)), {}).get(P.PRECISION, {})) == P.CHOICES_PER_INPUT:
                found += 1
    return found


def _count_db(db: Path, n_procs: int, n: int) -> int:
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute(
            "SELECT op, inputs, COUNT(DISTINCT choice_hash) FROM autotune_timings "
            "WHERE op LIKE 'conc_op%' GROUP BY op, inputs"
        ).fetchall()
    finally:
        conn.close()
    wanted = {(op_name(p), P.inputs_key(pair_id(p, i))) for p in range(n_procs) for i in range(n)}
    return sum(1 for op, inputs, k in rows if (op, inputs) in wanted and k == P.CHOICES_PER_INPUT)


def run(ctx: Context) -> SectionResult:
    from cachedb import CacheDB, Fingerprint
    from cachedb.layout.importer import Importer
    from torch._inductor.codecache import PersistentCache

    res = SectionResult(NAME, TITLE)
    n = 5 if ctx.quick else 25
    n_procs = QUICK_PROCS if ctx.quick else PROCS
    expected = n_procs * n
    modes = ["files", "cachedb"] if ctx.quick else ["files", "cachedb", "live"]
    out: dict[str, dict[str, Any]] = {}
    with fresh_torch_cache(ctx, "conc") as cache_dir:
        PersistentCache().update_local_cache(P.timings_document(PRELOAD_TIMINGS))
        cache_file = PersistentCache.get_local_cache_path()
        db_paths = {}
        for mode in ("cachedb", "live"):
            db_paths[mode] = ctx.tmpdir(f"conc{mode}") / "conc.db"
            db = CacheDB(db_paths[mode])
            Importer(db, fingerprint=Fingerprint(system={"hash": P.CPU_SYSTEM_HASH})).run(cache_dir)
            db.close()
        env = dict(os.environ)
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        for mode in modes:
            ctx.log(f"concurrency: {n_procs} '{mode}' writers x {n} records")
            mode_env = dict(env)
            if mode == "live":
                mode_env["TORCHINDUCTOR_CACHE_DIR"] = str(ctx.tmpdir("conclivecache"))
            out[mode] = _run_writers(mode, n_procs, n, mode_env, db_paths.get(mode))
        out["files"]["found"] = _count_files(cache_file, n_procs, n)
        for mode in ("cachedb", "live"):
            if mode in out:
                out[mode]["found"] = _count_db(db_paths[mode], n_procs, n)

    lost = {mode: expected - r["found"] for mode, r in out.items()}
    res.extra = {
        "procs": n_procs,
        "records_per_proc": n,
        "expected": expected,
        "lost": lost,
        "errors": {mode: r["errors"][:5] for mode, r in out.items()},
        "error_count": {mode: len(r["errors"]) for mode, r in out.items()},
        "wall_s": {mode: round(r["wall_s"], 2) for mode, r in out.items()},
    }
    base_lost = summarize([lost["files"]], "lost updates")
    base_lat = out["files"]["latencies"]
    for mode, label in (("cachedb", "cachedb repositories"), ("live", "live: PersistentCache via cachedb.install")):
        if mode not in out:
            continue
        r = out[mode]
        res.rows.append(
            Row(f"lost updates of {expected} ({label})", summarize([lost[mode]], "lost updates"), base_lost,
                "PersistentCache JSON", target="0", met=lost[mode] == 0)
        )
        res.rows.append(
            Row(f"record latency p50, {n_procs} writers ({label})", seconds_to("ms", r["latencies"]),
                seconds_to("ms", base_lat), "PersistentCache JSON")
        )
        res.rows.append(
            Row(f"record latency p99, {n_procs} writers ({label})", seconds_to("ms", [_percentile(r["latencies"], 0.99)]),
                seconds_to("ms", [_percentile(base_lat, 0.99)]), "PersistentCache JSON",
                note=f"one p99 over {len(r['latencies'])} / {len(base_lat)} records")
        )
    for mode, r in out.items():
        slow = sum(1 for x in r["latencies"] if x > 0.1)
        res.extra.setdefault("records_over_100ms", {})[mode] = slow
    if "cachedb" in out:
        res.notes.append(
            "cachedb's tail: a writer takes SQLite's write lock up front (`BEGIN IMMEDIATE`); the others "
            "wait in SQLite's busy handler, which sleeps in growing steps (up to 100 ms) between retries, "
            f"so with {n_procs} writers on {os.cpu_count()} cores some records wait several rounds. Records over 100 ms: "
            + ", ".join(f"{m} {k}" for m, k in res.extra["records_over_100ms"].items())
            + "."
        )
    res.notes.append(
        f"{n_procs} processes x {n} records on {os.cpu_count()} cores; lost updates: "
        + ", ".join(f"{m} {v}/{expected}" for m, v in lost.items())
        + "; the p50 rows show every record's latency (median [p10–p90]); the p99 rows one "
        "percentile over all records of all processes (hence n = 1). Errors: "
        + ", ".join(f"{m} {len(r['errors'])}" for m, r in out.items())
        + "."
    )
    return res


def _percentile(values: list[float], q: float) -> float:
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
