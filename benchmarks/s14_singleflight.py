"""§14 One compile per graph: N processes start the same cold workload together.

The workload (:mod:`benchmarks._flight_child` ``--shared-only``): four small CPU graphs,
compiled cold (real ``torch.compile``), each process with its own empty cache dir. N = 4 here
(2 in a quick run, on the first graph only), started at once:

- **one local file**: the ranks of a machine, one SQLite file;
- **own files, one PostgreSQL remote**: the machines of a fleet (needs
  ``$CACHEDB_BENCH_PG_URL``, as §8);
- **own files, PgBouncer**: the same through PgBouncer in transaction pooling mode;
- **claims off** (``CACHEDB_COMPILE_WAIT=0``, one local file): every process compiles
  everything, as before; and **torch alone** (its own files per process), for scale.

Per case: the FX graph compiles in all (the sum of every process's ``fxgraph_cache_miss``,
a hit of a graph another process stored counting none) against one process's (4), and the wall time until the last of the N finished against one process compiling
alone (the same workload, the same moment). And a holder killed mid-compile (SIGKILL, §
``_flight_child --hold-for``): seconds from the kill until its waiter compiles itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from ._context import Context
from ._report import Row, SectionResult
from ._stats import summarize

NAME = "singleflight"
TITLE = "One compile per graph: N processes start one cold workload together"

CHILD = Path(__file__).with_name("_flight_child.py")
PG_URL = os.environ.get("CACHEDB_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _dirs(ctx: Context, tag: str) -> tuple[Path, Path]:
    """A workload process's own cache dir and machine (``TMPDIR``): ``Context.cache_dir``,
    ``Context.machine``."""
    return ctx.cache_dir(f"ind-{tag}"), ctx.machine(f"tmp-{tag}")


def _start(dirs: tuple[Path, Path], db: str, tag: str, *args: str, stderr: Path | None = None,
           **env_extra: str) -> subprocess.Popen[str]:
    """One workload process on ``dirs`` (:func:`_dirs`); ``db``: its database ("-": torch alone)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_")}
    env["TORCHINDUCTOR_CACHE_DIR"], env["TMPDIR"] = (str(d) for d in dirs)
    env.update(env_extra)
    return subprocess.Popen([sys.executable, str(CHILD), db, tag, "--shared-only", *args], stdout=subprocess.PIPE,
                            stderr=stderr.open("w") if stderr is not None else subprocess.DEVNULL, text=True, env=env)


def _finish(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"a workload process failed (exit {proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def _herd(ctx: Context, scratch: Path, n: int, db_of: Any, *args: str, **env: str) -> tuple[float, int]:
    """``(seconds until the last of n processes finished, FX graph compiles in all)``."""
    tags = [f"{scratch.name}-{i}" for i in range(n)]
    dirs = [_dirs(ctx, tag) for tag in tags]
    started = time.perf_counter()
    procs = [_start(dirs[i], db_of(i), tags[i], *args, **env) for i in range(n)]
    reports = [_finish(p) for p in procs]
    return time.perf_counter() - started, sum(int(r["miss"]) for r in reports)


def _pg(sql: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(sql))
    finally:
        engine.dispose()


def run(ctx: Context) -> SectionResult:
    from cachedb import CacheDB

    res = SectionResult(NAME, TITLE)
    n = 2 if ctx.quick else 4
    one = 1 if ctx.quick else 4  # one process's compiles: its graphs (a quick run compiles one)
    graphs = ("--graphs", str(one))
    cases: list[tuple[str, Any, tuple[str, ...], dict[str, str]]] = []
    local = ctx.tmpdir("sf-local")
    cases.append(("one local file", lambda i, d=local: str(d / "machine.db"), (), {}))
    cleanup: list[Any] = []
    if not ctx.quick:
        try:
            _pg("SELECT 1")
            schema = f"bench_sf_{uuid.uuid4().hex[:8]}"
            _pg(f'CREATE SCHEMA "{schema}"')
            cleanup.append(lambda: _pg(f'DROP SCHEMA "{schema}" CASCADE'))
            remote = f"{PG_URL}{'&' if '?' in PG_URL else '?'}options=-csearch_path%3D{schema}"
            CacheDB(remote).close()
            fleet = ctx.tmpdir("sf-fleet")
            cases.append(("own files, one PostgreSQL remote", lambda i, d=fleet: str(d / f"m{i}.db"),
                          ("--remote", remote), {}))
            from ._pgbouncer import PgBouncer, binary

            if binary() is not None:
                database = f"bench_sf_{uuid.uuid4().hex[:8]}"
                _pg(f'CREATE DATABASE "{database}"')
                cleanup.append(lambda: _pg(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
                bouncer = PgBouncer(pool_size=10)
                cleanup.insert(0, bouncer.close)
                through = bouncer.url(database)
                CacheDB(through).close()
                bounced = ctx.tmpdir("sf-bouncer")
                cases.append(("own files, PgBouncer", lambda i, d=bounced: str(d / f"m{i}.db"),
                              ("--remote", through), {}))
            else:
                res.notes.append("PgBouncer is not installed: its case was not run.")
        except Exception as exc:  # noqa: BLE001 - no server: those cases are not run
            res.notes.append(f"No PostgreSQL at {PG_URL} ({type(exc).__name__}): the fleet cases were not run.")
        off = ctx.tmpdir("sf-off")
        cases.append(("claims off (CACHEDB_COMPILE_WAIT=0), one local file", lambda i, d=off: str(d / "machine.db"),
                      (), {"CACHEDB_COMPILE_WAIT": "0"}))
        cases.append(("torch alone, its own files", lambda i: "-", (), {}))
    try:
        alone_dir = ctx.tmpdir("sf-alone")
        alone_s, alone_misses = _herd(ctx, alone_dir, 1, lambda i, d=alone_dir: str(d / "alone.db"), *graphs)
        alone = summarize([alone_s], "s")
        for label, db_of, args, env in cases:
            ctx.log(f"singleflight: {n} processes, {label}")
            scratch = ctx.tmpdir(f"sf-{len(res.rows)}")
            seconds, compiles = _herd(ctx, scratch, n, db_of, *graphs, *args, **env)
            claimed = "claims off" not in label and "torch alone" not in label
            res.rows.append(Row(f"{n} processes, {label}: FX graph compiles in all", summarize([compiles], "compiles"),
                                summarize([alone_misses], "compiles"), "one process alone",
                                target=f"= {one}" if claimed else "", met=(compiles == one) if claimed else None))
            res.rows.append(Row(f"{n} processes, {label}: wall until the last finished", summarize([seconds], "s"),
                                alone, "one process alone", target="≤ 1.3x" if claimed else "",
                                met=(seconds <= 1.3 * alone_s) if claimed else None))
        if not ctx.quick:
            res.rows.append(_takeover(ctx))
    finally:
        for step in cleanup:
            try:
                step()
            except Exception:  # noqa: BLE001
                pass
    res.notes.append(f"The workload compiles {one} FX graphs in one process ({alone_misses} misses measured).")
    return res


def _takeover(ctx: Context) -> Row:
    """A holder killed while it compiles its first graph: seconds until its waiter compiles it."""
    scratch = ctx.tmpdir("sf-kill")
    db = str(scratch / "machine.db")
    holder = _start(_dirs(ctx, "holder"), db, "holder", "--hold-for", "120")
    assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
    log = scratch / "waiter.err"
    waiter = _start(_dirs(ctx, "waiter"), db, "waiter", stderr=log)
    deadline = time.monotonic() + 120
    while "waiting for" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)  # until the waiter waits on the holder's claim
    killed = time.time()
    holder.send_signal(signal.SIGKILL)
    holder.wait(30)
    report = _finish(waiter)
    waits = report["waits"]
    took = (waits[0]["ended_at"] - killed) if waits else float("nan")
    return Row("a holder killed mid-compile: seconds until its waiter compiles it", summarize([max(took, 0.0)], "s"),
               None, "", target="≤ 5 s", met=bool(waits) and took <= 5.0)
