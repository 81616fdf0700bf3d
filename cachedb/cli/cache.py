"""The commands over one database: init, import, export, stats, query, upgrade, prune, run,
verify, recover."""

from __future__ import annotations

import datetime as dt
import os
import sys

import click
from rich.text import Text
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from .._errors import DatabaseOpenError
from ..store.engine import (
    default_location,
    set_read_only,
)
from ._common import (
    _REMOTE_HELP,
    FORMATS,
    AgeType,
    DurationType,
    NoDatabaseError,
    ProgressBar,
    SizeType,
    _accepts,
    _columns,
    _Context,
    _fail,
    _human,
    _printable,
    _progress_callback,
    confirm,
    db_options,
    describe_error,
    emit,
    err,
    main,
    pass_ctx,
    print_skipped,
)


@main.command()
@db_options
@pass_ctx
def init(obj: _Context) -> None:
    """Create the database (or upgrade it) and print where it is.

    \b
    Example:
      cachedb --db inductor.db init
    """
    with obj.open() as db:
        click.echo(_printable(f"{db.where}: schema revision {db.revision()}"))


@main.command("import")
@click.argument("cache_dir", type=click.Path(file_okay=False, path_type=str))
@click.option(
    "--this-machine",
    is_flag=True,
    help="Attribute the entries to this machine and torch (the directory was written here, "
    "by the installed torch), so its C++ kernel libraries are served to this host's compiles. "
    "Needs torch.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=0, max=64),
    default=None,
    metavar="N",
    help="Processes that read, check and compress entry files while the database is written "
    "(default: one fewer than the usable CPUs, at most 4, for 1,024 FX graph/AOTAutograd files or more; "
    "also CACHEDB_IMPORT_WORKERS; at most 64). 0: all in this process.",
)
@db_options
@pass_ctx
def import_(obj: _Context, cache_dir: str, this_machine: bool, workers: int | None) -> None:
    """Import an Inductor cache directory (TORCHINDUCTOR_CACHE_DIR).

    Reads fxgraph/, aotautograd/, cache/<system hash>, every *.best_config,
    configs_*.json, Triton's kernels (triton/<device>/<key>/) and C++ kernel libraries
    (<k[1:3]>/<k>*.so). Pickles are never executed. Bad files are listed and skipped;
    re-importing is idempotent.

    \b
    Example:
      cachedb --db inductor.db import /tmp/torchinductor_$USER
      cachedb --db inductor.db import --workers 0 ./cache   # all in one process
    """
    from ..layout.importer import Importer

    fingerprint = None
    host_key = None
    if this_machine:
        from ..fingerprint import cpp_host_key, current

        fingerprint = current()
        host_key = cpp_host_key()
    with obj.open() as db, ProgressBar(f"importing {cache_dir}") as bar:
        report = Importer(db, fingerprint=fingerprint, host_key=host_key, workers=workers).run(
            cache_dir, progress=_progress_callback(bar)
        )
    kinds = sorted(set(report.added) | set(report.unchanged))
    emit(
        [{"kind": k, "added": report.added[k], "unchanged": report.unchanged[k]} for k in kinds],
        ("kind", "added", "unchanged"),
        "table",
    )
    click.echo(f"{report.bytes_read} bytes read; {report.ignored_files} files not cachedb's (sources, object files, locks, ...)")
    print_skipped(report, "file(s) skipped")


@main.command("export")
@click.argument("target_dir", type=click.Path(file_okay=False, path_type=str))
@db_options
@pass_ctx
def export(obj: _Context, target_dir: str) -> None:
    """Write the database back as an Inductor cache directory (atomic per file).

    Point TORCHINDUCTOR_CACHE_DIR at the result and torch.compile finds its entries.

    \b
    Example:
      cachedb --db inductor.db export /tmp/warm-cache
      TORCHINDUCTOR_CACHE_DIR=/tmp/warm-cache python train.py
    """
    from ..layout.exporter import export_cache_dir

    try:  # C++ libraries built on this host win where several hosts share a key
        from ..fingerprint import cpp_host_key

        prefer_host: str | None = cpp_host_key()
    except Exception:  # noqa: BLE001 - no torch or no compiler: any host's library
        prefer_host = None
    with obj.open(existing=True) as db, ProgressBar(f"exporting to {target_dir}") as bar:
        if _accepts(export_cache_dir, "progress"):
            report = export_cache_dir(db, target_dir, progress=_progress_callback(bar),  # type: ignore[call-arg]
                                      prefer_host=prefer_host)
        else:
            report = export_cache_dir(db, target_dir, prefer_host=prefer_host)
    kinds = sorted(set(report.written) | set(report.unchanged))
    emit(
        [{"kind": k, "written": report.written[k], "unchanged": report.unchanged[k]} for k in kinds],
        ("kind", "written", "unchanged"),
        "table",
    )
    files = sum(report.written.values())
    click.echo(_printable(f"{files} files, {report.bytes_written} bytes ({_human(report.bytes_written)}) "
                          f"written to {target_dir}"))


@main.command()
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv", "prometheus"]), default="table",
              show_default=True,
              help="prometheus: Prometheus' text exposition format (gauges named cachedb_*), for node_exporter's "
                   "textfile collector.")
@db_options
@pass_ctx
def stats(obj: _Context, fmt: str) -> None:
    """Entries, bytes, hits and seconds saved per kind and system fingerprint.

    --format prometheus also gives the miss log's lookups per kind and outcome
    (cachedb_misses). Write it to a temporary file and rename it into the textfile
    collector's directory, so that node_exporter never reads half a file.

    \b
    Example:
      cachedb --db inductor.db stats --format json
      cachedb --db inductor.db stats --format prometheus > /var/lib/node_exporter/cachedb.prom.tmp \\
        && mv /var/lib/node_exporter/cachedb.prom.tmp /var/lib/node_exporter/cachedb.prom
    """
    from ..tools.stats import COLUMNS, collect, prometheus

    with obj.open(existing=True) as db, db.read() as repos:
        if fmt == "prometheus":
            click.echo(prometheus(repos.session), nl=False)
            return
        rows = collect(repos.session)
    emit(rows, _columns(rows, COLUMNS), fmt)


@main.command()
@click.argument("sql")
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True)
@db_options
@pass_ctx
def query(obj: _Context, sql: str, fmt: str) -> None:
    """Run one read-only SQL statement (writes are refused by the database).

    Tables: guarded_entries, autotune_keys, autotune_runs, autotune_run_timings,
    local_cache_values, best_configs, cutlass_op_lists, cutlass_ops, kernel_artifacts,
    kernel_blobs, system_fingerprints; views: autotune_timings (every timing, flat),
    autotune_current, autotune_winners, autotune_history, kernels.

    \b
    Example:
      cachedb --db inductor.db query "SELECT op, choice_hash, timing_ms FROM autotune_winners" --format csv
    """
    from .._errors import QueryError

    with obj.open(existing=True) as db:
        with db.engine.connect() as conn:
            with conn.begin() as txn:
                set_read_only(conn)
                try:
                    result = conn.execute(text(sql))
                    columns = list(result.keys()) if result.returns_rows else []
                    rows = [dict(zip(columns, r)) for r in result] if result.returns_rows else []
                except (SQLAlchemyError, UnicodeError) as exc:
                    raise QueryError(f"{db.where}: query failed: {getattr(exc, 'orig', None) or exc}") from exc
                finally:
                    txn.rollback()
    emit(rows, columns, fmt)


@main.command()
@click.option("--dry-run", is_flag=True, help="Print the migrations that would run; change nothing.")
@db_options
@pass_ctx
def upgrade(obj: _Context, dry_run: bool) -> None:
    """Apply pending schema migrations (under a file lock).

    Creates the database when there is none. --dry-run lists the migrations an upgrade
    would run, creating and changing nothing.

    \b
    Example:
      cachedb --db inductor.db upgrade
      cachedb --db inductor.db upgrade --dry-run   # which migrations; nothing changes
    """
    if not dry_run:
        with obj.open() as db:
            click.echo(_printable(f"{db.where}: schema revision {db.revision()}"))
        return
    from ..store.migrate import head_revision, plan_upgrade

    try:
        db = obj.open(existing=True, upgrade=False)
    except NoDatabaseError as exc:
        click.echo(_printable(f"{exc}; `cachedb upgrade` would create it at schema revision {head_revision()}; "
                              "nothing was changed (--dry-run)"))
        return
    with db:
        plan = plan_upgrade(db.engine, where=db.where)
    if not plan.steps:
        click.echo(_printable(f"{plan.where}: schema revision {plan.current} is this cachedb's: nothing to upgrade; "
                              "nothing was changed (--dry-run)"))
        return
    emit([{"revision": r, "migration": d} for r, d in plan.steps], ("revision", "migration"), "table")
    click.echo(_printable(f"would upgrade {plan.where} from schema revision {plan.current} to {plan.head} "
                          f"({len(plan.steps)} migration(s), in one transaction); nothing was changed (--dry-run)"))


@main.command()
@click.option("--max-bytes", type=SizeType(), metavar="SIZE",
              help="Keep the stored entries and kernels under SIZE, e.g. 10G, 500M, 512K or 4096 (bytes; K, M, G, T: "
                   "powers of 1024). 0 removes them all (and asks first).")
@click.option("--older-than", type=AgeType(zero_hint=": it would remove everything; --max-bytes 0 empties the cache"),
              metavar="AGE", help="Remove entries and kernels not used for AGE, e.g. 30d, 12h, 30m (minutes), 2w; "
                                  "the unit is required.")
@click.option("--order", type=click.Choice(["lru", "value"]), default="lru", show_default=True,
              help="What --max-bytes removes first among FX graph and AOTAutograd entries. lru: the least recently "
                   "used. value: the least worth per stored byte, compile seconds x (hits + 1) x 2^(-age / 7 days) "
                   "/ stored bytes (age: since the last use), so an entry slow to compile and hit often stays. "
                   "Kernels and Dynamo's caches go least recently used first in both.")
@click.option("--dry-run", is_flag=True,
              help="Print what would be removed (entries, kernel files, stored bytes per kind); change nothing.")
@click.option("--yes", "-y", is_flag=True,
              help="Remove without asking, also more than half of the stored bytes (or any row of a PostgreSQL "
                   "database): needed then when stdin is not a terminal.")
@click.option("--vacuum", is_flag=True, help="Give the freed space back to the file system (SQLite VACUUM).")
@db_options
@pass_ctx
def prune(obj: _Context, max_bytes: int | None, older_than: dt.timedelta | None, order: str, dry_run: bool,
          yes: bool, vacuum: bool) -> None:
    """Evict FX graph and AOTAutograd entries and kernels, least recently used first.

    Kernels (Triton key directories, C++ libraries) go whole, and a blob goes when no kept
    kernel uses it. --older-than applies to both; --max-bytes bounds their stored bytes
    together, each kind giving up its share of the excess; --order value keeps the entries
    whose compile time saved most per byte, recently. A prune that would remove more
    than half of the stored bytes, or any row of a PostgreSQL database (shared by every
    machine), asks first on a terminal and otherwise needs --yes. --dry-run prints the
    plan; the run deletes what the plan names.

    \b
    Example:
      cachedb --db inductor.db prune --max-bytes 10G --older-than 30d
      cachedb --db inductor.db prune --max-bytes 1M --dry-run   # what would go; nothing changes
      cachedb --db inductor.db prune --max-bytes 10G --order value   # keep what saves most compile time
      cachedb --db postgresql+psycopg://cache@db.example/inductor prune --older-than 90d --yes
    """
    from ..tools import prune as pruning

    if max_bytes is None and older_than is None:
        raise click.UsageError("give --max-bytes and/or --older-than")
    if dry_run and vacuum:
        raise click.UsageError("--vacuum changes the database file: leave it out of a --dry-run")
    cutoff = dt.datetime.now(dt.timezone.utc) - older_than if older_than is not None else None
    with obj.open(existing=True, dry_run=dry_run) as db:
        with db.read() as repos:
            plan = pruning.plan(repos, max_bytes=max_bytes, older_than=cutoff, order=order)
        shared = db.engine.dialect.name == "postgresql"
        pct = f"{100 * plan.share():.0f}%" if plan.total_bytes else "0%"
        kernels = f" and {plan.files} of {plan.total_files} kernel files" if plan.total_files or plan.files else ""
        numbers = (f"{plan.entries} of {plan.total_entries} entries{kernels}: {plan.bytes} of {plan.total_bytes} "
                   f"stored bytes ({_human(plan.bytes)}, {pct})")
        if dry_run:
            emit(plan.rows(), pruning.COLUMNS, "table")
            click.echo(_printable(f"would remove {numbers} from {db.where}; nothing was changed (--dry-run)"))
            return
        if not plan.empty and (2 * plan.bytes > plan.total_bytes or shared):
            why = "rows of a shared PostgreSQL database" if shared else "more than half of the stored bytes"
            confirm(f"prune would remove {numbers} from {db.where} ({why})", yes=yes)
        with db.transaction() as repos:
            done = pruning.apply(repos, plan)
        if vacuum:
            from ..store.engine import vacuum as run_vacuum

            run_vacuum(db.engine)
    click.echo(f"removed {done.entries} entries, {done.entry_bytes} stored bytes ({_human(done.entry_bytes)}); "
               f"{done.files} kernel files, {done.kernel_bytes} stored bytes ({_human(done.kernel_bytes)})")


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--remote", metavar="URL", help=_REMOTE_HELP)
@click.option("--remote-timeout", type=DurationType(min=0.1, max=3600), metavar="SECONDS",
              help="Seconds a remote connect or statement may take before the remote is skipped "
                   "(default $CACHEDB_REMOTE_TIMEOUT, else 2; 0.1 to 3600), e.g. --remote-timeout 5.")
@db_options
@pass_ctx
def run(obj: _Context, command: tuple[str, ...], remote: str | None, remote_timeout: float | None) -> None:
    """Run a program with Inductor's caches served from the database.

    The program and every Python process it starts (compile workers) store and find FX
    graph and AOTAutograd entries, autotune timings, best configs, CUTLASS op lists and
    compiled kernels in the database instead of TORCHINDUCTOR_CACHE_DIR. Each process
    turns cachedb on when torch imports Inductor's cache modules: one that imports torch
    and never compiles (a spawn DataLoader worker, torchrun's launcher) starts as fast as
    without cachedb.

    With --remote, a shared database (PostgreSQL) stands behind the local one: a local miss
    is looked up there and copied into the local file, and what the program writes is
    copied there in the background. A remote that is down or slow costs one warning.

    \b
    Example:
      cachedb --db inductor.db run -- python train.py --epochs 1
      cachedb --db ~/.cache/inductor.db run --remote postgresql+psycopg://cache-host/inductor -- python train.py
    """

    from ..live import child_environment
    from ..settings import SettingError, check_environment

    location = obj.location or default_location()
    if "://" not in location:
        location = os.path.abspath(os.path.expanduser(location))
    remote = remote or obj.remote
    env = child_environment(location, remote=remote, remote_timeout_s=remote_timeout)
    try:
        check_environment(env)  # what every process of the program would refuse, said once here
    except SettingError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        sys.exit(2)
    try:
        os.execvpe(command[0], list(command), env)
    except OSError as exc:
        err.print(f"[bold red]error:[/] cannot run {command[0]!r}: {exc.strerror}", highlight=False)
        sys.exit(127)


@main.command()
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True)
@click.option("--no-quarantine", is_flag=True, help="Report corrupt entries but leave them in place.")
@click.option("--remote", "remote_url", metavar="URL",
              help="List a shared database's rows by signer instead (checked under CACHEDB_TRUSTED_KEYS).")
@db_options
@pass_ctx
def verify(obj: _Context, fmt: str, no_quarantine: bool, remote_url: str | None) -> None:
    """Check integrity, every payload's checksum (and signature, with CACHEDB_HMAC_KEY).

    Corrupt entries are moved to quarantine (kept for inspection, never served) and
    listed, with those quarantined earlier. Exit status 1 on any problem. With
    --remote URL: the shared database's rows per table and signer, and exit
    status 1 when a consumer trusting CACHEDB_TRUSTED_KEYS would not serve one.

    \b
    Example:
      cachedb --db inductor.db verify --format json
      CACHEDB_TRUSTED_KEYS=writer.pem.pub cachedb verify --remote postgresql+psycopg://cache/inductor
    """
    from ..tools.verify import verify as run_verify

    if remote_url is not None:
        from .fleet import report_signers

        report_signers(remote_url, obj.timeout, fmt)
        return

    with obj.open(existing=True) as db:
        problems, checked = run_verify(db, quarantine=not no_quarantine)
    if fmt != "table":  # machine-readable: the (possibly empty) list, the summary on stderr
        emit(problems, _columns(problems, ("what", "where", "problem")), fmt)
    elif problems:
        emit(problems, _columns(problems, ("what", "where", "problem")), fmt)
    if problems:
        err.print(f"{len(problems)} problem(s) in {checked} payloads", highlight=False)
        sys.exit(1)
    if fmt == "table":
        click.echo(f"ok: integrity check passed, {checked} payloads verified")
    else:
        err.print(f"ok: integrity check passed, {checked} payloads verified", highlight=False)


@main.command()
@click.argument("damaged", type=click.Path(dir_okay=False, exists=True, path_type=str))
@click.argument("new", type=click.Path(dir_okay=False, path_type=str))
@click.option("--method", type=click.Choice(["auto", "recover", "scan"]), default="auto", show_default=True,
              help="recover: SQLite's .recover through the sqlite3 shell; scan: page-tolerant table scans "
              "(no shell needed); auto: recover when a sqlite3 shell is on PATH.")
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True)
@click.option("--dry-run", is_flag=True,
              help="Salvage into a scratch copy that is removed afterwards and print what NEW would hold; "
                   "NEW is not created.")
def recover(damaged: str, new: str, method: str, fmt: str, dry_run: bool) -> None:
    """Salvage every readable row of a damaged database into a NEW one.

    DAMAGED is only read. Rows are copied with their ids into NEW (which must not
    exist), payload checksums are verified again (rows that fail are left out),
    and rows saved and not saved are printed per table. Exit status 1 if NEW
    still fails cachedb verify.

    \b
    Example:
      cachedb recover damaged.db saved.db
      cachedb recover --dry-run damaged.db saved.db   # what would be saved; writes nothing
      cachedb --db saved.db stats
    """
    from ..tools.recover import recover as run_recover

    with ProgressBar(f"recovering {damaged}", unit="tables") as bar:
        report = run_recover(damaged, new, method=method, dry_run=dry_run,
                             progress=lambda done, total: bar.update(count=done, total_count=total))
    rows = [t.as_row() for t in report.tables]
    emit(rows, _columns(rows, ("table", "saved", "lost", "corrupt", "orphaned", "indexed")), fmt)
    summary = (f"{report.saved} rows saved, {report.not_saved} not saved (lost, corrupt or orphaned) "
               f"into {report.target} (method: {report.method})")
    if dry_run:
        summary = (f"would save {report.saved} rows, {report.not_saved} not saved (lost, corrupt or orphaned) "
                   f"into {report.target} (method: {report.method}); nothing was written (--dry-run)")
    if fmt == "table":
        click.echo(_printable(summary))
    else:
        err.print(Text(_printable(summary)), highlight=False)
    for problem in report.problems:
        err.print(Text(_printable(f"{report.target}: {problem['what']} {problem['where']}: {problem['problem']}")),
                  highlight=False)
    if report.problems:
        sys.exit(1)


@main.command()
@click.option("--limit", "-n", type=click.IntRange(min=1), default=20, show_default=True,
              help="How many of the newest misses to show.")
@click.option("--kind", type=click.Choice(["fxgraph", "aotautograd", "timings", "best_config", "cpp", "precompile"]),
              default=None,
              help="Only misses of this kind (timings: autotune timings lookups that benchmarked; best_config: "
                   "Triton kernels tuned again; cpp: C++ kernel libraries compiled; precompile: precompiled "
                   "Dynamo packages not found).")
@click.option("--remote", metavar="URL", default=None,
              help="Explain the misses against the entries of this database (the shared tier, a SQLAlchemy URL "
                   "or a file) instead of --db's own; read only.")
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True)
@db_options
@pass_ctx
def misses(obj: _Context, limit: int, kind: str | None, remote: str | None, fmt: str) -> None:
    """Recent cache misses, newest first, each with the nearest stored entry and the factors
    of torch's key that differ (stored -> wanted).

    A live process records each FX graph and AOTAutograd lookup that misses (no entry,
    guards failed, or a bypass), each autotune timings lookup that benchmarks (no_entry,
    or new_choices: a choice without a timing), each Triton kernel's best config it lacks
    (no_entry, or configs_changed: stored for other candidate configs), each C++ kernel
    library it compiles and each precompiled Dynamo package it does not find (no_entry: none
    stored for this host or system; nearest: the one stored for another), the newest
    CACHEDB_MISS_LOG (1000) per database. Triton kernels, PGO profiles and CUTLASS op lists
    record no misses.
    --format json gives per miss: kind, key, outcome, nearest (a key or null) and differs (a
    list of {factor, stored, wanted}); a guards_failed miss also gives guards, the stored
    guard expressions that failed. With --remote the nearest entry is one of the shared
    database's (why this machine missed what another machine stored there).

    \b
    Example:
      cachedb --db cache.db misses -n 5
      cachedb --db cache.db misses --format json
      cachedb --db cache.db misses --remote postgresql+psycopg://cache-host/inductor
    """
    from ..tools.misses import COLUMNS, explain, words

    remote = remote or obj.remote
    with obj.open(existing=True) as db, db.read() as repos:
        if remote is None:
            rows = explain(repos.session, limit=limit, kind=kind)
        else:  # the shared database's errors name it, not --db
            other = _Context(remote, obj.timeout)
            try:
                with other.open(existing=True, upgrade=False) as shared, shared.read() as theirs:
                    rows = explain(repos.session, limit=limit, kind=kind, against=theirs.session)
            except DatabaseOpenError as exc:
                if isinstance(exc.__cause__, SQLAlchemyError):
                    _fail(describe_error(exc.__cause__, other.where, obj.timeout))
                raise
            except SQLAlchemyError as exc:
                _fail(describe_error(exc, other.where, obj.timeout))
    if fmt != "json":
        table = fmt == "table"  # short keys, one factor a line
        rows = [{
            "missed_at": r["missed_at"].strftime("%Y-%m-%d %H:%M:%S") if table else r["missed_at"],
            "kind": r["kind"], "key": r["key"][:12] if table else r["key"], "outcome": r["outcome"],
            "nearest": (r["nearest"] or "")[:12] if table else r["nearest"],
            "differs": words(r["differs"], sep="\n" if table else "; ") or r["reason"]
            or ("guards failed: " + " | ".join(r.get("guards") or []) if r["outcome"] == "guards_failed" else ""),
        } for r in rows]
    emit(rows, _columns(rows, COLUMNS), fmt)
