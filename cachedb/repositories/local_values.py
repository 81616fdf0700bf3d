"""LocalCache values: JSON under their key path, one current value per path."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, insert, select, update

from ..formats.local_cache_doc import ValueLeaf
from ..store import tables
from ..store.tables import utcnow

if TYPE_CHECKING:
    from sqlalchemy import Connection
    from sqlalchemy.orm import Session

_V = tables.local_cache_values
_F = tables.system_fingerprints
_INSERT = insert(_V)
_UPDATE = (
    update(_V)
    .where(_V.c.id == bindparam("row_id"))
    .values(value_json=bindparam("value_json"), updated_at=bindparam("updated_at"))
)


def _path_json(path: Sequence[str]) -> str:
    return json.dumps(list(path))


class LocalCacheValueRepository:
    def __init__(self, session: Session | Connection) -> None:
        self.session = session

    def _current(self, fingerprint_ids: Iterable[int]) -> dict[str, tuple[int, str, int]]:
        stmt = (
            select(_V.c.key_path, _V.c.id, _V.c.value_json, _V.c.position)
            .where(_V.c.fingerprint_id.in_(list(fingerprint_ids)))
            .order_by(_V.c.updated_at, _V.c.id)
        )
        out: dict[str, tuple[int, str, int]] = {}
        for key_path, row_id, value_json, position in self.session.execute(stmt):
            first = out.get(key_path)
            out[key_path] = (row_id, value_json, min(position, first[2]) if first else position)
        return out

    def add_leaves(self, fingerprint_id: int, leaves: Sequence[ValueLeaf]) -> int:
        """Store document leaves; unchanged values are left alone. Returns rows written."""
        current = self._current([fingerprint_id])
        now = utcnow()
        inserts, updates = [], []
        for leaf in leaves:
            path = _path_json(leaf.key_path)
            value_json = json.dumps(leaf.value)
            known = current.get(path)
            if known is None:
                inserts.append(
                    {
                        "fingerprint_id": fingerprint_id,
                        "namespace": leaf.key_path[0],
                        "key_path": path,
                        "value_json": value_json,
                        "position": leaf.position,
                        "updated_at": now,
                    }
                )
            elif known[1] != value_json:
                updates.append({"row_id": known[0], "value_json": value_json, "updated_at": now})
        if inserts:
            self.session.execute(_INSERT, inserts)
        if updates:
            self.session.execute(_UPDATE, updates)
        return len(inserts) + len(updates)

    def get(self, fingerprint_ids: Iterable[int], key_path: Sequence[str]) -> Any | None:
        """The current value at ``key_path`` (``None`` if absent)."""
        found = self._current(fingerprint_ids).get(_path_json(key_path))
        return None if found is None else json.loads(found[1])

    def current_leaves(self, fingerprint_ids: Iterable[int]) -> list[ValueLeaf]:
        return [
            ValueLeaf(tuple(json.loads(path)), json.loads(value_json), position)
            for path, (_id, value_json, position) in self._current(fingerprint_ids).items()
        ]


_FOR_NAMESPACE = (
    select(_V.c.key_path, _V.c.value_json)
    .where(_V.c.fingerprint_id.in_(bindparam("fingerprint_ids", expanding=True)), _V.c.namespace == bindparam("ns"))
    .order_by(_V.c.position, _V.c.updated_at, _V.c.id)
)


#: Hot path: the leaves ``(key_path, value_json)`` of one namespace on the fingerprints of a
#: system hash, in document order. Binds: ``system_hash``, ``ns``.
FOR_NAMESPACE_OF_SYSTEM = (
    select(_V.c.key_path, _V.c.value_json)
    .where(
        _V.c.fingerprint_id.in_(select(_F.c.id).where(_F.c.system_hash == bindparam("system_hash"))),
        _V.c.namespace == bindparam("ns"),
    )
    .order_by(_V.c.position, _V.c.updated_at, _V.c.id)
)


def current_for_namespace(session: Session, fingerprint_ids: list[int], namespace: str) -> tuple[bool, Any]:
    """``(found, value)`` of the top-level ``LocalCache`` key ``namespace``, rebuilt from its
    leaves (latest value per key path)."""
    return namespace_value(
        session.execute(_FOR_NAMESPACE, {"fingerprint_ids": fingerprint_ids, "ns": namespace}), namespace
    )


def namespace_value(rows: Iterable[tuple[str, str]], namespace: str) -> tuple[bool, Any]:
    """``(found, value)`` of ``namespace`` rebuilt from ``(key_path, value_json)`` rows in
    document order (:data:`FOR_NAMESPACE_OF_SYSTEM`); the latest value of a path wins."""
    found = False
    root: dict[str, Any] = {}
    for key_path, value_json in rows:
        found = True
        path = json.loads(key_path)
        node = root
        for key in path[:-1]:
            nxt = node.get(key)
            if not isinstance(nxt, dict):
                nxt = node[key] = {}
            node = nxt
        node[path[-1]] = json.loads(value_json)
    return found, root.get(namespace)
