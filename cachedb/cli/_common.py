"""What every ``cachedb`` command shares: the ``main`` group, its options, output and errors.

The command modules (:mod:`.cache`, :mod:`.cutlass`, :mod:`.artifacts`, :mod:`.copy`,
:mod:`.report`) import from here and nothing from each other.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import sqlite3
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

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


# --------------------------------------------------------------------------- option types
#
# Every size, age, count and duration an option takes is checked by its click type while the
# command line is parsed, before any database is opened: a negative, NaN or infinite value, an
# empty string or an unknown unit is a usage error (exit status 2, one line naming the option),
# never a request to delete everything.

_NUMBER = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?", re.IGNORECASE | re.ASCII)


def _split(text: str) -> tuple[str, str, str]:
    """``(sign, number, unit)`` of ``text`` such as ``-1.5d`` (unit: what follows the number)."""
    t = text.strip()
    sign = t[:1] if t[:1] in "+-" else ""
    body = t[len(sign):]
    m = _NUMBER.match(body)
    if m is None:
        return sign, "", body
    return sign, m.group(0), body[m.end():].strip()


class _Measure(click.ParamType):
    """A non-negative finite number with a unit (:class:`SizeType`, :class:`AgeType`)."""

    name = "measure"
    units: ClassVar[dict[str, float]] = {}
    example = ""
    allow_zero = False
    zero_hint = ""
    unit_required = False
    maximum = float("inf")
    maximum_text = ""

    def _unit(self, unit: str) -> str | None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _number(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if not isinstance(value, str):
            value = str(value)
        text = value.strip()
        expected = f"expected {self.example}"
        if not text:
            self.fail(f"empty; {expected}", param, ctx)
        sign, number, unit = _split(text)
        low = text.lower().lstrip("+-").strip()
        if low.startswith(("nan", "inf")):
            self.fail(f"{value!r} is not a finite number; {expected}", param, ctx)
        if not number:
            self.fail(f"{value!r} is not a number; {expected}", param, ctx)
        key = self._unit(unit)
        if key is None:
            self.fail(f"{value!r}: unknown unit {unit!r}; {expected}", param, ctx)
        if key == "" and self.unit_required:
            self.fail(f"{value!r} has no unit; {expected}", param, ctx)
        if sign == "-":
            self.fail(f"{value!r} is negative; {expected}", param, ctx)
        amount = float(number) * self.units[key]
        if not math.isfinite(amount) or amount > self.maximum:
            self.fail(f"{value!r} is too large (at most {self.maximum_text}); {expected}", param, ctx)
        if amount == 0 and not self.allow_zero:
            self.fail(f"{value!r} is zero{self.zero_hint}; {expected}", param, ctx)
        return amount


class SizeType(_Measure):
    """A byte size: ``500M``, ``10G``, ``1.5G``, ``512K``, ``4096`` (bytes); K, M, G, T are
    powers of 1024 (``KB``, ``KiB``, ``MB``, ... alike). Converts to an ``int`` of bytes."""

    name = "size"
    units: ClassVar[dict[str, float]] = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    example = "a size such as 500M, 10G or 4096 (bytes; K, M, G, T: powers of 1024)"
    maximum = float(1 << 62)
    maximum_text = "4E"

    def __init__(self, *, allow_zero: bool = True, zero_hint: str = "") -> None:
        self.allow_zero = allow_zero
        self.zero_hint = zero_hint

    def _unit(self, unit: str) -> str | None:
        u = unit.upper()
        if u in ("", "B"):
            return u
        if u[:1] in "KMGT" and u[1:] in ("", "B", "IB"):
            return u[:1]
        return None

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        return int(self._number(value, param, ctx))


class AgeType(_Measure):
    """An age with its unit: ``30d``, ``12h``, ``30m`` (minutes), ``90s``, ``2w``; converts to a
    :class:`datetime.timedelta`. A bare number is refused (``30``: seconds or days?)."""

    name = "age"
    units: ClassVar[dict[str, float]] = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    example = "an age such as 30d, 12h, 30m or 2w (s, m, h, d, w: seconds to weeks)"
    unit_required = True
    maximum = 36500 * 86400.0
    maximum_text = "36500d"
    _NAMES: ClassVar[dict[str, str]] = {"s": "s", "sec": "s", "secs": "s", "second": "s", "seconds": "s", "m": "m", "min": "m",
              "mins": "m", "minute": "m", "minutes": "m", "h": "h", "hour": "h", "hours": "h", "d": "d",
              "day": "d", "days": "d", "w": "w", "week": "w", "weeks": "w"}

    def __init__(self, *, allow_zero: bool = False, zero_hint: str = "") -> None:
        self.allow_zero = allow_zero
        self.zero_hint = zero_hint

    def _unit(self, unit: str) -> str | None:
        if unit == "":
            return ""
        return self._NAMES.get(unit.lower())

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        import datetime as dt

        if isinstance(value, dt.timedelta):
            return value
        age = dt.timedelta(seconds=self._number(value, param, ctx))
        if age <= dt.timedelta(0) and not self.allow_zero:  # 1e-9s: below a microsecond
            self.fail(f"{value!r} is zero{self.zero_hint}; expected {self.example}", param, ctx)
        return age


class DurationType(click.FloatRange):
    """Seconds as a finite float in ``[min, max]`` (click's :class:`~click.FloatRange` lets
    ``nan`` and ``inf`` through)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("empty; expected a number of seconds such as 0.5 or 30", param, ctx)
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return rv

#: Seconds a command waits on a database locked by another process before it gives up.
DEFAULT_TIMEOUT_S = 30.0
#: The longest --timeout (a day): SQLite's busy timeout is a 32-bit count of milliseconds.
MAX_TIMEOUT_S = 86400

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


def print_skipped(report: Any, what: str) -> None:
    """An import's ``note:`` and ``skipped:`` lines (one per path, on stderr), then how many
    ``what`` (e.g. ``"file(s) skipped"``) were not stored, if any."""
    for p in report.notes:
        err.print(f"note: {p.path}: {p.reason}", highlight=False, markup=False)
    for p in report.problems:
        err.print(f"skipped: {p.path}: {p.reason}", highlight=False, markup=False)
    if report.problems:
        err.print(f"{len(report.problems)} {what}", highlight=False)


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


def _require_head(db: CacheDB) -> None:
    """Refuse (changing nothing) a database whose schema this cachedb would upgrade first."""
    from ..store.migrate import HEAD_REVISION

    revision = db.revision()
    if revision != HEAD_REVISION:
        raise DatabaseOpenError(
            f"{db.where}: schema revision {revision}, not this cachedb's {HEAD_REVISION}: the command would "
            f"upgrade it first (`cachedb --db {db.where} upgrade --dry-run` shows how); nothing was changed")


def confirm(summary: str, *, yes: bool) -> None:
    """Go on with a big change that ``summary`` describes (one sentence, the numbers in it):
    at once with ``yes``; after asking on a terminal (default: no); otherwise (stdin is not a
    terminal) refuse, exit status 1, nothing changed."""
    if yes:
        return
    if not stdin_is_terminal():
        _fail(f"{summary}; nothing was changed: pass --yes to go ahead (stdin is not a terminal to ask on), "
              "or --dry-run to list what it would change")
    if not click.confirm(f"{_printable(summary)}. Go ahead?", default=False, err=True):
        _fail("nothing was changed")


def stdin_is_terminal() -> bool:
    """Whether a question can be asked on standard input."""
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (AttributeError, ValueError, OSError):
        return False


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
    if not path.is_file():
        raise DatabaseOpenError(f"{path}: not a regular file (a device, FIFO or socket), not a database file")
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


def _fail(message: str) -> None:
    err.print(Text("error: ", style="bold red") + Text(_printable(message)), highlight=False)
    sys.exit(1)


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
