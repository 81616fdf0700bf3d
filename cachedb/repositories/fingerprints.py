"""System fingerprints: one row per (system hash, torch build, host)."""

from __future__ import annotations

import json

from sqlalchemy import bindparam, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ..fingerprint import Fingerprint
from ..models import SystemFingerprint

_F = SystemFingerprint.__table__
# Prebuilt Core statements over the table's columns: an ORM entity select built per call cost
# ~3x as much to run (SQLAlchemy's cache key, ORM compile and loading steps each time).
_ID_BY_KEY = select(_F.c.id).where(_F.c.fingerprint_key == bindparam("key"))
_IDS_BY_SYSTEM_HASH = select(_F.c.id).where(_F.c.system_hash == bindparam("system_hash")).order_by(_F.c.id)
_SYSTEM_HASHES = select(_F.c.system_hash, _F.c.system_json).order_by(_F.c.id)


class FingerprintRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def ensure(self, fp: Fingerprint) -> int:
        """The id of ``fp``'s row, inserting it on first sight."""
        found = self.session.execute(_ID_BY_KEY, {"key": fp.key}).scalar()
        if found is not None:
            return int(found)
        row = SystemFingerprint(
            fingerprint_key=fp.key,
            system_hash=fp.system_hash,
            system_json=fp.system_json,
            device_name=fp.device_name,
            triton_key=fp.triton_key,
            cuda_version=fp.cuda_version,
            hip_version=fp.hip_version,
            torch_version=fp.torch_version,
            torch_key=fp.torch_key,
            cpu_model=fp.cpu_model,
            isa=fp.isa,
        )
        try:
            with self.session.begin_nested():  # another process may record it first
                self.session.add(row)
                self.session.flush()
        except IntegrityError:
            return int(self.session.execute(_ID_BY_KEY, {"key": fp.key}).scalar_one())
        return row.id

    def get(self, fingerprint_id: int) -> Fingerprint:
        row = self.session.get_one(SystemFingerprint, fingerprint_id)
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
        return [row[0] for row in self.session.execute(_IDS_BY_SYSTEM_HASH, {"system_hash": system_hash})]

    def system_hashes(self) -> dict[str, str]:
        """``{system_hash: system_json}`` of every fingerprint (one JSON per hash)."""
        out: dict[str, str] = {}
        for system_hash, system_json in self.session.execute(_SYSTEM_HASHES):
            out.setdefault(system_hash, system_json)
        return out
