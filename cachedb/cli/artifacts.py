"""``cachedb export-artifacts`` / ``import-artifacts``: torch's Mega-Cache blobs."""

from __future__ import annotations

import os
from pathlib import Path

import click

from ._common import (
    _Context,
    _printable,
    db_options,
    emit,
    err,
    main,
    pass_ctx,
    print_skipped,
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
    import tempfile

    from .._errors import ExportError
    from ..layout.mega_cache import build_artifacts
    from ..store.files import refuse_special

    try:  # a device or FIFO (/dev/null) would be replaced by a regular file: refused before any work
        refuse_special(Path(os.path.abspath(file)))
    except OSError as exc:
        raise ExportError(f"{file}: cannot write: {exc.strerror or exc}") from exc
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
    from ..layout.mega_cache import KIND_OF_TYPE, import_artifacts, read_blob_file

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
    print_skipped(report, "artifact(s) not stored")
