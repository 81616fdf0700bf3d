"""``cachedb cutlass``: CUTLASS op lists generated and stored."""

from __future__ import annotations

import click

from ._common import (
    _Context,
    db_options,
    main,
    pass_ctx,
)


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
    from ..layout.cutlass_gen import generate_and_store

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
