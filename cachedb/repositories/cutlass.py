"""CUTLASS op lists, stored whole (exact bytes) plus one queryable row per op."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from sqlalchemy import bindparam, delete, insert, select

from ..store import prebuilt
from ..store.payload import pack, unpack
from ..formats.cutlass_ops import CutlassOpRow
from ..store import tables
from ..store.tables import utcnow

if TYPE_CHECKING:
    from sqlalchemy import Connection
    from sqlalchemy.orm import Session

_L = tables.cutlass_op_lists
_O = tables.cutlass_ops
_GET = select(_L.c.payload, _L.c.size_bytes, _L.c.checksum).where(
    _L.c.request_key == bindparam("request_key")
)


class CutlassOpListRepository:
    def __init__(self, session: Session | Connection) -> None:
        self.session = session

    def put(
        self,
        request_key: str,
        data: bytes,
        rows: Sequence[CutlassOpRow],
        *,
        arch: int | None = None,
        cuda_version: str | None = None,
        instantiation_level: str | None = None,
    ) -> bool:
        """Store the op list ``configs_<request_key>.json`` (its exact ``data`` bytes) and its
        parsed ``rows``. Returns False if identical bytes were already stored under the key;
        different bytes replace the old list and its ops."""
        packed = pack(data)
        found = self.session.execute(
            select(_L.c.id, _L.c.checksum).where(_L.c.request_key == request_key)
        ).first()
        if found is not None:
            if found.checksum == packed.checksum:
                return False
            self.session.execute(delete(_O).where(_O.c.op_list_id == found.id))
            self.session.execute(delete(_L).where(_L.c.id == found.id))
        list_id = self.session.execute(
            insert(_L).returning(_L.c.id),
            {
                "request_key": request_key,
                "arch": arch,
                "cuda_version": cuda_version,
                "instantiation_level": instantiation_level,
                "op_count": len(rows),
                "payload": packed.blob,
                "size_bytes": packed.size_bytes,
                "checksum": packed.checksum,
                "created_at": utcnow(),
            },
        ).scalar_one()
        if rows:
            self.session.execute(
                insert(_O), [{"op_list_id": list_id, **dataclasses.asdict(r)} for r in rows]
            )
        return True

    def get(self, request_key: str, *, full: bool = False) -> bytes | None:
        """The op list's exact bytes, or ``None``; raises
        :class:`~cachedb.CorruptPayloadError` if the stored payload fails its checksum
        (``full``: checked by the SHA-256 of the content, :func:`cachedb.store.payload.unpack`)."""
        rows = prebuilt.fetch(self.session, _GET, {"request_key": request_key})
        if not rows:
            return None
        payload, size_bytes, checksum = rows[0]
        return unpack(payload, size_bytes, checksum, where=f"configs_{request_key}.json", full=full)

    def request_keys(self) -> list[str]:
        return list(self.session.execute(select(_L.c.request_key).order_by(_L.c.request_key)).scalars())

    def iter_all(self) -> Iterator[tuple[str, bytes]]:
        for key in self.request_keys():
            data = self.get(key)
            if data is not None:
                yield key, data
