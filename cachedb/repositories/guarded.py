"""Guarded entries: the compiled variants of FX graph and AOTAutograd cache keys."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.orm import Session

from .._payload import pack, unpack
from ..keys import sha256_hash
from ..models import GUARDED_KINDS, GuardedEntry, utcnow

_G = GuardedEntry.__table__

# Hot path: every variant of one key, in Inductor's order (sorted file names).
_VARIANTS = (
    select(_G.c.variant, _G.c.payload, _G.c.size_bytes, _G.c.checksum)
    .where(_G.c.kind == bindparam("kind"), _G.c.key == bindparam("key"))
    .order_by(_G.c.variant)
)
_EXISTS = select(_G.c.id).where(
    _G.c.kind == bindparam("kind"), _G.c.key == bindparam("key"), _G.c.variant == bindparam("variant")
)
_INSERT = insert(_G)
_HIT = (
    update(_G)
    .where(_G.c.kind == bindparam("k_kind"), _G.c.key == bindparam("k_key"), _G.c.variant == bindparam("k_variant"))
    .values(hit_count=_G.c.hit_count + 1, last_used_at=bindparam("now"))
)


@dataclass(frozen=True, slots=True)
class StoredVariant:
    """One stored variant: its kind, key, variant name and uncompressed payload bytes."""

    kind: str
    key: str
    variant: str
    payload: bytes
    guards_expr: str | None


def _check_kind(kind: str) -> None:
    if kind not in GUARDED_KINDS:
        raise ValueError(f"unknown guarded entry kind {kind!r}; expected one of {GUARDED_KINDS}")


class GuardedEntryRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def put(
        self,
        kind: str,
        key: str,
        payload: bytes,
        *,
        guards_expr: str | None,
        guards_known: bool = True,
        guards_note: str | None = None,
        time_taken_ns: int | None = None,
        fingerprint_id: int | None = None,
    ) -> tuple[str, bool]:
        """Store one variant. Returns ``(variant, inserted)``; an identical variant (same
        kind, key and payload hash) is kept as it is and ``inserted`` is False."""
        _check_kind(kind)
        variant = sha256_hash(payload)
        params = {"kind": kind, "key": key, "variant": variant}
        if self.session.execute(_EXISTS, params).first() is not None:
            return variant, False
        packed = pack(payload)
        now = utcnow()
        self.session.execute(
            _INSERT,
            {
                **params,
                "guards_expr": guards_expr,
                "guards_known": guards_known,
                "guards_note": guards_note,
                "payload": packed.blob,
                "size_bytes": packed.size_bytes,
                "checksum": packed.checksum,
                "time_taken_ns": time_taken_ns,
                "created_at": now,
                "last_used_at": now,
                "hit_count": 0,
                "fingerprint_id": fingerprint_id,
            },
        )
        return variant, True

    def candidates(self, kind: str, key: str) -> list[tuple[str, bytes]]:
        """``[(variant, payload bytes), ...]`` of ``key`` in Inductor's candidate order
        (sorted variant names, as ``GuardedCache.iterate_over_candidates`` lists files).

        Raises :class:`~cachedb.CorruptPayloadError` for a payload that fails its checksum.
        """
        return [(variant, load()) for variant, load in self.raw_candidates(kind, key)]

    def raw_candidates(self, kind: str, key: str) -> list[tuple[str, Callable[[], bytes]]]:
        """Like :meth:`candidates`, but each payload is decompressed and verified only when
        its loader is called (raising :class:`~cachedb.CorruptPayloadError` then)."""
        rows = self.session.execute(_VARIANTS, {"kind": kind, "key": key}).all()
        out = [
            (v, functools.partial(unpack, blob, size, digest, where=f"{kind}/{key}/{v}"))
            for v, blob, size, digest in rows
        ]
        out.sort(key=lambda item: item[0])
        return out

    def record_hit(self, kind: str, key: str, variant: str) -> None:
        self.session.execute(
            _HIT, {"k_kind": kind, "k_key": key, "k_variant": variant, "now": utcnow()}
        )

    def iter_all(self, kind: str | None = None) -> Iterator[StoredVariant]:
        """Every stored variant (payloads verified), ordered by kind, key and variant."""
        stmt = select(
            _G.c.kind, _G.c.key, _G.c.variant, _G.c.payload, _G.c.size_bytes, _G.c.checksum, _G.c.guards_expr
        ).order_by(_G.c.kind, _G.c.key, _G.c.variant)
        if kind is not None:
            stmt = stmt.where(_G.c.kind == kind)
        for k, key, variant, blob, size, digest, guards in self.session.execute(
            stmt.execution_options(yield_per=64)
        ):
            where = f"{k}/{key}/{variant}"
            yield StoredVariant(k, key, variant, unpack(blob, size, digest, where=where), guards)

    def count(self, kind: str | None = None) -> int:
        stmt = select(func.count()).select_from(_G)
        if kind is not None:
            stmt = stmt.where(_G.c.kind == kind)
        return int(self.session.execute(stmt).scalar_one())
