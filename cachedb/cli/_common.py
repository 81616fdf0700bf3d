"""What every ``cachedb`` command shares: the ``main`` group, its options, output and errors.

The command modules (:mod:`.cache`, :mod:`.cutlass`, :mod:`.artifacts`, :mod:`.copy`,
:mod:`.report`) import from here and nothing from each other.
"""

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
from sqlalchemy.exc import SQLAlchemyError

from .._errors import CacheDBError, DatabaseOpenError, NotADatabaseError
from .._version import __version__
from ..db import CacheDB
from ..store.engine import (
    SQLITE_HEADER,
    default_location,
    sqlite_path,
    to_url,
)

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
