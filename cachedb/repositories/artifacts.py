"""Kernel artifacts: Triton cache directories and C++ kernel libraries, content-addressed.

A kernel *key directory* is the unit: Triton's ``<key>/`` holds ``.source .ttir .ttgir .llir
.ptx .cubin .json`` and ``__grp__<name>.json``; a C++ key holds its ``.so``. Each file is a row
of ``kernel_artifacts`` pointing at a row of ``kernel_blobs`` (one zstd frame per distinct
SHA-256, however many keys share the bytes). :meth:`KernelArtifactRepository.key_files`
fetches a whole key directory in one indexed query.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, delete, exists, func, insert, select, update

from ..keys.factors import CPP_HOST
from .factors import KeyFactorRepository
from ..store import prebuilt
from ..store.bulk import dialect_insert
from ..store.engine import connection_of
from .._errors import CorruptBlobError, CorruptPayloadError
from ..store.payload import pack, unpack
from ..store import tables
from ..store.tables import ARTIFACT_KINDS, utcnow

if TYPE_CHECKING:
    from sqlalchemy import Connection
    from sqlalchemy.orm import Session

_A = tables.kernel_artifacts
_B = tables.kernel_blobs

# Hot path: every file of one key directory with its blob, in one query.
_KEY_FILES = (
    select(_A.c.name, _B.c.sha256, _B.c.payload, _A.c.size_bytes)
    .join_from(_A, _B, _A.c.blob_id == _B.c.id)
    .where(_A.c.kind == bindparam("kind"), _A.c.host_key == bindparam("host_key"), _A.c.key == bindparam("key"))
    .order_by(_A.c.name)
)
_ONE_FILE = _KEY_FILES.where(_A.c.name == bindparam("name"))
_KEY_ROWS = select(_A.c.name, _A.c.blob_id).where(
    _A.c.kind == bindparam("kind"), _A.c.host_key == bindparam("host_key"), _A.c.key == bindparam("key")
)
_HIT = (
    update(_A)
    .where(_A.c.kind == bindparam("k_kind"), _A.c.host_key == bindparam("k_host"), _A.c.key == bindparam("k_key"))
    .values(hit_count=_A.c.hit_count + bindparam("n"), last_used_at=bindparam("now"))
)
#: Blobs no artifact points at (left by eviction, quarantine or an overwritten file).
_ORPHANS = select(_B.c.id, _B.c.stored_bytes).where(~exists().where(_A.c.blob_id == _B.c.id))


@dataclass
class KernelEviction:
    """What an eviction deletes (:meth:`KernelArtifactRepository.plan_evict`): the ``(kind,
    host_key, key)`` directories and the blobs left unused (``unreferenced``: stored bytes of
    those no file pointed at already), and per kind the directories, files and stored bytes,
    beside what the kind holds (``total_bytes``: every blob)."""

    groups: list[tuple[str, str, str]] = field(default_factory=list)
    blob_ids: list[int] = field(default_factory=list)
    keys: dict[str, int] = field(default_factory=dict)
    files: dict[str, int] = field(default_factory=dict)
    stored_bytes: dict[str, int] = field(default_factory=dict)
    unreferenced: int = 0
    total_keys: dict[str, int] = field(default_factory=dict)
    total_files: dict[str, int] = field(default_factory=dict)
    total_bytes: int = 0


@dataclass(frozen=True, slots=True)
class KernelFile:
    """One stored kernel file: where it belongs and its (verified, uncompressed) bytes."""

    kind: str
    host_key: str
    key: str
    name: str
    data: bytes


def _unpack(blob: bytes, size: int, digest: str, where: str) -> bytes:
    try:
        return unpack(blob, size, digest, where=where)
    except CorruptPayloadError as exc:
        raise CorruptBlobError(exc.where, exc.reason, digest) from exc


def _check_kind(kind: str) -> None:
    if kind not in ARTIFACT_KINDS:
        raise ValueError(f"unknown kernel artifact kind {kind!r}; expected one of {ARTIFACT_KINDS}")


def _dialect_insert(session: Any, table: Any) -> Any:
    """``INSERT ... ON CONFLICT DO NOTHING`` for SQLite and PostgreSQL (concurrent writers may
    add the same blob or file first; the first one wins, the others change nothing)."""
    make = dialect_insert(connection_of(session).dialect.name)
    return insert(table) if make is None else make(table).on_conflict_do_nothing()


class KernelArtifactRepository:
    """Reads and writes kernel files on a caller's session or connection; never commits."""

    def __init__(self, session: Session | Connection) -> None:
        self.session = session

    # -- writes ------------------------------------------------------------------------------

    def _blob_ids(self, packed: dict[str, tuple[bytes, int]]) -> dict[str, int]:
        """Ids of the blobs with these SHA-256 hex digests, inserting the missing ones.
        ``packed``: digest → (zstd frame, uncompressed size in bytes)."""
        digests = sorted(packed)
        ids: dict[str, int] = {}
        for start in range(0, len(digests), 500):
            chunk = digests[start:start + 500]
            ids.update((d, i) for d, i in self.session.execute(select(_B.c.sha256, _B.c.id).where(_B.c.sha256.in_(chunk))))
        missing = [d for d in digests if d not in ids]
        if missing:
            now = utcnow()
            self.session.execute(
                _dialect_insert(self.session, _B),
                [{"sha256": d, "payload": packed[d][0], "size_bytes": packed[d][1],
                  "stored_bytes": len(packed[d][0]), "created_at": now} for d in missing],
            )
            for start in range(0, len(missing), 500):
                chunk = missing[start:start + 500]
                ids.update((d, i) for d, i in self.session.execute(select(_B.c.sha256, _B.c.id).where(_B.c.sha256.in_(chunk))))
        return ids

    def put_files(
        self,
        kind: str,
        key: str,
        files: Sequence[tuple[str, bytes]],
        *,
        host_key: str = "",
        fingerprint_id: int | None = None,
    ) -> int:
        """Store the files ``[(name, bytes), ...]`` of key directory ``key``.

        Bytes already stored under another key are not stored again (the file row points at
        the existing blob). A name already stored with other bytes is repointed (the compiler
        rewrote the file). Returns how many files were added or changed (0: all present).
        Raises ``ValueError`` for an unknown ``kind``.
        """
        _check_kind(kind)
        if not files:
            return 0
        digests = {name: hashlib.sha256(data).digest() for name, data in files}
        stored = {name: blob_id for name, blob_id in self.session.execute(
            _KEY_ROWS, {"kind": kind, "host_key": host_key, "key": key}
        )}
        packed: dict[str, tuple[bytes, int]] = {}
        for name, data in files:
            hexdigest = digests[name].hex()
            if hexdigest not in packed:
                p = pack(data, digest=digests[name])
                packed[hexdigest] = (p.blob, p.size_bytes)
        ids = self._blob_ids(packed)
        now = utcnow()
        new_rows, changed, replaced = [], 0, []
        for name, data in files:
            blob_id = ids[digests[name].hex()]
            if name not in stored:
                new_rows.append({
                    "kind": kind, "host_key": host_key, "key": key, "name": name, "blob_id": blob_id,
                    "size_bytes": len(data), "fingerprint_id": fingerprint_id, "created_at": now,
                    "last_used_at": now, "hit_count": 0,
                })
                stored[name] = blob_id
            elif stored[name] != blob_id:
                self.session.execute(
                    update(_A)
                    .where(_A.c.kind == kind, _A.c.host_key == host_key, _A.c.key == key, _A.c.name == name)
                    .values(blob_id=blob_id, size_bytes=len(data), last_used_at=now)
                )
                replaced.append(stored[name])
                stored[name] = blob_id
                changed += 1
        if new_rows:
            result = self.session.execute(_dialect_insert(self.session, _A), new_rows)
            changed += len(new_rows) if result.rowcount is None or result.rowcount < 0 else result.rowcount
        if replaced:
            self._drop_orphans(replaced)
        return changed

    def _drop_orphans(self, blob_ids: Iterable[int] | None = None) -> tuple[int, int]:
        """Delete blobs no file points at (all of them, or among ``blob_ids``).
        Returns ``(blobs deleted, stored bytes freed)``."""
        stmt = _ORPHANS
        if blob_ids is not None:
            stmt = stmt.where(_B.c.id.in_(list(blob_ids)))
        orphans = self.session.execute(stmt).all()
        ids = [int(i) for i, _ in orphans]
        for start in range(0, len(ids), 500):
            self.session.execute(delete(_B).where(_B.c.id.in_(ids[start:start + 500])))
        return len(ids), sum(int(n) for _, n in orphans)

    def record_hits(self, hits: dict[tuple[str, str, str], tuple[int, dt.datetime]]) -> None:
        """Add ``n`` serves and set the last use of each ``(kind, host_key, key)`` directory."""
        if hits:
            self.session.execute(_HIT, [
                {"k_kind": kind, "k_host": host, "k_key": key, "n": n, "now": when}
                for (kind, host, key), (n, when) in hits.items()
            ])

    # -- reads -------------------------------------------------------------------------------

    def key_files(self, kind: str, key: str, *, host_key: str = "") -> dict[str, bytes]:
        """Every file of key directory ``key`` as ``{name: bytes}`` (empty: not stored), in
        one query. Raises :class:`~cachedb.CorruptBlobError` naming the first file whose
        bytes fail their SHA-256 (the caller serves none of the directory then)."""
        rows = prebuilt.fetch(self.session, _KEY_FILES, {"kind": kind, "host_key": host_key, "key": key})
        return {name: _unpack(blob, size, digest, f"{kind}/{key}/{name}")
                for name, digest, blob, size in rows}

    def get_file(self, kind: str, key: str, name: str, *, host_key: str = "") -> bytes | None:
        """One file's bytes, or ``None``. Raises :class:`~cachedb.CorruptBlobError`."""
        rows = prebuilt.fetch(self.session, _ONE_FILE, {"kind": kind, "host_key": host_key, "key": key, "name": name})
        if not rows:
            return None
        name, digest, blob, size = rows[0]
        return _unpack(blob, size, digest, f"{kind}/{key}/{name}")

    def iter_all(self, kind: str | None = None) -> Iterator[KernelFile]:
        """Every stored file (bytes verified), ordered by kind, host key, key and name.
        Raises :class:`~cachedb.CorruptBlobError` at the first damaged blob."""
        stmt = (
            select(_A.c.kind, _A.c.host_key, _A.c.key, _A.c.name, _B.c.sha256, _B.c.payload, _A.c.size_bytes)
            .join_from(_A, _B, _A.c.blob_id == _B.c.id)
            .order_by(_A.c.kind, _A.c.host_key, _A.c.key, _A.c.name)
        )
        if kind is not None:
            stmt = stmt.where(_A.c.kind == kind)
        for k, host, key, name, digest, blob, size in self.session.execute(stmt.execution_options(yield_per=64)):
            yield KernelFile(k, host, key, name, _unpack(blob, size, digest, f"{k}/{key}/{name}"))

    def cpp_hosts(self, prefer_host: str | None = None) -> dict[tuple[str, str], str]:
        """For each stored C++ library ``(key, name)``, the host key to export: ``prefer_host``
        where it is stored, else the first in host-key order (metadata only, no payloads)."""
        chosen: dict[tuple[str, str], str] = {}
        for host, key, name in self.session.execute(
            select(_A.c.host_key, _A.c.key, _A.c.name).where(_A.c.kind == "cpp").order_by(_A.c.host_key)
        ):
            if (key, name) not in chosen or host == prefer_host:
                chosen[(key, name)] = host
        return chosen

    def stored_keys(self, kind: str) -> list[tuple[str, str, Any]]:
        """``(key, host key, first stored at)`` of every stored key of ``kind`` (metadata only:
        what ``cachedb misses`` compares a kernel miss with), oldest first."""
        rows = self.session.execute(
            select(_A.c.key, _A.c.host_key, func.min(_A.c.created_at)).where(_A.c.kind == kind)
            .group_by(_A.c.key, _A.c.host_key).order_by(func.min(_A.c.created_at)))
        return [(key, host, at) for key, host, at in rows]

    def check_blobs(self) -> Iterator[tuple[str, str]]:
        """``(sha256, reason)`` of every blob whose frame does not decompress to bytes of its
        size and SHA-256 (``cachedb verify``: the content is hashed, whatever the format)."""
        stmt = select(_B.c.sha256, _B.c.payload, _B.c.size_bytes).order_by(_B.c.id)
        for digest, blob, size in self.session.execute(stmt.execution_options(yield_per=64)):
            try:
                unpack(blob, size, digest, where=f"kernel blob {digest}", full=True)
            except CorruptPayloadError as exc:
                yield digest, exc.reason

    def totals(self) -> list[dict[str, Any]]:
        """Per kind: key directories, files, blobs, uncompressed bytes of the files and stored
        bytes of their distinct blobs."""
        out = []
        for kind, keys, files, size in self.session.execute(
            select(_A.c.kind, func.count(func.distinct(_A.c.host_key + "/" + _A.c.key)), func.count(),
                   func.coalesce(func.sum(_A.c.size_bytes), 0))
            .group_by(_A.c.kind).order_by(_A.c.kind)
        ):
            blobs = select(_A.c.blob_id).where(_A.c.kind == kind).distinct().subquery()
            nblobs, stored = self.session.execute(
                select(func.count(), func.coalesce(func.sum(_B.c.stored_bytes), 0))
                .where(_B.c.id.in_(select(blobs.c.blob_id)))
            ).one()
            out.append({"kind": kind, "keys": int(keys), "files": int(files), "blobs": int(nblobs),
                        "size_bytes": int(size), "stored_bytes": int(stored)})
        return out

    # -- removal -----------------------------------------------------------------------------

    def quarantine_blob(self, sha256: str, reason: str) -> int:
        """Move a damaged blob aside: its payload goes to ``quarantined_entries`` (kind
        ``kernel_blob``, key = the SHA-256), and every key directory holding it is deleted
        (a directory missing one file is useless). Returns the number of files removed."""
        row = self.session.execute(
            select(_B.c.id, _B.c.payload, _B.c.size_bytes).where(_B.c.sha256 == sha256)
        ).first()
        if row is None:
            return 0
        blob_id, payload, size = row
        owners = self.session.execute(
            select(_A.c.kind, _A.c.host_key, _A.c.key).where(_A.c.blob_id == blob_id).distinct()
        ).all()
        removed, freed_blobs = 0, set()
        for kind, host, key in owners:
            freed_blobs.update(b for _, b in self.session.execute(
                _KEY_ROWS, {"kind": kind, "host_key": host, "key": key}))
            removed += self.session.execute(
                delete(_A).where(_A.c.kind == kind, _A.c.host_key == host, _A.c.key == key)
            ).rowcount or 0
        self.session.execute(insert(tables.quarantined_entries).values(
            kind="kernel_blob", key=sha256, variant="", payload=payload, size_bytes=size,
            checksum=sha256, reason=reason, quarantined_at=utcnow(),
        ))
        self._drop_orphans(freed_blobs | {blob_id})
        return removed

    def stored_total(self) -> int:
        """Stored (compressed) bytes of every blob."""
        return int(self.session.execute(select(func.coalesce(func.sum(_B.c.stored_bytes), 0))).scalar_one())

    def plan_evict(self, *, max_bytes: int | None = None, older_than: dt.datetime | None = None) -> KernelEviction:
        """What :meth:`evict` would delete, deleting nothing: every key directory last used
        before ``older_than``, every blob no file points at, then the least recently used key
        directories until the stored blobs total at most ``max_bytes``; a blob goes with the
        last key that uses it (one shared with a kept key stays). :meth:`apply_evict` deletes it."""
        groups = self.session.execute(
            select(_A.c.kind, _A.c.host_key, _A.c.key, func.max(_A.c.last_used_at).label("used"))
            .group_by(_A.c.kind, _A.c.host_key, _A.c.key)
            .order_by("used", _A.c.kind, _A.c.key)
        ).all()
        blobs_of: dict[tuple[str, str, str], list[int]] = {}
        refs: dict[int, int] = {}
        for kind, host, key, blob_id in self.session.execute(select(_A.c.kind, _A.c.host_key, _A.c.key, _A.c.blob_id)):
            blobs_of.setdefault((kind, host, key), []).append(int(blob_id))
            refs[int(blob_id)] = refs.get(int(blob_id), 0) + 1
        stored = {int(i): int(n) for i, n in self.session.execute(select(_B.c.id, _B.c.stored_bytes))}
        plan = KernelEviction()
        for (kind, _host, _key), ids in blobs_of.items():
            plan.total_keys[kind] = plan.total_keys.get(kind, 0) + 1
            plan.total_files[kind] = plan.total_files.get(kind, 0) + len(ids)
        plan.total_bytes = sum(stored.values())
        freed: list[int] = []

        def drop(group: tuple[str, str, str]) -> int:
            kind = group[0]
            plan.groups.append(group)
            plan.keys[kind] = plan.keys.get(kind, 0) + 1
            plan.files[kind] = plan.files.get(kind, 0) + len(blobs_of.get(group, ()))
            n = 0
            for blob_id in blobs_of.get(group, ()):
                refs[blob_id] -= 1
                if refs[blob_id] == 0:
                    freed.append(blob_id)
                    n += stored.get(blob_id, 0)
            plan.stored_bytes[kind] = plan.stored_bytes.get(kind, 0) + n
            return n

        chosen: set[tuple[str, str, str]] = set()
        if older_than is not None:
            cutoff = older_than if older_than.tzinfo else older_than.replace(tzinfo=dt.timezone.utc)
            for kind, host, key, used in groups:
                used_utc = used if used.tzinfo else used.replace(tzinfo=dt.timezone.utc)
                if used_utc < cutoff:
                    chosen.add((kind, host, key))
                    drop((kind, host, key))
        already = set(freed)
        unused = [i for i in stored if refs.get(i, 0) == 0 and i not in already]
        plan.unreferenced = sum(stored[i] for i in unused)
        freed += unused
        if max_bytes is not None:
            total = plan.total_bytes - sum(stored.get(i, 0) for i in freed)
            for kind, host, key, _used in groups:
                if total <= max_bytes:
                    break
                if (kind, host, key) not in chosen:
                    total -= drop((kind, host, key))
        plan.blob_ids = freed
        return plan

    def apply_evict(self, plan: KernelEviction) -> tuple[int, int]:
        """Delete the key directories ``plan`` names, then those of its blobs no file points at
        any more. Returns ``(files deleted, stored bytes freed)``."""
        files = 0
        for kind, host, key in plan.groups:
            files += self.session.execute(
                delete(_A).where(_A.c.kind == kind, _A.c.host_key == host, _A.c.key == key)
            ).rowcount or 0
        freed = 0
        for start in range(0, len(plan.blob_ids), 500):
            freed += self._drop_orphans(plan.blob_ids[start:start + 500])[1]
        KeyFactorRepository(self.session).delete_orphans(CPP_HOST)  # hosts left with no library
        return files, freed

    def evict(self, *, max_bytes: int | None = None, older_than: dt.datetime | None = None) -> tuple[int, int]:
        """Delete least recently used key directories, whole: every one last used before
        ``older_than``, then the oldest until the stored blobs total at most ``max_bytes``;
        then every blob no file points at. A blob shared with a kept key stays
        (:meth:`plan_evict`, then :meth:`apply_evict`). Returns ``(files deleted, stored bytes
        freed)``."""
        return self.apply_evict(self.plan_evict(max_bytes=max_bytes, older_than=older_than))

    def count(self, kind: str | None = None) -> int:
        """Number of stored files (of ``kind``, or all)."""
        stmt = select(func.count()).select_from(_A)
        if kind is not None:
            stmt = stmt.where(_A.c.kind == kind)
        return int(self.session.execute(stmt).scalar_one())
