"""§8 Fleet: machine B warm from a shared PostgreSQL, round trips, copy and merge throughput.

Needs the PostgreSQL server named by ``$CACHEDB_BENCH_PG_URL`` (default: this machine's,
``postgresql+psycopg://postgres@127.0.0.1:5432/test``); each run uses a fresh schema, dropped
at the end. Without a reachable server the section says so and measures nothing.

Warm start (real ``torch.compile``, a fresh process per sample, §1's CPU workloads):

- **machine A**: an empty cache dir and an empty local SQLite file, ``cachedb.installed(local,
  remote=PG)``, a writer (``CACHEDB_SIGNING_KEY``): the cold compile fills the local file and,
  through the background writer, the remote, every row signed;
- **machine B**: per sample a new empty cache dir and a new empty local file, same remote, a
  consumer holding only A's public key (``CACHEDB_TRUSTED_KEYS``): every lookup misses
  locally, is pulled from the remote (one query each), its signatures checked, and served;
- **machine B, unsigned**: the same with ``CACHEDB_REMOTE_TRUST=1`` instead of keys (nothing
  checked): what the signatures cost, side by side;
- **warm local files**: the populated directory of a cold run with torch's own file caches;
- **B again**: the local file B filled, a new empty dir (local hits only, no round trip).

Round trips: statements B's lookups ran on the remote (``RemoteTier.counts``, counted with a
SQLAlchemy ``before_cursor_execute`` event), against the FX/AOTAutograd lookups torch made.

Copy and merge (``cachedb.fleet.copy``), each target on the workload it names: payload throughput
(MB/s) on a synthetic cache of pickled FX/AOTAutograd entries and best configs, small-row
throughput (rows/s) on one of autotune timings (:mod:`benchmarks._payloads`), each imported
into SQLite, then copied to PostgreSQL, copied back to a new SQLite file, and merged into
an empty PostgreSQL schema, then merged again (all present: nothing added). Payload
throughput counts the bytes the SQLite source stores (each side keeps FX graph / AOTAutograd
payloads in its own form, so the same entries take other bytes in PostgreSQL); every figure
is a whole command's time (opening, checks and the target's creation included).
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from typing import Any

from ._context import Context
from ._payloads import synthetic_cache_dir
from ._report import Row, SectionResult
from ._stats import summarize
from .s1_warm_start import _sample

NAME = "fleet"
TITLE = "Fleet: warm start from a shared PostgreSQL, round trips, copy/merge throughput"

PG_URL = os.environ.get("CACHEDB_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _schema_url(schema: str) -> str:
    sep = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{sep}options=-csearch_path%3D{schema}"


def _admin(sql: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(PG_URL)
    try:
        with engine.begin() as conn:
            conn.execute(text(sql))
    finally:
        engine.dispose()


def _pg_reachable() -> str | None:
    try:
        _admin("SELECT 1")
        return None
    except Exception as exc:  # noqa: BLE001 - any failure: the section is skipped
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _warm_start(ctx: Context, res: SectionResult, remote: str) -> None:
    models = "tiny" if ctx.quick else "mlp,dynamic,gemm"
    n = 1 if ctx.quick else 3
    samples: dict[str, list[dict[str, Any]]] = {}

    def add(case: str, report: dict[str, Any]) -> dict[str, Any]:
        samples.setdefault(case, []).append(report)
        ctx.log(f"fleet: {case}: first calls {report['first_call_s']:.1f}s, wall {report['wall_s']:.1f}s, "
                f"remote {report.get('remote_counts')}")
        return report

    from cachedb.store.signing import SigningKey

    key = SigningKey.generate()
    key_file = ctx.tmpdir("fleetkey") / "writer.pem"
    key_file.write_text(key.private_pem())
    key_file.chmod(0o600)
    writer = {"CACHEDB_SIGNING_KEY": str(key_file)}
    consumer = {"CACHEDB_TRUSTED_KEYS": key.public_line()}
    cold_dir = ctx.cache_dir("fleetcold")
    add("cold, files", _sample("files", cold_dir, models))
    a_db = ctx.tmpdir("fleeta") / "a.db"
    add("machine A: cold, local + remote", _sample("cachedb-cold", ctx.cache_dir("fleetadir"), models,
                                                   extra_env=writer, db=str(a_db), remote=remote))
    b_db = None
    cases = ["warm local files", "machine B", "machine B, unsigned"]
    for r in range(n):
        for case in cases[r % 3:] + cases[:r % 3]:
            if case == "warm local files":
                add(case, _sample("files", cold_dir, models))
                continue
            db = ctx.tmpdir("fleetb") / "b.db"  # a new machine every time: empty local file
            env = consumer if case == "machine B" else {"CACHEDB_REMOTE_TRUST": "1"}
            add(case, _sample("cachedb", ctx.cache_dir("fleetbdir"), models, extra_env=env, db=str(db),
                              remote=remote))
            if case == "machine B":
                b_db = db
    assert b_db is not None
    for _ in range(n):
        add("machine B again (local hits)", _sample("cachedb", ctx.cache_dir("fleetb2"), models,
                                                    extra_env=consumer, db=str(b_db), remote=remote))

    first = {c: summarize([s["first_call_s"] for s in ss], "s") for c, ss in samples.items()}
    wall = {c: summarize([s["wall_s"] for s in ss], "s") for c, ss in samples.items()}
    res.rows.append(Row("machine B (empty local file, shared remote), fresh dir: first calls vs warm local files",
                        first["machine B"], first["warm local files"], "warm local dir", target="≤ 1.2x",
                        met=first["machine B"].median <= 1.2 * first["warm local files"].median))
    res.rows.append(Row("machine B, fresh dir: process wall vs warm local files", wall["machine B"],
                        wall["warm local files"], "warm local dir"))
    res.rows.append(Row("machine B with public keys (signatures checked) vs unsigned (CACHEDB_REMOTE_TRUST=1): "
                        "first calls", first["machine B"], first["machine B, unsigned"], "unsigned", target="≤ 1.05x",
                        met=first["machine B"].median <= 1.05 * first["machine B, unsigned"].median))
    refused = [s["remote_counts"].get("refused_rows", 0) for s in samples["machine B"]]
    hits = [s["remote_counts"].get("pull_hit", 0) for s in samples["machine B"]]
    res.notes.append(f"machine B (public keys only): remote hits per sample {hits}, rows refused {refused}; "
                     f"machine A signed {samples['machine A: cold, local + remote'][0]['remote_counts'].get('signed_rows', 0)} rows.")
    res.rows.append(Row("machine B again (its local file, no round trips), fresh dir: first calls vs warm local",
                        first["machine B again (local hits)"], first["warm local files"], "warm local dir"))
    res.rows.append(Row("machine A cold, writing local + remote, vs cold to files: first calls",
                        first["machine A: cold, local + remote"], first["cold, files"], "cold compile"))

    def lookups(s: dict[str, Any]) -> int:
        c = s["counters"]
        return sum(c.get(k, 0) for k in ("fxgraph_cache_hit", "fxgraph_cache_miss", "autograd_cache_hit",
                                          "autograd_cache_miss"))

    b = samples["machine B"]
    statements = summarize([s["remote_counts"].get("lookup_statements", 0) for s in b], "statements")
    pulls = summarize([s["remote_counts"].get("pull", 0) for s in b], "lookups")
    res.rows.append(Row("machine B: remote statements per remote lookup (all kinds)", statements, pulls,
                        "remote lookups (local misses)", target="1.0x (one query per lookup)",
                        met=statements.median <= pulls.median))
    again = summarize([s["remote_counts"].get("lookup_statements", 0) for s in samples["machine B again (local hits)"]],
                      "statements")
    res.rows.append(Row("machine B again: remote statements (all lookups hit the local file)", again,
                        target="0", met=again.median == 0))
    res.notes.append(
        f"machine B (first sample): {lookups(b[0])} FX/AOTAutograd lookups, counters "
        f"{ {k: v for k, v in b[0]['counters'].items() if k.endswith(('_hit', '_miss', 'autotune'))} }, "
        f"remote {b[0]['remote_counts']}; machine A: remote {samples['machine A: cold, local + remote'][0]['remote_counts']}."
    )
    res.notes.append("PostgreSQL on the same host (loopback): a round trip costs ~0.1 ms here; over a network "
                     "each remote lookup adds one round trip of that network.")


def _copy_throughput(ctx: Context, res: SectionResult, schemas: list[str]) -> None:
    """Payload throughput on a cache of pickled entries, row throughput on a cache of small rows
    (timings): the two targets of the issue, each on the workload it names."""
    from cachedb import CacheDB
    from cachedb.fleet.copy import copy_database, merge_databases
    from cachedb.layout.importer import Importer

    n_files, entry_bytes, n_timings = (100, 20_000, 1_000) if ctx.quick else (2_000, 100_000, 50_000)
    sources = {}
    for name, files, size, timings in (("payloads", n_files, entry_bytes, 0), ("small rows", 100, 2_000, n_timings)):
        src_dir = ctx.tmpdir(f"fleetsyn-{name[0]}")
        synthetic_cache_dir(src_dir, files, entry_bytes=size, timings=timings)
        src = ctx.tmpdir(f"fleetsrc-{name[0]}") / "src.db"
        with CacheDB(src) as db:
            Importer(db).run(src_dir)
        sources[name] = src

    reps = 1 if ctx.quick else 3
    urls = iter(_schema_url(schema) for schema in schemas)

    #: Bytes of each workload's SQLite source as read (its first leg's report): every payload
    #: leg's rate is over these, since each side stores FX graph / AOTAutograd payloads in its
    #: own form (SQLite under 1 MiB as they are, PostgreSQL compressed) and a report counts the
    #: bytes as its source stores them.
    moved: dict[str, int] = {}

    def timed(label: str, workload: str, fn: Any) -> None:
        """``fn(i)`` (the i-th repetition into fresh targets) ``reps`` times: median rate."""
        rates, reports = [], []
        for i in range(reps):
            t0 = time.perf_counter()
            report = fn(i)
            s = time.perf_counter() - t0
            reports.append((report, s))
            payload = moved.setdefault(workload, report.bytes_written)
            rates.append(payload / s / 1e6 if workload == "payloads" else report.rows_written / s)
        if workload == "payloads":
            res.rows.append(Row(f"{label}: payload throughput (pickled entries)", summarize(rates, "MB/s"),
                                target="≥ 20 MB/s", met=statistics.median(rates) >= 20))
        else:
            res.rows.append(Row(f"{label}: small rows per second (timings)", summarize(rates, "rows/s"),
                                target="≥ 20,000 rows/s", met=statistics.median(rates) >= 20_000))
        ctx.log(f"fleet: {label}, {workload}: {', '.join(f'{r:.1f}' for r in rates)}")
        report, s = reports[0]
        res.notes.append(f"{label}, {workload}: {report.rows_written} rows, {report.bytes_written / 1e6:.1f} MB "
                         f"as its source stores them ({moved[workload] / 1e6:.1f} MB in the SQLite source, the "
                         f"rate's measure) per run, {', '.join(f'{s:.2f}' for _, s in reports)} s (whole command: "
                         "opening, checks, target creation included).")

    for workload, src in sources.items():
        remotes = [next(urls) for _ in range(reps)]
        merged = [next(urls) for _ in range(reps)]
        backs = [ctx.tmpdir(f"fleetback-{workload[0]}{i}") / "back.db" for i in range(reps)]
        timed("copy SQLite -> PostgreSQL", workload, lambda i: copy_database(src, remotes[i]))
        timed("copy PostgreSQL -> new SQLite file", workload, lambda i: copy_database(remotes[i], backs[i]))
        timed("merge SQLite into an empty PostgreSQL", workload, lambda i: merge_databases([src], merged[i]))
        t0 = time.perf_counter()
        again = merge_databases([backs[0]], merged[0])
        res.notes.append(f"merge of the same {workload} again: {again.rows_written} rows written, "
                         f"{time.perf_counter() - t0:.2f} s (natural keys: nothing to add).")
    res.notes.append(f"Payloads: {n_files} files of ~{entry_bytes // 1000} KB (FX/AOTAutograd pickles, best configs); "
                     f"small rows: {n_timings} timings and 100 small files; each imported into SQLite.")


def run(ctx: Context) -> SectionResult:
    res = SectionResult(NAME, TITLE)
    why = _pg_reachable()
    if why is not None:
        res.notes.append(f"Not measured: PostgreSQL at {PG_URL} is not reachable ({why}).")
        return res
    schemas = [f"cachedb_bench_{uuid.uuid4().hex[:10]}" for _ in range(1 + 2 * 2 * (1 if ctx.quick else 3))]
    for schema in schemas:
        _admin(f'CREATE SCHEMA "{schema}"')
    try:
        _warm_start(ctx, res, _schema_url(schemas[0]))
        _copy_throughput(ctx, res, schemas[1:])
    finally:
        for schema in schemas:
            _admin(f'DROP SCHEMA "{schema}" CASCADE')
    return res


__all__ = ["NAME", "TITLE", "run"]
