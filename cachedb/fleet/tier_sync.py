"""Point sync of one cache entry between two databases: the rows behind one lookup.

The two tiers of a fleet cache (:mod:`cachedb.live._remote`: a machine's SQLite file in front
of a shared PostgreSQL) move entries one lookup at a time: a local miss *pulls* the entry from
the remote into the local file, a local write *pushes* it to the remote. An :class:`Entry`
names the rows of one lookup (the FX graph variants of one key, the timings of one
``(op, inputs)``, one best config, ...); :func:`fetch` reads them from one database in **one
query** (joined with their fingerprint, and kernel files with their blobs), and :func:`store`
writes them into another in the caller's transaction, by the rules of ``cachedb merge``
(:mod:`cachedb.fleet.copy`):

- rows are matched by natural key, never by id: what DST already holds is kept (guarded
  entries by variant, kernel files by ``(kind, host_key, key, name)``, CUTLASS op lists by
  request key, timings by their whole benchmark, ``recorded_at`` included: history);
- best configs, LocalCache values and Dynamo's caches (PGO profiles, ...): the newer
  ``updated_at`` wins;
- timings carry the descriptions of the choices they name (``autotune_choices``, revision
  0011: :attr:`Bundle.choices`), added where DST has none for a hash (a stored one stays);
- fingerprints are unified by ``fingerprint_key``, kernel blobs by ``sha256`` (a blob DST has
  is never sent again: :func:`missing_blobs` asks first);
- an FX graph / AOTAutograd key carries its factors (``entry_factors``, revision 0013): the
  ``key_factors`` ids of the database read come in the same query (:attr:`Bundle.factor_ids`),
  are looked up there (:func:`resolve_factors`) and stored under DST's own ids, each
  ``(factor, hash)`` found or added in DST (:func:`store_factors`); DST's factors of a key are
  kept.

Payloads (zstd frames), checksums and signatures travel as stored: what DST serves is checked
by DST's ordinary read path, and a signed entry still verifies under the same key. One
exception: :func:`in_form_of` re-encodes a bundle's FX graph / AOTAutograd payloads in DST's
form (:func:`cachedb.store.payload.repacked_guarded`: on SQLite an entry under 1 MiB as it is, on
PostgreSQL compressed), content and SHA-256 (which a signature signs) unchanged, before the
caller opens DST's transaction (compression holds no lock).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Select, bindparam, insert, select, update

from ..keys.factors import Factor
from ..repositories.factors import KeyFactorRepository, id_list
from ..store import prebuilt
from ..store.bulk import bulk_insert
from ..store.bulk import utc as _utc
from .._errors import CorruptPayloadError
from ..store.payload import repacked_guarded
from ..store.tables import AUTOTUNE_TIMINGS, DYNAMO_TABLES, NATURAL_KEY_COLUMNS, NEWEST_WINS_COMPARED, metadata
from ..repositories import choices as choices_repo
from ..repositories import timings as timings_repo
from ..repositories.timings import next_position

#: The tables, and the flat timings view (revision 0004) under its name.
_T = {**metadata.tables, "autotune_timings": AUTOTUNE_TIMINGS}
_F = _T["system_fingerprints"]
_BLOBS = _T["kernel_blobs"]
_OPS = _T["cutlass_ops"]
_EF = _T["entry_factors"]
#: Fingerprint columns carried with a row (``fp_<name>``), all but the id.
_FP_COLUMNS = tuple(c.name for c in _F.c if c.name != "id")
_BLOB_COLUMNS = tuple(c.name for c in _BLOBS.c if c.name != "id")

#: What each kind of entry reads: its table and the columns it filters on.
KINDS = {
    "guarded": ("guarded_entries", ("kind", "key")),
    "timings": ("autotune_timings", ("system_hash", "op", "inputs", "hint_override")),
    "timings_op": ("autotune_timings", ("system_hash", "op")),
    "local_values": ("local_cache_values", ("system_hash", "namespace")),
    "best_config": ("best_configs", ("key",)),
    "cutlass": ("cutlass_op_lists", ("request_key",)),
    # the descriptions of some choice hashes (one value: a tuple of hashes)
    "choices": ("autotune_choices", ("choice_hash",)),
    "kernel": ("kernel_artifacts", ("kind", "host_key", "key")),
    # Dynamo's caches, by Mega-Cache type (cachedb.store.tables.DYNAMO_TABLES)
    **{kind: (table, ("key",)) for kind, table in DYNAMO_TABLES.items()},
}


@dataclass(frozen=True, slots=True)
class Entry:
    """The rows of one lookup: ``kind`` (a key of :data:`KINDS`) and its filter values, in
    the order :data:`KINDS` names the columns (``system_hash`` is the fingerprint's)."""

    kind: str
    values: tuple[Any, ...]

    @property
    def table(self) -> str:
        return KINDS[self.kind][0]

    def __str__(self) -> str:
        return f"{self.kind}{self.values}"


def guarded(kind: str, key: str) -> Entry:
    """Every variant of an FX graph (``kind="fxgraph"``) or AOTAutograd key."""
    return Entry("guarded", (kind, key))


def timings(system_hash: str, op: str, inputs: str, hint_override: int | None) -> Entry:
    """The autotune timings of one ``(op, inputs, hint_override)`` on one system hash (every
    precision, every benchmark: history)."""
    return Entry("timings", (system_hash, op, inputs, hint_override))


def timings_of_op(system_hash: str, op: str) -> Entry:
    """Every autotune timing of ``op`` on one system hash."""
    return Entry("timings_op", (system_hash, op))


def local_values(system_hash: str, namespace: str) -> Entry:
    """The LocalCache values of one top-level key (namespace) on one system hash."""
    return Entry("local_values", (system_hash, namespace))


def best_config(key: str) -> Entry:
    """One best config (``<kernel dir>/<name>.best_config``)."""
    return Entry("best_config", (key,))


def choices(hashes: Iterable[str]) -> Entry:
    """The descriptions (``autotune_choices`` rows) of the choice ``hashes``: what a process
    sends after describing choices whose timings were written before (a timings entry carries
    its choices' own)."""
    return Entry("choices", (tuple(sorted(set(hashes))),))


def cutlass(request_key: str) -> Entry:
    """One CUTLASS op list with its ops."""
    return Entry("cutlass", (request_key,))


def dynamo(kind: str, key: str) -> Entry:
    """One of Dynamo's caches (``kind``: its Mega-Cache type, ``pgo``, ...): the row of ``key``."""
    if kind not in DYNAMO_TABLES:
        raise ValueError(f"unknown Dynamo cache kind {kind!r}")
    return Entry(kind, (key,))


def kernel(kind: str, host_key: str, key: str) -> Entry:
    """Every file of one kernel key directory (``kind`` ``triton`` or ``cpp``)."""
    return Entry("kernel", (kind, host_key, key))


@dataclass
class Bundle:
    """The rows :func:`fetch` read: ``rows`` of the entry's table (ids dropped; ``fp`` holds
    the fingerprint's columns or ``None``; a kernel file's ``sha256`` instead of its blob id),
    ``blobs`` by SHA-256 (kernel files), ``ops`` by request key (CUTLASS op lists),
    ``choices``: the ``autotune_choices`` rows of the choice hashes timings name (ids dropped).

    An FX graph / AOTAutograd key's factors (``entry_factors``): ``factor_ids``, the
    ``key_factors`` ids of the database read (``[]``: none stored), and ``factors``, those
    factors themselves once looked up (:func:`resolve_factors`), which :func:`store` writes."""

    entry: Entry
    rows: list[dict[str, Any]] = field(default_factory=list)
    blobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    ops: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    choices: list[dict[str, Any]] = field(default_factory=list)
    factor_ids: list[int] = field(default_factory=list)
    factors: list[Factor] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.rows)


def _statement(entry: Entry, with_blobs: bool) -> Select[Any]:
    table_name, columns = KINDS[entry.kind]
    t = _T[table_name]
    fp_cols = [_F.c[c].label(f"fp_{c}") for c in _FP_COLUMNS]
    cols: list[Any] = [c for c in t.c if c.name not in ("id", "blob_id")]
    source: Any = t
    if "fingerprint_id" in t.c:
        source = source.outerjoin(_F, t.c.fingerprint_id == _F.c.id)
        cols += fp_cols
    if entry.kind == "guarded":  # the key's factor ids, in the same query (one per variant row)
        cols.append(select(_EF.c.factor_ids).where(_EF.c.kind == t.c.kind, _EF.c.key == t.c.key)
                    .scalar_subquery().label("ef_factor_ids"))
    if entry.kind == "kernel":
        source = source.join(_BLOBS, t.c.blob_id == _BLOBS.c.id)
        cols.append(_BLOBS.c.sha256.label("blob_sha256"))
        if with_blobs:
            cols += [_BLOBS.c[c].label(f"blob_{c}") for c in _BLOB_COLUMNS if c != "sha256"]
    stmt = select(*cols).select_from(source)
    for name, value in zip(columns, entry.values):
        column = _F.c[name] if name == "system_hash" else t.c[name]
        if entry.kind == "choices":
            stmt = stmt.where(column.in_(list(value)))
            continue
        stmt = stmt.where(column.is_(None) if value is None else column == value)
    return stmt.order_by(t.c.id)


def fetch(conn: Connection, entry: Entry, *, with_blobs: bool = True) -> Bundle:
    """The rows of ``entry`` in the database of ``conn``: one query (a CUTLASS op list adds one
    for its ops; an FX graph / AOTAutograd key's ``factor_ids`` come in the same query).
    ``with_blobs=False`` reads kernel files without their blobs' bytes (then
    :func:`missing_blobs` and :func:`fetch_blobs`). An empty bundle is falsy."""
    bundle = bundle_of(entry, conn.execute(_statement(entry, with_blobs)).mappings(), with_blobs=with_blobs)
    if entry.table == "autotune_timings" and bundle.rows:
        bundle.choices = choices_repo.rows_for(conn, {r["choice_hash"] for r in bundle.rows})
    if entry.kind == "cutlass" and bundle.rows:
        lists = _T["cutlass_op_lists"]
        op_cols = [c for c in _OPS.c if c.name not in ("id", "op_list_id")]
        stmt = (
            select(lists.c.request_key, *op_cols)
            .join_from(_OPS, lists, _OPS.c.op_list_id == lists.c.id)
            .where(lists.c.request_key == entry.values[0])
            .order_by(_OPS.c.id)
        )
        for mapping in conn.execute(stmt).mappings():
            values = dict(mapping)
            bundle.ops.setdefault(values.pop("request_key"), []).append(values)
    return bundle


def bundle_of(entry: Entry, mappings: Iterable[Mapping[str, Any]], *, with_blobs: bool = True) -> Bundle:
    """The :class:`Bundle` of ``entry`` from the rows of its :func:`fetch` statement (each a
    mapping of the statement's column labels), the timings' choices and CUTLASS ops aside:
    what :func:`fetch` and :class:`cachedb.fleet.tier_read.DriverReader` make of the rows."""
    bundle = Bundle(entry)
    for mapping in mappings:
        row = {k: v for k, v in mapping.items() if not k.startswith(("fp_", "blob_", "ef_"))}
        if entry.kind == "guarded" and not bundle.factor_ids:
            bundle.factor_ids = id_list(mapping["ef_factor_ids"])
        if entry.kind == "choices":
            bundle.rows.append(row)
            continue
        fp = {c: mapping[f"fp_{c}"] for c in _FP_COLUMNS} if "fp_fingerprint_key" in mapping else None
        row["fp"] = fp if fp is not None and fp["fingerprint_key"] is not None else None
        if entry.kind == "kernel":
            sha = row["sha256"] = mapping["blob_sha256"]
            if with_blobs and sha not in bundle.blobs:
                bundle.blobs[sha] = {c: (sha if c == "sha256" else mapping[f"blob_{c}"]) for c in _BLOB_COLUMNS}
        bundle.rows.append(row)
    return bundle


#: Columns that differ between two copies of the same rows: when each was made or used.
_VOLATILE = frozenset({"created_at", "updated_at", "last_used_at", "hit_count", "time_taken_ns", "time_taken_ms"})


def content_digest(bundle: Bundle) -> bytes:
    """A 16-byte digest of what ``bundle``'s rows hold, less :data:`_VOLATILE` columns (when a
    row was written or last served): equal for the same entry written by two processes that
    stored the same content (the remote would keep one row of each), different once a row was
    added or a value changed."""
    h = hashlib.blake2b(digest_size=16)
    h.update(str(bundle.entry).encode("utf-8", "surrogatepass"))
    for row in bundle.rows:
        for name in sorted(row):
            if name not in _VOLATILE:
                h.update(f"\x1f{name}\x1e".encode())
                value = row[name]
                h.update(value if isinstance(value, bytes) else repr(value).encode("utf-8", "surrogatepass"))
        h.update(b"\x1d")
    for request_key, ops in sorted(bundle.ops.items()):
        h.update(repr((request_key, ops)).encode("utf-8", "surrogatepass"))
    for row in bundle.choices:
        h.update(repr(sorted((k, v) for k, v in row.items() if k not in _VOLATILE)).encode("utf-8", "surrogatepass"))
    return h.digest()


def resolve_factors(conn: Connection, bundle: Bundle, known: dict[int, Factor] | None = None) -> Bundle:
    """``bundle.factors`` from its ``factor_ids``, the ids of the database of ``conn`` (the one
    :func:`fetch` read): those in ``known`` (``{id: Factor}`` of that database) without a
    query, the others with one per 500 (added to ``known``). In place."""
    ids = bundle.factor_ids
    if not ids:
        return bundle
    known = known if known is not None else {}
    unknown = [i for i in ids if i not in known]
    if unknown:
        known.update(KeyFactorRepository(conn).by_id(unknown))
    bundle.factors = [known[i] for i in ids if i in known]
    return bundle


def missing_blobs(conn: Connection, sha256s: Iterable[str]) -> set[str]:
    """The SHA-256s among ``sha256s`` that the database of ``conn`` has no blob for."""
    wanted = sorted(set(sha256s))
    have: set[str] = set()
    for start in range(0, len(wanted), 500):
        chunk = wanted[start:start + 500]
        have.update(conn.execute(select(_BLOBS.c.sha256).where(_BLOBS.c.sha256.in_(chunk))).scalars())
    return set(wanted) - have


def fetch_blobs(conn: Connection, sha256s: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The ``kernel_blobs`` rows (ids dropped) of ``sha256s``, by SHA-256."""
    wanted = sorted(set(sha256s))
    out: dict[str, dict[str, Any]] = {}
    cols = [_BLOBS.c[c] for c in _BLOB_COLUMNS]
    for start in range(0, len(wanted), 500):
        chunk = wanted[start:start + 500]
        for mapping in conn.execute(select(*cols).where(_BLOBS.c.sha256.in_(chunk))).mappings():
            out[mapping["sha256"]] = dict(mapping)
    return out


# -- writing -----------------------------------------------------------------------------------


#: Prebuilt statements of the writes of one lookup's rows (one fingerprint, one key: what a
#: remote lookup brings into a machine's file), compiled once per process and dialect
#: (:mod:`cachedb.store.prebuilt`, and ahead of the first lookup by the live store) instead of
#: once per engine as SQLAlchemy's ``IN`` statements are.
FINGERPRINT_ID = select(_F.c.id).where(_F.c.fingerprint_key == bindparam("key"))
NATURAL_KEYS_OF_KEY = {
    table: select(*(_T[table].c[c] for c in NATURAL_KEY_COLUMNS[table])).where(_T[table].c.key == bindparam("key"))
    for table in ("guarded_entries", "kernel_artifacts")
}
#: Every prebuilt statement of this module.
PREBUILT = (FINGERPRINT_ID, *NATURAL_KEYS_OF_KEY.values())


def _fingerprint_ids(conn: Connection, rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    """DST ids of the fingerprints the rows carry, inserting those DST lacks."""
    fps = {r["fp"]["fingerprint_key"]: r["fp"] for r in rows if r.get("fp") is not None}
    if not fps:
        return {}
    if len(fps) == 1:  # one lookup's rows: a prebuilt point read
        ((key, fp),) = fps.items()
        found = prebuilt.fetch(conn, FINGERPRINT_ID, {"key": key})
        if not found:
            bulk_insert(conn, _F, [fp])
            found = prebuilt.fetch(conn, FINGERPRINT_ID, {"key": key})
        return {key: int(found[0][0])}
    stmt = select(_F.c.fingerprint_key, _F.c.id).where(_F.c.fingerprint_key.in_(sorted(fps)))
    ids = {k: int(i) for k, i in conn.execute(stmt)}
    new = [fp for k, fp in fps.items() if k not in ids]
    if new:
        conn.execute(insert(_F), new)
        ids.update((k, int(i)) for k, i in conn.execute(stmt))
    return ids


def _blob_ids(conn: Connection, bundle: Bundle) -> dict[str, int]:
    shas = sorted({r["sha256"] for r in bundle.rows})
    stmt = select(_BLOBS.c.sha256, _BLOBS.c.id).where(_BLOBS.c.sha256.in_(shas))
    ids = {k: int(i) for k, i in conn.execute(stmt)}
    new = [bundle.blobs[s] for s in shas if s not in ids and s in bundle.blobs]
    if new:
        conn.execute(insert(_BLOBS), new)
        ids.update((k, int(i)) for k, i in conn.execute(stmt))
    return ids


def _utc_values(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` without what :func:`fetch` adds (``fp``), its timestamps aware UTC."""
    return {k: _utc(v) if isinstance(v, dt.datetime) else v for k, v in row.items() if k != "fp"}


def _natural(table: str, row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(_utc(row[c]) for c in NATURAL_KEY_COLUMNS[table])


def store(conn: Connection, bundle: Bundle, *, factor_ids: dict[tuple[str, str], int] | None = None) -> int:
    """Write ``bundle`` into the database of ``conn`` (inside the caller's transaction).

    Returns the number of rows added or replaced (0: DST held it all already). Rows whose
    fingerprint is required and missing, and kernel files whose blob neither DST nor the
    bundle holds, are skipped. An FX graph / AOTAutograd key's ``factors`` are written with
    it where DST has none for the key (their ``key_factors`` rows found by ``(factor, hash)``,
    added where DST lacks them; ``factor_ids``: ``{(factor, hash): id}`` of DST known already,
    :meth:`~cachedb.repositories.factors.KeyFactorRepository.ids`); they are not counted.
    """
    if not bundle.rows:
        return 0
    table = bundle.entry.table
    store_factors(conn, bundle, factor_ids=factor_ids)
    if table == "autotune_choices":
        return choices_repo.insert_missing(conn, [_utc_values(r) for r in bundle.rows])
    t = _T[table]
    fp_ids = _fingerprint_ids(conn, bundle.rows)
    required_fp = table in ("autotune_timings", "local_cache_values")
    rows: list[dict[str, Any]] = []
    for r in bundle.rows:
        values = {k: v for k, v in r.items() if k not in ("fp", "sha256")}
        if "fingerprint_id" in t.c:
            fp = r.get("fp")
            values["fingerprint_id"] = fp_ids.get(fp["fingerprint_key"]) if fp is not None else None
            if required_fp and values["fingerprint_id"] is None:
                continue
        for name, value in values.items():
            if isinstance(value, dt.datetime):
                values[name] = _utc(value)
        rows.append(values)
    if table == "kernel_artifacts":
        blob_ids = _blob_ids(conn, bundle)
        kept = []
        for r, values in zip(bundle.rows, rows):
            if r["sha256"] in blob_ids:
                values["blob_id"] = blob_ids[r["sha256"]]
                kept.append(values)
        rows = kept
    if table == "autotune_timings":
        added = _insert_timings(conn, rows)
        return added + choices_repo.insert_missing(conn, [_utc_values(r) for r in bundle.choices])
    if table in NATURAL_KEY_COLUMNS:
        return _insert_new(conn, bundle.entry, table, rows)
    if table in NEWEST_WINS_COMPARED:
        return _newest_wins(conn, table, rows)
    return _cutlass(conn, bundle, rows)


def store_factors(conn: Connection, bundle: Bundle, *, factor_ids: dict[tuple[str, str], int] | None = None) -> bool:
    """Write the ``factors`` of ``bundle``'s FX graph / AOTAutograd key into the database of
    ``conn`` (inside the caller's transaction) unless it has factors for that key already;
    ``factor_ids`` as :func:`store` takes it. True if written."""
    if bundle.entry.table != "guarded_entries" or not bundle.factors:
        return False
    kind, key = bundle.entry.values
    return KeyFactorRepository(conn).put(kind, key, bundle.factors, known=factor_ids)


def in_form_of(bundle: Bundle, dialect: str) -> Bundle:
    """``bundle`` with its FX graph / AOTAutograd payloads re-encoded as a ``dialect``
    database stores them (:func:`cachedb.store.payload.repacked_guarded`), in place; other kinds
    untouched. A payload that fails its checks is left as it is, for the destination's read
    path to refuse. Call it before :func:`store`'s transaction: compression holds no lock."""
    if bundle.entry.table != "guarded_entries":
        return bundle
    for values in bundle.rows:
        where = f"guarded_entries {values['kind']}/{values['key']}/{values['variant']}"
        try:
            blob = repacked_guarded(bytes(values["payload"]), int(values["size_bytes"]), values["checksum"],
                                    where=where, dialect=dialect)
        except CorruptPayloadError:
            continue
        if blob is not None:
            values["payload"] = blob
    return bundle


def _insert_timings(conn: Connection, rows: list[dict[str, Any]]) -> int:
    """Timings DST lacks (same key, ``recorded_at`` and choice: history is never doubled),
    placed after everything DST holds in document order."""
    return len(timings_repo.insert_flat(conn, rows, skip_stored=True, place_after_stored=True))


def _insert_new(conn: Connection, entry: Entry, table: str, rows: list[dict[str, Any]]) -> int:
    """Rows of a table keyed by its natural key (guarded entries, kernel files) that DST lacks:
    one query per 500 of the bundle's keys."""
    t = _T[table]
    key_cols = [t.c[c] for c in NATURAL_KEY_COLUMNS[table]]
    values = sorted({r["key"] for r in rows})
    have: set[tuple[Any, ...]] = set()
    if len(values) == 1 and table in NATURAL_KEYS_OF_KEY:  # one lookup's rows: a prebuilt read
        for found in prebuilt.fetch(conn, NATURAL_KEYS_OF_KEY[table], {"key": values[0]}):
            have.add(tuple(_utc(v) for v in found))
        values = []
    for start in range(0, len(values), 500):
        for found in conn.execute(select(*key_cols).where(t.c.key.in_(values[start:start + 500]))):
            have.add(tuple(_utc(v) for v in found))
    new = []
    for r in rows:
        k = _natural(table, r)
        if k not in have:
            have.add(k)
            new.append(r)
    if new:
        bulk_insert(conn, t, new)
    return len(new)


def _newest_wins(conn: Connection, table: str, rows: list[dict[str, Any]]) -> int:
    t = _T[table]
    key = ("fingerprint_id", "key_path") if table == "local_cache_values" else ("key",)
    same = NEWEST_WINS_COMPARED[table]
    changed = 0
    new: list[dict[str, Any]] = []
    narrow = key[-1]  # one query for the bundle's rows: its key paths / best-config keys
    existing = {
        tuple(row[2 + len(same):]): row
        for row in conn.execute(
            select(t.c.id, t.c.updated_at, *(t.c[c] for c in same), *(t.c[k] for k in key))
            .where(t.c[narrow].in_(sorted({r[narrow] for r in rows})))
        )
    }
    for r in rows:
        found = existing.get(tuple(r[k] for k in key))
        if found is None:
            new.append(r)
        elif any(r[c] != found[2 + i] for i, c in enumerate(same)) and r["updated_at"] > _utc(found.updated_at):
            replace = {c: v for c, v in r.items() if c not in ("created_at", "position", *key)}
            conn.execute(update(t).where(t.c.id == found.id).values(replace))
            changed += 1
    if new:
        if "position" in t.c:
            start = next_position(conn)  # type: ignore[arg-type]
            for i, r in enumerate(sorted(new, key=lambda r: r["position"])):
                r["position"] = start + i
        bulk_insert(conn, t, new)
    return changed + len(new)


def _cutlass(conn: Connection, bundle: Bundle, rows: list[dict[str, Any]]) -> int:
    lists = _T["cutlass_op_lists"]
    added = 0
    for values in rows:
        request_key = values["request_key"]
        if conn.execute(select(lists.c.id).where(lists.c.request_key == request_key)).first() is not None:
            continue
        list_id = conn.execute(insert(lists).returning(lists.c.id), values).scalar_one()
        ops = bundle.ops.get(request_key, [])
        if ops:
            conn.execute(insert(_OPS), [{**op, "op_list_id": list_id} for op in ops])
        added += 1
    return added


__all__ = [
    "Bundle",
    "Entry",
    "KINDS",
    "best_config",
    "choices",
    "cutlass",
    "dynamo",
    "fetch",
    "fetch_blobs",
    "guarded",
    "in_form_of",
    "kernel",
    "local_values",
    "missing_blobs",
    "resolve_factors",
    "store",
    "store_factors",
    "timings",
    "timings_of_op",
]
