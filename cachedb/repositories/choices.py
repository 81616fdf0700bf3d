"""Autotune choices described: what torch says of each choice hash (revision 0011).

A timing names its choice by hash (``ChoiceCaller.hash_key()``); ``autotune_choices`` holds,
once per hash, the choice's ``name``, ``description`` and ``info_dict()`` as torch gave them at
tuning time (:class:`cachedb.store.models.AutotuneChoice` documents each column). The live path
describes the choices ``PersistentCache.lookup`` is handed (:mod:`cachedb.live._choices`);
copy, merge and the remote tier carry the rows by hash (:func:`insert_missing`). Timings
imported from Inductor's files have none: the views show ``NULL`` for them until a live tuning
of the same choice describes it.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Text, bindparam, func, select

from ..store import prebuilt
from ..store.bulk import bulk_insert, dialect_insert
from ..store.engine import connection_of
from ..store import tables
from ..store.tables import utcnow

if TYPE_CHECKING:
    from sqlalchemy import Connection
    from sqlalchemy.orm import Session

_C = tables.autotune_choices

#: The columns of a row as :func:`describe` makes it and :func:`rows_for` reads it (all but ``id``).
COLUMNS = tuple(c.name for c in _C.c if c.name != "id")

#: Hashes looked up (or rows written) per statement.
_PER_QUERY = 500

#: The stored hashes among ``hashes`` (expanding). Binds: ``hashes``.
STORED = select(_C.c.choice_hash).where(_C.c.choice_hash.in_(bindparam("hashes", expanding=True)))
_ROWS = select(*(_C.c[c] for c in COLUMNS)).where(_C.c.choice_hash.in_(bindparam("hashes", expanding=True)))


@functools.cache
def stored_statement(dialect: str) -> Any:
    """Hot path: the stored hashes among a list of them in one prebuilt statement of one bind
    (:func:`stored_params`), for :meth:`cachedb.store.engine.KeptConnection.fetch`: on SQLite
    ``choice_hash IN (SELECT value FROM json_each(:hashes))`` (SQLite >= 3.38, where JSON is
    built in), on PostgreSQL ``choice_hash = ANY(:hashes)``; ``None`` elsewhere (use
    :func:`stored`)."""
    if dialect == "sqlite" and sqlite3.sqlite_version_info >= (3, 38):
        each = func.json_each(bindparam("hashes", type_=Text)).table_valued("value")
        return select(_C.c.choice_hash).where(_C.c.choice_hash.in_(select(each.c.value)))
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import ARRAY  # only here: PostgreSQL connections

        return select(_C.c.choice_hash).where(_C.c.choice_hash == func.any(bindparam("hashes", type_=ARRAY(Text))))
    return None


def stored_params(dialect: str, hashes: Sequence[str]) -> dict[str, Any]:
    """The bind of :func:`stored_statement` for ``hashes``."""
    return {"hashes": json.dumps(list(hashes)) if dialect == "sqlite" else list(hashes)}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def describe(choice_hash: str, name: str, description: str | None, info: Mapping[str, Any],
             *, kernel_name: str | None = None) -> dict[str, Any]:
    """The row of one choice from what torch gives of it: ``name`` and ``description``
    (``ChoiceCaller.name`` / ``.description``, torch/_inductor/ir.py) and ``info``
    (``ChoiceCaller.info_dict()``: e.g. ``TritonTemplateCaller.info_dict`` and
    ``ExternKernelCaller.info_dict``, torch/_inductor/select_algorithm.py). The columns
    ``backend``, ``kernel_name`` (``info["kernel_name"]``, else ``info["kernel_call_name"]``,
    else ``kernel_name``), ``tile_shape``, ``num_stages``, ``num_warps`` and ``group_m``
    (``info["GROUP_M"]``) are read from ``info`` as torch wrote them; ``info_json`` is all of
    it (keys sorted; a value JSON cannot hold as its ``str``). Touches no database. Raises
    ``TypeError``/``ValueError`` for an ``info`` JSON cannot encode (keys that are not
    strings)."""
    info = dict(info)
    return {
        "choice_hash": choice_hash,
        "name": str(name),
        "description": _text(description),
        "backend": _text(info.get("backend")),
        "kernel_name": _text(info.get("kernel_name") or info.get("kernel_call_name") or kernel_name),
        "tile_shape": _text(info.get("tile_shape")),
        "num_stages": _int(info.get("num_stages")),
        "num_warps": _int(info.get("num_warps")),
        "group_m": _int(info.get("GROUP_M")),
        "info_json": json.dumps(info, sort_keys=True, default=str),
        "created_at": utcnow(),
        "ed25519_signature": None,
    }


def _chunks(values: Sequence[str]) -> Iterable[list[str]]:
    for start in range(0, len(values), _PER_QUERY):
        yield list(values[start:start + _PER_QUERY])


def stored(conn: Session | Connection, hashes: Iterable[str]) -> set[str]:
    """The hashes among ``hashes`` that have a row (one indexed query per 500)."""
    wanted = sorted(set(hashes))
    found: set[str] = set()
    for chunk in _chunks(wanted):
        found.update(conn.execute(STORED, {"hashes": chunk}).scalars())
    return found


def rows_for(conn: Session | Connection, hashes: Iterable[str]) -> list[dict[str, Any]]:
    """The rows (:data:`COLUMNS`) of the hashes among ``hashes`` that have one, by hash."""
    wanted = sorted(set(hashes))
    out: list[dict[str, Any]] = []
    for chunk in _chunks(wanted):
        out += [dict(m) for m in conn.execute(_ROWS, {"hashes": chunk}).mappings()]
    out.sort(key=lambda r: r["choice_hash"])
    return out


def insert_missing(conn: Session | Connection, rows: Sequence[Mapping[str, Any]]) -> int:
    """Insert the rows whose hash has none yet (a stored description stays: a hash names one
    kernel), each hash once; inside the caller's transaction. On SQLite and PostgreSQL one
    ``INSERT ... ON CONFLICT DO NOTHING`` per 500 rows (no read: the caller's write transaction
    holds the lock already); elsewhere the stored hashes are read first. Returns the rows
    added."""
    if not rows:
        return 0
    make = dialect_insert(connection_of(conn).dialect.name)
    have = stored(conn, (r["choice_hash"] for r in rows)) if make is None else set()  # else: ON CONFLICT
    new: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["choice_hash"] not in have and r["choice_hash"] not in new:
            new[r["choice_hash"]] = {c: r.get(c) for c in COLUMNS}
            if new[r["choice_hash"]]["created_at"] is None:
                new[r["choice_hash"]]["created_at"] = utcnow()
    if not new:
        return 0
    values = list(new.values())
    if make is None:
        bulk_insert(conn, _C, values)  # type: ignore[arg-type]
        return len(values)
    added = 0
    dialect = connection_of(conn).dialect.name
    for start in range(0, len(values), _PER_QUERY):
        chunk = values[start:start + _PER_QUERY]
        if dialect == "sqlite":  # on the driver; sqlite3's executemany counts the rows it added
            added += max(prebuilt.execute_many(conn, _insert_new(dialect), chunk), 0)
        else:  # psycopg's rowcount of an executemany is not that: RETURNING the rows added
            added += len(conn.execute(_insert_new(dialect).returning(_C.c.choice_hash), chunk).all())
    return added


@functools.cache
def _insert_new(dialect: str) -> Any:
    """``INSERT ... ON CONFLICT (choice_hash) DO NOTHING`` of a row (:data:`COLUMNS`) for
    ``dialect`` (``sqlite`` or ``postgresql``), built once."""
    make = dialect_insert(dialect)
    assert make is not None
    return make(_C).values({c: bindparam(c) for c in COLUMNS}).on_conflict_do_nothing(
        index_elements=[_C.c.choice_hash])


class ChoiceRepository:
    """The ``autotune_choices`` rows of one transaction (:class:`cachedb.db.Repos`)."""

    def __init__(self, session: Session | Connection) -> None:
        self.session = session

    def get(self, choice_hash: str) -> dict[str, Any] | None:
        """The row (:data:`COLUMNS`) of ``choice_hash``, ``None`` when it was never described."""
        rows = rows_for(self.session, [choice_hash])
        return rows[0] if rows else None

    def stored(self, hashes: Iterable[str]) -> set[str]:
        """:func:`stored`."""
        return stored(self.session, hashes)

    def rows_for(self, hashes: Iterable[str]) -> list[dict[str, Any]]:
        """:func:`rows_for`."""
        return rows_for(self.session, hashes)

    def put_new(self, rows: Sequence[Mapping[str, Any]]) -> int:
        """:func:`insert_missing`: the described choices not stored yet. Never commits."""
        return insert_missing(self.session, rows)

    def count(self) -> int:
        """How many choices are described."""
        return int(self.session.execute(select(func.count()).select_from(_C)).scalar_one())
