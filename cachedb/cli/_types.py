"""The click types of ``cachedb``'s options: sizes, ages and durations, checked as the
command line is parsed."""

from __future__ import annotations

import math
import re
from typing import Any, ClassVar

import click

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
