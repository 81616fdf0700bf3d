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

from sqlalchemy import and_, delete, exists, func, insert, literal, or_, select, tuple_

from ..keys.factors import BEST_CONFIG, CPP_HOST, PACKAGE_SYSTEM, Factor
from ..store.tables import best_configs as _BC
from ..store.tables import cache_misses as _M
from ..store.tables import dynamo_packages as _P
from ..store.tables import kernel_artifacts as _A
from ..store.tables import entry_factors as _E
from ..store.tables import guarded_entries as _G
from ..store.tables import key_factors as _F
from ..store.tables import utcnow

if TYPE_CHECKING:
    from sqlalchemy import Connection
    from sqlalchemy.orm import Session

#: Miss outcomes: no variant of the key, variants whose guards all failed, torch's bypass.
OUTCOMES = ("no_entry", "guards_failed", "bypass")
#: Miss outcomes of autotune timings lookups (kind ``timings``): no timing of the op, inputs
#: and precision, or timings but not of every choice asked for.
TIMINGS_OUTCOMES = ("no_entry", "new_choices")
#: The miss outcome of a C++ kernel library (kind ``cpp``) or a precompiled Dynamo package
#: (kind ``precompile``): none stored for this host or system.
KERNEL_OUTCOMES = ("no_entry",)
#: Miss outcomes of best configs (kind ``best_config``): none stored for the kernel's key, or
#: one stored for other candidate configs (another ``configs_hash``: torch tunes again).
BEST_CONFIG_OUTCOMES = ("no_entry", "configs_changed")
#: The outcomes of each kind logged that has its own (every other kind: :data:`OUTCOMES`).
OUTCOMES_OF = {"timings": TIMINGS_OUTCOMES, "cpp": KERNEL_OUTCOMES, "precompile": KERNEL_OUTCOMES,
               "best_config": BEST_CONFIG_OUTCOMES}

#: ``{factor: (hash, value)}``: a key's factors as :mod:`cachedb.keys.factors` compares them.
Factors = dict[str, tuple[str, str]]


def id_list(text: str | None) -> list[int]:
    """The ids of a JSON array of ``key_factors`` ids (``factor_ids``); ``[]`` for ``None`` or
    text that is not one."""
    if text is None:
        return []
    try:
        return [int(i) for i in json.loads(text)]
    except (ValueError, TypeError):
        return []


def id_text(ids: Sequence[int]) -> str:
    """``ids`` as the JSON array ``factor_ids`` holds."""
    return json.dumps([int(i) for i in ids], separators=(",", ":"))


class KeyFactorRepository:
    """The factors of each entry's key (``key_factors`` and ``entry_factors``)."""

    def __init__(self, session: Session | Connection) -> None:
        self.session = session

    def ids(self, factors: Sequence[Factor], *, known: dict[tuple[str, str], int] | None = None) -> list[int]:
        """The ``key_factors`` ids of ``factors`` (in their order), rows added for those not
        stored yet. ``known``: ``{(factor, hash): id}`` of this database already looked up
        (asked for none of them again), and given every id found or added here."""
        return self.map_ids(factors, known=known)[0]

    def map_ids(self, factors: Sequence[Factor], *, known: dict[tuple[str, str], int] | None = None
                ) -> tuple[list[int], list[Factor]]:
        """:meth:`ids`, and the factors whose ``key_factors`` rows it added."""
        wanted = {(f.factor, f.hash): f for f in factors}
        found: dict[tuple[str, str], int] = known if known is not None else {}
        pairs = [p for p in wanted if p not in found]
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
        return [found[(f.factor, f.hash)] for f in factors], missing

    def by_id(self, ids: Sequence[int]) -> dict[int, Factor]:
        """``{id: Factor}`` of the ``key_factors`` rows of ``ids`` (ids not stored left out)."""
        every = sorted(set(ids))
        out: dict[int, Factor] = {}
        for start in range(0, len(every), 500):
            for i, name, h, v in self.session.execute(select(_F.c.id, _F.c.factor, _F.c.hash, _F.c.value).where(
                    _F.c.id.in_(every[start:start + 500]))):
                out[int(i)] = Factor(name, h, v)
        return out

    def put(self, kind: str, key: str, factors: Sequence[Factor], *,
            known: dict[tuple[str, str], int] | None = None) -> bool:
        """Store the ``factors`` of ``kind``/``key`` unless that key has factors already (they
        are a function of the key); True if written. ``known`` as :meth:`ids` takes it."""
        if not factors or self.session.execute(
                select(_E.c.id).where(_E.c.kind == kind, _E.c.key == key)).first() is not None:
            return False
        ids = self.ids(factors, known=known)
        self.session.execute(insert(_E).values(kind=kind, key=key[:128], factor_ids=id_text(ids)))
        return True

    def resolve(self, id_lists: Sequence[str]) -> list[Factors]:
        """Each JSON array of ``key_factors`` ids as ``{factor: (hash, value)}``."""
        lists = [id_list(text) for text in id_lists]
        rows = self.by_id([i for ids in lists for i in ids])
        return [{rows[i].factor: (rows[i].hash, rows[i].value) for i in ids if i in rows} for ids in lists]

    def factors_of(self, text: str | None) -> list[Factor]:
        """The factors of one JSON array of ``key_factors`` ids (``entry_factors.factor_ids``),
        in its order; ids not stored left out."""
        ids = id_list(text)
        rows = self.by_id(ids)
        return [rows[i] for i in ids if i in rows]

    def of(self, kind: str, key: str) -> Factors:
        """``{factor: (hash, value)}`` of ``kind``/``key`` (empty when none are stored)."""
        text = self.session.execute(select(_E.c.factor_ids).where(_E.c.kind == kind, _E.c.key == key)).scalar()
        return self.resolve([text])[0] if text is not None else {}

    def of_kind(self, kind: str) -> dict[str, Factors]:
        """``{key: {factor: (hash, value)}}`` of every key of ``kind`` that has factors, stored
        entry or not (C++ hosts: :data:`~cachedb.keys.factors.CPP_HOST`)."""
        rows = list(self.session.execute(select(_E.c.key, _E.c.factor_ids).where(_E.c.kind == kind)))
        return dict(zip((k for k, _ in rows), self.resolve([t for _, t in rows])))

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
        variant left, of C++ hosts (:data:`~cachedb.keys.factors.CPP_HOST`) with no kernel
        library left, of package systems (:data:`~cachedb.keys.factors.PACKAGE_SYSTEM`) with no
        precompiled package left and of best configs no longer stored; returns how many keys'
        rows went (prune, clear and kernel and package eviction call it). The shared
        ``key_factors`` rows stay."""
        entry_gone = and_(_E.c.kind.not_in((CPP_HOST, PACKAGE_SYSTEM, BEST_CONFIG)),
                          ~exists().where(and_(_G.c.kind == _E.c.kind, _G.c.key == _E.c.key)))
        host_gone = and_(_E.c.kind == CPP_HOST, ~exists().where(_A.c.host_key == _E.c.key))
        system_gone = and_(_E.c.kind == PACKAGE_SYSTEM,
                           ~exists().where(_P.c.key.like(literal("%.") + _E.c.key)))
        config_gone = and_(_E.c.kind == BEST_CONFIG, ~exists().where(_BC.c.key == _E.c.key))
        stmt = delete(_E).where(or_(entry_gone, host_gone, system_gone, config_gone))
        if kind is not None:
            stmt = stmt.where(_E.c.kind == kind)
        return int(self.session.execute(stmt).rowcount or 0)


class MissLogRepository:
    """The newest lookups that missed (``cache_misses``), a ring of at most ``keep`` rows."""

    def __init__(self, session: Session | Connection) -> None:
        self.session = session

    def add(self, kind: str, key: str, outcome: str, factors: Sequence[Factor], *, reason: str = "",
            keep: int = 1000, missed_at: Any = None) -> None:
        """Record one miss (its factors through :meth:`KeyFactorRepository.ids`) at
        ``missed_at`` (a timezone-aware datetime; default: now), then drop all but the newest
        ``keep`` rows."""
        ids = KeyFactorRepository(self.session).ids(factors) if factors else []
        self.session.execute(insert(_M).values(kind=kind, key=key[:128], outcome=outcome[:16], reason=reason[:300],
                                               factor_ids=id_text(ids),
                                               missed_at=missed_at or utcnow()))
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
