"""Guarded entries: the compiled variants of FX graph and AOTAutograd cache keys."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import Connection, and_, bindparam, case, delete, func, insert, literal_column, null, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql import ColumnElement, Insert, Select

from ..store import prebuilt
from ..store.bulk import bulk_insert_values, dialect_insert
from ..store.engine import connection_of
from .._errors import CorruptPayloadError
from ..store.payload import STREAM_PAYLOAD_BYTES, BlobSource, PackingAside, guarded_level, pack, unpack, unpack_from
from ..formats.own_pickle import read_own_entry_fields
from ..formats.pickle_scan import read_entry_fields
from ..store.signing import Signer
from ..keys import sha256_digest_name
from ..store import tables
from ..store.tables import GUARDED_KINDS, utcnow
from .factors import KeyFactorRepository

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

_G = tables.guarded_entries

def _variants(payload: ColumnElement[bytes]) -> Select[Any]:
    return (
        select(_G.c.variant, payload, _G.c.size_bytes, _G.c.checksum, _G.c.signature, _G.c.id)
        .where(_G.c.kind == bindparam("kind"), _G.c.key == bindparam("key"))
        .order_by(_G.c.variant)
    )


#: Hot path: ``(variant, payload, size_bytes, checksum, signature, id)`` of every variant of
#: one key, in Inductor's order (sorted file names). Binds: ``kind``, ``key``.
VARIANTS = _VARIANTS = _variants(_G.c.payload)
#: Hot path on SQLite: the row of :data:`VARIANTS` for the first variant of a key in
#: Inductor's order (the least name: the ``(kind, key, variant)`` index's first entry, ``LIMIT
#: 1``), none for a key not stored. Its payload, size, checksum and signature when the payload
#: is under :data:`~cachedb.store.payload.STREAM_PAYLOAD_BYTES` (stored and uncompressed); else
#: ``NULL`` and :func:`load_streamed_variant` reads it in place, with its size, checksum and
#: signature (:data:`VARIANT_AT`), when Inductor reaches it. SQLite stores ``payload`` before
#: ``size_bytes``, ``checksum`` and ``signature`` in the row, and reaching them walks the
#: payload's overflow pages (~1.4 ms for 20 MB at 4 KiB pages): the condition reads
#: ``length(payload)`` from the row's header first, so a large payload's pages are not read.
#: Inductor stops at the first variant whose guards hold, most often the first: the key's
#: other variants (:data:`LATER_VARIANTS`) are listed only when it asks for more, and the
#: row's last column, the key's number of variants (from the index), says whether there are
#: any. Binds: ``kind``, ``key``.
_STREAM_BYTES = literal_column(str(int(STREAM_PAYLOAD_BYTES)))  # in the SQL text: no bind per use
_OTHER = _G.alias("other_variant")
_INLINE = and_(func.length(_G.c.payload) < _STREAM_BYTES, _G.c.size_bytes < _STREAM_BYTES)
FIRST_VARIANT = (
    select(
        _G.c.variant,
        *(
            case((_INLINE, column), else_=null())
            for column in (_G.c.payload, _G.c.size_bytes, _G.c.checksum, _G.c.signature)
        ),
        _G.c.id,
        select(func.count()).where(_OTHER.c.kind == bindparam("kind"), _OTHER.c.key == bindparam("key"))
        .scalar_subquery(),
    )
    .where(_G.c.kind == bindparam("kind"), _G.c.key == bindparam("key"))
    .order_by(_G.c.variant)
    .limit(literal_column("1"))  # in the SQL text, as below: no binds
    .offset(literal_column("0"))
)
#: Hot path on SQLite: ``(variant, NULL, NULL, NULL, NULL, id)`` of each variant of a key after
#: ``after`` (the first's name) in Inductor's order, from the ``(kind, key, variant)`` index
#: alone (no row is read): each is read in place when Inductor reaches it
#: (:data:`VARIANT_AT`). Binds: ``kind``, ``key``, ``after``.
LATER_VARIANTS = (
    select(_G.c.variant, null(), null(), null(), null(), _G.c.id)
    .where(_G.c.kind == bindparam("kind"), _G.c.key == bindparam("key"), _G.c.variant > bindparam("after"))
    .order_by(_G.c.variant)
)
#: A row of :data:`FIRST_VARIANT` or :data:`LATER_VARIANTS` left ``NULL``: ``(size_bytes,
#: checksum, signature)`` while the row ``id`` is still that variant (its id may name another
#: row once it is deleted).
#: Binds: ``id``, ``kind``, ``key``, ``variant``.
VARIANT_AT = select(_G.c.size_bytes, _G.c.checksum, _G.c.signature).where(
    _G.c.id == bindparam("id"), _G.c.kind == bindparam("kind"), _G.c.key == bindparam("key"),
    _G.c.variant == bindparam("variant"),
)
_EXISTS = select(_G.c.id).where(
    _G.c.kind == bindparam("kind"), _G.c.key == bindparam("key"), _G.c.variant == bindparam("variant")
)
_INSERT = insert(_G)

#: The columns of a new variant (``id`` comes from the database): a
#: :class:`PreparedVariant`'s row plus the two timestamps (:func:`insert_params`).
_INSERT_COLUMNS = (
    "kind", "key", "variant", "guards_expr", "guards_known", "guards_note", "payload", "size_bytes",
    "checksum", "time_taken_ns", "hit_count", "fingerprint_id", "signature", "created_at", "last_used_at",
)


def _insert_new(make: Callable[..., Insert]) -> Insert:
    stmt = make(_G).values({name: bindparam(name) for name in _INSERT_COLUMNS})
    return stmt.on_conflict_do_nothing(index_elements=[_G.c.kind, _G.c.key, _G.c.variant])  # type: ignore[no-any-return]


@functools.cache
def insert_new_for(dialect: str) -> Insert | None:
    """Hot path: store one variant unless that (kind, key, variant) is stored already, in one
    statement (``INSERT ... ON CONFLICT DO NOTHING``, SQLite >= 3.24 and PostgreSQL): no
    existence check inside the write transaction. Binds: :func:`insert_params`. ``None`` for
    another dialect; built on first use per dialect."""
    make = dialect_insert(dialect)
    return None if make is None else _insert_new(make)
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


def _dialect(bind: Session | Connection) -> str:
    """The SQLAlchemy dialect name of the database ``bind`` (a Connection or an ORM Session)
    writes to: the payload level depends on it (:func:`~cachedb.store.payload.guarded_level`)."""
    return connection_of(bind).dialect.name


@dataclass(frozen=True, slots=True)
class PreparedVariant:
    """A variant ready to insert: everything computed outside the write transaction (one
    SHA-256 of the payload for both its name and its checksum, the pickle scan, the zstd
    frame, the signature), so that ``BEGIN IMMEDIATE`` holds the write lock only for the
    INSERT. ``row`` holds the column values but the timestamps."""

    kind: str
    key: str
    variant: str
    row: dict[str, object]


class ScannedPayload(NamedTuple):
    """A pickled entry as a bulk import holds it after checking it, so that storing it hashes
    and scans nothing again: ``checksum`` is the SHA-256 hex digest of the entry's bytes,
    ``variant`` is ``sha256_digest_name`` of that digest (the entry's file name), the guards
    fields and ``time_taken_ns`` are :func:`cachedb.formats.pickle_scan.read_entry_fields` of the
    bytes, ``size_bytes`` their length. ``blob``, when the checker already compressed them, is
    ``pack(payload, level=guarded_level(size_bytes, dialect)).blob``, and ``payload`` may then
    be ``None`` (an import worker sends back the stored frame alone); else ``payload`` holds the
    bytes: :meth:`content` gives them either way.

    A named tuple, not a dataclass: an import makes one per file, and the fields are a row's
    columns in :data:`_SCANNED_COLUMNS` order (kind to time)."""

    kind: str
    key: str
    variant: str
    guards_expr: str | None
    guards_known: bool
    guards_note: str | None
    size_bytes: int
    checksum: str
    time_taken_ns: int | None
    payload: bytes | None
    blob: bytes | None

    def content(self) -> bytes:
        """The entry's bytes: ``payload``, else ``blob`` read back (checked as any stored
        payload; :class:`~cachedb.CorruptPayloadError` if it does not verify)."""
        if self.payload is not None:
            return self.payload
        if self.blob is None:
            raise ValueError(f"{self.kind}/{self.key}/{self.variant}: neither payload nor blob")
        return unpack(self.blob, self.size_bytes, self.checksum, where=f"{self.kind}/{self.key}/{self.variant}")


#: The columns a bulk import writes (:meth:`GuardedEntryRepository.put_many_pickled`): a
#: :class:`ScannedPayload`'s first nine fields, then the stored payload and the rest.
_SCANNED_COLUMNS = (
    "kind", "key", "variant", "guards_expr", "guards_known", "guards_note", "size_bytes", "checksum",
    "time_taken_ns", "payload", "created_at", "last_used_at", "hit_count", "fingerprint_id", "signature",
)


def prepare_pickled(
    kind: str,
    key: str,
    payload: bytes,
    *,
    signer: Signer | None = None,
    fingerprint_id: int | None = None,
    where: str | None = None,
    own: bool = False,
    dialect: str = "sqlite",
) -> PreparedVariant:
    """Hash, scan (:func:`cachedb.formats.pickle_scan.read_entry_fields`, nothing is unpickled),
    compress (at :func:`~cachedb.store.payload.guarded_level` for a ``dialect`` database) and sign
    one pickled entry, touching no database. From 1 MiB on a host with more than one CPU the
    compression runs on a helper thread while the payload is hashed and read
    (:class:`~cachedb.store.payload.PackingAside`).

    ``own``: ``payload`` is what this process's torch just pickled (a live write): its fields
    are read by :func:`cachedb.formats.own_pickle.read_own_entry_fields` (the C unpickler over inert
    stand-ins, same result) instead of the opcode walk.

    Raises:
        ValueError: unknown ``kind``.
        PickleScanError: a truncated or malformed pickle.
    """
    _check_kind(kind)
    # a large payload is compressed on a helper thread while this one hashes and reads it
    with PackingAside(payload, guarded_level(len(payload), dialect)) as aside:
        digest = hashlib.sha256(payload).digest()
        variant = sha256_digest_name(digest)
        read_fields = read_own_entry_fields if own else read_entry_fields
        fields = read_fields(payload, where=where or f"{kind}/{key}")
        packed = aside.packed(digest)
    row: dict[str, object] = {
        "kind": kind, "key": key, "variant": variant,
        "guards_expr": fields.guards_expr, "guards_known": fields.guards_known,
        "guards_note": fields.reason, "payload": packed.blob, "size_bytes": packed.size_bytes,
        "checksum": packed.checksum, "time_taken_ns": fields.time_taken_ns, "hit_count": 0,
        "fingerprint_id": fingerprint_id,
        "signature": signer.guarded(kind, key, variant, packed.checksum) if signer else None,
    }
    return PreparedVariant(kind, key, variant, row)


def insert_params(prepared: PreparedVariant) -> dict[str, object]:
    """The binds of :func:`insert_new_for` for ``prepared`` (written now)."""
    now = utcnow()
    return {**prepared.row, "created_at": now, "last_used_at": now}


def _signed_where(
    signer: Signer | None, kind: str, key: str, variant: str, digest: str, signature: str | None
) -> str:
    """The variant's name for errors, ``"<kind>/<key>/<variant>"``, once its signature verifies
    under ``signer`` (none: nothing to verify). Raises :class:`~cachedb.CorruptPayloadError`."""
    where = f"{kind}/{key}/{variant}"
    if signer is not None and not signer.verify(signature, "guarded", kind, key, variant, digest):
        raise CorruptPayloadError(where, "signature does not verify under CACHEDB_HMAC_KEY")
    return where


def load_variant(
    signer: Signer | None, kind: str, key: str, variant: str, blob: bytes, size: int, digest: str,
    signature: str | None, *, full: bool = False,
) -> bytes:
    """The payload bytes of one stored variant (a row of :data:`VARIANTS`), signature and
    checksum verified (:func:`cachedb.store.payload.unpack`; with a ``signer``, or ``full``, by the
    SHA-256 of the content, since the signature signs that digest). Raises
    :class:`~cachedb.CorruptPayloadError` when either fails."""
    where = _signed_where(signer, kind, key, variant, digest, signature)
    return unpack(blob, size, digest, where=where, full=full or signer is not None)


def load_streamed_variant(
    signer: Signer | None, kind: str, key: str, variant: str, source: BlobSource, size: int, digest: str,
    signature: str | None,
) -> bytes:
    """:func:`load_variant` of a payload read in place (a row of :data:`FIRST_VARIANT` or
    :data:`LATER_VARIANTS` whose payload is ``NULL``; ``source``: its ``sqlite3.Blob``;
    ``size``, ``digest``, ``signature``: its :data:`VARIANT_AT` row), decompressed as it is read
    (:func:`cachedb.store.payload.unpack_from`): the stored frame is never copied whole into
    memory. Raises :class:`~cachedb.CorruptPayloadError` as :func:`load_variant` does."""
    where = _signed_where(signer, kind, key, variant, digest, signature)
    return unpack_from(source, size, digest, where=where, full=signer is not None)


#: Orders :meth:`GuardedEntryRepository.plan_evict` evicts in: ``lru`` the least recently used
#: first; ``value`` the variants worth least per stored byte first (:func:`eviction_value`).
EVICTION_ORDERS = ("lru", "value")

#: The half-life of a variant's hits in the ``value`` order: a variant last used this long ago
#: counts half its hits.
DEFAULT_HALF_LIFE = dt.timedelta(days=7)


def eviction_value(time_taken_ns: int | None, hits: int, stored_bytes: int, age: dt.timedelta,
                   half_life: dt.timedelta = DEFAULT_HALF_LIFE) -> float:
    """What keeping one variant is worth per stored byte, in seconds of compile per byte:
    ``compile_s × (hits + 1) × 2 ** (-age / half_life) / stored_bytes``.

    ``compile_s`` is the compile time torch recorded (``time_taken_ns`` / 10^9; 0 where it
    recorded none, so such variants go first); ``hits + 1`` counts the write as the first use,
    so a variant not hit yet is ranked by its compile time rather than tied at 0; ``age`` is the
    time since its last use (hit or write; a negative age counts as 0), which halves the weight
    of its hits every ``half_life``: the schema keeps a hit count and the last use, not a time
    per hit, so the hits decay together. ``stored_bytes`` is the compressed payload (at least 1).
    Raises ``ValueError`` for a ``half_life`` that is not positive."""
    if half_life <= dt.timedelta(0):
        raise ValueError("half_life must be positive")
    decay = 0.5 ** (max(age.total_seconds(), 0.0) / half_life.total_seconds())
    return (time_taken_ns or 0) / 1e9 * (hits + 1) * decay / max(stored_bytes, 1)


@dataclass
class GuardedEviction:
    """The variants an eviction deletes (:meth:`GuardedEntryRepository.plan_evict`): their ids,
    and per kind how many and their stored bytes, beside what the kind holds."""

    ids: list[int] = field(default_factory=list)
    entries: dict[str, int] = field(default_factory=dict)
    stored_bytes: dict[str, int] = field(default_factory=dict)
    total_entries: dict[str, int] = field(default_factory=dict)
    total_bytes: dict[str, int] = field(default_factory=dict)


class GuardedEntryRepository:
    """FX graph and AOTAutograd variants. With a :class:`~cachedb.store.signing.Signer`, writes are
    signed and reads refuse (as corrupt) entries whose signature does not verify."""

    def __init__(self, session: Session | Connection, signer: Signer | None = None) -> None:
        self.session = session
        self.signer = signer

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
        digest = hashlib.sha256(payload).digest()
        variant = sha256_digest_name(digest)
        params = {"kind": kind, "key": key, "variant": variant}
        if prebuilt.fetch(self.session, _EXISTS, params):
            return variant, False
        dialect = _dialect(self.session)
        packed = pack(payload, digest=digest, level=guarded_level(len(payload), dialect))
        now = utcnow()
        row = {
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
            "signature": self.signer.guarded(kind, key, variant, packed.checksum) if self.signer else None,
        }
        return variant, self._insert(row, dialect)

    def put_many_pickled(self, entries: Sequence[ScannedPayload], *, fingerprint_id: int | None = None) -> list[bool]:
        """Store many scanned pickled entries at once (bulk import): one query per 500 keys
        finds the variants already stored, one bulk INSERT (:func:`cachedb.store.bulk.bulk_insert_values`)
        adds the rest. Nothing is hashed or scanned again: the checksum, variant name and fields
        are the caller's (:class:`ScannedPayload`); an entry without its ``blob`` is compressed
        here (only if it is added). Returns, per entry, whether it was added.

        The INSERT runs without a SAVEPOINT: on a database where another writer may insert
        the same variant meanwhile (PostgreSQL), it can raise ``IntegrityError``; the caller
        then stores the entries one by one (:meth:`put`)."""
        for entry in entries:
            _check_kind(entry.kind)
        keys = sorted({entry.key for entry in entries})
        kinds = sorted({entry.kind for entry in entries})
        existing: set[tuple[str, str, str]] = set()
        for start in range(0, len(keys), 500):
            chunk = keys[start:start + 500]
            # kind and key: a search of the (kind, key, variant) index, not a scan of all of it
            existing.update(
                (k, key, v) for k, key, v in self.session.execute(
                    select(_G.c.kind, _G.c.key, _G.c.variant).where(_G.c.kind.in_(kinds), _G.c.key.in_(chunk))
                )
            )
        rows: list[list[Any]] = []
        added: list[bool] = []
        now = utcnow()
        signer, dialect = self.signer, _dialect(self.session)
        for entry in entries:
            kind, key, variant = entry[0], entry[1], entry[2]
            if (kind, key, variant) in existing:
                added.append(False)
                continue
            existing.add((kind, key, variant))
            blob = entry.blob
            if blob is None:
                content = entry.content()
                blob = pack(content, digest=bytes.fromhex(entry.checksum), level=guarded_level(len(content), dialect)).blob
            # the first nine fields are the first nine columns (_SCANNED_COLUMNS)
            rows.append([*entry[:9], blob, now, now, 0, fingerprint_id,
                         signer.guarded(kind, key, variant, entry.checksum) if signer else None])
            added.append(True)
        if rows:
            bind = self.session
            bulk_insert_values(connection_of(bind), _G, _SCANNED_COLUMNS, rows)
        return added

    def put_prepared(self, prepared: PreparedVariant) -> tuple[str, bool]:
        """Store a :class:`PreparedVariant` (one INSERT). Returns ``(variant, inserted)``;
        False when that variant was already stored."""
        return prepared.variant, self._insert(insert_params(prepared), _dialect(self.session))

    def _insert(self, row: dict[str, Any], dialect: str) -> bool:
        """INSERT the variant ``row`` (:data:`_INSERT_COLUMNS`) unless its (kind, key, variant)
        is stored; whether it was added. One ``INSERT ... ON CONFLICT DO NOTHING`` where the
        dialect has it (:func:`insert_new_for`), run on the driver; elsewhere an INSERT in a
        SAVEPOINT, since another writer may insert the same variant first."""
        insert_new = insert_new_for(dialect)
        if insert_new is not None:
            return prebuilt.execute(self.session, insert_new, row) > 0
        try:
            with self.session.begin_nested():
                self.session.execute(_INSERT, row)
        except IntegrityError:
            return False
        return True

    def put_pickled(
        self, kind: str, key: str, payload: bytes, *, fingerprint_id: int | None = None, where: str | None = None
    ) -> tuple[str, bool]:
        """:meth:`put` with ``guards_expr`` and the compile time read from the pickle's opcode
        stream (:func:`cachedb.formats.pickle_scan.read_entry_fields`; nothing is unpickled).
        Raises :class:`~cachedb.PickleScanError` for a truncated or malformed pickle."""
        fields = read_entry_fields(payload, where=where or f"{kind}/{key}")
        return self.put(
            kind,
            key,
            payload,
            guards_expr=fields.guards_expr,
            guards_known=fields.guards_known,
            guards_note=fields.reason,
            time_taken_ns=fields.time_taken_ns,
            fingerprint_id=fingerprint_id,
        )

    def candidates(self, kind: str, key: str) -> list[tuple[str, bytes]]:
        """``[(variant, payload bytes), ...]`` of ``key`` in Inductor's candidate order
        (sorted variant names, as ``GuardedCache.iterate_over_candidates`` lists files).

        Raises :class:`~cachedb.CorruptPayloadError` for a payload that fails its checksum.
        """
        return [(variant, load()) for variant, load in self.raw_candidates(kind, key)]

    def raw_candidates(self, kind: str, key: str, *, full: bool = False) -> list[tuple[str, Callable[[], bytes]]]:
        """Like :meth:`candidates`, but each payload is decompressed and verified only when
        its loader is called (raising :class:`~cachedb.CorruptPayloadError` then). ``full``:
        verify by the SHA-256 of the content (``cachedb verify``)."""
        rows = prebuilt.fetch(self.session, _VARIANTS, {"kind": kind, "key": key})
        out = [
            (v, functools.partial(load_variant, self.signer, kind, key, v, blob, size, digest, signature, full=full))
            for v, blob, size, digest, signature, _id in rows
        ]
        out.sort(key=lambda item: item[0])
        return out

    def _load(
        self, kind: str, key: str, variant: str, blob: bytes, size: int, digest: str, signature: str | None
    ) -> bytes:
        return load_variant(self.signer, kind, key, variant, blob, size, digest, signature)

    def quarantine(self, kind: str, key: str, variant: str, reason: str) -> bool:
        """Move a variant to ``quarantined_entries`` (kept for inspection, never served)."""
        g = _G
        row = self.session.execute(
            select(g.c.payload, g.c.size_bytes, g.c.checksum).where(
                g.c.kind == kind, g.c.key == key, g.c.variant == variant
            )
        ).first()
        if row is None:
            return False
        self.session.execute(
            insert(tables.quarantined_entries),
            {"kind": kind, "key": key, "variant": variant, "payload": row.payload,
             "size_bytes": row.size_bytes, "checksum": row.checksum, "reason": reason,
             "quarantined_at": utcnow()},
        )
        self.session.execute(delete(g).where(g.c.kind == kind, g.c.key == key, g.c.variant == variant))
        return True

    def record_hits(self, hits: dict[tuple[str, str, str], tuple[int, dt.datetime]]) -> None:
        """Add ``{(kind, key, variant): (hits, last used)}`` to the hit counts."""
        for (kind, key, variant), (n, when) in hits.items():
            self.session.execute(
                update(_G)
                .where(_G.c.kind == kind, _G.c.key == key, _G.c.variant == variant)
                .values(hit_count=_G.c.hit_count + n, last_used_at=when)
            )

    def stored_total(self) -> int:
        """Stored (compressed) bytes of every variant's payload."""
        return int(self.session.execute(select(func.coalesce(func.sum(func.length(_G.c.payload)), 0))).scalar_one())

    def plan_evict(self, *, max_bytes: int | None = None, older_than: dt.datetime | None = None,
                   order: str = "lru", half_life: dt.timedelta = DEFAULT_HALF_LIFE,
                   now: dt.datetime | None = None) -> GuardedEviction:
        """What :meth:`evict` would delete, deleting nothing: every variant last used before
        ``older_than``, then, until the stored (compressed) payloads total at most
        ``max_bytes``, the least recently used (``order="lru"``) or those worth least per stored
        byte (``order="value"``: :func:`eviction_value` with ``half_life``, ages counted to
        ``now``, default the current time; ties go least recently used first). The ``value``
        order reads one small row per variant into memory (no payload). :meth:`apply_evict`
        deletes it. Raises ``ValueError`` for an order not in :data:`EVICTION_ORDERS` or a
        ``half_life`` that is not positive."""
        if order not in EVICTION_ORDERS:
            raise ValueError(f"order must be one of {', '.join(EVICTION_ORDERS)}, not {order!r}")
        if half_life <= dt.timedelta(0):
            raise ValueError("half_life must be positive")
        stored = func.length(_G.c.payload)
        plan = GuardedEviction()
        for kind, n, nbytes in self.session.execute(select(_G.c.kind, func.count(), func.coalesce(func.sum(stored), 0))
                                                    .group_by(_G.c.kind)):
            plan.total_entries[kind] = int(n)
            plan.total_bytes[kind] = int(nbytes)
        victims: list[tuple[int, str, int]] = []
        if older_than is not None:
            victims += [
                (int(i), k, int(n))
                for i, k, n in self.session.execute(select(_G.c.id, _G.c.kind, stored).where(_G.c.last_used_at < older_than))
            ]
        if max_bytes is not None:
            chosen = {i for i, _, _ in victims}
            total = sum(plan.total_bytes.values()) - sum(n for _, _, n in victims)
            if total > max_bytes:
                for row_id, kind, n in self._eviction_order(order, half_life, now):
                    if total <= max_bytes:
                        break
                    if row_id not in chosen:
                        victims.append((int(row_id), kind, int(n)))
                        total -= int(n)
        for row_id, kind, n in victims:
            plan.ids.append(row_id)
            plan.entries[kind] = plan.entries.get(kind, 0) + 1
            plan.stored_bytes[kind] = plan.stored_bytes.get(kind, 0) + n
        return plan

    def _eviction_order(self, order: str, half_life: dt.timedelta,
                        now: dt.datetime | None) -> Iterator[tuple[int, str, int]]:
        """``(id, kind, stored bytes)`` of every variant, the first to evict first."""
        stored = func.length(_G.c.payload)
        if order == "lru":
            yield from self.session.execute(
                select(_G.c.id, _G.c.kind, stored).order_by(_G.c.last_used_at, _G.c.id).execution_options(yield_per=500))
            return
        now = now or utcnow()
        if now.tzinfo is None:
            now = now.replace(tzinfo=dt.timezone.utc)
        ranked: list[tuple[float, dt.datetime, int, str, int]] = []
        for row_id, kind, n, taken, hits, used in self.session.execute(
            select(_G.c.id, _G.c.kind, stored, _G.c.time_taken_ns, _G.c.hit_count, _G.c.last_used_at)
        ):
            used = used if used.tzinfo else used.replace(tzinfo=dt.timezone.utc)  # SQLite reads naive UTC
            value = eviction_value(taken, int(hits or 0), int(n), now - used, half_life)
            ranked.append((value, used, int(row_id), kind, int(n)))
        ranked.sort()
        for _value, _used, row_id, kind, n in ranked:
            yield row_id, kind, n

    def apply_evict(self, plan: GuardedEviction) -> tuple[int, int]:
        """Delete the variants ``plan`` names (those still there). Returns ``(entries deleted,
        stored bytes freed)``."""
        deleted = freed = 0
        for start in range(0, len(plan.ids), 500):
            chunk = plan.ids[start:start + 500]
            freed += int(self.session.execute(
                select(func.coalesce(func.sum(func.length(_G.c.payload)), 0)).where(_G.c.id.in_(chunk))).scalar_one())
            deleted += self.session.execute(delete(_G).where(_G.c.id.in_(chunk))).rowcount or 0
        if deleted:
            KeyFactorRepository(self.session).delete_orphans()
        return deleted, freed

    def evict(self, *, max_bytes: int | None = None, older_than: dt.datetime | None = None,
              order: str = "lru", half_life: dt.timedelta = DEFAULT_HALF_LIFE) -> tuple[int, int]:
        """Delete variants: every one last used before ``older_than``, then the least recently
        used (or, ``order="value"``, those worth least per byte) until the stored (compressed)
        payloads total at most ``max_bytes`` (:meth:`plan_evict`, then :meth:`apply_evict`).
        Returns ``(entries deleted, stored bytes freed)``."""
        return self.apply_evict(self.plan_evict(max_bytes=max_bytes, older_than=older_than, order=order,
                                                half_life=half_life))

    def variant_names(self, kind: str, key: str) -> list[str]:
        """The stored variants of ``key``, by name (read from the index alone)."""
        return list(self.session.execute(
            select(_G.c.variant).where(_G.c.kind == kind, _G.c.key == key)).scalars())

    def clear(self, kind: str) -> int:
        """Delete every variant of ``kind`` (``fxgraph`` or ``aotautograd``); returns how many."""
        _check_kind(kind)
        n = int(self.session.execute(delete(_G).where(_G.c.kind == kind)).rowcount or 0)
        KeyFactorRepository(self.session).delete_orphans(kind)
        return n

    def record_hit(self, kind: str, key: str, variant: str) -> None:
        self.session.execute(
            _HIT, {"k_kind": kind, "k_key": key, "k_variant": variant, "now": utcnow()}
        )

    def iter_all(self, kind: str | None = None) -> Iterator[StoredVariant]:
        """Every stored variant (payloads verified), ordered by kind, key and variant."""
        stmt = select(
            _G.c.kind, _G.c.key, _G.c.variant, _G.c.payload, _G.c.size_bytes, _G.c.checksum,
            _G.c.guards_expr, _G.c.signature,
        ).order_by(_G.c.kind, _G.c.key, _G.c.variant)
        if kind is not None:
            stmt = stmt.where(_G.c.kind == kind)
        for k, key, variant, blob, size, digest, guards, signature in self.session.execute(
            stmt.execution_options(yield_per=64)
        ):
            payload = self._load(k, key, variant, blob, size, digest, signature)
            yield StoredVariant(k, key, variant, payload, guards)

    def count(self, kind: str | None = None) -> int:
        stmt = select(func.count()).select_from(_G)
        if kind is not None:
            stmt = stmt.where(_G.c.kind == kind)
        return int(self.session.execute(stmt).scalar_one())
