"""§11 Herd: hundreds of processes looking up the same entries on one shared tier at once.

A fleet job starts all its ranks together: ``PROCESSES`` client processes (200; 24 with
``--quick``), as machines of ``PER_MACHINE`` (8) processes that share one fresh local SQLite
file each, wait on one barrier and then look up the same ``ENTRIES`` FX graph entries (64 KB
each) through the live store (``LiveStore.guarded_candidates``, what Inductor's FX graph cache
lookup calls, with a :class:`~cachedb.live._remote.RemoteTier` behind an empty local file), then
each rank writes the same best config. The clients are light: forked from this process after
cachedb is imported, no torch.

Three herds over the same entries, in the same run:

- **PostgreSQL, direct**: the server on this machine (its ``max_connections`` is reported; 100,
  the server's default, here);
- **PostgreSQL through PgBouncer** in transaction pooling mode (Debian's ``pgbouncer``,
  ``default_pool_size`` 10), started by the section (:mod:`benchmarks._pgbouncer`);
- **torch's Redis remote cache** on the Redis server of this machine: each client makes one
  ``redis.Redis(host, port)`` and one ``GET`` per lookup, what
  ``RedisRemoteCacheBackend._get`` (torch/_inductor/remote_cache.py) does.

Before the herds, the cost the idle timeout saves: a remote lookup on a connection opened for
it against one on a connection kept open (one process, its engine initialized, interleaved).

Reported per herd: the share of lookups served from the remote, the clients that fell back to
their local cache (a remote failure: ``RemoteTier.counts["failures"]``), p50 and p99 lookup
latency (from the barrier: each lookup's own time, the connect of a first lookup included),
the peak of the server's connections (direct: the most client connections open at once, each
psycopg connection from its ``connect`` to its ``close``, the engine's and the driver reader's
(:mod:`cachedb.fleet.tier_read`), the server's backends; through PgBouncer: the
server connections PgBouncer holds to the herd's database after it, ``pg_stat_activity``, which
it keeps open for ``server_idle_timeout``), remote lookups per entry per
machine (``counts["pull"]`` summed over a machine's ranks), remote writes per written entry per
machine (``counts["push"]``) and the waits a full server cost (``counts["retries"]``).

Needs the PostgreSQL server of ``$CACHEDB_BENCH_PG_URL`` (as §8); the PgBouncer rows need
``pgbouncer`` on the PATH (or /usr/sbin) and the Redis rows the ``redis`` package and a server
at ``$CACHEDB_BENCH_REDIS`` (default ``127.0.0.1:6379``); each part that lacks its server says
so in one line and measures nothing.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import random
import time
import traceback
import uuid
from typing import Any

from ._context import Context
from ._report import Row, SectionResult
from ._stats import summarize

NAME = "herd"


def _accept() -> Any:
    """The herd measures the tier's transport: every remote row is taken unsigned
    (``CACHEDB_REMOTE_TRUST=1``; signatures' cost is §8's side-by-side)."""
    from cachedb.fleet.trust import TrustPolicy

    return TrustPolicy(accept_unsigned=True)
TITLE = "Herd: hundreds of processes on one PostgreSQL (direct, PgBouncer) and on torch's Redis remote cache"

PG_URL = os.environ.get("CACHEDB_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS = os.environ.get("CACHEDB_BENCH_REDIS", "127.0.0.1:6379")
PROCESSES = 200
PER_MACHINE = 8
ENTRIES = 4
ENTRY_BYTES = 64 << 10
#: The best config every rank of a machine writes after its lookups.
WRITTEN_KEY = "he/herd.best_config"


def _admin_engine() -> Any:
    from sqlalchemy import create_engine

    return create_engine(PG_URL, isolation_level="AUTOCOMMIT")


def _database_url(database: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(PG_URL).set(database=database).render_as_string(hide_password=False)


def _entries(n: int) -> dict[str, bytes]:
    rng = random.Random(11)
    return {
        f"f{i:02d}{uuid.UUID(int=rng.getrandbits(128)).hex}": pickle.dumps(
            {"graph": i, "code": rng.randbytes(ENTRY_BYTES // 2).hex()[:ENTRY_BYTES]}
        )
        for i in range(n)
    }


# -- the clients (forked) -------------------------------------------------------------------


def _client(mode: str, url: str, local: str, keys: list[str], barrier: Any, out: Any) -> None:
    report: dict[str, Any] = {"mode": mode, "local": local}
    try:
        if mode == "redis":
            import redis

            host, port = REDIS.rsplit(":", 1)
            client = redis.Redis(host=host, port=int(port))  # RedisRemoteCacheBackend.__init__

            def lookup(key: str) -> bool:
                return client.get(key) is not None  # RedisRemoteCacheBackend._get
        else:
            import psycopg

            from cachedb.live._remote import RemoteTier
            from cachedb.live._store import LiveStore

            opened: dict[int, list[float]] = report.setdefault("connections", {})
            connect, close = psycopg.Connection.connect, psycopg.Connection.close

            def connected(*args: Any, **kwargs: Any) -> Any:  # every connection to the server:
                conn = connect(*args, **kwargs)                 # an engine's and the driver reader's
                opened[id(conn)] = [time.time(), 0.0]
                return conn

            def closed(conn: Any) -> None:
                if id(conn) in opened and not opened[id(conn)][1]:
                    opened[id(conn)][1] = time.time()
                close(conn)

            psycopg.connect = connected  # what SQLAlchemy's dialect and the driver reader call
            psycopg.Connection.close = closed  # type: ignore[method-assign]
            store = LiveStore(local, remote=RemoteTier(url, trust=_accept()), write_behind=False)
            store.db  # the local file opened before the barrier: the herd measures the remote
            opened.clear()  # the local SQLite file's connection is not the server's

            def lookup(key: str) -> bool:
                return next(iter(store.guarded_candidates("fxgraph", key)), None) is not None

        barrier.wait(300)
        latencies, served = [], 0
        for key in keys:
            t0 = time.perf_counter()
            served += lookup(key)
            latencies.append(time.perf_counter() - t0)
        report.update(latencies=latencies, served=served)
        barrier.wait(300)  # the writes after every process's lookups: lookups measured alone
        if mode != "redis":
            store.best_config_put(WRITTEN_KEY, b'{"XBLOCK": 64, "num_warps": 4, "num_stages": 1}')
            store.remote.flush()
            report["counts"] = dict(store.remote.counts)
            store.close()
            end = time.time()
            report["connections"] = [(a, b or end) for a, b in opened.values()]
    except Exception:  # noqa: BLE001 - reported, counted as not served
        report["error"] = traceback.format_exc(limit=3)
    out.put(report)


def _peak(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at once."""
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals], key=lambda e: (e[0], e[1]))
    peak = now = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def _server_connections(database: str) -> int:
    from sqlalchemy import text

    engine = _admin_engine()
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE datname = :d"),
                                    {"d": database}).scalar_one())
    finally:
        engine.dispose()


def _herd(ctx: Context, mode: str, url: str, database: str, keys: list[str], n: int) -> dict[str, Any]:
    from cachedb import CacheDB

    mp = multiprocessing.get_context("fork")
    machines = [str(ctx.tmpdir("herdlocal") / "local.db") for _ in range(max(1, n // PER_MACHINE))]
    for path in machines:  # each machine's fresh local file, at the code's schema
        CacheDB(path).close()
    barrier = mp.Barrier(n)
    out = mp.Queue()
    procs = [mp.Process(target=_client, args=(mode, url, machines[i % len(machines)], keys, barrier, out))
             for i in range(n)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    reports = [out.get(timeout=600) for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join(60)
    peak = None
    if mode == "direct":  # every client's connections, from open to close (server backends)
        peak = _peak([tuple(c) for r in reports for c in r.get("connections", [])])
    elif mode == "pgbouncer":  # the server connections PgBouncer opened (kept: server_idle_timeout)
        peak = _server_connections(database)
    errors = [r["error"] for r in reports if "error" in r]
    latencies = [x for r in reports for x in r.get("latencies", [])]
    served = sum(r.get("served", 0) for r in reports)
    per_machine: dict[str, dict[str, int]] = {}
    for r in reports:
        m = per_machine.setdefault(r["local"], {"pull": 0, "push": 0})
        for k in ("pull", "push"):
            m[k] += r.get("counts", {}).get(k, 0)
    result = {
        "mode": mode, "processes": n, "machines": len(machines), "wall_s": wall, "errors": errors,
        "served": served, "lookups": n * len(keys), "latencies": latencies, "peak_connections": peak,
        "fell_back": sum(1 for r in reports if r.get("counts", {}).get("failures", 0) or "error" in r),
        "retries": sum(r.get("counts", {}).get("retries", 0) for r in reports),
        "coalesced": sum(r.get("counts", {}).get("coalesced", 0) for r in reports),
        "coalesce_timeouts": sum(r.get("counts", {}).get("coalesce_timeouts", 0) for r in reports),
        "pulls_per_entry_machine": [m["pull"] / len(keys) for m in per_machine.values()],
        "pushes_per_machine": [m["push"] for m in per_machine.values()],
    }
    ctx.log(f"herd {mode}: {served}/{n * len(keys)} served, peak connections {peak}, "
            f"fell back {result['fell_back']}, retries {result['retries']}, coalesce timeouts "
            f"{result['coalesce_timeouts']}, errors {len(errors)}, wall {wall:.1f}s")
    if errors:
        ctx.log(f"herd {mode}: first error: {errors[0]}")
    return result


def _connect_cost(ctx: Context, url: str, n: int) -> tuple[list[float], list[float]]:
    """Seconds of ``n`` remote lookups (a best config the remote lacks: one query each, nothing
    written locally) on a connection opened for each (``idle_s=0``) and on one kept open,
    interleaved, after one lookup that initialized each tier's engine."""
    from cachedb.live._remote import RemoteTier
    from cachedb.live._store import LiveStore

    fresh = LiveStore(str(ctx.tmpdir("herdconn") / "a.db"), remote=RemoteTier(url, trust=_accept(), idle_s=0.0), write_behind=False)
    kept = LiveStore(str(ctx.tmpdir("herdconn") / "b.db"), remote=RemoteTier(url, trust=_accept(), idle_s=60.0), write_behind=False)
    out: dict[str, list[float]] = {"fresh": [], "kept": []}
    for i in range(n + 1):
        for name, store in (("fresh", fresh), ("kept", kept)):
            t0 = time.perf_counter()
            store.best_config_get(f"zz/miss{i}-{uuid.uuid4().hex}.best_config")
            if i:  # the first initialized the engine (dialect, compiled statements)
                out[name].append(time.perf_counter() - t0)
    assert fresh.remote is not None and fresh.remote.counts["connections"] >= n + 1  # one per lookup
    fresh.close()
    kept.close()
    return out["fresh"], out["kept"]


def _p99(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(0.99 * (len(s) - 1))))]


def run(ctx: Context) -> SectionResult:
    res = SectionResult(NAME, TITLE)
    try:
        admin = _admin_engine()
        from sqlalchemy import text

        with admin.connect() as conn:
            max_connections = int(conn.execute(text("SHOW max_connections")).scalar_one())
    except Exception as exc:  # noqa: BLE001
        res.notes.append(f"skipped: PostgreSQL at {PG_URL} not reachable ({type(exc).__name__})")
        return res
    n = 24 if ctx.quick else PROCESSES
    entries = _entries(2 if ctx.quick else ENTRIES)
    keys = list(entries)
    database = f"cachedb_herd_{uuid.uuid4().hex[:10]}"
    herds: dict[str, dict[str, Any]] = {}
    connect_costs: dict[str, tuple[list[float], list[float]]] = {}
    bouncer = None
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{database}"'))
    try:
        url = _database_url(database)
        from cachedb.live._remote import RemoteTier
        from cachedb.live._store import LiveStore

        writer = LiveStore(str(ctx.tmpdir("herdfill") / "fill.db"), remote=RemoteTier(url, trust=_accept(), timeout_s=30),
                           write_behind=False)
        for key, content in entries.items():
            writer.guarded_put("fxgraph", key, content)
        assert writer.remote is not None and writer.remote.flush(60)
        writer.close()
        ctx.log(f"herd: {len(entries)} FX graph entries in {database}; server max_connections {max_connections}")

        connect_costs["direct"] = _connect_cost(ctx, url, 10 if ctx.quick else 50)
        herds["direct"] = _herd(ctx, "direct", url, database, keys, n)
        try:
            from ._pgbouncer import PgBouncer

            bouncer = PgBouncer(pool_size=10)
            connect_costs["pgbouncer"] = _connect_cost(ctx, bouncer.url(database), 10 if ctx.quick else 50)
            herds["pgbouncer"] = _herd(ctx, "pgbouncer", bouncer.url(database), database, keys, n)
        except RuntimeError as exc:
            res.notes.append(f"PgBouncer rows skipped: {exc}")
        try:
            import redis

            host, port = REDIS.rsplit(":", 1)
            r = redis.Redis(host=host, port=int(port))
            for key, content in entries.items():
                r.set(key, content)
            herds["redis"] = _herd(ctx, "redis", "", database, keys, n)
            r.delete(*entries)
        except Exception as exc:  # noqa: BLE001 - no package or no server: say so
            res.notes.append(f"Redis rows skipped: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    finally:
        if bouncer is not None:
            bouncer.close()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        admin.dispose()

    for mode, label in (("direct", "PostgreSQL direct"), ("pgbouncer", "through PgBouncer")):
        if mode in connect_costs:
            fresh, kept = connect_costs[mode]
            res.rows.append(Row(f"{label}: remote lookup on a new connection vs on an open one (the idle timeout's "
                                "saving)", summarize(fresh, "ms", scale=1e3), summarize(kept, "ms", scale=1e3),
                                "open connection"))
    machines = max(1, n // PER_MACHINE)
    for mode, label, peak_target in (("direct", "PostgreSQL direct", 50), ("pgbouncer", "through PgBouncer", 10)):
        h = herds.get(mode)
        if h is None:
            continue
        share = h["served"] / h["lookups"]
        res.rows.append(Row(f"{label}: {n} processes ({machines} machines x {PER_MACHINE}), lookups served from the "
                            "remote", summarize([100 * share], "%"), target="100%", met=share == 1.0))
        res.rows.append(Row(f"{label}: processes that fell back to the local cache alone",
                            summarize([h["fell_back"]], "processes"), target="0", met=h["fell_back"] == 0))
        res.rows.append(Row(f"{label}: peak server connections (max_connections {max_connections})",
                            summarize([h["peak_connections"]], "connections"), target=f"≤ {peak_target}",
                            met=h["peak_connections"] <= peak_target))
        pulls = summarize(h["pulls_per_entry_machine"], "queries")
        res.rows.append(Row(f"{label}: remote lookups per entry per machine ({PER_MACHINE} processes, one local file)",
                            pulls, target="≤ 1", met=pulls.max <= 1))
        pushes = summarize(h["pushes_per_machine"], "writes")
        res.rows.append(Row(f"{label}: remote writes of one entry all {PER_MACHINE} ranks wrote, per machine",
                            pushes, target="≤ 1", met=pushes.max <= 1))
        res.rows.append(Row(f"{label}: lookup latency", summarize(h["latencies"], "ms", scale=1e3)))
        if "redis" in herds:
            r = herds["redis"]
            ours, theirs = _p99(h["latencies"]) * 1e3, _p99(r["latencies"]) * 1e3
            res.rows.append(Row(f"{label}: p99 lookup latency vs torch's Redis remote cache, same herd",
                                summarize([ours], "ms"), summarize([theirs], "ms"), "Redis p99", target="≤ 3x",
                                met=ours <= 3 * theirs))
        res.notes.append(f"{label}: {h['retries']} transient refusals waited out, {h['coalesced']} lookups answered "
                         f"by another rank's query, herd wall {h['wall_s']:.1f} s, errors {len(h['errors'])}.")
    if "redis" in herds:
        r = herds["redis"]
        res.rows.append(Row(f"torch's Redis remote cache: {n} processes, lookups served",
                            summarize([100 * r["served"] / r["lookups"]], "%")))
        res.rows.append(Row("torch's Redis remote cache: lookup latency", summarize(r["latencies"], "ms", scale=1e3)))
    res.extra = {
        "max_connections": max_connections, "processes": n, "per_machine": PER_MACHINE, "entries": len(entries),
        "entry_bytes": ENTRY_BYTES,
        "herds": {m: {k: v for k, v in h.items() if k not in ("latencies", "errors")} | {
            "p50_ms": summarize(h["latencies"], "ms", scale=1e3).median if h["latencies"] else None,
            "p99_ms": _p99(h["latencies"]) * 1e3 if h["latencies"] else None,
            "first_error": h["errors"][0] if h["errors"] else None} for m, h in herds.items()},
    }
    return res
