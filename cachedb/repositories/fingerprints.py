"""System fingerprints: one row per (system hash, torch build, host)."""

from __future__ import annotations

import json

from typing import TYPE_CHECKING

from sqlalchemy import bindparam, insert, select
from sqlalchemy.exc import IntegrityError

from ..store import prebuilt
from ..store import tables
from ..fingerprint import Fingerprint

if TYPE_CHECKING:
    from sqlalchemy import Connection
    from sqlalchemy.orm import Session

_F = tables.system_fingerprints
# Prebuilt Core statements over the table's columns: an ORM entity select built per call cost
# ~3x as much to run (SQLAlchemy's cache key, ORM compile and loading steps each time).
_ID_BY_KEY = select(_F.c.id).where(_F.c.fingerprint_key == bindparam("key"))
_IDS_BY_SYSTEM_HASH = select(_F.c.id).where(_F.c.system_hash == bindparam("system_hash")).order_by(_F.c.id)
_SYSTEM_HASHES = select(_F.c.system_hash, _F.c.system_json).order_by(_F.c.id)
_INSERT = insert(_F)
_BY_ID = select(_F.c.system_json, _F.c.torch_version, _F.c.torch_key, _F.c.cpu_model, _F.c.isa).where(
    _F.c.id == bindparam("id"))


class FingerprintRepository:
    def __init__(self, session: Session | Connection) -> None:
        self.session = session

    def ensure(self, fp: Fingerprint) -> int:
        """The id of ``fp``'s row, inserting it on first sight."""
        found = prebuilt.fetch(self.session, _ID_BY_KEY, {"key": fp.key})
        if found:
            return int(found[0][0])
        row = {
            "fingerprint_key": fp.key,
            "system_hash": fp.system_hash,
            "system_json": fp.system_json,
            "device_name": fp.device_name,
            "triton_key": fp.triton_key,
            "cuda_version": fp.cuda_version,
            "hip_version": fp.hip_version,
            "torch_version": fp.torch_version,
            "torch_key": fp.torch_key,
            "cpu_model": fp.cpu_model,
            "isa": fp.isa,
        }
        try:
            with self.session.begin_nested():  # another process may record it first
                inserted = self.session.execute(_INSERT, row).inserted_primary_key
        except IntegrityError:
            return int(self.session.execute(_ID_BY_KEY, {"key": fp.key}).scalar_one())
        return int(inserted[0])

    def get(self, fingerprint_id: int) -> Fingerprint:
        """The fingerprint of row ``fingerprint_id``; raises ``sqlalchemy.exc.NoResultFound``
        if there is none."""
        row = self.session.execute(_BY_ID, {"id": fingerprint_id}).one()
        return Fingerprint(
            system=json.loads(row.system_json),
            torch_version=row.torch_version,
            torch_key=row.torch_key,
            cpu_model=row.cpu_model,
            isa=row.isa,
        )

    def ids_for_system_hash(self, system_hash: str) -> list[int]:
        """The ids of every fingerprint recorded under ``system_hash`` (torch's
        ``CacheBase.get_system()["hash"]``), oldest first; one prebuilt statement."""
        return [row[0] for row in prebuilt.fetch(self.session, _IDS_BY_SYSTEM_HASH, {"system_hash": system_hash})]

    def system_hashes(self) -> dict[str, str]:
        """``{system_hash: system_json}`` of every fingerprint (one JSON per hash)."""
        out: dict[str, str] = {}
        for system_hash, system_json in self.session.execute(_SYSTEM_HASHES):
            out.setdefault(system_hash, system_json)
        return out
