"""Autotune timings: every benchmark of every choice, the latest one being current.

Stored compact (revision 0004): a key (``autotune_keys``: fingerprint, op, inputs,
``hint_override``, precision) once, a run (``autotune_runs``: one benchmark's
``recorded_at``) once per benchmark, and per choice a row of ``autotune_run_timings``. Reads
go through the flat view ``autotune_timings`` (:data:`cachedb.store.tables.AUTOTUNE_TIMINGS`),
whose join SQLite and PostgreSQL inline into index lookups; writes go to the three tables,
by :meth:`AutotuneTimingRepository.record` (one benchmark) or :func:`insert_flat` (rows in
the view's shape: import, ``copy``/``merge``, the fleet tiers' point sync).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, bindparam, func, insert, select, text

from ..store import prebuilt
from ..store.bulk import bulk_insert, matching, utc
from ..store.engine import connection_of
from ..formats.local_cache_doc import TimingLeaf
from ..keys import persistent_cache_inputs_key
from ..store import tables
from ..store.tables import AUTOTUNE_TIMINGS, utcnow

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

#: The flat view: every read.
_T = AUTOTUNE_TIMINGS
_K = tables.autotune_keys
_R = tables.autotune_runs
_RT = tables.autotune_run_timings
_V = tables.local_cache_values
_F = tables.system_fingerprints

#: The fingerprints of one system hash, as a subquery (bind ``system_hash``): hot statements
#: resolve them in the same query instead of a separate round trip.
FINGERPRINTS_OF_SYSTEM = select(_F.c.id).where(_F.c.system_hash == bindparam("system_hash"))

_INSERT_TIMINGS = insert(_RT)
# Hot path: the timings of one (op, inputs, precision) on the fingerprints of a system hash,
# oldest first so that the last row of each choice is its current value.
_FOR_INPUTS = (
    select(_T.c.choice_hash, _T.c.timing_ms)
    .where(_T.c.op == bindparam("op"), _T.c.inputs == bindparam("inputs"), _T.c.precision == bindparam("precision"))
    .order_by(_T.c.recorded_at, _T.c.id)
)
# By (one fingerprint?, hint_override given?): a system hash has one fingerprint on most
# machines, and ``fingerprint_id = ?`` runs without the expanding IN's per-call rendering.
_ANY_OF = _T.c.fingerprint_id.in_(bindparam("fingerprint_ids", expanding=True))
_ONE = _T.c.fingerprint_id == bindparam("fingerprint_id")
_NO_HINT = _T.c.hint_override.is_(None)
_HINT = _T.c.hint_override == bindparam("hint_override")
_FOR_INPUTS_BY_SHAPE = {
    (True, False): _FOR_INPUTS.where(_ONE, _NO_HINT),
    (True, True): _FOR_INPUTS.where(_ONE, _HINT),
    (False, False): _FOR_INPUTS.where(_ANY_OF, _NO_HINT),
    (False, True): _FOR_INPUTS.where(_ANY_OF, _HINT),
}


# One statement for a record: the ids of the key (every copy, should two writers have added
# it) with the first document position of each choice benchmarked under it (choice NULL: a key
# without timings).
_KEY_POSITIONS = (
    select(_K.c.id, _RT.c.choice_hash, func.min(_RT.c.position))
    .select_from(_K.outerjoin(_R, _R.c.key_id == _K.c.id).outerjoin(_RT, _RT.c.run_id == _R.c.id))
    .where(
        _K.c.fingerprint_id == bindparam("fingerprint_id"),
        _K.c.op == bindparam("op"),
        _K.c.inputs == bindparam("inputs"),
        _K.c.precision == bindparam("precision"),
    )
    .group_by(_K.c.id, _RT.c.choice_hash)
)
_KEY_POSITIONS_NO_HINT = _KEY_POSITIONS.where(_K.c.hint_override.is_(None))
_KEY_POSITIONS_HINT = _KEY_POSITIONS.where(_K.c.hint_override == bindparam("hint_override"))
_INSERT_KEY = insert(_K)
_INSERT_RUN = insert(_R)
# Both maxima in one statement (each an indexed MAX: the table's index, not the view's join).
_NEXT_POSITION = select(
    select(func.max(_RT.c.position)).scalar_subquery(), select(func.max(_V.c.position)).scalar_subquery()
)


def next_position(session: Session | Connection) -> int:
    """The next free document position, shared by timings and LocalCache values (one
    statement: two indexed MAX lookups)."""
    tops = session.execute(_NEXT_POSITION).one()
    return max((int(t) for t in tops if t is not None), default=-1) + 1


class AutotuneTimingRepository:
    def __init__(self, session: Session | Connection) -> None:
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
        """Append one benchmark: a run of the key ``(op, inputs, hint_override, precision)`` on
        the fingerprint (the key added on first sight) with one row per choice
        (``{choice_hash: milliseconds}``). Returns the number of rows added. Existing rows are
        history and stay. Four statements (key and first positions, next position, run,
        timings) plus one for a new key; never commits."""
        if not timings:
            return 0
        params = {
            "fingerprint_id": fingerprint_id, "op": op, "inputs": inputs, "precision": precision,
            "hint_override": hint_override,
        }
        key_id: int | None = None
        first_positions: dict[str, int] = {}
        for kid, choice, pos in self.session.execute(
            _KEY_POSITIONS_NO_HINT if hint_override is None else _KEY_POSITIONS_HINT, params
        ):
            key_id = kid if key_id is None else min(key_id, kid)
            if choice is not None:
                first = first_positions.get(choice)
                first_positions[choice] = pos if first is None else min(first, pos)
        position = next_position(self.session)
        if key_id is None:
            key_id = self.session.execute(_INSERT_KEY, params).inserted_primary_key[0]
        run_id = self.session.execute(
            _INSERT_RUN, {"key_id": key_id, "recorded_at": utcnow()}
        ).inserted_primary_key[0]
        rows = []
        for choice, ms in timings.items():
            known = first_positions.get(choice)
            rows.append(
                {
                    "run_id": run_id,
                    "choice_hash": choice,
                    "timing_ms": float(ms),
                    "position": known if known is not None else position,
                }
            )
            if known is None:
                position += 1
        self.session.execute(_INSERT_TIMINGS, rows)
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
        insert_flat(connection_of(self.session), rows)
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
        """``{choice_hash: current timing in ms}`` for one (op, inputs, precision) on the
        fingerprints ``fingerprint_ids`` (``{}`` when there are none). Mirrors what
        ``PersistentCache.lookup`` (torch/_inductor/codecache.py) reads under
        ``cache[op][inputs][precision]``."""
        ids = list(fingerprint_ids)
        if not ids:
            return {}
        stmt = _FOR_INPUTS_BY_SHAPE[len(ids) == 1, hint_override is not None]
        params = {
            "fingerprint_ids": ids,
            "fingerprint_id": ids[0],
            "op": op,
            "inputs": inputs,
            "precision": precision,
            "hint_override": hint_override,
        }
        if len(ids) == 1:  # no expanding IN list: the prebuilt statement on the driver
            return {choice: ms for choice, ms in prebuilt.fetch(self.session, stmt, params)}
        return {choice: ms for choice, ms in self.session.execute(stmt, params)}

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


# --------------------------------------------------------------------------------------------
# Rows in the view's shape (import, copy/merge, tier sync)
# --------------------------------------------------------------------------------------------

#: A row's key: ``(fingerprint_id, op, inputs, hint_override, precision)``.
_KEY_COLUMNS = ("fingerprint_id", "op", "inputs", "hint_override", "precision")
_key_of = operator.itemgetter(*_KEY_COLUMNS)
#: Keys (by ``(fingerprint_id, op, inputs)``, the index's prefix: hint and precision are
#: compared here, ``hint_override`` may be NULL) or ids looked up per query.
_PER_QUERY = 500


def _key_ids(conn: Connection, keys: Iterable[tuple[Any, ...]]) -> dict[tuple[Any, ...], int]:
    """The ids of the stored keys among ``keys`` (the lowest id where a key is stored twice)."""
    wanted = set(keys)
    narrow = sorted({k[:3] for k in wanted})
    out: dict[tuple[Any, ...], int] = {}
    stmt = select(_K.c.id, *(_K.c[c] for c in _KEY_COLUMNS)).order_by(_K.c.id.desc())
    for start in range(0, len(narrow), _PER_QUERY):
        chunk = narrow[start:start + _PER_QUERY]
        for kid, *key in conn.execute(matching(conn, stmt, _K, _KEY_COLUMNS[:3], chunk)):
            k = tuple(key)
            if k in wanted:
                out[k] = int(kid)
    return out


def _run_ids(conn: Connection, key_ids: Iterable[int]) -> dict[tuple[int, Any], int]:
    """``{(key_id, recorded_at as aware UTC): run id}`` of the runs of ``key_ids``."""
    ids = sorted(set(key_ids))
    out: dict[tuple[int, Any], int] = {}
    stmt = select(_R.c.id, _R.c.key_id, _R.c.recorded_at).order_by(_R.c.id.desc())
    for start in range(0, len(ids), _PER_QUERY):
        for rid, kid, at in conn.execute(stmt.where(_R.c.key_id.in_(ids[start:start + _PER_QUERY]))):
            out[(int(kid), utc(at))] = int(rid)
    return out


def _held(conn: Connection, run_ids: Iterable[int]) -> set[tuple[int, str]]:
    """``(run_id, choice_hash)`` of the timings of ``run_ids``."""
    runs = sorted(set(run_ids))
    held: set[tuple[int, str]] = set()
    stmt = select(_RT.c.run_id, _RT.c.choice_hash)
    for start in range(0, len(runs), _PER_QUERY):
        held.update((int(r), c) for r, c in conn.execute(stmt.where(_RT.c.run_id.in_(runs[start:start + _PER_QUERY]))))
    return held


def _new_ids(conn: Connection, table: Any, n: int) -> list[int]:
    """``n`` unused ids of ``table``: from its sequence on PostgreSQL; on SQLite the ones after
    the largest, which the caller's write transaction (``BEGIN IMMEDIATE``) keeps free."""
    if conn.dialect.name == "postgresql":
        stmt = text(f"SELECT nextval(pg_get_serial_sequence('{table.name}', 'id')) FROM generate_series(1, :n)")
        return [int(i) for i in conn.execute(stmt, {"n": n}).scalars()]
    start = int(conn.execute(select(func.max(table.c.id))).scalar() or 0) + 1
    return list(range(start, start + n))


def insert_flat(conn: Connection, rows: Sequence[Mapping[str, Any]], *, skip_stored: bool = False,
                place_after_stored: bool = False) -> list[int]:
    """Store ``rows`` in the view's shape (``fingerprint_id, op, inputs, hint_override,
    precision, choice_hash, timing_ms, position, recorded_at``; ``id`` ignored), adding the
    keys and runs they need: rows of one key with one ``recorded_at`` join one run.

    ``skip_stored``: leave out the rows whose benchmark is stored already (a timing of the
    same choice in a run of the same key recorded at the same instant) and repeats within
    ``rows``. ``place_after_stored``: the rows stored take the document positions after
    everything the database holds, in the order of their own positions (the rows are not
    modified). Returns the indexes of the rows stored. Inside the caller's write transaction;
    about six statements per 500 keys."""
    if not rows:
        return []
    row_keys = [_key_of(r) for r in rows]
    stamps = [utc(r["recorded_at"]) for r in rows]
    key_ids = _key_ids(conn, row_keys)
    run_ids = _run_ids(conn, key_ids.values()) if key_ids else {}  # a new key has no runs
    keep = list(range(len(rows)))
    if skip_stored:
        held = _held(conn, run_ids.values()) if run_ids else set()
        keep, seen = [], set()
        for i, r in enumerate(rows):
            natural = (row_keys[i], stamps[i], r["choice_hash"])
            if natural in seen:
                continue
            seen.add(natural)
            kid = key_ids.get(row_keys[i])
            rid = run_ids.get((kid, stamps[i])) if kid is not None else None
            if rid is None or (rid, r["choice_hash"]) not in held:
                keep.append(i)
    if not keep:
        return []
    positions = {i: rows[i]["position"] for i in keep}
    if place_after_stored:
        start = next_position(conn)
        for n, i in enumerate(sorted(keep, key=lambda i: rows[i]["position"])):
            positions[i] = start + n
    new_keys = [k for k in dict.fromkeys(row_keys[i] for i in keep) if k not in key_ids]
    if new_keys:
        ids = _new_ids(conn, _K, len(new_keys))
        bulk_insert(conn, _K, [{"id": i, **dict(zip(_KEY_COLUMNS, k))} for i, k in zip(ids, new_keys)])
        key_ids.update(zip(new_keys, ids))
    row_runs = [(key_ids[row_keys[i]], stamps[i]) for i in keep]
    new_runs = [s for s in dict.fromkeys(row_runs) if s not in run_ids]
    if new_runs:
        ids = _new_ids(conn, _R, len(new_runs))
        bulk_insert(conn, _R, [{"id": i, "key_id": kid, "recorded_at": at} for i, (kid, at) in zip(ids, new_runs)])
        run_ids.update(zip(new_runs, ids))
    bulk_insert(
        conn,
        _RT,
        [
            {
                "run_id": run_ids[run],
                "choice_hash": rows[i]["choice_hash"],
                "timing_ms": rows[i]["timing_ms"],
                "position": positions[i],
                "ed25519_signature": rows[i].get("ed25519_signature"),
            }
            for i, run in zip(keep, row_runs)
        ],
    )
    return keep


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


def lookup_groups(session: Session | Connection) -> list[dict[str, Any]]:
    """Every stored timings lookup (one ``autotune_keys`` row: fingerprint, op, inputs,
    hint_override, precision): ``{"system_hash", "device_name",
    "cuda_version", "hip_version", "op", "inputs", "hint_override", "precision", "choices"}``,
    ``choices`` being ``(choice_hash, name or None, first recorded at)`` per choice, oldest
    first (``name`` from ``autotune_choices``). What ``cachedb misses`` explains a timings miss
    against."""
    _C = tables.autotune_choices
    stmt = (
        select(_K.c.id, _F.c.system_hash, _F.c.device_name, _F.c.cuda_version, _F.c.hip_version, _K.c.op,
               _K.c.inputs, _K.c.hint_override, _K.c.precision, _RT.c.choice_hash, _C.c.name,
               func.min(_R.c.recorded_at).label("at"))
        .select_from(_K.join(_F, _F.c.id == _K.c.fingerprint_id).join(_R, _R.c.key_id == _K.c.id)
                     .join(_RT, _RT.c.run_id == _R.c.id).outerjoin(_C, _C.c.choice_hash == _RT.c.choice_hash))
        .group_by(_K.c.id, _F.c.system_hash, _F.c.device_name, _F.c.cuda_version, _F.c.hip_version, _K.c.op,
                  _K.c.inputs, _K.c.hint_override, _K.c.precision, _RT.c.choice_hash, _C.c.name)
        .order_by(_K.c.id, "at")
    )
    groups: dict[int, dict[str, Any]] = {}
    for row in session.execute(stmt):
        group = groups.setdefault(row.id, {
            "system_hash": row.system_hash, "device_name": row.device_name, "cuda_version": row.cuda_version,
            "hip_version": row.hip_version, "op": row.op, "inputs": row.inputs, "hint_override": row.hint_override,
            "precision": row.precision, "choices": []})
        group["choices"].append((row.choice_hash, row.name, row.at))
    return list(groups.values())
