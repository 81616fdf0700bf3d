"""What every ``cachedb`` command shares: the ``main`` group, its options and the database it
opens; the option types (:mod:`._types`), output (:mod:`._output`) and database checks
(:mod:`._checks`) come from their own modules and are named here too.

The command modules (:mod:`.cache`, :mod:`.cutlass`, :mod:`.artifacts`, :mod:`.copy`,
:mod:`.report`, :mod:`.fleet`) import from here and nothing from each other.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.text import Text
from sqlalchemy.exc import SQLAlchemyError

from .._errors import CacheDBError, DatabaseOpenError
from .._version import __version__
from ..db import CacheDB
from ..store.engine import default_location, sqlite_path, to_url
from ._checks import NoDatabaseError, _owner_note, _require_database_file, _require_head, describe_error
from ._output import (
    FORMATS,
    ProgressBar,
    _accepts,
    _columns,
    _fail,
    _human,
    _json_default,
    _printable,
    _progress_callback,
    confirm,
    emit,
    err,
    print_skipped,
    stdin_is_terminal,
)
from ._types import DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S, AgeType, DurationType, SizeType

__all__ = [
    "DEFAULT_TIMEOUT_S", "FORMATS", "MAX_TIMEOUT_S", "AgeType", "DurationType", "NoDatabaseError", "ProgressBar",
    "SizeType", "_Context", "_accepts", "_columns", "_fail", "_human", "_json_default", "_owner_note", "_printable",
    "_progress_callback", "confirm", "db_options", "describe_error", "emit", "err", "main", "pass_ctx",
    "print_skipped", "stdin_is_terminal",
]

F = TypeVar("F", bound=Callable[..., Any])


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

    def open(self, *, existing: bool = False, dry_run: bool = False, upgrade: bool = True) -> CacheDB:
        """The command's database. ``existing``: a command that reads or trims a database
        (stats, query, verify, export, prune): it never creates a file, a directory or a
        schema, and says there is no database instead. ``dry_run`` (with ``existing``): not
        even an older schema is upgraded; one not at this cachedb's revision is refused.
        ``upgrade=False`` (with ``existing``): an older schema is left as it is."""
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
            if dry_run:
                _require_head(db)
            elif upgrade:
                db.upgrade()  # an older cachedb schema is brought up to date, as on every open
        except BaseException:
            db.close()
            raise
        return db


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
_REMOTE_HELP = ("`run`: a shared database (SQLAlchemy URL, e.g. PostgreSQL) behind --db: local "
                "misses are looked up there and copied into --db; local writes are copied there. "
                "Default: $CACHEDB_REMOTE_URL. `misses`: the database whose entries explain --db's misses.")
_TIMEOUT_HELP = (f"Seconds to wait for a database another process has locked (default {DEFAULT_TIMEOUT_S:g}; "
                 f"0: fail at once; at most {MAX_TIMEOUT_S}), e.g. --timeout 120.")


def db_options(func: F) -> F:
    """``--db`` and ``--timeout`` on a subcommand too (``cachedb stats --db x.db``): a value
    given after the command overrides the one given before it."""
    func = click.option("--timeout", type=DurationType(min=0, max=MAX_TIMEOUT_S), metavar="SECONDS", expose_value=False,
                        callback=_set_timeout, help=_TIMEOUT_HELP)(func)
    func = click.option("--db", metavar="PATH|URL", type=click.Path(path_type=str), expose_value=False,
                        callback=_set_location, help=_DB_HELP)(func)
    return func


pass_ctx = click.make_pass_decorator(_Context)


def _bad_parameter(exc: click.UsageError) -> None:
    """A value an option refused (a negative size, an unknown unit, ...) or another usage error:
    one line (naming the option), exit status 2, before any database is opened."""
    if isinstance(exc, getattr(click.exceptions, "NoArgsIsHelpError", ())):
        raise exc  # `cachedb` alone: click prints the help
    message = exc.format_message()
    if not isinstance(exc, click.BadParameter) and exc.ctx is not None:
        message += f" (see `{exc.ctx.command_path} --help`)"
    err.print(Text("error: ", style="bold red") + Text(_printable(message)), highlight=False)
    sys.exit(exc.exit_code)


class _Group(click.Group):
    """Turns every error into one clear line naming the database, and exit status 1; a value
    an option refuses into one line naming the option, and exit status 2."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as exc:
            _bad_parameter(exc)
            raise  # pragma: no cover - _bad_parameter exits

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            _bad_parameter(exc)
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


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]},
             epilog="Shell completion (bash; zsh and fish alike with zsh_source / fish_source):\n\n"
                    "\b\n  eval \"$(_CACHEDB_COMPLETE=bash_source cachedb)\"   # in ~/.bashrc")
@click.option("--db", "location", metavar="PATH|URL", type=click.Path(path_type=str), help=_DB_HELP)
@click.option("--timeout", type=DurationType(min=0, max=MAX_TIMEOUT_S), default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
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
