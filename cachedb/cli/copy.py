"""``cachedb copy`` and ``cachedb merge``: the command-line side of :mod:`cachedb.fleet.copy`.

Registered on the ``cachedb`` group when :mod:`cachedb.cli` is imported.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import click
from rich.text import Text

from ..fleet.copy import (
    COLUMNS,
    DEFAULT_BATCH_ROWS,
    CopyProgress,
    CopyReport,
    copy_database,
    merge_databases,
)
from ._common import (
    FORMATS,
    ProgressBar,
    _Context,
    _human,
    _printable,
    db_options,
    emit,
    err,
    main,
    pass_ctx,
)

_SIGNED_HELP = ("Refuse (nothing written) a source holding a row that carries code or steers code generation "
                "without a signature a public key of CACHEDB_TRUSTED_KEYS verifies (or, with CACHEDB_HMAC_KEY, an FX "
                "graph/AOTAutograd entry, best config or Dynamo cache row that does not verify under it).")
_BATCH_HELP = "Rows per batch (at least 1); each batch is one transaction on the target."
_DRY_RUN_HELP = ("Do everything but keep nothing: the rows go into DST in one transaction that is rolled back (into "
                 "an absent DST: a scratch database in $TMPDIR, removed), and the summary says what would be "
                 "written. DST is neither created nor upgraded.")
_REPACK_HELP = ("Re-encode FX graph/AOTAutograd payloads as this cachedb writes them to DST (SQLite: entries "
                "under 1 MiB stored as they are (payload format 3), read ~12x faster, larger ones compressed; PostgreSQL: all "
                "compressed) also between two databases of a kind (between SQLite and PostgreSQL they always "
                "are); each is verified first and keeps its SHA-256, so signatures still verify. For "
                "databases written by an older cachedb.")


def _progress(bar: ProgressBar) -> Callable[[CopyProgress], None]:
    def progress(p: CopyProgress) -> None:
        bar.update(count=p.rows_done, total_count=p.rows_total, done_bytes=p.bytes_done, total_bytes=p.bytes_total)

    return progress


def _summary(report: CopyReport, fmt: str) -> None:
    emit(report.rows(), COLUMNS, fmt)
    verb = "copied" if report.mode == "copy" else "merged"
    if report.dry_run:
        verb = f"would {report.mode}"
    rate = report.bytes_written / report.seconds if report.seconds > 0 else 0.0
    sources = ", ".join(f"{s} (revision {report.source_revisions.get(s)})" for s in report.sources)
    line = (f"{verb} {report.rows_written} rows, {report.bytes_written} bytes ({_human(report.bytes_written)}) "
            f"from {sources} into {report.target} in {report.seconds:.1f} s ({_human(rate)}/s)"
            + ("; continued an interrupted copy" if report.resumed else "")
            + (f"; {report.repacked} FX graph/AOTAutograd entries re-encoded" if report.repacked else "")
            + (f"; {report.not_repacked} failed their checks and were copied as stored (see `cachedb verify`)"
               if report.not_repacked else "")
            + ("; nothing was written (--dry-run)" if report.dry_run else ""))
    if fmt == "table":
        click.echo(_printable(line))
    else:  # machine-readable output stays parseable: the summary line goes to stderr
        err.print(Text(_printable(line)), highlight=False)


def _interrupted(command: str) -> None:
    err.print(Text(f"interrupted: the batches committed so far stay; run the same `cachedb {command}` "
                   "again to continue"), highlight=False)
    sys.exit(130)


@main.command("copy")
@click.argument("src", metavar="SRC")
@click.argument("dst", metavar="DST")
@click.option("--require-signed", is_flag=True, help=_SIGNED_HELP)
@click.option("--repack", is_flag=True, help=_REPACK_HELP)
@click.option("--batch-rows", type=click.IntRange(min=1), metavar="N", default=DEFAULT_BATCH_ROWS, show_default=True,
              help=_BATCH_HELP)
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True,
              help="Format of the summary (rows and bytes per table).")
@click.option("--dry-run", is_flag=True, help=_DRY_RUN_HELP)
@pass_ctx
def copy_cmd(obj: _Context, src: str, dst: str, require_signed: bool, repack: bool, batch_rows: int,
             fmt: str, dry_run: bool) -> None:
    """Copy a whole database into an empty or absent one (any path or URL to any other).

    SQLite to PostgreSQL, PostgreSQL to one portable SQLite file, SQLite to a compacted
    SQLite file. DST is created at this cachedb's schema; every row goes over (ids
    remapped, payloads and signatures as stored, FX graph/AOTAutograd payloads in DST's form
    between SQLite and PostgreSQL, or always with --repack), one transaction per batch. SRC is only read (an older schema is read as is, never
    upgraded); a damaged SQLite SRC is refused. Interrupted? Run the same command again: it
    continues where it stopped. A new SQLite file takes 16 KiB pages.

    \b
    Example:
      cachedb copy inductor.db postgresql+psycopg://cache@db.example/inductor
      cachedb copy postgresql+psycopg://cache@db.example/inductor portable.db
      cachedb copy --repack old.db new.db    # a database from an older cachedb, at today's speed
      cachedb copy --dry-run inductor.db half-copied.db   # what a resumed copy would still write
    """
    obj.where = dst
    try:
        with ProgressBar(f"copying {src}", unit="rows") as bar:
            report = copy_database(src, dst, progress=_progress(bar), require_signed=require_signed,
                                   batch_rows=batch_rows, timeout_s=obj.timeout, repack=repack, dry_run=dry_run)
    except KeyboardInterrupt:
        _interrupted(f"copy {src} {dst}")
    _summary(report, fmt)


@main.command("merge")
@click.argument("sources", metavar="SRC...", nargs=-1, required=True)
@click.option("--into", "into", metavar="DST", help="The database merged into (default: --db).")
@click.option("--require-signed", is_flag=True, help=_SIGNED_HELP)
@click.option("--repack", is_flag=True, help=_REPACK_HELP)
@click.option("--batch-rows", type=click.IntRange(min=1), metavar="N", default=DEFAULT_BATCH_ROWS, show_default=True,
              help=_BATCH_HELP)
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True,
              help="Format of the summary (rows and bytes per table).")
@click.option("--dry-run", is_flag=True, help=_DRY_RUN_HELP)
@db_options
@pass_ctx
def merge_cmd(obj: _Context, sources: tuple[str, ...], into: str | None, require_signed: bool, repack: bool,
              batch_rows: int, fmt: str, dry_run: bool) -> None:
    """Merge databases into one (the union; running it twice adds nothing).

    FX graph/AOTAutograd entries are deduplicated by (kind, key, variant), kernels by
    SHA-256 and (kind, host, key, file), CUTLASS lists by request key, fingerprints by
    fingerprint key; every autotune benchmark of every source is kept. A best config (or
    LocalCache value) present on both sides keeps the newer one (updated_at; DST's on a
    tie); the older is dropped. Sources are only read. DST is created if absent.

    \b
    Example:
      cachedb merge host-a.db host-b.db --into team.db
      cachedb --db postgresql+psycopg://cache@db.example/inductor merge ci-*.db --require-signed
      cachedb merge host-a.db --into team.db --dry-run   # rows added and replaced; nothing written
    """
    target = into or obj._resolve()
    obj.where = target
    try:
        with ProgressBar(f"merging into {target}", unit="rows") as bar:
            report = merge_databases(list(sources), target, progress=_progress(bar), require_signed=require_signed,
                                     batch_rows=batch_rows, timeout_s=obj.timeout, repack=repack, dry_run=dry_run)
    except KeyboardInterrupt:
        _interrupted("merge")
    _summary(report, fmt)
