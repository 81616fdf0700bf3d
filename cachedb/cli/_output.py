"""What a ``cachedb`` command prints and asks: rows as a table, JSON or CSV, progress bars on
stderr, one-line errors, and the confirmation of a big change."""

from __future__ import annotations

import csv
import io
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

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

FORMATS = click.Choice(["table", "json", "csv"])
err = Console(stderr=True, soft_wrap=True)


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


def _fail(message: str) -> None:
    err.print(Text("error: ", style="bold red") + Text(_printable(message)), highlight=False)
    sys.exit(1)
