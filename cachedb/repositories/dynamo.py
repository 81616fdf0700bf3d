"""Dynamo's own caches: one opaque pickle per key, the newer one winning.

======================  =======================  ======================================  ==========
kind                    table                    torch's file under ``cache_dir()``      key
======================  =======================  ======================================  ==========
``pgo``                 ``pgo_profiles``         ``dynamo/code_state_<key>.pkl``         file name
``precompile``          ``dynamo_packages``      ``dynamo/<source id>/entry``            source id
                                                                                         and system
``precompile_refusal``  ``precompile_refusals``  none (cachedb's own record)             as the
                                                                                         package's
======================  =======================  ======================================  ==========

A package written live is keyed ``<source id>.<system tag>`` (:func:`cachedb.keys.package_key`:
torch checks the system a package was built for when it loads it), one imported from torch's
files or a Mega-Cache blob by its source id alone; both name the file ``dynamo/<source
id>/entry``, so an export writes, of a function's packages, the newest
(:func:`newest_per_file`).

A refusal records that torch could not build the package of a function on a system (a JSON
payload of cachedb's: :mod:`cachedb.live._precompile_fallback`); it has no file or Mega-Cache
artifact of torch's, so imports, exports and Mega-Cache blobs hold only :data:`FILE_KINDS`, and
it goes with the database (copy, merge, the remote tier, verify, prune).

The file kinds are named after their Mega-Cache artifact types (torch/compiler/_cache.py). A row's
``payload`` is the pickle torch wrote, stored as any payload (:mod:`cachedb.store.payload`:
zstd frame, size, SHA-256 checksum; signed under ``CACHEDB_HMAC_KEY``) and handed back to torch
as it is: cachedb never unpickles it, and so never merges two of them. Torch rewrites a profile
whole (the one it loaded plus what it learned, merged by ``FrameStateSizeEntry.__ior__``,
torch/_dynamo/pgo.py) and keeps the last file written; here too one row per key, and of two
rows of one key the one with the newer ``updated_at`` wins (a live write, an import of a newer
file, ``cachedb merge``, the remote tier).
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import Table, bindparam, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from .._errors import BadInputError, CorruptPayloadError
from ..store import prebuilt, tables
from ..store.bulk import utc as _utc
from ..store.payload import Packed, pack, unpack
from ..store.signing import Signer
from ..store.tables import DYNAMO_TABLES, utcnow
from ..keys.dynamo_package import package_source_id
from ..keys.factors import PACKAGE_SYSTEM
from .factors import KeyFactorRepository

if TYPE_CHECKING:
    from sqlalchemy import Connection
    from sqlalchemy.orm import Session

#: The kinds.
KINDS = tuple(DYNAMO_TABLES)
#: The kinds torch keeps in files under ``cache_dir()`` and in Mega-Cache blobs, by artifact type.
FILE_KINDS = ("pgo", "precompile")
#: How each kind is named in reports (``cachedb stats``, import and export counts).
LABELS = {"pgo": "pgo_profile", "precompile": "dynamo_package", "precompile_refusal": "precompile_refusal"}

#: ``code_state_path`` (torch/_dynamo/pgo.py) replaces these in the PGO cache key.
_PGO_UNSAFE = re.compile(r'[<>:"/\\|?*]')
#: ``dynamo/code_state_<key>.pkl``: a PGO profile file (the key is group 1).
PGO_FILE = re.compile(r"code_state_(.+)\.pkl")
#: A package key: one path component (torch's are 64 hex digits).
PACKAGE_KEY = re.compile(r"[A-Za-z0-9_.-]+")


def pgo_key(cache_key: str) -> str:
    """The key of the PGO profile of torch's cache key ``cache_key`` (``get_cache_key``,
    torch/_dynamo/pgo.py: ``f"{job_id}:{rank}:{cache_key_tag}"``): the part of its file name
    ``code_state_path`` makes of it, ``code_state_<key>.pkl`` (``<>:"/\\|?*`` become ``_``).
    Idempotent: the key of a key is itself, so a Mega-Cache artifact keyed either way lands
    on the same row."""
    return _PGO_UNSAFE.sub("_", cache_key)


def table_of(kind: str) -> Table:
    """The table of ``kind`` (``ValueError`` for another kind)."""
    try:
        return tables.metadata.tables[DYNAMO_TABLES[kind]]
    except KeyError:
        raise ValueError(f"unknown Dynamo cache kind {kind!r}; expected one of {KINDS}") from None


def check_key(kind: str, key: str) -> None:
    """Raise :class:`~cachedb.BadInputError` unless ``key`` can name a row of ``kind``: a PGO key
    as torch's file name holds it (no ``<>:"/\\|?*``, no control character), at most as long
    as the column."""
    limit = table_of(kind).c.key.type.length
    if not key or len(key) > limit or any(ord(ch) < 32 for ch in key):
        raise BadInputError(key or "<empty>", f"not a {kind} key: 1 to {limit} printable characters")
    if kind == "pgo" and _PGO_UNSAFE.search(key):
        raise BadInputError(key, 'not a PGO key as its file name holds it (no <>:"/\\|?*)')
    if kind in ("precompile", "precompile_refusal") and (not PACKAGE_KEY.fullmatch(key) or key in (".", "..")):
        raise BadInputError(key, "not a package key: one directory name (a source id)")


def newest_per_file(kind: str, rows: Iterator[tuple[str, bytes, dt.datetime]]) -> Iterator[tuple[str, bytes, dt.datetime]]:
    """Of ``rows`` (``(key, pickle, updated_at)``, as :meth:`DynamoRepository.iter_all` gives
    them), the newest of those that :func:`file_of` puts in one file (a function's packages of
    several systems), in key order; every row of a kind whose keys each name their own file."""
    if kind != "precompile":
        yield from rows
        return
    newest: dict[str, tuple[str, bytes, dt.datetime]] = {}
    for row in rows:
        path = file_of(kind, row[0])
        if path not in newest or row[2] > newest[path][2]:
            newest[path] = row
    yield from sorted(newest.values())


def file_of(kind: str, key: str) -> str:
    """The path, relative to ``cache_dir()``, of the file torch keeps the entry ``key`` in
    (``ValueError`` for a kind torch keeps no file of)."""
    if kind == "pgo":
        return f"dynamo/code_state_{key}.pkl"
    if kind == "precompile":  # one file per function: the system tag is not in torch's name
        return f"dynamo/{package_source_id(key)}/entry"
    raise ValueError(f"unknown Dynamo cache kind {kind!r}")


@dataclass
class DynamoEviction:
    """The rows of one kind an eviction deletes (:meth:`DynamoRepository.plan_evict`): their
    ids, how many and their stored bytes, beside what the kind holds."""

    kind: str
    ids: list[int] = field(default_factory=list)
    entries: int = 0
    stored_bytes: int = 0
    total_entries: int = 0
    total_bytes: int = 0


class Statements(NamedTuple):
    """The prebuilt statements of one kind's table (:mod:`cachedb.store.prebuilt`)."""

    #: Hot path: ``(payload, size_bytes, checksum, signature)`` of one key. Binds: ``key``.
    get: Any
    #: ``(id, checksum, updated_at)`` of one key. Binds: ``key``.
    found: Any
    #: One served key's hits. Binds: ``k_key``, ``n``, ``now``.
    hit: Any


@functools.cache
def statements(kind: str) -> Statements:
    t = table_of(kind)
    return Statements(
        get=select(t.c.payload, t.c.size_bytes, t.c.checksum, t.c.signature).where(t.c.key == bindparam("key")),
        found=select(t.c.id, t.c.checksum, t.c.updated_at).where(t.c.key == bindparam("key")),
        hit=update(t).where(t.c.key == bindparam("k_key"))
        .values(hit_count=t.c.hit_count + bindparam("n"), last_used_at=bindparam("now")),
    )


def checked(
    signer: Signer | None, kind: str, key: str, blob: bytes, size: int, digest: str, signature: str | None,
    *, full: bool = False,
) -> bytes:
    """The pickle of one stored row (its ``payload``, ``size_bytes``, ``checksum``,
    ``signature``), signature and checksum verified (with a ``signer``, or ``full``, by the
    SHA-256 of the content, since the signature signs that digest). Raises
    :class:`~cachedb.CorruptPayloadError` naming ``<kind>/<key>`` when either fails."""
    where = f"{kind}/{key}"
    if signer is not None and not signer.verify(signature, "dynamo", kind, key, digest):
        raise CorruptPayloadError(where, "signature does not verify under CACHEDB_HMAC_KEY")
    return unpack(blob, size, digest, where=where, full=full or signer is not None)


class DynamoRepository:
    """The rows of one of Dynamo's caches (``kind``: :data:`KINDS`). With a
    :class:`~cachedb.store.signing.Signer`, writes are signed and reads refuse (as corrupt) rows
    whose signature does not verify."""

    def __init__(self, session: Session | Connection, kind: str, signer: Signer | None = None) -> None:
        self.session = session
        self.kind = kind
        self.table = table_of(kind)
        self.signer = signer

    def put(
        self, key: str, data: bytes, *, fingerprint_id: int | None = None, updated_at: dt.datetime | None = None,
        packed: Packed | None = None,
    ) -> bool:
        """Store the pickle ``data`` under ``key`` unless a newer one is stored: a stored row
        with other bytes is replaced when ``updated_at`` (default now) is newer than its own
        (a tie keeps it). Returns whether anything changed (False: the same bytes, or a newer
        row, were stored). ``fingerprint_id``: the writer's system fingerprint (``None``: unknown;
        a replaced row keeps its own). ``packed``: ``pack(data)``, made by the caller before its
        write transaction (default: made here). Raises :class:`~cachedb.BadInputError` for a key
        that cannot be one (:func:`check_key`)."""
        check_key(self.kind, key)
        t = self.table
        if packed is None:
            packed = pack(bytes(data))
        when = _utc(updated_at) if updated_at is not None else utcnow()
        columns = {
            "payload": packed.blob, "size_bytes": packed.size_bytes, "checksum": packed.checksum,
            "signature": self.signer.dynamo(self.kind, key, packed.checksum) if self.signer else None,
            "fingerprint_id": fingerprint_id, "updated_at": when,
        }
        found = self.session.execute(statements(self.kind).found, {"key": key}).first()
        if found is None:
            row = {"key": key, **columns, "created_at": when, "last_used_at": when, "hit_count": 0}
            try:
                with self.session.begin_nested():  # another writer may insert the key first
                    self.session.execute(insert(t), row)
                return True
            except IntegrityError:
                found = self.session.execute(statements(self.kind).found, {"key": key}).first()
                if found is None:
                    raise
        if found.checksum == packed.checksum or when <= _utc(found.updated_at):
            return False
        if fingerprint_id is None:  # unknown: the row keeps the one it has
            del columns["fingerprint_id"]
        self.session.execute(update(t).where(t.c.id == found.id).values(columns))
        return True

    def get(self, key: str, *, full: bool = False) -> bytes | None:
        """The pickle stored under ``key``, or ``None``; raises
        :class:`~cachedb.CorruptPayloadError` when it fails its checksum or signature."""
        rows = prebuilt.fetch(self.session, statements(self.kind).get, {"key": key})
        if not rows:
            return None
        return checked(self.signer, self.kind, key, *rows[0], full=full)

    def keys(self) -> list[str]:
        return list(self.session.execute(select(self.table.c.key).order_by(self.table.c.key)).scalars())

    def iter_all(self, *, full: bool = False) -> Iterator[tuple[str, bytes, dt.datetime]]:
        """``(key, pickle, updated_at)`` of every row by key, each verified (raises
        :class:`~cachedb.CorruptPayloadError` at the first that fails)."""
        t = self.table
        stmt = select(t.c.key, t.c.payload, t.c.size_bytes, t.c.checksum, t.c.signature, t.c.updated_at)
        for key, blob, size, digest, signature, when in self.session.execute(
            stmt.order_by(t.c.key).execution_options(yield_per=64)
        ):
            yield key, checked(self.signer, self.kind, key, blob, size, digest, signature, full=full), _utc(when)

    def check_all(self) -> Iterator[tuple[str, str]]:
        """``(key, reason)`` of every row whose payload fails its checks (by the SHA-256 of the
        content), reading one row at a time."""
        t = self.table
        for (key,) in self.session.execute(select(t.c.key).order_by(t.c.key)).all():
            try:
                self.get(key, full=True)
            except CorruptPayloadError as exc:
                yield key, exc.reason

    def quarantine(self, key: str, reason: str) -> str | None:
        """Move the row of ``key`` to ``quarantined_entries`` (kind: this kind; variant: its
        checksum), kept for inspection and never served. Returns that checksum, ``None`` if
        there is no row."""
        t = self.table
        row = self.session.execute(
            select(t.c.payload, t.c.size_bytes, t.c.checksum).where(t.c.key == key)
        ).first()
        if row is None:
            return None
        self.session.execute(
            insert(tables.quarantined_entries),
            # the quarantine's key holds 128 characters: a longer PGO key is cut there
            {"kind": self.kind, "key": key[:128], "variant": row.checksum, "payload": row.payload,
             "size_bytes": row.size_bytes, "checksum": row.checksum, "reason": reason, "quarantined_at": utcnow()},
        )
        self.session.execute(delete(t).where(t.c.key == key))
        return str(row.checksum)

    def record_hits(self, hits: dict[str, tuple[int, dt.datetime]]) -> None:
        """Add ``{key: (hits, last used)}`` to the hit counts."""
        stmt = statements(self.kind).hit
        for key, (n, when) in hits.items():
            self.session.execute(stmt, {"k_key": key, "n": n, "now": when})

    def stored_bytes(self) -> int:
        t = self.table
        return int(self.session.execute(select(func.coalesce(func.sum(func.length(t.c.payload)), 0))).scalar_one())

    def plan_evict(self, *, max_bytes: int | None = None, older_than: dt.datetime | None = None) -> DynamoEviction:
        """What :meth:`evict` would delete, deleting nothing: every row last used before
        ``older_than``, then the least recently used until the stored payloads total at most
        ``max_bytes``. :meth:`apply_evict` deletes it."""
        t = self.table
        stored = func.length(t.c.payload)
        n, total = self.session.execute(select(func.count(), func.coalesce(func.sum(stored), 0)).select_from(t)).one()
        plan = DynamoEviction(self.kind, total_entries=int(n), total_bytes=int(total))
        victims: dict[int, int] = {}
        if older_than is not None:
            for row_id, size in self.session.execute(select(t.c.id, stored).where(t.c.last_used_at < older_than)):
                victims[int(row_id)] = int(size)
        if max_bytes is not None:
            left = plan.total_bytes - sum(victims.values())
            if left > max_bytes:
                for row_id, size in self.session.execute(select(t.c.id, stored).order_by(t.c.last_used_at, t.c.id)):
                    if left <= max_bytes:
                        break
                    if int(row_id) not in victims:
                        victims[int(row_id)] = int(size)
                        left -= int(size)
        plan.ids = list(victims)
        plan.entries, plan.stored_bytes = len(victims), sum(victims.values())
        return plan

    def apply_evict(self, plan: DynamoEviction) -> tuple[int, int]:
        """Delete the rows ``plan`` names (those still there). Returns ``(rows deleted, stored
        bytes freed)``."""
        t = self.table
        deleted = freed = 0
        for start in range(0, len(plan.ids), 500):
            chunk = plan.ids[start:start + 500]
            freed += int(self.session.execute(
                select(func.coalesce(func.sum(func.length(t.c.payload)), 0)).where(t.c.id.in_(chunk))).scalar_one())
            deleted += self.session.execute(delete(t).where(t.c.id.in_(chunk))).rowcount or 0
        self._drop_system_factors()
        return deleted, freed

    def _drop_system_factors(self) -> None:
        """Packages only: the factors of the systems no package is stored for any more."""
        if self.kind == "precompile":
            KeyFactorRepository(self.session).delete_orphans(PACKAGE_SYSTEM)

    def evict(self, *, max_bytes: int | None = None, older_than: dt.datetime | None = None) -> tuple[int, int]:
        """Delete least recently used rows (:meth:`plan_evict`, then :meth:`apply_evict`): every
        one last used before ``older_than``, then the oldest until the stored payloads total at
        most ``max_bytes``. Returns ``(rows deleted, stored bytes freed)``."""
        return self.apply_evict(self.plan_evict(max_bytes=max_bytes, older_than=older_than))

    def count(self) -> int:
        return int(self.session.execute(select(func.count()).select_from(self.table)).scalar_one())

    def clear(self) -> int:
        """Delete every row of this kind; returns how many."""
        n = int(self.session.execute(delete(self.table)).rowcount or 0)
        self._drop_system_factors()
        return n
