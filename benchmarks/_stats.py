"""Timing statistics: medians and spreads of repeated measurements.

All durations are kept in **seconds** internally; :class:`Dist` carries its own display unit
(``"ms"``, ``"us"``, ``"s"``, ``"bytes"``, ``"entries/s"``, ...) and the values in that unit.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from typing import Any

#: Unit name -> factor from seconds.
TIME_UNITS: dict[str, float] = {"s": 1.0, "ms": 1e3, "us": 1e6}


@dataclass(frozen=True)
class Dist:
    """A distribution of ``n`` measurements in ``unit``: median, p10/p90, quartiles, extremes."""

    n: int
    unit: str
    median: float
    p10: float
    p90: float
    q1: float
    q3: float
    min: float
    max: float

    def to_json(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}

    def fmt(self) -> str:
        """``median [p10–p90]`` with 3 significant digits (just the value when n == 1)."""
        if self.n <= 1 or self.p10 == self.p90:
            return f"{sig(self.median)}"
        return f"{sig(self.median)} [{sig(self.p10)}–{sig(self.p90)}]"


def sig(x: float, digits: int = 3) -> str:
    """``x`` with ``digits`` significant digits, without scientific notation for common ranges."""
    if x == 0:
        return "0"
    if abs(x) >= 10 ** digits:
        return f"{x:,.0f}"
    text = f"{x:.{digits}g}"
    if "e" in text:
        return f"{x:.{digits}e}" if abs(x) < 1e-4 else f"{x:.6f}".rstrip("0")
    return text


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (``q`` in [0, 1]) of already sorted values."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(values: Iterable[float], unit: str, *, scale: float = 1.0) -> Dist:
    """The :class:`Dist` of ``values`` multiplied by ``scale`` (e.g. seconds -> ms: 1e3)."""
    xs = sorted(float(v) * scale for v in values)
    if not xs:
        raise ValueError("no measurements")
    return Dist(
        n=len(xs),
        unit=unit,
        median=statistics.median(xs),
        p10=_quantile(xs, 0.10),
        p90=_quantile(xs, 0.90),
        q1=_quantile(xs, 0.25),
        q3=_quantile(xs, 0.75),
        min=xs[0],
        max=xs[-1],
    )


def seconds_to(unit: str, values: Iterable[float]) -> Dist:
    """Durations in seconds summarized in ``unit`` (``"s"``, ``"ms"`` or ``"us"``)."""
    return summarize(values, unit, scale=TIME_UNITS[unit])


def time_ops(op: Callable[[int], object], indices: Iterable[int]) -> list[float]:
    """Call ``op(i)`` for each index; returns each call's wall time in seconds."""
    out: list[float] = []
    clock = time.perf_counter
    for i in indices:
        t0 = clock()
        op(i)
        out.append(clock() - t0)
    return out


def interleaved(
    ops: Mapping[str, Callable[[int], object]], n: int, *, rounds: int = 5, warmup: int = 0,
    scopes: Mapping[str, Callable[[], AbstractContextManager[object]]] | None = None,
) -> dict[str, list[float]]:
    """Per-call seconds of every op in ``ops`` over indices ``0..n-1``, run in ``rounds``
    alternating blocks (order reversed every other round) so drift in the machine's speed
    (page cache, CPU frequency, a neighbour process) hits every contender alike.

    ``warmup`` extra calls per op use indices ``n..n+warmup-1`` before timing starts (give each
    op room for them). Garbage is collected before each block; the collector stays on while
    timing, as it is in a real caller. ``scopes``: per op, a context entered (untimed) around
    each of its blocks and its warm-up, e.g. ``cachedb.installed`` for a live op whose seams
    replace the file methods another op times.
    """
    names = list(ops)
    scopes = scopes or {}

    def scope(name: str) -> AbstractContextManager[object]:
        make = scopes.get(name)
        return make() if make is not None else nullcontext()

    for name in names:
        with scope(name):
            for i in range(n, n + warmup):
                ops[name](i)
    out: dict[str, list[float]] = {name: [] for name in names}
    rounds = max(1, min(rounds, n))
    bounds = [n * r // rounds for r in range(rounds + 1)]
    for r in range(rounds):
        order = names if r % 2 == 0 else list(reversed(names))
        for name in order:
            with scope(name):
                gc.collect()
                out[name].extend(time_ops(ops[name], range(bounds[r], bounds[r + 1])))
    return out
