"""§7 Bytes on disk: the cachedb database against the directory, for the same entries.

Two caches: (a) a REAL Inductor cache built by ``examples/build_cache.py`` (torch.compile of
an MLP, dynamic shapes, forward+backward, a CPU max-autotune GEMM and a best config) in full
runs, or the cold cache directory left by §1 in quick runs when §1 ran; (b) the synthetic
10k-file directory of §5 (generated here if §5 did not run).

Directory side: only the files cachedb stores (``fxgraph/``, ``aotautograd/``,
``cache/<hash>``, ``*.best_config``, ``configs_*.json``) — generated kernels, ``.so`` files and
locks are not cachedb's and are reported separately. Allocated bytes = ``st_blocks * 512``
(what the file system spends: small files round up to 4 KB blocks); apparent = ``st_size``.
Database side: the ``.db`` file after ``Importer`` and a clean close (WAL checkpointed).
Units: KB.

Eviction (:mod:`benchmarks._eviction`): a seeded lookup trace over pointwise FX graphs
(0.1–1 s to compile, 20–200 KB) and max-autotune graphs (30–120 s, 1–20 MB) of Zipf-like
popularity, replayed into a database bounded at 25% of the trace's bytes and pruned by
cachedb's own ``tools.prune.plan``/``apply``, once with ``order="lru"`` (the baseline) and once
with ``order="value"``: compile seconds saved by hits, hit rate, compile seconds spent on
misses. Full runs: 800 pointwise and 16 max-autotune graphs, 8,000 lookups; quick runs: 120
and 3 (of 1–4 MB), 500 lookups.
"""

from __future__ import annotations

from pathlib import Path

from . import _eviction as E
from . import _payloads as P
from ._context import Context, built_real_cache
from ._report import Row, SectionResult
from ._stats import summarize

NAME = "disk"
TITLE = "Bytes on disk: database vs directory; eviction under a bound"


def _db_bytes(db_path: Path) -> tuple[int, int]:
    apparent = allocated = 0
    for suffix in ("", "-wal", "-shm"):
        p = Path(str(db_path) + suffix)
        if p.exists():
            st = p.stat()
            apparent += st.st_size
            allocated += st.st_blocks * 512
    return apparent, allocated


def _dbstat(db_path: Path) -> dict[str, int]:
    """Bytes per table/index (SQLite's ``dbstat`` virtual table; empty if not compiled in)."""
    import sqlite3

    conn = sqlite3.connect(db_path)
    try:
        rows = conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC").fetchall()
    except sqlite3.Error:
        rows = []
    finally:
        conn.close()
    return {name: int(size) for name, size in rows}


def _import(ctx: Context, root: Path) -> tuple[Path, int]:
    from cachedb import CacheDB
    from cachedb.layout.importer import Importer

    db_path = ctx.tmpdir("diskdb") / "cache.db"
    db = CacheDB(db_path)
    report = Importer(db).run(root)
    db.close()
    return db_path, sum(report.added.values())


def _case(ctx: Context, res: SectionResult, label: str, root: Path, db_path: Path | None = None) -> None:
    if db_path is None:
        db_path, _added = _import(ctx, root)
    n, d_app, d_alloc = P.dir_bytes(root, only_cachedb_kinds=True)
    n_all, all_app, all_alloc = P.dir_bytes(root)
    db_app, db_alloc = _db_bytes(db_path)
    kb = 1 / 1024
    res.rows += [
        Row(f"{label}: allocated bytes, {n} entry files", summarize([db_alloc], "KB", scale=kb),
            summarize([d_alloc], "KB", scale=kb), "directory (st_blocks)"),
        Row(f"{label}: apparent bytes, {n} entry files", summarize([db_app], "KB", scale=kb),
            summarize([d_app], "KB", scale=kb), "directory (st_size)"),
    ]
    res.extra[label] = {
        "entry_files": n,
        "dir_entry_bytes": {"apparent": d_app, "allocated": d_alloc},
        "dir_all_files": {"files": n_all, "apparent": all_app, "allocated": all_alloc},
        "db_bytes": {"apparent": db_app, "allocated": db_alloc},
        "db_objects": _dbstat(db_path),
    }
    objects = res.extra[label]["db_objects"]
    res.notes.append(
        f"{label}: {n} entry files take {d_alloc / 1e6:.2f} MB allocated ({d_app / 1e6:.2f} MB apparent); "
        f"the database {db_alloc / 1e6:.2f} MB. The whole directory including what cachedb does not "
        f"store (kernels, .so, locks) is {n_all} files, {all_alloc / 1e6:.2f} MB allocated. Largest "
        "database objects: " + ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in list(objects.items())[:4]) + "."
    )


def _eviction(ctx: Context, res: SectionResult) -> None:
    small, autotuned, lookups = (120, 3, 500) if ctx.quick else (800, 16, 8_000)
    # a quick run's bound (~3 MB) would hold no 20 MB graph: its max-autotune graphs take 1-4 MB
    trace = E.make_trace(small=small, autotuned=autotuned, lookups=lookups,
                         autotuned_bytes=(1e6, 4e6) if ctx.quick else (1e6, 20e6))
    bound = E.bound_bytes(trace)
    ctx.log(f"disk: eviction replay, {lookups} lookups over {small + autotuned} graphs, bound {bound / 1e6:.1f} MB")
    done = {order: E.replay(trace, order, ctx.tmpdir(f"evict-{order}") / "cache.db") for order in ("lru", "value")}
    value, lru = done["value"], done["lru"]
    case = f"eviction at {E.BOUND_SHARE:.0%} of the bytes ({lookups:,} lookups), --order value vs lru"
    base = "prune --order lru"
    res.rows += [
        Row(f"{case}: compile seconds saved", summarize([value.seconds_saved], "s"),
            summarize([lru.seconds_saved], "s"), base),
        Row(f"{case}: hit rate", summarize([100 * value.hit_rate], "%"), summarize([100 * lru.hit_rate], "%"), base),
        Row(f"{case}: compile seconds spent on misses", summarize([value.seconds_compiled], "s"),
            summarize([lru.seconds_compiled], "s"), base),
    ]
    repeats = [trace.graphs[i] for i in trace.lookups]
    unbounded = sum(g.compile_s for g in repeats) - sum(trace.graphs[i].compile_s for i in set(trace.lookups))
    res.extra["eviction"] = {
        "graphs": {"pointwise": small, "max_autotune": autotuned}, "lookups": lookups, "seed": trace.seed,
        "bound_bytes": bound, "low_water": E.LOW_WATER, "days": E.DAYS,
        "unbounded_seconds_saved": round(unbounded, 1),
        "max_autotune_lookups": sum(1 for g in repeats if g.autotuned),
        "orders": {o: {"hits": r.hits, "misses": r.misses, "hit_rate": round(r.hit_rate, 4),
                       "seconds_saved": round(r.seconds_saved, 1), "seconds_compiled": round(r.seconds_compiled, 1),
                       "prunes": r.prunes, "evicted": r.evicted, "wall_s": round(r.wall_s, 2)}
                   for o, r in done.items()},
    }
    res.notes.append(
        f"eviction: {lookups:,} lookups over {small} pointwise and {autotuned} max-autotune graphs "
        f"({sum(1 for g in repeats if g.autotuned)} lookups of the latter), the cache bounded at {bound / 1e6:.1f} MB "
        f"({E.BOUND_SHARE:.0%} of the trace's bytes) and pruned to {E.LOW_WATER:.0%} of it when over. "
        f"Compile seconds saved: value {value.seconds_saved:,.0f} s, LRU {lru.seconds_saved:,.0f} s, an unbounded "
        f"cache {unbounded:,.0f} s; hit rate {value.hit_rate:.1%} / {lru.hit_rate:.1%}; entries evicted "
        f"{value.evicted} / {lru.evicted} in {value.prunes} / {lru.prunes} prunes; replay wall "
        f"{value.wall_s:.1f} / {lru.wall_s:.1f} s."
    )


def run(ctx: Context) -> SectionResult:
    res = SectionResult(NAME, TITLE)
    real: Path | None = None
    real_label = ""
    if not ctx.quick:
        real = built_real_cache(ctx)
        real_label = "real cache (examples/build_cache.py)"
    elif ctx.shared.get("real_cache_dir"):
        real = Path(ctx.shared["real_cache_dir"])
        real_label = "real cache (§1 cold compile dir)"
    if real is not None:
        _case(ctx, res, real_label, real)
    else:
        res.notes.append("quick run without §1: no real cache directory; synthetic only.")

    synth = ctx.shared.get("synthetic_dir")
    synth_db = ctx.shared.get("synthetic_db")
    if synth is None:
        synth = ctx.tmpdir("disksynth") / "inductor"
        ctx.log("disk: generating a 2,000-file synthetic cache dir")
        P.synthetic_cache_dir(synth, 2_000)
        synth_db = None
    _case(ctx, res, "synthetic cache (§5 generator)", Path(synth), Path(synth_db) if synth_db else None)
    _eviction(ctx, res)
    return res
