"""Autotune timings: every benchmark of every choice, the latest one being current."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import bindparam, func, insert, select
from sqlalchemy.orm import Session

from .._local_cache_doc import TimingLeaf
from ..keys import persistent_cache_inputs_key
from ..models import AutotuneTiming, LocalCacheValue, SystemFingerprint, utcnow

_T = AutotuneTiming.__table__
_V = LocalCacheValue.__table__
_F = SystemFingerprint.__table__

#: The fingerprints of one system hash, as a subquery (bind ``system_hash``): hot statements
#: resolve them in the same query instead of a separate round trip.
FINGERPRINTS_OF_SYSTEM = select(_F.c.id).where(_F.c.system_hash == bindparam("system_hash"))

_INSERT = insert(_T)
# Hot path: the timings of one (op, inputs, precision) on the fingerprints of a system hash,
# oldest first so that the last row of each choice is its current value.
_FOR_INPUTS = (
    select(_T.c.choice_hash, _T.c.timing_ms)
    .where(
        _T.c.fingerprint_id.in_(bindparam("fingerprint_ids", expanding=True)),
        _T.c.op == bindparam("op"),
        _T.c.inputs == bindparam("inputs"),
        _T.c.precision == bindparam("precision"),
    )
    .order_by(_T.c.recorded_at, _T.c.id)
)
_FOR_INPUTS_NO_HINT = _FOR_INPUTS.where(_T.c.hint_override.is_(None))
_FOR_INPUTS_HINT = _FOR_INPUTS.where(_T.c.hint_override == bindparam("hint_override"))


_GROUP_POSITIONS = (
    select(_T.c.choice_hash, func.min(_T.c.position))
    .where(
        _T.c.fingerprint_id == bindparam("fingerprint_id"),
        _T.c.op == bindparam("op"),
        _T.c.inputs == bindparam("inputs"),
        _T.c.precision == bindparam("precision"),
    )
    .group_by(_T.c.choice_hash)
)
_MAX_T = select(func.max(_T.c.position))
_MAX_V = select(func.max(_V.c.position))


def next_position(session: Session) -> int:
    """The next free document position, shared by timings and LocalCache values (two indexed
    MAX lookups)."""
    tops = [session.execute(stmt).scalar() for stmt in (_MAX_T, _MAX_V)]
    return max((int(t) for t in tops if t is not None), default=-1) + 1


class AutotuneTimingRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def record(
        self,
        fingerprint_id: int,
        op: str,
        inputs: str,
        precision: str,
        timings: Mapping[str, float],
        *,
        hint_override: int | None = None,
    ) -> int:
        """Append one benchmark row per choice (``{choice_hash: milliseconds}``). Returns the
        number of rows added. Existing rows are history and stay."""
        group = _GROUP_POSITIONS.where(
            _T.c.hint_override.is_(None) if hint_override is None else _T.c.hint_override == hint_override
        )
        params = {"fingerprint_id": fingerprint_id, "op": op, "inputs": inputs, "precision": precision}
        first_positions = {choice: pos for choice, pos in self.session.execute(group, params)}
        position = next_position(self.session)
        rows = []
        now = utcnow()
        for choice, ms in timings.items():
            known = (None, first_positions[choice]) if choice in first_positions else None
            rows.append(
                {
                    "fingerprint_id": fingerprint_id,
                    "op": op,
                    "inputs": inputs,
                    "hint_override": hint_override,
                    "precision": precision,
                    "choice_hash": choice,
                    "timing_ms": float(ms),
                    "position": known[1] if known else position,
                    "recorded_at": now,
                }
            )
            if not known:
                position += 1
        if rows:
            self.session.execute(_INSERT, rows)
        return len(rows)

    def add_leaves(self, fingerprint_id: int, leaves: Sequence[TimingLeaf]) -> int:
        """Import document leaves: a leaf whose current value is already that value adds
        nothing (re-import is idempotent); a changed value adds a history row. Returns the
        number of rows added."""
        current = self.current_paths([fingerprint_id])
        now = utcnow()
        rows = []
        for leaf in leaves:
            path = (leaf.op, leaf.inputs, leaf.hint_override, leaf.precision, leaf.choice_hash)
            known = current.get(path)
            if known is not None and known[0] == leaf.timing_ms:
                continue
            rows.append(
                {
                    "fingerprint_id": fingerprint_id,
                    "op": leaf.op,
                    "inputs": leaf.inputs,
                    "hint_override": leaf.hint_override,
                    "precision": leaf.precision,
                    "choice_hash": leaf.choice_hash,
                    "timing_ms": leaf.timing_ms,
                    "position": known[1] if known else leaf.position,
                    "recorded_at": now,
                }
            )
        if rows:
            self.session.execute(_INSERT, rows)
        return len(rows)

    def lookup(
        self,
        fingerprint_ids: Iterable[int],
        op: str,
        inputs: str,
        precision: str,
        *,
        hint_override: int | None = None,
    ) -> dict[str, float]:
        """``{choice_hash: current timing in ms}`` for one (op, inputs, precision)."""
        stmt = _FOR_INPUTS_NO_HINT if hint_override is None else _FOR_INPUTS_HINT
        params = {
            "fingerprint_ids": list(fingerprint_ids),
            "op": op,
            "inputs": inputs,
            "precision": precision,
            "hint_override": hint_override,
        }
        rows = self.session.execute(stmt, params)
        return {choice: ms for choice, ms in rows}

    def current_paths(self, fingerprint_ids: Iterable[int]) -> dict[tuple, tuple[float, int]]:
        """``{(op, inputs, hint_override, precision, choice_hash): (current ms, first position)}``."""
        stmt = (
            select(
                _T.c.op, _T.c.inputs, _T.c.hint_override, _T.c.precision, _T.c.choice_hash,
                _T.c.timing_ms, _T.c.position,
            )
            .where(_T.c.fingerprint_id.in_(list(fingerprint_ids)))
            .order_by(_T.c.recorded_at, _T.c.id)
        )
        out: dict[tuple, tuple[float, int]] = {}
        for op, inputs, hint, precision, choice, ms, position in self.session.execute(stmt):
            path = (op, inputs, hint, precision, choice)
            first = out.get(path)
            out[path] = (ms, min(position, first[1]) if first else position)
        return out

    def current_leaves(self, fingerprint_ids: Iterable[int]) -> list[TimingLeaf]:
        """The current value of every path, as document leaves (for export)."""
        return [
            TimingLeaf(op, inputs, hint, precision, choice, ms, position)
            for (op, inputs, hint, precision, choice), (ms, position) in self.current_paths(
                fingerprint_ids
            ).items()
        ]


# Hot path for the live backend: every timing of one op on the fingerprints of a system hash.
_FOR_OP = (
    select(_T.c.inputs, _T.c.hint_override, _T.c.precision, _T.c.choice_hash, _T.c.timing_ms)
    .where(_T.c.fingerprint_id.in_(bindparam("fingerprint_ids", expanding=True)), _T.c.op == bindparam("op"))
    .order_by(_T.c.position, _T.c.recorded_at, _T.c.id)
)


def current_for_op(session: Session, fingerprint_ids: list[int], op: str) -> dict[str, dict[str, dict[str, float]]]:
    """``{inputs_key: {precision: {choice_hash: ms}}}`` of ``op``: what
    ``PersistentCache.lookup`` reads under ``cache[op]``, latest value per choice."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for inputs, hint, precision, choice, ms in session.execute(
        _FOR_OP, {"fingerprint_ids": fingerprint_ids, "op": op}
    ):
        key = persistent_cache_inputs_key(inputs, hint)
        out.setdefault(key, {}).setdefault(precision, {})[choice] = ms
    return out


# --------------------------------------------------------------------------------------------
# Hot path of the live backend: prebuilt statements for KeptConnection.fetch (binds: str/int)
# --------------------------------------------------------------------------------------------

_OF_SYSTEM = _T.c.fingerprint_id.in_(FINGERPRINTS_OF_SYSTEM)

#: One row if ``op`` has any timing on the fingerprints of ``system_hash`` (index prefix
#: ``fingerprint_id, op``). Binds: ``system_hash``, ``op``.
OP_EXISTS = select(_T.c.id).where(_OF_SYSTEM, _T.c.op == bindparam("op")).limit(1)

_FOR_INPUTS_KEY = (
    select(_T.c.precision, _T.c.choice_hash, _T.c.timing_ms)
    .where(_OF_SYSTEM, _T.c.op == bindparam("op"), _T.c.inputs == bindparam("inputs"))
    .order_by(_T.c.position, _T.c.recorded_at, _T.c.id)
)
#: ``(precision, choice_hash, timing_ms)`` of one ``cache[op][inputs_key]``, oldest first per
#: choice (index ``fingerprint_id, op, inputs, ...``). Binds: ``system_hash``, ``op``,
#: ``inputs`` (and ``hint_override`` for :data:`FOR_INPUTS_KEY_HINT`).
FOR_INPUTS_KEY_NO_HINT = _FOR_INPUTS_KEY.where(_T.c.hint_override.is_(None))
FOR_INPUTS_KEY_HINT = _FOR_INPUTS_KEY.where(_T.c.hint_override == bindparam("hint_override"))

#: Every timing of ``op`` (``inputs, hint_override, precision, choice_hash, timing_ms``), in
#: document order. Binds: ``system_hash``, ``op``.
FOR_OP_OF_SYSTEM = (
    select(_T.c.inputs, _T.c.hint_override, _T.c.precision, _T.c.choice_hash, _T.c.timing_ms)
    .where(_OF_SYSTEM, _T.c.op == bindparam("op"))
    .order_by(_T.c.position, _T.c.recorded_at, _T.c.id)
)


def inputs_key_params(system_hash: str, op: str, inputs: str, hint_override: int | None) -> tuple[Any, dict[str, Any]]:
    """``(statement, params)`` reading one ``cache[op][inputs_key]`` (see :data:`FOR_INPUTS_KEY_NO_HINT`)."""
    params: dict[str, Any] = {"system_hash": system_hash, "op": op, "inputs": inputs}
    if hint_override is None:
        return FOR_INPUTS_KEY_NO_HINT, params
    params["hint_override"] = hint_override
    return FOR_INPUTS_KEY_HINT, params


def per_precision(rows: Iterable[tuple[str, str, float]]) -> dict[str, dict[str, float]]:
    """``{precision: {choice_hash: ms}}`` from rows of :data:`FOR_INPUTS_KEY_NO_HINT` (the last
    row of a choice is its current value)."""
    out: dict[str, dict[str, float]] = {}
    for precision, choice, ms in rows:
        out.setdefault(precision, {})[choice] = ms
    return out


def per_inputs_key(
    rows: Iterable[tuple[str, int | None, str, str, float]],
) -> dict[str, dict[str, dict[str, float]]]:
    """``{inputs_key: {precision: {choice_hash: ms}}}`` from rows of :data:`FOR_OP_OF_SYSTEM`."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for inputs, hint, precision, choice, ms in rows:
        key = persistent_cache_inputs_key(inputs, hint)
        out.setdefault(key, {}).setdefault(precision, {})[choice] = ms
    return out
