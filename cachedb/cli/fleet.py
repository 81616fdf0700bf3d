"""``cachedb fleet``: keys, roles and signatures for a shared tier (:mod:`cachedb.fleet.trust`,
:mod:`cachedb.fleet.roles`). Registered on the ``cachedb`` group when :mod:`cachedb.cli` is
imported."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import cast

import click
from sqlalchemy import Connection

from ._common import FORMATS, _Context, db_options, emit, err, main, pass_ctx


@main.group()
def fleet() -> None:
    """Keys, roles and signatures for a shared cache (PostgreSQL behind every machine).

    \b
    Example (a writer, then consumers):
      cachedb fleet keygen --out ~/.cachedb/writer.pem      # prints the public key
      CACHEDB_SIGNING_KEY=~/.cachedb/writer.pem cachedb --remote URL run -- python train.py
      CACHEDB_TRUSTED_KEYS=<public key> cachedb --remote URL run -- python train.py
    """


@fleet.command()
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the private key (PEM, mode 0600); the public key goes to OUT.pub.")
def keygen(out: Path) -> None:
    """Make a writer's Ed25519 key pair; print the public key.

    The private key signs what this writer sends (CACHEDB_SIGNING_KEY=OUT); the
    printed public key goes into every consumer's CACHEDB_TRUSTED_KEYS.
    openssl makes the same keys: openssl genpkey -algorithm ed25519 -out OUT.

    \b
    Example:
      cachedb fleet keygen --out ~/.cachedb/writer.pem
    """
    from ..store.signing import SigningKey

    if out.exists():
        raise click.UsageError(f"{out} exists; not overwriting a key")
    key = SigningKey.generate()
    out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key.private_pem())
    Path(f"{out}.pub").write_text(key.public_line() + "\n")
    err.print(f"private key: {out} (key id {key.key_id}); public key also in {out}.pub", highlight=False)
    click.echo(key.public_line())


@fleet.command()
@click.option("--reader", "readers", multiple=True, metavar="ROLE",
              help="A login role that only reads (repeatable; created with LOGIN when missing).")
@click.option("--writer", "writers", multiple=True, metavar="ROLE",
              help="A login role that reads and writes (repeatable; created with LOGIN when missing).")
@click.option("--reader-role", default="cachedb_reader", show_default=True, help="The readers' group role.")
@click.option("--writer-role", default="cachedb_writer", show_default=True, help="The writers' group role.")
@click.option("--print", "print_only", is_flag=True, help="Print the SQL instead of running it.")
@db_options
@pass_ctx
def grant(obj: _Context, readers: tuple[str, ...], writers: tuple[str, ...], reader_role: str, writer_role: str,
          print_only: bool) -> None:
    """Create least-privilege roles on a shared PostgreSQL cache.

    A reader role may SELECT (consumers: every hit, their writes stay local);
    a writer role may also INSERT and UPDATE (trusted builders). Run it as the
    schema's owner after `cachedb --db URL upgrade`.

    \b
    Example:
      cachedb --db postgresql+psycopg://admin@cache/inductor fleet grant --reader fleet --writer ci
    """
    from ..fleet.roles import grant as run_grant, grant_statements

    with obj.open(existing=True) as db:
        if db.engine.dialect.name != "postgresql":
            raise click.UsageError(f"{db.where} is not PostgreSQL: roles exist on PostgreSQL only")
        if print_only:
            with db.engine.connect() as conn:
                database, schema = conn.exec_driver_sql("SELECT current_database(), current_schema()").one()
            for sql in grant_statements(database, schema, readers=readers, writers=writers,
                                        reader_role=reader_role, writer_role=writer_role):
                click.echo(sql + ";")
            return
        with db.engine.begin() as conn:
            statements = run_grant(conn, readers=readers, writers=writers, reader_role=reader_role,
                                   writer_role=writer_role)
    click.echo(f"ok: {len(statements)} statements; readers {list(readers)} in {reader_role}, "
               f"writers {list(writers)} in {writer_role}")


@fleet.command()
@db_options
@pass_ctx
def sign(obj: _Context) -> None:
    """Sign every unsigned row of your own database with CACHEDB_SIGNING_KEY.

    For a writer's file before `cachedb copy`/`merge` into a shared database
    (the live remote tier signs what it sends by itself). Never sign a database
    others write: a signature vouches for every row it covers.

    \b
    Example:
      CACHEDB_SIGNING_KEY=writer.pem cachedb --db inductor.db fleet sign
    """
    from ..fleet.trust import sign_database
    from ..store.signing import ENV_SIGNING_KEY, SigningKey

    key = SigningKey.from_environment()
    if key is None:
        raise click.UsageError(f"{ENV_SIGNING_KEY} is not set (a private key: `cachedb fleet keygen`)")
    with obj.open(existing=True) as db, db.write() as repos:
        signed = sign_database(cast(Connection, repos.session), key)
    click.echo(f"ok: signed {sum(signed.values())} row(s) with key {key.key_id} "
               + ", ".join(f"{t} {n}" for t, n in signed.items() if n))


def signer_rows(location: str, timeout: float) -> list[dict[str, object]]:
    """Rows per table and signer of the database at ``location`` (``cachedb verify --remote``)."""
    from ..db import CacheDB
    from ..fleet.trust import SIGNED_TABLES, signers
    from ..store.signing import TrustedKeys

    trusted = TrustedKeys.from_environment()
    out: list[dict[str, object]] = []
    with CacheDB(location, busy_timeout_s=timeout, upgrade=False) as db, db.engine.connect() as conn:
        for table in SIGNED_TABLES:
            for signer, n in sorted(signers(conn, table, trusted).items()):
                out.append({"table": table, "signer": signer, "rows": n})
    return out


def report_signers(location: str, timeout: float, fmt: str) -> None:
    """Print :func:`signer_rows`; exit 1 when a row is not served by a consumer holding
    ``CACHEDB_TRUSTED_KEYS`` (unsigned, failing, or signed by another key)."""
    rows = signer_rows(location, timeout)
    emit(rows, ["table", "signer", "rows"], fmt)
    bad = sum(int(r["rows"]) for r in rows if not str(r["signer"]).endswith("(trusted)"))  # type: ignore[call-overload]
    if bad:
        err.print(f"{bad} row(s) would not be served by a consumer trusting CACHEDB_TRUSTED_KEYS", highlight=False)
        sys.exit(1)
    err.print("ok: every row is signed by a trusted key", highlight=False)


@fleet.command()
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True)
@db_options
@pass_ctx
def signers(obj: _Context, fmt: str) -> None:
    """Rows per table and signer (checked under CACHEDB_TRUSTED_KEYS).

    Exit status 1 when any row would not be served by a consumer trusting those keys.

    \b
    Example:
      CACHEDB_TRUSTED_KEYS=writer.pem.pub cachedb --db postgresql+psycopg://cache/inductor fleet signers
    """
    obj._resolve()
    report_signers(obj.location or "", obj.timeout, fmt)
