"""The ``cachedb`` command line (also ``python -m cachedb``)."""

from __future__ import annotations

import csv
import io
import json
import os
import sqlite3
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table
from rich.text import Text
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from . import __version__
from ._engine import SQLITE_HEADER, default_location, set_read_only, sqlite_path, to_url
from ._errors import CacheDBError, DatabaseOpenError, NotADatabaseError
from .db import CacheDB

FORMATS = click.Choice(["table", "json", "csv"])
err = Console(stderr=True, soft_wrap=True)

#: Seconds a command waits on a database locked by another process before it gives up.
DEFAULT_TIMEOUT_S = 30.0

F = TypeVar("F", bound=Callable[..., Any])


class NoDatabaseError(DatabaseOpenError):
    """A read command was pointed at a database that does not exist (nothing is created)."""


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, memoryview)):
        return f"<{len(bytes(value))} bytes>"
    return str(value)


def _columns(rows: Sequence[dict[str, Any]], known: Sequence[str] = ()) -> list[str]:
    """``known`` columns first, then any other key the rows carry (in first-seen order)."""
    columns = list(known)
    for r in rows:
        columns += [k for k in r if k not in columns]
    return columns


def emit(rows: Sequence[dict[str, Any]], columns: Sequence[str], fmt: str) -> None:
    """Print ``rows`` as a rich table, a JSON array or CSV (with a header)."""
    if fmt == "json":
        click.echo(json.dumps([dict(r) for r in rows], indent=2, default=_json_default))
    elif fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: _json_default(v) if isinstance(v, (bytes, memoryview)) else v for k, v in r.items()})
        click.echo(buf.getvalue(), nl=False)
    else:
        table = Table()
        for c in columns:
            table.add_column(Text(str(c)))
        for r in rows:
            table.add_row(*(Text("" if r.get(c) is None else str(r[c]) if isinstance(r[c], (int, float, str))
                                 else _json_default(r[c])) for c in columns))
        Console(width=max(120, Console().width)).print(table)


def _printable(text: str) -> str:
    """``text`` with undecodable file-name bytes (surrogate escapes) shown as ``\\xNN``."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


# --------------------------------------------------------------------------- progress bars


def _human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"  # pragma: no cover


class ProgressBar:
    """A rich progress bar on stderr with counts and bytes, drawn only on a terminal.

    :meth:`update` may be called after every item: it only stores the numbers and passes them
    to rich at most every :attr:`interval` seconds (and once more at the end), so a fast loop
    pays a clock read per call. ``refreshes`` counts the updates passed on.
    """

    interval = 0.1

    def __init__(self, description: str, *, unit: str = "files", console: Console | None = None,
                 enabled: bool | None = None) -> None:
        console = console or Console(stderr=True)
        self.enabled = console.is_terminal if enabled is None else enabled
        self.unit = unit
        self.refreshes = 0
        self._last = 0.0
        self._state: dict[str, Any] = {}
        self._progress = Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[count]}"),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
            disable=not self.enabled,
        )
        self._task: TaskID = self._progress.add_task(_printable(description), total=None, count="")

    def __enter__(self) -> ProgressBar:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._push()
        self._progress.stop()

    def update(self, *, count: int | None = None, total_count: int | None = None,
               done_bytes: int | None = None, total_bytes: int | None = None) -> None:
        for k, v in (("count", count), ("total_count", total_count), ("done", done_bytes), ("total", total_bytes)):
            if v is not None:
                self._state[k] = v
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            self._push()

    def _push(self) -> None:
        if not self.enabled or not self._state:
            return
        self.refreshes += 1
        st = self._state
        count = ""
        if "count" in st:
            count = f"{st['count']}/{st['total_count']} {self.unit}" if "total_count" in st else f"{st['count']} {self.unit}"
        self._progress.update(self._task, completed=st.get("done", 0), total=st.get("total"), count=count)


def _accepts(func: Callable[..., Any], name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(func).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return False


def _progress_callback(bar: ProgressBar) -> Callable[..., None]:
    """A ``progress`` callback for the importer/exporter/prune: ``(done_bytes, total_bytes)``,
    optionally followed by ``(done_items, total_items)``."""

    def progress(done: int, total: int, *counts: int) -> None:
        if len(counts) >= 2:
            bar.update(done_bytes=done, total_bytes=total, count=counts[0], total_count=counts[1])
        else:
            bar.update(done_bytes=done, total_bytes=total)

    return progress


# --------------------------------------------------------------------------- the database of a command


class _Context:
    def __init__(self, location: str | None, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.location = location
        self.timeout = timeout
        self.where: str | None = None
        self.remote: str | None = None

    def _resolve(self) -> str:
        location = self.location or default_location()
        try:
            url = to_url(location)
            path = sqlite_path(url)
        except Exception:  # noqa: BLE001 - CacheDB() reports a bad location with its reason
            self.where = location
            return location
        self.where = str(path) if path is not None else url.render_as_string(hide_password=True)
        return location

    def open(self, *, existing: bool = False) -> CacheDB:
        """The command's database. ``existing``: a command that reads or trims a database
        (stats, query, verify, export, prune): it never creates a file, a directory or a
        schema, and says there is no database instead."""
        location = self._resolve()
        if not existing:
            return CacheDB(location, busy_timeout_s=self.timeout)
        path = None
        try:
            path = sqlite_path(to_url(location))
        except Exception:  # noqa: BLE001
            pass
        if path is not None:
            _require_database_file(path, self.timeout)
        db = CacheDB(location, busy_timeout_s=self.timeout, upgrade=False)
        try:
            if db.revision() is None:
                raise NoDatabaseError(
                    f"no cachedb database at {db.where}: it has no cachedb schema "
                    f"(`cachedb --db {db.where} init` creates one)"
                )
            db.upgrade()  # an older cachedb schema is brought up to date, as on every open
        except BaseException:
            db.close()
            raise
        return db


def _require_database_file(path: Path, timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """Refuse, without creating or changing anything, a path where no cachedb database is."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise NoDatabaseError(f"no database at {path}") from None
    except OSError as exc:
        raise DatabaseOpenError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if path.is_dir():
        raise DatabaseOpenError(f"{path}: is a directory, not a database file")
    if st.st_size == 0:
        raise NoDatabaseError(f"no database at {path} (the file is empty)")
    try:
        with path.open("rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise DatabaseOpenError(f"{path}: cannot read: {exc.strerror or exc}{_owner_note(path)}") from exc
    if head != SQLITE_HEADER:
        raise NotADatabaseError(path, "file header is not 'SQLite format 3'")
    # Another program's SQLite file: looked at read-only, so that not even its journal mode
    # changes (cachedb's engine would switch it to WAL).
    con = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=timeout)
    try:
        found = con.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'").fetchone()
    finally:
        con.close()
    if found is None:
        raise NoDatabaseError(f"no cachedb database at {path}: it has no cachedb schema "
                              f"(`cachedb --db {path} init` creates one)")


def _owner_note(path: Path | None) -> str:
    """`` (owned by uid N, not by this user ...)`` when ``path`` belongs to someone else."""
    if path is None or not hasattr(os, "getuid"):
        return ""
    try:
        st = path.stat()
    except OSError:
        return ""
    if st.st_uid != os.getuid():
        return f" (the file is owned by uid {st.st_uid}, not by this user, uid {os.getuid()})"
    if not os.access(path, os.W_OK):
        return " (this user may not write it)"
    return ""


def describe_error(exc: BaseException, where: str | None, timeout: float | None = None) -> str:
    """One line naming the database (``where``) and what is wrong, for an error SQLite, the
    driver or the file system raised below cachedb's own checks."""
    where = where or "the database"
    orig = getattr(exc, "orig", None) or exc
    message = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    low = message.lower()
    path = Path(where) if "://" not in where else None
    if "database is locked" in low or "database table is locked" in low:
        waited = f" longer than the {timeout:g} s timeout (--timeout SECONDS)" if timeout is not None else ""
        return f"{where}: database is locked: another process held it{waited}"
    if "malformed" in low or "disk image" in low or "could not decode" in low or "corrupt" in low:
        return (f"{where}: the database is damaged ({message}); `cachedb verify` lists the damage, "
                f"`cachedb recover` salvages the readable rows")
    if "file is not a database" in low:
        return f"{where}: not an SQLite database ({message})"
    if "readonly" in low or "read-only" in low or "unable to open" in low or isinstance(orig, PermissionError):
        return f"{where}: cannot open or write the database ({message}){_owner_note(path)}"
    if isinstance(orig, OSError) and getattr(orig, "filename", None):
        return f"{orig.filename}: {orig.strerror or message}"
    return f"{where}: {type(orig).__name__}: {message}"


def _set_location(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        ctx.ensure_object(_Context).location = value
    return value


def _set_timeout(ctx: click.Context, _param: click.Parameter, value: float | None) -> float | None:
    if value is not None:
        ctx.ensure_object(_Context).timeout = value
    return value


_DB_HELP = ("SQLite file or SQLAlchemy URL; before or after the command. Default: $CACHEDB_URL, "
            "$CACHEDB_PATH, else ~/.cache/cachedb/cachedb.db.")
_REMOTE_HELP = ("`run` only: a shared database (SQLAlchemy URL, e.g. PostgreSQL) behind --db: local "
                "misses are looked up there and copied into --db; local writes are copied there. "
                "Default: $CACHEDB_REMOTE_URL.")
_TIMEOUT_HELP = f"Seconds to wait for a database another process has locked (default {DEFAULT_TIMEOUT_S:g})."


def db_options(func: F) -> F:
    """``--db`` and ``--timeout`` on a subcommand too (``cachedb stats --db x.db``): a value
    given after the command overrides the one given before it."""
    func = click.option("--timeout", type=click.FloatRange(min=0), metavar="SECONDS", expose_value=False,
                        callback=_set_timeout, help=_TIMEOUT_HELP)(func)
    func = click.option("--db", metavar="PATH|URL", type=click.Path(path_type=str), expose_value=False,
                        callback=_set_location, help=_DB_HELP)(func)
    return func


pass_ctx = click.make_pass_decorator(_Context)


class _Group(click.Group):
    """Turns every error into one clear line naming the database, and exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CacheDBError as exc:
            cause = exc.__cause__
            if type(exc) is DatabaseOpenError and isinstance(cause, (SQLAlchemyError, sqlite3.Error)):
                # CacheDB's "cannot open: OperationalError(...)": said in the user's words
                obj = ctx.find_object(_Context)
                _fail(describe_error(cause, obj.where if obj else None, obj.timeout if obj else None))
            _fail(str(exc))
        except (SQLAlchemyError, sqlite3.Error, UnicodeDecodeError, OSError) as exc:
            obj = ctx.find_object(_Context)
            _fail(describe_error(exc, obj.where if obj else None, obj.timeout if obj else None))


def _fail(message: str) -> None:
    err.print(Text("error: ", style="bold red") + Text(_printable(message)), highlight=False)
    sys.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]},
             epilog="Shell completion (bash; zsh and fish alike with zsh_source / fish_source):\n\n"
                    "\b\n  eval \"$(_CACHEDB_COMPLETE=bash_source cachedb)\"   # in ~/.bashrc")
@click.option("--db", "location", metavar="PATH|URL", type=click.Path(path_type=str), help=_DB_HELP)
@click.option("--timeout", type=click.FloatRange(min=0), default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
              help=_TIMEOUT_HELP)
@click.option("--remote", "remote", metavar="URL", help=_REMOTE_HELP)
@click.version_option(__version__, prog_name="cachedb")
@click.pass_context
def main(ctx: click.Context, location: str | None, timeout: float, remote: str | None) -> None:
    """cachedb: PyTorch Inductor's caches in one SQLite (or PostgreSQL) database.

    --db and --timeout go before or after the command. Commands that read or
    trim a database (stats, query, verify, export, export-artifacts, prune)
    never create one.

    \b
    Example:
      cachedb --db inductor.db import /tmp/torchinductor_$USER
      cachedb stats --db inductor.db --format json
    """
    ctx.obj = _Context(location, timeout)
    ctx.obj.remote = remote


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
    type=click.IntRange(min=0),
    default=None,
    help="Processes that read, check and compress entry files while the database is written "
    "(default: one fewer than the usable CPUs, at most 4, for 1,024 FX graph/AOTAutograd files or more; "
    "also CACHEDB_IMPORT_WORKERS). 0: all in this process.",
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
    from .importer import Importer

    fingerprint = None
    host_key = None
    if this_machine:
        from .fingerprint import cpp_host_key, current

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
    for p in report.notes:
        err.print(f"note: {p.path}: {p.reason}", highlight=False, markup=False)
    for p in report.problems:
        err.print(f"skipped: {p.path}: {p.reason}", highlight=False, markup=False)
    if report.problems:
        err.print(f"{len(report.problems)} file(s) skipped", highlight=False)


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
    from .exporter import export_cache_dir

    try:  # C++ libraries built on this host win where several hosts share a key
        from .fingerprint import cpp_host_key

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
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True)
@db_options
@pass_ctx
def stats(obj: _Context, fmt: str) -> None:
    """Entries and bytes per kind and system fingerprint.

    \b
    Example:
      cachedb --db inductor.db stats --format json
    """
    from .stats import COLUMNS, collect

    with obj.open(existing=True) as db, db.read() as repos:
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
    from ._errors import QueryError

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
@db_options
@pass_ctx
def upgrade(obj: _Context) -> None:
    """Apply pending schema migrations (under a file lock).

    \b
    Example:
      cachedb --db inductor.db upgrade
    """
    with obj.open() as db:
        click.echo(_printable(f"{db.where}: schema revision {db.revision()}"))


def _parse_size(text: str) -> int:
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = t[-1] if t and t[-1] in units else ""
    try:
        return int(float(t[: len(t) - len(unit)]) * units[unit])
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected a size such as 500M or 10G") from None


def _parse_age(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    t = text.strip().lower()
    unit = t[-1] if t and t[-1] in units else "s"
    try:
        return float(t.rstrip("smhdw")) * units[unit]
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected an age such as 30d or 12h") from None


@main.command()
@click.option("--max-bytes", metavar="SIZE", help="Keep stored entries under SIZE (e.g. 10G, 500M).")
@click.option("--older-than", metavar="AGE", help="Remove entries not used for AGE (e.g. 30d, 12h).")
@click.option("--vacuum", is_flag=True, help="Give the freed space back to the file system (SQLite VACUUM).")
@db_options
@pass_ctx
def prune(obj: _Context, max_bytes: str | None, older_than: str | None, vacuum: bool) -> None:
    """Evict FX graph and AOTAutograd entries and kernels, least recently used first.

    Kernels (Triton key directories, C++ libraries) go whole, and a blob goes when no kept
    kernel uses it. --older-than applies to both; --max-bytes bounds their stored bytes
    together, each kind giving up its share of the excess.

    \b
    Example:
      cachedb --db inductor.db prune --max-bytes 10G --older-than 30d
    """
    import datetime as dt

    from sqlalchemy import func, select

    from .models import GuardedEntry, KernelBlob

    if max_bytes is None and older_than is None:
        raise click.UsageError("give --max-bytes and/or --older-than")
    limit = _parse_size(max_bytes) if max_bytes is not None else None
    cutoff = None
    if older_than is not None:
        cutoff = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=_parse_age(older_than))
    with obj.open(existing=True) as db:
        with ProgressBar(f"pruning {db.where}", unit="entries") as bar, db.transaction() as repos:
            g_limit = k_limit = None
            if limit is not None:
                g = int(repos.session.execute(select(func.coalesce(func.sum(func.length(GuardedEntry.payload)), 0))).scalar_one())
                k = int(repos.session.execute(select(func.coalesce(func.sum(KernelBlob.stored_bytes), 0))).scalar_one())
                over = max(0, g + k - limit)
                g_limit = g - (over * g // (g + k) if g + k else 0)
                k_limit = k - (over - (over * g // (g + k) if g + k else 0))
            if _accepts(repos.guarded.evict, "progress"):
                n, freed = repos.guarded.evict(max_bytes=g_limit, older_than=cutoff,  # type: ignore[call-arg]
                                               progress=_progress_callback(bar))
            else:
                n, freed = repos.guarded.evict(max_bytes=g_limit, older_than=cutoff)
            kn, kfreed = repos.artifacts.evict(max_bytes=k_limit, older_than=cutoff)
        if vacuum:
            from ._engine import vacuum as run_vacuum

            run_vacuum(db.engine)
    click.echo(f"removed {n} entries, {freed} stored bytes ({_human(freed)}); "
               f"{kn} kernel files, {kfreed} stored bytes ({_human(kfreed)})")


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--remote", metavar="URL", help=_REMOTE_HELP)
@click.option("--remote-timeout", type=click.FloatRange(min=0.1), metavar="SECONDS",
              help="Seconds a remote connect or statement may take before the remote is skipped "
                   "(default $CACHEDB_REMOTE_TIMEOUT, else 2).")
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
    import os

    from ._engine import default_location
    from .live import child_environment

    location = obj.location or default_location()
    if "://" not in location:
        location = os.path.abspath(os.path.expanduser(location))
    remote = remote or obj.remote
    env = child_environment(location, remote=remote, remote_timeout_s=remote_timeout)
    try:
        os.execvpe(command[0], list(command), env)
    except OSError as exc:
        err.print(f"[bold red]error:[/] cannot run {command[0]!r}: {exc.strerror}", highlight=False)
        sys.exit(127)


@main.command()
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True)
@click.option("--no-quarantine", is_flag=True, help="Report corrupt entries but leave them in place.")
@db_options
@pass_ctx
def verify(obj: _Context, fmt: str, no_quarantine: bool) -> None:
    """Check integrity, every payload's checksum (and signature, with CACHEDB_HMAC_KEY).

    Corrupt entries are moved to quarantine (kept for inspection, never served) and
    listed, with those quarantined earlier. Exit status 1 on any problem.

    \b
    Example:
      cachedb --db inductor.db verify --format json
    """
    from .verify import verify as run_verify

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
def recover(damaged: str, new: str, method: str, fmt: str) -> None:
    """Salvage every readable row of a damaged database into a NEW one.

    DAMAGED is only read. Rows are copied with their ids into NEW (which must not
    exist), payload checksums are verified again (rows that fail are left out),
    and rows saved and not saved are printed per table. Exit status 1 if NEW
    still fails cachedb verify.

    \b
    Example:
      cachedb recover damaged.db saved.db
      cachedb --db saved.db stats
    """
    from .recover import recover as run_recover

    with ProgressBar(f"recovering {damaged}", unit="tables") as bar:
        report = run_recover(damaged, new, method=method,
                             progress=lambda done, total: bar.update(count=done, total_count=total))
    rows = [t.as_row() for t in report.tables]
    emit(rows, _columns(rows, ("table", "saved", "lost", "corrupt", "orphaned", "indexed")), fmt)
    summary = (f"{report.saved} rows saved, {report.not_saved} not saved (lost, corrupt or orphaned) "
               f"into {report.target} (method: {report.method})")
    if fmt == "table":
        click.echo(_printable(summary))
    else:
        err.print(Text(_printable(summary)), highlight=False)
    for problem in report.problems:
        err.print(Text(_printable(f"{report.target}: {problem['what']} {problem['where']}: {problem['problem']}")),
                  highlight=False)
    if report.problems:
        sys.exit(1)


@main.group()
def cutlass() -> None:
    """CUTLASS op lists (configs_<request key>.json) in the database.

    \b
    Example:
      cachedb --db inductor.db cutlass generate --arch 90 --cuda 12.8
    """


@cutlass.command("generate")
@click.option("--arch", required=True, help='CUDA arch as config.cuda.arch takes it: "90", "90a", "100".')
@click.option("--cuda", "cuda_version", required=True, help='CUDA toolkit version: "12.8".')
@click.option(
    "--level",
    default="0",
    show_default=True,
    help="config.cutlass.cutlass_instantiation_level (4 digits; more kernels when higher).",
)
@click.option(
    "--cutlass-dir",
    type=click.Path(file_okay=False, exists=True, path_type=str),
    help="CUTLASS root holding python/cutlass_library. Default: config.cutlass.cutlass_dir "
    "if it has one, else the installed nvidia-cutlass packages.",
)
@db_options
@pass_ctx
def cutlass_generate(obj: _Context, arch: str, cuda_version: str, level: str, cutlass_dir: str | None) -> None:
    """Run torch's own CUTLASS generator once and store the op list.

    Computes the request key torch's maybe_fetch_ops looks up
    (get_config_request_key) and the op list it would read, then stores both, so that
    torch.compile under cachedb (install / run) skips generating the ops. Needs torch
    and nvidia-cutlass (pip install 'cachedb[cutlass]'); no GPU.

    \b
    Example:
      cachedb --db inductor.db cutlass generate --arch 90 --cuda 12.8
      cachedb --db inductor.db cutlass generate --arch 100 --cuda 12.9 --level 2222
    """
    from .cutlass_gen import generate_and_store

    with obj.open() as db:
        result = generate_and_store(db, arch, cuda_version, level, cutlass_dir=cutlass_dir)
    click.echo(f"request key: {result.request_key}")
    click.echo(f"ops: {result.op_count}")
    click.echo(f"bytes: {result.size_bytes}")
    click.echo(
        f"arch {result.arch}, CUDA {result.cuda_version}, level {result.instantiation_level}: "
        f"{'stored' if result.added else 'already stored (same bytes)'} as configs_{result.request_key}.json "
        f"(generated in {result.generate_s:.1f} s)"
    )



@main.command("export-artifacts")
@click.argument("file", type=click.Path(dir_okay=False, path_type=str))
@db_options
@pass_ctx
def export_artifacts_cmd(obj: _Context, file: str) -> None:
    """Write a Mega-Cache blob (torch.compiler.save_cache_artifacts format) to FILE.

    It holds every FX graph entry (type inductor), AOTAutograd entry (aot_autograd) and
    best config (autotune) in the database; torch.compiler.load_cache_artifacts(blob) in
    any process puts them in its cache directory (or, under cachedb, in its database).
    FILE is written atomically. Needs torch.

    \b
    Example:
      cachedb --db inductor.db export-artifacts warm.bin
      python -c "import torch; torch.compiler.load_cache_artifacts(open('warm.bin','rb').read())"
    """
    import os
    import tempfile

    from ._errors import ExportError
    from .mega_cache import build_artifacts

    with obj.open(existing=True) as db:
        result = build_artifacts(db)
    target = os.path.abspath(file)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp", dir=os.path.dirname(target))
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(result.data)
            os.replace(tmp, target)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:
        raise ExportError(f"{file}: cannot write: {exc.strerror or exc}") from exc
    emit(
        [{"type": t, "artifacts": n} for t, n in result.counts.items()],
        ("type", "artifacts"),
        "table",
    )
    for p in result.left_out:
        err.print(f"left out: {p.path}: {p.reason}", highlight=False, markup=False)
    click.echo(_printable(f"{len(result.data)} bytes written to {file}"))


@main.command("import-artifacts")
@click.argument("file", type=click.Path(dir_okay=False, path_type=str))
@db_options
@pass_ctx
def import_artifacts_cmd(obj: _Context, file: str) -> None:
    """Import a Mega-Cache blob (what torch.compiler.save_cache_artifacts() returns).

    FX graph (inductor), AOTAutograd (aot_autograd) and best-config (autotune)
    artifacts are stored; pgo and precompile artifacts are counted and skipped. Pickles are
    never executed. Re-importing is idempotent. Needs torch.

    \b
    Example:
      python -c "import torch; ...; open('a.bin','wb').write(torch.compiler.save_cache_artifacts()[0])"
      cachedb --db inductor.db import-artifacts a.bin
    """
    from .mega_cache import KIND_OF_TYPE, import_artifacts, read_blob_file

    data = read_blob_file(file)
    with obj.open() as db:
        report = import_artifacts(db, data, where=file)
    rows = []
    for type_, n in report.artifacts.items():
        kind = KIND_OF_TYPE.get(type_)
        rows.append(
            {
                "type": type_,
                "artifacts": n,
                "added": report.added[kind] if kind else 0,
                "unchanged": report.unchanged[kind] if kind else 0,
                "skipped": report.skipped[type_],
            }
        )
    emit(rows, ("type", "artifacts", "added", "unchanged", "skipped"), "table")
    click.echo(f"{report.bytes_read} bytes read from {file}")
    for p in report.notes:
        err.print(f"note: {p.path}: {p.reason}", highlight=False, markup=False)
    for p in report.problems:
        err.print(f"skipped: {p.path}: {p.reason}", highlight=False, markup=False)
    if report.problems:
        err.print(f"{len(report.problems)} artifact(s) not stored", highlight=False)


from .cli_report import register as _register_report; _register_report(main)  # noqa: E402 (report, datasette-metadata)


if __name__ == "__main__":  # pragma: no cover
    main()
from . import cli_copy  # noqa: E402,F401  (registers `cachedb copy` and `cachedb merge`)
