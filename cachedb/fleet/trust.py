"""Trust at the boundary: what a row must carry to cross from another database into a machine.

A compile cache hands its consumers code to run (FX graph and AOTAutograd pickles, Triton
kernels, C++ libraries, Dynamo packages and profiles) and values that steer code generation
(best configs, autotune timings and the descriptions of their choices, LocalCache values,
CUTLASS op lists). Every row of those
tables (:data:`SIGNED_TABLES`) can carry a writer's Ed25519 signature, ``ed25519_signature``
= ``<key id>:<base64>`` over :func:`row_message`: what identifies the row and a SHA-256 of
what it holds.

- **Writers** sign what they send (:func:`sign_bundle`, with ``CACHEDB_SIGNING_KEY``: the remote
  tier's pushes, ``cachedb copy``/``merge --sign``).
- **Consumers** check rows where they cross into the machine (:func:`screen`: a remote pull,
  ``copy``/``merge --require-signed``) against public keys only (``CACHEDB_TRUSTED_KEYS``); a
  row whose signature does not verify under a trusted key, or whose payload does not hash to
  what was signed (SHA-256 of the whole content, not the stored trailer's fast digest), is
  refused. Rows that pass are recorded in the local file's ``row_origins`` under their key
  id, so a local hit costs no public-key operation.
- **Safe by default**: with neither trusted keys nor ``CACHEDB_REMOTE_TRUST=1``
  (``install(remote_trust=True)``) a remote's rows are not taken at all.
- **Revocation**: a live store that opens sweeps (:func:`sweep`) the rows whose origin its
  trust no longer allows (a key removed from ``CACHEDB_TRUSTED_KEYS``, remote trust turned
  off): they are misses, then replaced by what trusted writers hold.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, and_, bindparam, delete, insert, select, update

from .. import settings
from .._errors import CacheDBError, CorruptPayloadError
from ..store import prebuilt
from ..store.bulk import bulk_insert, utc
from ..store.payload import unpack
from ..store.signing import SigningKey, TrustedKeys
from ..store.tables import AUTOTUNE_TIMINGS, metadata, row_origins, utcnow
from .tier_sync import Bundle

log = logging.getLogger("cachedb.fleet")

#: ``1`` takes a remote's unsigned rows (the risk accepted explicitly).
ENV_REMOTE_TRUST = "CACHEDB_REMOTE_TRUST"
#: ``row_origins.origin`` of a row taken unsigned under :data:`ENV_REMOTE_TRUST`.
ACCEPTED = "accepted"

#: What a row's signature covers, per table: the fields of :func:`row_message` (``fp``: the
#: fingerprint's ``fingerprint_key``; ``sha256``: a kernel file's blob; ``content`` is
#: hashed). Payload columns are covered through their SHA-256 ``checksum``.
SIGNED_TABLES: dict[str, tuple[str, ...]] = {
    "guarded_entries": ("kind", "key", "variant", "checksum", "guards_expr"),
    "kernel_artifacts": ("kind", "host_key", "key", "name", "sha256"),
    "best_configs": ("key", "content"),
    "pgo_profiles": ("key", "checksum"),
    "dynamo_packages": ("key", "checksum"),
    "precompile_refusals": ("key", "checksum"),
    "cutlass_op_lists": ("request_key", "checksum"),
    "autotune_timings": ("fp", "op", "inputs", "hint_override", "precision", "choice_hash", "timing_ms",
                         "recorded_at"),
    "local_cache_values": ("fp", "key_path", "value_json"),
    "autotune_choices": ("choice_hash", "name", "description", "info_json"),
}

#: A row's natural key per table, as ``row_origins.row_key`` holds it (a JSON array).
ROW_KEYS: dict[str, tuple[str, ...]] = {
    "guarded_entries": ("kind", "key", "variant"),
    "kernel_artifacts": ("kind", "host_key", "key", "name"),
    "best_configs": ("key",),
    "pgo_profiles": ("key",),
    "dynamo_packages": ("key",),
    "precompile_refusals": ("key",),
    "cutlass_op_lists": ("request_key",),
    "autotune_timings": ("fp", "op", "inputs", "hint_override", "precision", "recorded_at", "choice_hash"),
    "local_cache_values": ("fp", "key_path"),
    "autotune_choices": ("choice_hash",),
}

#: Tables whose rows carry a payload checked against its ``checksum`` at the boundary.
_PAYLOAD_TABLES = frozenset({"guarded_entries", "pgo_profiles", "dynamo_packages", "precompile_refusals",
                             "cutlass_op_lists"})


class TrustRefusedError(CacheDBError):
    """Rows of a source did not carry a signature a trusted key verifies (``cachedb copy``/
    ``merge --require-signed``); nothing was written. The message names the source and the
    first row."""


def _field(value: Any) -> str:
    if value is None:
        return "\x00"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, dt.datetime):
        return utc(value).isoformat(timespec="microseconds")
    if isinstance(value, float):
        return value.hex()
    return str(value)


def _value(table: str, row: dict[str, Any], name: str) -> Any:
    if name == "fp":
        fp = row.get("fp")
        return fp["fingerprint_key"] if fp else None
    if name == "content" and table == "best_configs":
        return hashlib.sha256(row["content"].encode("utf-8")).hexdigest()
    if name == "timing_ms":
        return float(row["timing_ms"])
    return row.get(name)


def row_message(table: str, row: dict[str, Any]) -> bytes:
    """The bytes a row's Ed25519 signature signs: ``cachedb-row-v1``, the table and the
    :data:`SIGNED_TABLES` fields of ``row`` (a row as :func:`cachedb.fleet.tier_sync.fetch`
    reads it), ``\\x1f``-separated. Raises ``KeyError`` for a table that is not signed."""
    fields = SIGNED_TABLES[table]
    parts = ["cachedb-row-v1", table, *(_field(_value(table, row, f)) for f in fields)]
    return "\x1f".join(parts).encode("utf-8", "surrogatepass")


def row_key(table: str, row: dict[str, Any]) -> str:
    """``row``'s natural key as ``row_origins.row_key`` holds it: a JSON array."""
    return json.dumps([_field(_value(table, row, f)) if f in ("fp", "recorded_at") else row.get(f)
                       for f in ROW_KEYS[table]])


@dataclass(frozen=True)
class TrustPolicy:
    """What a process accepts from another database and signs for one.

    ``trusted``: public keys whose signatures are accepted; ``accept_unsigned``: take rows
    that carry none (``CACHEDB_REMOTE_TRUST=1``); ``signing_key``: this writer's private key."""

    trusted: TrustedKeys | None = None
    accept_unsigned: bool = False
    signing_key: SigningKey | None = None

    @classmethod
    def from_environment(cls, remote_trust: bool | None = None) -> TrustPolicy:
        """From ``CACHEDB_TRUSTED_KEYS``, ``CACHEDB_REMOTE_TRUST`` (or ``remote_trust``) and
        ``CACHEDB_SIGNING_KEY``. Raises :class:`~cachedb.KeyConfigError` for a bad key."""
        accept = bool(settings.value_or_default(ENV_REMOTE_TRUST)) if remote_trust is None else remote_trust
        return cls(TrustedKeys.from_environment(), accept, SigningKey.from_environment())

    @property
    def reads(self) -> bool:
        """Whether anything from another database can be taken at all."""
        return bool(self.trusted) or self.accept_unsigned

    def allows(self, origin: str) -> bool:
        """Whether a row recorded with ``origin`` may still be served."""
        if origin == ACCEPTED:
            return self.accept_unsigned
        if origin.startswith("key:"):
            return self.trusted is not None and origin[4:] in self.trusted.ids
        return False

    def signer_of(self, table: str, row: dict[str, Any]) -> str | None:
        """The trusted key id whose signature on ``row`` verifies, or ``None``."""
        if not self.trusted:
            return None
        return self.trusted.verify(row.get("ed25519_signature"), row_message(table, row))


def sign_rows(table: str, rows: Iterable[dict[str, Any]], key: SigningKey) -> int:
    """Sign, in place, the rows of ``table`` that carry no Ed25519 signature (rows signed by
    another writer keep theirs). Returns how many were signed."""
    if table not in SIGNED_TABLES:
        return 0
    signed = 0
    for row in rows:
        if not row.get("ed25519_signature"):
            row["ed25519_signature"] = key.sign(row_message(table, row))
            signed += 1
    return signed


def sign_bundle(bundle: Bundle, key: SigningKey) -> int:
    """:func:`sign_rows` for the rows of one lookup (:class:`~cachedb.fleet.tier_sync.Bundle`),
    the descriptions of the choices its timings name included."""
    return sign_rows(bundle.entry.table, bundle.rows, key) + sign_rows("autotune_choices", bundle.choices, key)


def _content_ok(table: str, row: dict[str, Any], blobs: dict[str, dict[str, Any]]) -> bool:
    """Whether the payload (or a kernel file's blob) hashes to what the signature covers:
    the SHA-256 of the whole content, never the stored trailer's fast digest."""
    try:
        if table in _PAYLOAD_TABLES:
            unpack(bytes(row["payload"]), int(row["size_bytes"]), row["checksum"], where=table, full=True)
        elif table == "kernel_artifacts":
            blob = blobs.get(row["sha256"])
            if blob is not None:  # a blob the bundle lacks is the local file's own: checked then
                unpack(bytes(blob["payload"]), int(blob["size_bytes"]), row["sha256"], where=table, full=True)
    except (CorruptPayloadError, KeyError, TypeError, ValueError):
        return False
    return True


@dataclass
class Screened:
    """What :func:`screen` let through: ``origins`` per kept row (``key:<id>`` or
    :data:`ACCEPTED`), ``choice_origins`` per kept row of a bundle's ``choices`` (the
    descriptions its timings carry), and how many rows were ``refused`` (first:
    ``first_refused``)."""

    origins: list[str] = field(default_factory=list)
    refused: int = 0
    first_refused: str | None = None
    choice_origins: list[str] = field(default_factory=list)


def screen_rows(table: str, rows: list[dict[str, Any]], policy: TrustPolicy,
                blobs: dict[str, dict[str, Any]] | None = None) -> tuple[list[dict[str, Any]], Screened]:
    """The rows of ``table`` that ``policy`` takes, and what happened: a row is taken when
    its signature verifies under a trusted key and its content hashes to what was signed,
    or, under ``accept_unsigned``, whatever it carries."""
    result = Screened()
    kept: list[dict[str, Any]] = []
    for row in rows:
        origin: str | None = None
        kid = policy.signer_of(table, row)
        if kid is not None and _content_ok(table, row, blobs or {}):
            origin = f"key:{kid}"
        elif policy.accept_unsigned:
            origin = ACCEPTED
        if origin is None:
            result.refused += 1
            if result.first_refused is None:
                result.first_refused = f"{table} {row_key(table, row)}"
            continue
        kept.append(row)
        result.origins.append(origin)
    return kept, result


def screen(bundle: Bundle, policy: TrustPolicy) -> Screened:
    """Keep, in place, the rows of ``bundle`` that ``policy`` takes (:func:`screen_rows`)."""
    table = bundle.entry.table
    kept, result = screen_rows(table, bundle.rows, policy, bundle.blobs)
    bundle.rows = kept
    if bundle.choices:
        held = {r["choice_hash"] for r in kept} if table == "autotune_timings" else set()
        choices, described = screen_rows("autotune_choices", [c for c in bundle.choices if c["choice_hash"] in held],
                                         policy)
        bundle.choices = choices
        result.choice_origins = described.origins
        result.refused += described.refused
        result.first_refused = result.first_refused or described.first_refused
    if table == "cutlass_op_lists":
        held = {r["request_key"] for r in kept}
        bundle.ops = {k: v for k, v in bundle.ops.items() if k in held}
    return result


#: The origin recorded for one row (:func:`record_origins` of one lookup's rows).
DELETE_ORIGIN = delete(row_origins).where(row_origins.c.table_name == bindparam("t"),
                                          row_origins.c.row_key == bindparam("k"))


def record_origins(conn: Connection, table: str, rows: Sequence[dict[str, Any]], origins: Sequence[str]) -> None:
    """Record in the local file (inside the caller's transaction) where ``rows`` came from,
    replacing what was recorded for the same rows."""
    if not rows or table not in ROW_KEYS:
        return
    keys = [row_key(table, r) for r in rows]
    o = row_origins.c
    if len(keys) <= 4:  # one lookup's rows: prebuilt statements (compiled once per process)
        for k in keys:
            prebuilt.execute(conn, DELETE_ORIGIN, {"t": table, "k": k})
    else:
        for start in range(0, len(keys), 500):
            conn.execute(delete(row_origins).where(o.table_name == table, o.row_key.in_(keys[start:start + 500])))
    now = utcnow()
    by_key = dict(zip(keys, origins))
    bulk_insert(conn, row_origins, [{"table_name": table, "row_key": k, "origin": v, "recorded_at": now}
                                    for k, v in by_key.items()])


def record_origin_keys(conn: Connection, origins: Sequence[tuple[str, str, str]]) -> None:
    """:func:`record_origins` from ``(table, row key, origin)`` triples (``cachedb copy``/
    ``merge --require-signed`` into a machine's file)."""
    by_table: dict[str, dict[str, str]] = {}
    for table, key, origin in origins:
        by_table.setdefault(table, {})[key] = origin
    o = row_origins.c
    now = utcnow()
    for table, keyed in by_table.items():
        keys = sorted(keyed)
        for start in range(0, len(keys), 500):
            chunk = keys[start:start + 500]
            conn.execute(delete(row_origins).where(o.table_name == table, o.row_key.in_(chunk)))
            conn.execute(insert(row_origins), [{"table_name": table, "row_key": k, "origin": keyed[k],
                                                "recorded_at": now} for k in chunk])


# -- sweep: rows whose origin is no longer allowed ---------------------------------------------

_T = metadata.tables
_F = _T["system_fingerprints"]


def _delete_row(conn: Connection, table: str, values: list[Any]) -> int:
    """Delete the row of ``table`` whose natural key is ``values`` (as :func:`row_key` wrote it)."""
    names = ROW_KEYS[table]
    given = dict(zip(names, values))
    if table == "autotune_timings":
        k, r, t = _T["autotune_keys"], _T["autotune_runs"], _T["autotune_run_timings"]
        stmt = (
            select(t.c.id, r.c.recorded_at)
            .join_from(t, r, t.c.run_id == r.c.id).join(k, r.c.key_id == k.c.id).join(_F, k.c.fingerprint_id == _F.c.id)
            .where(_F.c.fingerprint_key == given["fp"], k.c.op == given["op"], k.c.inputs == given["inputs"],
                   k.c.precision == given["precision"], t.c.choice_hash == given["choice_hash"],
                   k.c.hint_override.is_(None) if given["hint_override"] is None
                   else k.c.hint_override == given["hint_override"])
        )
        ids = [i for i, at in conn.execute(stmt) if _field(at) == given["recorded_at"]]
        if ids:
            conn.execute(delete(t).where(t.c.id.in_(ids)))
        return len(ids)
    t = _T[table]
    conds = []
    for name, value in given.items():
        if name == "fp":
            fp_id = conn.execute(select(_F.c.id).where(_F.c.fingerprint_key == value)).scalar()
            conds.append(t.c.fingerprint_id == fp_id)
        else:
            conds.append(t.c[name] == value)
    if table == "cutlass_op_lists":
        ops = _T["cutlass_ops"]
        ids = list(conn.execute(select(t.c.id).where(and_(*conds))).scalars())
        if ids:
            conn.execute(delete(ops).where(ops.c.op_list_id.in_(ids)))
    return conn.execute(delete(t).where(and_(*conds))).rowcount or 0


def stale_origins(conn: Connection, policy: TrustPolicy) -> list[str]:
    """The origins recorded in the local file that ``policy`` no longer allows (one query
    over the ``origin`` index)."""
    return [o for o in conn.execute(select(row_origins.c.origin).distinct()).scalars() if not policy.allows(o)]


def sweep(conn: Connection, policy: TrustPolicy, origins: Sequence[str] | None = None) -> int:
    """Delete (inside the caller's transaction) every row whose recorded origin ``policy``
    no longer allows, with its ``row_origins`` record. Returns the rows deleted."""
    stale = stale_origins(conn, policy) if origins is None else list(origins)
    if not stale:
        return 0
    o = row_origins.c
    deleted = 0
    for rid, table, key in conn.execute(select(o.id, o.table_name, o.row_key).where(o.origin.in_(stale))).all():
        if table in ROW_KEYS:
            deleted += _delete_row(conn, table, json.loads(key))
        conn.execute(delete(row_origins).where(o.id == rid))
    return deleted


# -- whole databases: signers, signing in place, checking a source ----------------------------


def signed_rows(conn: Connection, table: str, *, columns: Sequence[str] = ()) -> Iterable[dict[str, Any]]:
    """Every row of ``table`` in the database of ``conn`` as :func:`row_message` reads it
    (its ``id``, the signed fields, ``ed25519_signature`` and the extra ``columns``), in id
    order, streamed. ``autotune_timings`` is read through its view."""
    t = AUTOTUNE_TIMINGS if table == "autotune_timings" else _T[table]
    wanted = {"id", "ed25519_signature", *columns, *SIGNED_TABLES[table], *ROW_KEYS[table]} - {"fp", "sha256"}
    cols: list[Any] = [t.c[name] for name in t.c.keys() if name in wanted]
    source: Any = t
    if "fingerprint_id" in t.c:
        source = source.outerjoin(_F, t.c.fingerprint_id == _F.c.id)
        cols.append(_F.c.fingerprint_key.label("fp_key"))
    if table == "kernel_artifacts":  # the blob's SHA-256 (and, asked for as ``payload``, its bytes)
        blobs = _T["kernel_blobs"]
        source = source.join(blobs, t.c.blob_id == blobs.c.id)
        cols.append(blobs.c.sha256)
        if "payload" in columns:
            cols += [blobs.c.payload.label("blob_payload"), blobs.c.size_bytes.label("blob_size_bytes")]
    stmt = select(*cols).select_from(source).order_by(t.c.id).execution_options(yield_per=500)
    for mapping in conn.execute(stmt).mappings():
        row = dict(mapping)
        if "fp_key" in row:
            fp_key = row.pop("fp_key")
            row["fp"] = {"fingerprint_key": fp_key} if fp_key is not None else None
        yield row


def sign_database(conn: Connection, key: SigningKey) -> dict[str, int]:
    """Sign, in place and inside the caller's transaction, every row of every signed table
    that carries no Ed25519 signature (a writer's own database, before it is copied or merged
    into a shared one: never a database others write). Returns the rows signed per table."""
    out: dict[str, int] = {}
    for table in SIGNED_TABLES:
        target = _T["autotune_run_timings"] if table == "autotune_timings" else _T[table]
        todo = [{"row_id": r["id"], "new_signature": key.sign(row_message(table, r))}
                for r in signed_rows(conn, table) if not r.get("ed25519_signature")]
        if todo:  # one executemany per table
            conn.execute(update(target).where(target.c.id == bindparam("row_id"))
                         .values(ed25519_signature=bindparam("new_signature")), todo)
        out[table] = len(todo)
    return out


def check_source(conn: Connection, policy: TrustPolicy, where: str) -> list[tuple[str, str, str]]:
    """Check every row of a signed table in the database of ``conn`` (named ``where``):
    returns ``(table, row key, origin)`` of each (for :func:`record_origin_keys`); raises
    :class:`TrustRefusedError` when any carries no signature a key of ``policy`` verifies,
    or its payload does not hash to what was signed. Reads every payload once."""
    refused = 0
    first: str | None = None
    origins: list[tuple[str, str, str]] = []
    for table in SIGNED_TABLES:
        extra = ("payload", "size_bytes") if table in _PAYLOAD_TABLES or table == "kernel_artifacts" else ()
        for row in signed_rows(conn, table, columns=extra):
            blobs: dict[str, dict[str, Any]] = {}
            if table == "kernel_artifacts":
                blobs[row["sha256"]] = {"payload": row.pop("blob_payload"), "size_bytes": row.pop("blob_size_bytes")}
            kid = policy.signer_of(table, row)
            if kid is None or not _content_ok(table, row, blobs):
                refused += 1
                first = first or f"{table} {row_key(table, row)}"
            elif not refused:
                origins.append((table, row_key(table, row), f"key:{kid}"))
    if refused:
        raise TrustRefusedError(f"{where}: {refused} row(s) carry no signature a trusted key verifies "
                                f"(first: {first})")
    return origins


def signers(conn: Connection, table: str, trusted: TrustedKeys | None) -> dict[str, int]:
    """How many rows of ``table`` each signer signed: ``<key id> (trusted)`` when ``trusted``
    holds the key and the signature verifies, ``<key id> (fails)`` when it does not,
    ``<key id> (not trusted)``, or ``unsigned``."""
    counts: dict[str, int] = {}
    for row in signed_rows(conn, table):
        signature = row.get("ed25519_signature")
        if not signature:
            name = "unsigned"
        else:
            kid = signature.partition(":")[0]
            if trusted is not None and kid in trusted.ids:
                name = f"{kid} (trusted)" if trusted.verify(signature, row_message(table, row)) else f"{kid} (fails)"
            else:
                name = f"{kid} (not trusted)"
        counts[name] = counts.get(name, 0) + 1
    return counts


__all__ = [
    "ACCEPTED",
    "ENV_REMOTE_TRUST",
    "ROW_KEYS",
    "SIGNED_TABLES",
    "Screened",
    "TrustPolicy",
    "TrustRefusedError",
    "check_source",
    "record_origin_keys",
    "record_origins",
    "row_key",
    "row_message",
    "screen",
    "screen_rows",
    "sign_bundle",
    "sign_database",
    "signed_rows",
    "sign_rows",
    "signers",
    "stale_origins",
    "sweep",
]
