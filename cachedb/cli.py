"""The ``cachedb`` command line (also ``python -m cachedb``)."""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Sequence
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn
from rich.table import Table
from rich.text import Text
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from . import __version__
from ._engine import set_read_only
from ._errors import CacheDBError
from .db import CacheDB

FORMATS = click.Choice(["table", "json", "csv"])
err = Console(stderr=True, soft_wrap=True)


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, memoryview)):
        return f"<{len(bytes(value))} bytes>"
    return str(value)


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
            table.add_row(*(Text("" if r[c] is None else str(r[c]) if isinstance(r[c], (int, float, str))
                                 else _json_default(r[c])) for c in columns))
        Console(width=max(120, Console().width)).print(table)


def _printable(text: str) -> str:
    """``text`` with undecodable file-name bytes (surrogate escapes) shown as ``\\xNN``."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class _Context:
    def __init__(self, location: str | None) -> None:
        self.location = location

    def open(self) -> CacheDB:
        return CacheDB(self.location)


pass_ctx = click.make_pass_decorator(_Context)


class _Group(click.Group):
    """Turns cachedb's own errors into one clear line and exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CacheDBError as exc:
            err.print(Text("error: ", style="bold red") + Text(str(exc)), highlight=False)
            sys.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--db",
    "location",
    metavar="PATH|URL",
    help="SQLite file or SQLAlchemy URL. Default: $CACHEDB_URL, $CACHEDB_PATH, else "
    "~/.cache/cachedb/cachedb.db.",
)
@click.version_option(__version__, prog_name="cachedb")
@click.pass_context
def main(ctx: click.Context, location: str | None) -> None:
    """cachedb: PyTorch Inductor's caches in one SQLite (or PostgreSQL) database.

    \b
    Example:
      cachedb --db inductor.db import /tmp/torchinductor_$USER
      cachedb --db inductor.db stats
    """
    ctx.obj = _Context(location)


@main.command()
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
    "by the installed torch). Needs torch.",
)
@pass_ctx
def import_(obj: _Context, cache_dir: str, this_machine: bool) -> None:
    """Import an Inductor cache directory (TORCHINDUCTOR_CACHE_DIR).

    Reads fxgraph/, aotautograd/, cache/<system hash>, every *.best_config and
    configs_*.json. Pickles are never executed. Bad files are listed and skipped;
    re-importing is idempotent.

    \b
    Example:
      cachedb --db inductor.db import /tmp/torchinductor_$USER
    """
    from .importer import Importer

    fingerprint = None
    if this_machine:
        from .fingerprint import current

        fingerprint = current()
    with obj.open() as db:
        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TimeRemainingColumn(),
            console=err,
            transient=True,
            disable=not err.is_terminal,
        ) as bar:
            task = bar.add_task(f"importing {cache_dir}", total=None)

            def progress(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            report = Importer(db, fingerprint=fingerprint).run(cache_dir, progress=progress)
    kinds = sorted(set(report.added) | set(report.unchanged))
    emit(
        [{"kind": k, "added": report.added[k], "unchanged": report.unchanged[k]} for k in kinds],
        ("kind", "added", "unchanged"),
        "table",
    )
    click.echo(f"{report.bytes_read} bytes read; {report.ignored_files} files not cachedb's (kernels, locks, ...)")
    for p in report.notes:
        err.print(f"note: {p.path}: {p.reason}", highlight=False, markup=False)
    for p in report.problems:
        err.print(f"skipped: {p.path}: {p.reason}", highlight=False, markup=False)
    if report.problems:
        err.print(f"{len(report.problems)} file(s) skipped", highlight=False)


@main.command("export")
@click.argument("target_dir", type=click.Path(file_okay=False, path_type=str))
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

    with obj.open() as db:
        report = export_cache_dir(db, target_dir)
    kinds = sorted(set(report.written) | set(report.unchanged))
    emit(
        [{"kind": k, "written": report.written[k], "unchanged": report.unchanged[k]} for k in kinds],
        ("kind", "written", "unchanged"),
        "table",
    )
    click.echo(_printable(f"{report.bytes_written} bytes written to {target_dir}"))


@main.command()
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True)
@pass_ctx
def stats(obj: _Context, fmt: str) -> None:
    """Entries and bytes per kind and system fingerprint.

    \b
    Example:
      cachedb --db inductor.db stats --format json
    """
    from .stats import COLUMNS, collect

    with obj.open() as db, db.read() as repos:
        rows = collect(repos.session)
    emit(rows, COLUMNS, fmt)


@main.command()
@click.argument("sql")
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True)
@pass_ctx
def query(obj: _Context, sql: str, fmt: str) -> None:
    """Run one read-only SQL statement (writes are refused by the database).

    Tables: guarded_entries, autotune_timings, local_cache_values, best_configs,
    cutlass_op_lists, cutlass_ops, system_fingerprints; views: autotune_current,
    autotune_winners, autotune_history.

    \b
    Example:
      cachedb --db inductor.db query "SELECT op, choice_hash, timing_ms FROM autotune_winners" --format csv
    """
    from ._errors import QueryError

    with obj.open() as db:
        with db.engine.connect() as conn:
            with conn.begin() as txn:
                set_read_only(conn)
                try:
                    result = conn.execute(text(sql))
                    columns = list(result.keys()) if result.returns_rows else []
                    rows = [dict(zip(columns, r)) for r in result] if result.returns_rows else []
                except (SQLAlchemyError, UnicodeError) as exc:
                    raise QueryError(f"query failed: {getattr(exc, 'orig', None) or exc}") from exc
                finally:
                    txn.rollback()
    emit(rows, columns, fmt)


@main.command()
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
@pass_ctx
def prune(obj: _Context, max_bytes: str | None, older_than: str | None, vacuum: bool) -> None:
    """Evict FX graph and AOTAutograd entries, least recently used first.

    \b
    Example:
      cachedb --db inductor.db prune --max-bytes 10G --older-than 30d
    """
    import datetime as dt

    if max_bytes is None and older_than is None:
        raise click.UsageError("give --max-bytes and/or --older-than")
    limit = _parse_size(max_bytes) if max_bytes is not None else None
    cutoff = None
    if older_than is not None:
        cutoff = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=_parse_age(older_than))
    with obj.open() as db:
        with db.transaction() as repos:
            n, freed = repos.guarded.evict(max_bytes=limit, older_than=cutoff)
        if vacuum:
            from ._engine import vacuum as run_vacuum

            run_vacuum(db.engine)
    click.echo(f"removed {n} entries, {freed} stored bytes")


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@pass_ctx
def run(obj: _Context, command: tuple[str, ...]) -> None:
    """Run a program with Inductor's caches served from the database.

    The program and every Python process it starts (compile workers) store and find FX
    graph and AOTAutograd entries, autotune timings, best configs and CUTLASS op lists in
    the database instead of TORCHINDUCTOR_CACHE_DIR.

    \b
    Example:
      cachedb --db inductor.db run -- python train.py --epochs 1
    """
    import os

    from ._engine import default_location
    from .live import child_environment

    location = obj.location or default_location()
    if "://" not in location:
        location = os.path.abspath(os.path.expanduser(location))
    env = child_environment(location)
    try:
        os.execvpe(command[0], list(command), env)
    except OSError as exc:
        err.print(f"[bold red]error:[/] cannot run {command[0]!r}: {exc.strerror}", highlight=False)
        sys.exit(127)


@main.command()
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True)
@click.option("--no-quarantine", is_flag=True, help="Report corrupt entries but leave them in place.")
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

    with obj.open() as db:
        problems, checked = run_verify(db, quarantine=not no_quarantine)
    if problems:
        emit(problems, ("what", "where", "problem"), fmt)
        err.print(f"{len(problems)} problem(s) in {checked} payloads", highlight=False)
        sys.exit(1)
    click.echo(f"ok: integrity check passed, {checked} payloads verified")



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

    with obj.open() as db:
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


if __name__ == "__main__":  # pragma: no cover
    main()
