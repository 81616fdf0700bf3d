"""Autotune best configs, keyed by their path relative to the cache directory."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql import Insert

from ..store import prebuilt
from ..store.bulk import bulk_insert, dialect_insert
from ..store.engine import connection_of
from .._errors import BadInputError, CorruptPayloadError
from ..store.signing import Signer
from ..store import tables
from ..store.tables import utcnow

if TYPE_CHECKING:
    from sqlalchemy import Connection
    from sqlalchemy.orm import Session

_B = tables.best_configs
#: Hot path: ``(content, signature)`` of one best config. Binds: ``key``.
GET_BY_KEY = select(_B.c.content, _B.c.signature).where(_B.c.key == bindparam("key"))
_GET = GET_BY_KEY
#: Hot path: ``(key, content, signature)`` of every best config, at most ``limit`` rows (a
#: process-local copy, :mod:`cachedb.live._best_configs`). Binds: ``limit``.
ALL_CONTENT = select(_B.c.key, _B.c.content, _B.c.signature).limit(bindparam("limit"))
_ROW = select(_B.c.id, _B.c.content).where(_B.c.key == bindparam("key"))
_INSERT = insert(_B)

#: The columns an upsert binds (``id`` comes from the database).
_UPSERT_COLUMNS = (
    "key", "content", "configs_hash", "num_warps", "num_stages", "found_by_coordesc", "time_taken_ms",
    "triton_cache_hash", "kernel_kwargs", "signature", "fingerprint_id", "created_at", "updated_at",
)
#: What a changed config replaces: everything but its key, fingerprint and creation time.
_UPSERT_REPLACED = tuple(c for c in _UPSERT_COLUMNS if c not in ("key", "fingerprint_id", "created_at"))


def _upsert(make: Any) -> Insert:
    stmt = make(_B).values({name: bindparam(name) for name in _UPSERT_COLUMNS})
    return stmt.on_conflict_do_update(  # type: ignore[no-any-return]
        index_elements=[_B.c.key],
        set_={name: stmt.excluded[name] for name in _UPSERT_REPLACED},
        where=_B.c.content != stmt.excluded.content,
    )


@functools.cache
def upsert_for(dialect: str) -> Insert | None:
    """Hot path: store (or replace) one best config in one statement, ``INSERT ... ON CONFLICT
    (key) DO UPDATE ... WHERE content differs`` (SQLite >= 3.24 and PostgreSQL): no read inside
    the write transaction. Binds: :data:`_UPSERT_COLUMNS` (:func:`upsert_params`). ``None``
    for another dialect. Built on first use per dialect (importing PostgreSQL's dialect costs
    a process that only uses SQLite ~20 ms)."""
    make = dialect_insert(dialect)
    return None if make is None else _upsert(make)

#: Keys of a best config that are not Triton ``Config.kwargs``
#: (``AutotuneCache._save``, torch/_inductor/runtime/autotune_cache.py).
NON_KWARG_FIELDS = frozenset(
    {
        "num_warps",
        "num_stages",
        "configs_hash",
        "found_by_coordesc",
        "time_taken_ms",
        "triton_cache_hash",
        "extra_options",
        "num_consumer_groups",
        "num_buffers_warp_spec",
    }
)


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def extract_columns(content: str, *, where: str) -> dict[str, Any]:
    """The queryable columns of a best config's JSON text.

    Raises :class:`~cachedb.BadInputError` naming ``where`` for text that is not a JSON object.
    """
    try:
        data = json.loads(content)
    except ValueError as exc:
        raise BadInputError(where, f"malformed JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BadInputError(where, "a best config must be a JSON object")
    coordesc = data.get("found_by_coordesc")
    triton_hash = data.get("triton_cache_hash")
    configs_hash = data.get("configs_hash")
    return {
        "configs_hash": configs_hash if isinstance(configs_hash, str) else None,
        "num_warps": _int_or_none(data.get("num_warps")),
        "num_stages": _int_or_none(data.get("num_stages")),
        "found_by_coordesc": coordesc if isinstance(coordesc, bool) else None,
        "time_taken_ms": _int_or_none(data.get("time_taken_ms")),
        "triton_cache_hash": triton_hash if isinstance(triton_hash, str) else None,
        "kernel_kwargs": json.dumps({k: v for k, v in data.items() if k not in NON_KWARG_FIELDS}),
    }


def prepare_columns(signer: Signer | None, key: str, content: str) -> dict[str, Any]:
    """The columns of a best config but its key, content and timestamps (extracted fields and
    signature), checked and computed without touching the database, so that a caller can do
    it before its write transaction. Raises :class:`~cachedb.BadInputError` for a key that is
    not a relative path inside the cache directory ending in ``.best_config``, or content that
    is not a JSON object."""
    parts = key.split("/")
    if (
        not key.endswith(".best_config")
        or key.startswith("/")
        or "\\" in key
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise BadInputError(key, "a best config key must be a relative path such as '<k[1:3]>/<name>.best_config'")
    columns = extract_columns(content, where=key)
    columns["signature"] = signer.best_config(key, content) if signer else None
    return columns


def upsert_params(key: str, content: str, columns: dict[str, Any], fingerprint_id: int | None) -> dict[str, Any]:
    """The binds of :func:`upsert_for` for the best config ``content`` at ``key``;
    ``columns``: :func:`prepare_columns` of them."""
    now = utcnow()
    return {"key": key, "content": content, "fingerprint_id": fingerprint_id, "created_at": now,
            "updated_at": now, **columns}


def checked_content(signer: Signer | None, key: str, content: str, signature: str | None) -> str:
    """``content`` of the best config at ``key``, after its signature is checked when ``signer``
    is set. Raises :class:`~cachedb.CorruptPayloadError` when it does not verify."""
    if signer is not None and not signer.verify(
        signature, "best_config", key, hashlib.sha256(content.encode("utf-8")).hexdigest()
    ):
        raise CorruptPayloadError(key, "signature does not verify under CACHEDB_HMAC_KEY")
    return content


class BestConfigRepository:
    """Best configs. With a :class:`~cachedb.store.signing.Signer`, writes are signed and reads
    refuse configs whose signature does not verify."""

    def __init__(self, session: Session | Connection, signer: Signer | None = None) -> None:
        self.session = session
        self.signer = signer

    def _check(self, key: str, content: str, signature: str | None) -> str:
        return checked_content(self.signer, key, content, signature)

    def put(
        self, key: str, content: str, *, fingerprint_id: int | None = None, columns: dict[str, Any] | None = None
    ) -> bool:
        """Store (or replace) the best config at ``key`` (``"<k[1:3]>/<name>.best_config"``).
        Returns False if the same content was already stored. Raises
        :class:`~cachedb.BadInputError` for a key that is not a relative path inside the
        cache directory ending in ``.best_config``, or content that is not a JSON object.
        ``columns``: :func:`prepare_columns` of this key and content, computed before the write
        transaction (by default computed here). On SQLite and PostgreSQL one upsert
        (:func:`upsert_for`, as the live put), run on the driver (:mod:`cachedb.store.prebuilt`);
        elsewhere a read, then an INSERT (in a SAVEPOINT: another writer may insert the key
        first) or an UPDATE."""
        if columns is None:
            columns = prepare_columns(self.signer, key, content)
        upsert = upsert_for(connection_of(self.session).dialect.name)
        if upsert is not None:  # one statement, no read first (SQLite, PostgreSQL)
            return prebuilt.execute(self.session, upsert, upsert_params(key, content, columns, fingerprint_id)) > 0
        found = self.session.execute(_ROW, {"key": key}).first()
        now = utcnow()
        if found is None:
            row = {"key": key, "content": content, "fingerprint_id": fingerprint_id,
                   "created_at": now, "updated_at": now, **columns}
            try:
                with self.session.begin_nested():  # another writer may insert the key first
                    self.session.execute(_INSERT, row)
                return True
            except IntegrityError:
                found = self.session.execute(_ROW, {"key": key}).first()
                if found is None:
                    raise
        if found.content == content:
            return False
        self.session.execute(
            update(_B).where(_B.c.id == found.id).values(content=content, updated_at=now, **columns)
        )
        return True

    def put_many(
        self, items: Sequence[tuple[str, str, dict[str, Any]]], *, fingerprint_id: int | None = None
    ) -> list[bool]:
        """Store many ``(key, content, columns)`` at once (bulk import), as :meth:`put` stores
        each: ``columns`` is :func:`prepare_columns` of that key and content (the caller checks
        every item before its write transaction). One query per 500 keys finds the stored
        ones, one bulk INSERT (:func:`cachedb.store.bulk.bulk_insert`) adds the new keys, a stored
        key whose content differs is updated. Returns, per item, whether anything changed.

        Raises ValueError when a key appears twice. The INSERT runs without a SAVEPOINT: on a
        database where another writer may insert the same key meanwhile (PostgreSQL), it can
        raise ``IntegrityError``; the caller then stores the items one by one (:meth:`put`)."""
        keys = [key for key, _, _ in items]
        if len(set(keys)) != len(keys):
            raise ValueError("put_many: a key appears twice")
        found: dict[str, tuple[int, str]] = {}
        for start in range(0, len(keys), 500):
            stmt = select(_B.c.key, _B.c.id, _B.c.content).where(_B.c.key.in_(keys[start:start + 500]))
            found.update((key, (row_id, content)) for key, row_id, content in self.session.execute(stmt))
        now = utcnow()
        rows: list[dict[str, Any]] = []
        changed: list[bool] = []
        for key, content, columns in items:
            stored = found.get(key)
            if stored is None:
                rows.append({"key": key, "content": content, "fingerprint_id": fingerprint_id,
                             "created_at": now, "updated_at": now, **columns})
                changed.append(True)
            elif stored[1] == content:
                changed.append(False)
            else:
                self.session.execute(
                    update(_B).where(_B.c.id == stored[0]).values(content=content, updated_at=now, **columns)
                )
                changed.append(True)
        if rows:
            bind = self.session
            bulk_insert(connection_of(bind), _B, rows)
        return changed

    def get(self, key: str) -> str | None:
        """The JSON text stored at ``key``, or ``None``. Raises
        :class:`~cachedb.CorruptPayloadError` when signing is on and the signature fails."""
        rows = prebuilt.fetch(self.session, _GET, {"key": key})
        return self._check(key, rows[0][0], rows[0][1]) if rows else None

    def iter_all(self) -> Iterator[tuple[str, str]]:
        """``(key, content)`` of every best config, by key."""
        for key, content, signature in self.session.execute(
            select(_B.c.key, _B.c.content, _B.c.signature).order_by(_B.c.key)
        ):
            yield key, self._check(key, content, signature)
