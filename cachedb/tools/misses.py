"""Recent misses explained (``cachedb misses``): for each lookup in the miss log, the stored
entry nearest to the key wanted and the factors that differ between them, in words."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import select

from ..keys.factors import differences, equal_count
from ..repositories.factors import KeyFactorRepository, MissLogRepository
from ..store.tables import guarded_entries as _G

COLUMNS = ("missed_at", "kind", "key", "outcome", "nearest", "differs")


def _naive(when: Any) -> Any:
    """A timestamp without its zone (SQLite gives them back naive, PostgreSQL aware; both UTC)."""
    return when.replace(tzinfo=None) if isinstance(when, dt.datetime) else when


def explain(session: Any, *, limit: int = 20, kind: str | None = None) -> list[dict[str, Any]]:
    """The newest ``limit`` misses (of ``kind``, or of every kind), newest first. Each is a
    dict: ``kind``, ``key`` (torch's key wanted; empty for a bypass), ``outcome``
    (``no_entry``, ``guards_failed``, ``bypass``), ``reason`` (a bypass's), ``missed_at``,
    ``nearest`` (of the keys of that kind stored before the miss, the one whose factors most
    often equal the wanted ones; the key itself for ``guards_failed``; ``None`` when no stored entry has factors),
    ``differs`` (a list of ``{factor, stored, wanted}``: the factors whose hashes differ, or
    that one side lacks, ``None`` for that side) and, for ``guards_failed``, ``guards`` (the
    guard expressions of the variants stored before the miss, which all failed: torch's
    ``guards_expr``, e.g. ``6 <= L['t0']``)."""
    misses = MissLogRepository(session).recent(limit, kind)
    factors = KeyFactorRepository(session)
    stored_by_kind: dict[str, dict[str, dict[str, tuple[str, str]]]] = {}
    out = []
    for miss in misses:
        row: dict[str, Any] = {"missed_at": miss["missed_at"], "kind": miss["kind"], "key": miss["key"],
                               "outcome": miss["outcome"], "reason": miss["reason"], "nearest": None, "differs": []}
        wanted = miss["factors"]
        if miss["outcome"] == "guards_failed":
            row["nearest"] = miss["key"]
            row["guards"] = [g for g, at in session.execute(select(_G.c.guards_expr, _G.c.created_at).where(
                _G.c.kind == miss["kind"], _G.c.key == miss["key"]).order_by(_G.c.created_at))
                if g and _naive(at) <= _naive(miss["missed_at"])]
        elif wanted:
            stored = stored_by_kind.get(miss["kind"])
            if stored is None:
                stored = stored_by_kind[miss["kind"]] = factors.all_of_kind(miss["kind"])
            best, best_score = None, -1
            for key, (at, theirs) in stored.items():
                if key == miss["key"] or _naive(at) > _naive(miss["missed_at"]):  # stored after this miss
                    continue
                score = equal_count(theirs, wanted)
                if score > best_score or score == best_score and best is not None and key < best:
                    best, best_score = key, score
            if best is not None:
                row["nearest"] = best
                row["differs"] = [{"factor": d.factor, "stored": d.stored, "wanted": d.wanted}
                                  for d in differences(stored[best][1], wanted)]
        out.append(row)
    return out


def words(differs: list[dict[str, Any]], *, width: int = 60, sep: str = "; ") -> str:
    """``factor: stored -> wanted``, joined by ``sep`` (``(none)`` for a side without the
    factor; each side cut to ``width`` characters)."""
    def side(v: Any) -> str:
        text = "(none)" if v is None else str(v)
        return text if len(text) <= width else text[:width - 3] + "..."

    return sep.join(f"{d['factor']}: {side(d['stored'])} -> {side(d['wanted'])}" for d in differs)
