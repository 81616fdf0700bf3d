"""Key factors (``key_factors``, shared by keys; ``entry_factors``, per entry key) and the
miss log (``cache_misses``).

A key's factors are stored as the JSON array of their ``key_factors`` ids: an FX graph key has
~600 factors, nearly all of them (the Inductor config) the same in every key, so an entry costs
one short row and the factors it does not share with others.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, delete, exists, func, insert, select, tuple_

from ..keys.factors import Factor
from ..store.tables import cache_misses as _M
from ..store.tables import entry_factors as _E
from ..store.tables import guarded_entries as _G
from ..store.tables import key_factors as _F
from ..store.tables import utcnow

if TYPE_CHECKING:
    from sqlalchemy import Connection
    from sqlalchemy.orm import Session

#: Miss outcomes: no variant of the key, variants whose guards all failed, torch's bypass.
OUTCOMES = ("no_entry", "guards_failed", "bypass")

#: ``{factor: (hash, value)}``: a key's factors as :mod:`cachedb.keys.factors` compares them.
Factors = dict[str, tuple[str, str]]


class KeyFactorRepository:
    """The factors of each entry's key (``key_factors`` and ``entry_factors``)."""

    def __init__(self, session: Session | Connection) -> None:
        self.session = session

    def ids(self, factors: Sequence[Factor]) -> list[int]:
        """The ``key_factors`` ids of ``factors`` (in their order), rows added for those not
        stored yet."""
        wanted = {(f.factor, f.hash): f for f in factors}
        found: dict[tuple[str, str], int] = {}
        pairs = list(wanted)
        for start in range(0, len(pairs), 400):
            chunk = pairs[start:start + 400]
            for i, name, h in self.session.execute(select(_F.c.id, _F.c.factor, _F.c.hash).where(
                    tuple_(_F.c.factor, _F.c.hash).in_(chunk))):
                found[(name, h)] = int(i)
        missing = [wanted[p] for p in pairs if p not in found]
        if missing:
            self.session.execute(insert(_F), [{"factor": f.factor, "hash": f.hash, "value": f.value} for f in missing])
            for start in range(0, len(missing), 400):
                chunk = [(f.factor, f.hash) for f in missing[start:start + 400]]
                for i, name, h in self.session.execute(select(_F.c.id, _F.c.factor, _F.c.hash).where(
                        tuple_(_F.c.factor, _F.c.hash).in_(chunk))):
                    found[(name, h)] = int(i)
        return [found[(f.factor, f.hash)] for f in factors]

    def put(self, kind: str, key: str, factors: Sequence[Factor]) -> bool:
        """Store the ``factors`` of ``kind``/``key`` unless that key has factors already (they
        are a function of the key); True if written."""
        if not factors or self.session.execute(
                select(_E.c.id).where(_E.c.kind == kind, _E.c.key == key)).first() is not None:
            return False
        ids = self.ids(factors)
        self.session.execute(insert(_E).values(kind=kind, key=key[:128], factor_ids=json.dumps(ids, separators=(",", ":"))))
        return True

    def resolve(self, id_lists: Sequence[str]) -> list[Factors]:
        """Each JSON array of ``key_factors`` ids as ``{factor: (hash, value)}``."""
        lists = []
        for text in id_lists:
            try:
                lists.append([int(i) for i in json.loads(text)])
            except (ValueError, TypeError):
                lists.append([])
        every = sorted({i for ids in lists for i in ids})
        rows: dict[int, tuple[str, str, str]] = {}
        for start in range(0, len(every), 500):
            for i, name, h, v in self.session.execute(select(_F.c.id, _F.c.factor, _F.c.hash, _F.c.value).where(
                    _F.c.id.in_(every[start:start + 500]))):
                rows[int(i)] = (name, h, v)
        return [{rows[i][0]: rows[i][1:] for i in ids if i in rows} for ids in lists]

    def of(self, kind: str, key: str) -> Factors:
        """``{factor: (hash, value)}`` of ``kind``/``key`` (empty when none are stored)."""
        text = self.session.execute(select(_E.c.factor_ids).where(_E.c.kind == kind, _E.c.key == key)).scalar()
        return self.resolve([text])[0] if text is not None else {}

    def all_of_kind(self, kind: str) -> dict[str, tuple[Any, Factors]]:
        """``{key: (first stored at, {factor: (hash, value)})}`` of every stored ``kind`` entry
        that has factors (the time: its oldest variant's ``created_at``)."""
        first = (select(_G.c.key.label("key"), func.min(_G.c.created_at).label("at")).where(_G.c.kind == kind)
                 .group_by(_G.c.key).subquery())
        rows = list(self.session.execute(select(_E.c.key, first.c.at, _E.c.factor_ids)
                                         .join(first, first.c.key == _E.c.key).where(_E.c.kind == kind)))
        return {k: (at, f) for (k, at, _), f in zip(rows, self.resolve([t for _, _, t in rows]))}

    def delete_orphans(self, kind: str | None = None) -> int:
        """Delete the factors of entry keys (of ``kind``, or of every kind) with no stored
        variant left; returns how many keys' rows went (prune and clear call it). The shared
        ``key_factors`` rows stay."""
        stmt = delete(_E).where(~exists().where(and_(_G.c.kind == _E.c.kind, _G.c.key == _E.c.key)))
        if kind is not None:
            stmt = stmt.where(_E.c.kind == kind)
        return int(self.session.execute(stmt).rowcount or 0)


class MissLogRepository:
    """The newest lookups that missed (``cache_misses``), a ring of at most ``keep`` rows."""

    def __init__(self, session: Session | Connection) -> None:
        self.session = session

    def add(self, kind: str, key: str, outcome: str, factors: Sequence[Factor], *, reason: str = "",
            keep: int = 1000) -> None:
        """Record one miss (its factors through :meth:`KeyFactorRepository.ids`), then drop
        all but the newest ``keep`` rows."""
        ids = KeyFactorRepository(self.session).ids(factors) if factors else []
        self.session.execute(insert(_M).values(kind=kind, key=key[:128], outcome=outcome[:16], reason=reason[:300],
                                               factor_ids=json.dumps(ids, separators=(",", ":")),
                                               missed_at=utcnow()))
        newest = self.session.execute(select(func.max(_M.c.id))).scalar_one()
        if newest is not None and newest > keep:
            self.session.execute(delete(_M).where(_M.c.id <= newest - keep))

    def recent(self, limit: int, kind: str | None = None) -> list[dict[str, Any]]:
        """The newest ``limit`` misses, newest first: ``kind``, ``key``, ``outcome``,
        ``reason``, ``missed_at`` and ``factors`` (``{factor: (hash, value)}``)."""
        stmt = select(_M).order_by(_M.c.id.desc()).limit(limit)
        if kind is not None:
            stmt = stmt.where(_M.c.kind == kind)
        rows = [dict(r) for r in self.session.execute(stmt).mappings()]
        resolved = KeyFactorRepository(self.session).resolve([r["factor_ids"] for r in rows])
        return [{"kind": r["kind"], "key": r["key"], "outcome": r["outcome"], "reason": r["reason"],
                 "missed_at": r["missed_at"], "factors": f} for r, f in zip(rows, resolved)]

    def count(self) -> int:
        """How many misses the log holds."""
        return int(self.session.execute(select(func.count()).select_from(_M)).scalar_one())
