"""The row transfer: one source's rows into DST, table by table in batches, ids remapped
through natural keys, each batch one DST transaction."""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, DateTime, LargeBinary, String, func, insert, select, update
from sqlalchemy.exc import DBAPIError

from ..store.bulk import bulk_insert, stream
from ..store.bulk import matching as _matching
from ..store.bulk import utc as _utc
from ..store.engine import WRITE_OPTION
from .._errors import CopyError, CorruptPayloadError
from ..keys.factors import Factor
from ..store.payload import repacked_guarded
from ..db import CacheDB
from ..store.tables import DYNAMO_TABLES, NATURAL_KEY_COLUMNS, NEWEST_WINS_COMPARED
from ..repositories import timings as timings_repo
from ..repositories.factors import KeyFactorRepository, id_list, id_text
from ._copy_report import CopyProgress, CopyReport, ProgressCallback
from ._copy_source import _Source, _prefetched
from ._copy_tables import _T

log = logging.getLogger("cachedb")

#: Keys of a batch looked up in DST per query (merge).
_KEYS_PER_QUERY = 500

#: SQLite's default ``wal_autocheckpoint`` (pages), restored after each batch.
_SQLITE_AUTOCHECKPOINT = 1000


class _Transfer:
    """Moves the rows of one source into ``dst``, batch by batch."""

    def __init__(self, src: _Source, conn: Connection, dst: CacheDB, report: CopyReport, *, mode: str,
                 progress: ProgressCallback | None, done: list[int], totals: tuple[int, int],
                 batch_rows: int, batch_bytes: int, fresh: bool = False, repack: bool = False,
                 shared: Connection | None = None) -> None:
        self.src, self.conn, self.dst, self.report = src, conn, dst, report
        #: A dry run's one DST transaction: every batch is written in it, and it is rolled back.
        self.shared = shared
        self.mode = mode
        #: FX graph / AOTAutograd payloads re-encoded for DST: asked for, or DST's form differs
        #: from SRC's (an SQLite file stores small entries as they are, PostgreSQL compresses)
        self.repack = repack or src.sqlite != (dst.engine.dialect.name == "sqlite")
        #: ids of the guarded rows of the current batch whose payload was re-encoded: counted
        #: in the report when the batch writes them (:meth:`_added`)
        self._repacked_rows: set[int] = set()
        #: A copy into a target that was empty when it started (not a resumed one): DST holds
        #: only what this run wrote, and SRC's rows are copied as they are, so the natural-key
        #: lookups in DST are skipped.
        self.fresh = fresh
        self.progress = progress
        self.done = done  # [rows, bytes] read so far, over all sources
        self.totals = totals
        self.batch_rows, self.batch_bytes = batch_rows, batch_bytes
        self.fp: dict[int, int] = {}
        self.blob: dict[int, int] = {}
        #: SRC ``key_factors`` id -> DST id, of the factors the entries copied so far refer to
        self.factor: dict[int, int] = {}
        self.position_offset = 0
        #: What a reader thread does ahead of the writes (:meth:`_batches`).
        self.prefetch: str | None = (
            "prepared" if dst.engine.dialect.name != "sqlite" else None if src.sqlite else "fetched")

    # -- plumbing -----------------------------------------------------------------------------

    def _batches(self, table: str, stmt: Any = None, *, prefetch: bool = True) -> Iterator[list[tuple[dict[str, Any], int]]]:
        """Rows of ``table`` (``stmt``: default all, by id) as ``(row, bytes)`` batches.

        With ``prefetch``, a reader thread reads ahead while the caller writes (the drivers
        release the GIL while they wait on the databases; the source connection is the
        reader's alone until the iteration ends): for a PostgreSQL DST it also prepares the
        rows, for an SQLite DST it only fetches from a PostgreSQL SRC. An SQLite DST's
        inserts release and retake the GIL on every row, and a reader thread busy in Python
        would make each retake wait, so nothing reads ahead from an SQLite SRC into one."""
        if not self.src.has(table):
            return
        if not prefetch or self.prefetch is None:
            yield from self._read(table, stmt)
        elif self.prefetch == "prepared":
            yield from _prefetched(self._read(table, stmt))
        else:
            yield from self._read(table, stmt, fetched=_prefetched)

    def _read(self, table: str, stmt: Any, fetched: Callable[[Iterator[Any]], Iterator[Any]] | None = None
              ) -> Iterator[list[tuple[dict[str, Any], int]]]:
        t = _T[table]
        stmt = stmt if stmt is not None else self.src.select(table).order_by(t.c.id)
        names = [c.name for c in stmt.selected_columns]
        sized = [i for i, c in enumerate(stmt.selected_columns) if isinstance(c.type, (String, LargeBinary))]
        fixed = 8 * (len(names) - len(sized))
        fill = self.src.fill
        try:
            batch: list[tuple[dict[str, Any], int]] = []
            size = 0
            raw = stream(self.conn, stmt, min(self.batch_rows, 2000))
            for rows in (fetched(raw) if fetched is not None else raw):
                for row in rows:
                    n = fixed + sum([len(row[i]) for i in sized if row[i] is not None])
                    batch.append((fill(table, dict(zip(names, row))), n))
                    size += n
                    if len(batch) >= self.batch_rows or size >= self.batch_bytes:
                        yield batch
                        batch, size = [], 0
            if batch:
                yield batch
        except DBAPIError as exc:
            raise self.src._wrap(exc, None) from exc
        except ValueError as exc:  # a timestamp that is not one
            raise CopyError(f"{self.src.where}: {table}: unreadable value: {exc}") from exc

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        """One DST transaction (``BEGIN IMMEDIATE`` on SQLite), committed on success.

        On SQLite the commit does not checkpoint the WAL (``wal_autocheckpoint`` is 0 around
        it, SQLite's default again after): a bulk copy would otherwise write and sync the
        database file at every few batches; :func:`cachedb.fleet.copy._run` checkpoints once at
        the end. A dry run writes every batch in its one transaction (:attr:`shared`), which
        :func:`cachedb.fleet.copy._run` rolls back."""
        if self.shared is not None:
            yield self.shared
            return
        with self.dst.engine.connect().execution_options(**{WRITE_OPTION: True}) as conn:
            # on the driver connection: SQLAlchemy's execute would begin the transaction
            driver = conn.connection.driver_connection if conn.dialect.name == "sqlite" else None
            if driver is not None:
                driver.execute("PRAGMA wal_autocheckpoint = 0")
            try:
                with conn.begin():
                    yield conn
            finally:
                if driver is not None:
                    driver.execute(f"PRAGMA wal_autocheckpoint = {_SQLITE_AUTOCHECKPOINT}")

    def _tick(self, table: str, batch: Sequence[tuple[dict[str, Any], int]]) -> None:
        self.done[0] += len(batch)
        self.done[1] += sum(n for _, n in batch)
        self.report.tables[table].read += len(batch)
        if self.progress is not None:
            self.progress(CopyProgress(self.src.where, table, self.done[0], self.totals[0],
                                       self.done[1], max(self.done[1], self.totals[1])))

    def _added(self, table: str, rows: Sequence[tuple[dict[str, Any], int]]) -> None:
        if self._repacked_rows:
            self.report.repacked += sum(1 for m, _ in rows if id(m) in self._repacked_rows)
            self._repacked_rows.clear()
        entry = self.report.tables[table]
        entry.added += len(rows)
        entry.bytes += sum(n for _, n in rows)

    @staticmethod
    def _strip(values: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in values.items() if k != "id"}

    def _ids(self, w: Connection, table: str, column: str, keys: Sequence[Any]) -> dict[Any, int]:
        t = _T[table]
        out: dict[Any, int] = {}
        for start in range(0, len(keys), 500):
            chunk = list(keys[start:start + 500])
            out.update((k, int(i)) for k, i in w.execute(select(t.c[column], t.c.id).where(t.c[column].in_(chunk))))
        return out

    # -- tables with ids others point at ------------------------------------------------------

    def _by_natural_key(self, table: str, column: str, mapping: dict[int, int]) -> None:
        """Fingerprints and kernel blobs: insert what DST lacks, map SRC ids to DST ids."""
        for batch in self._batches(table):
            with self._write() as w:
                have = self._ids(w, table, column, [v[column] for v, _ in batch])
                new = [(v, n) for v, n in batch if v[column] not in have]
                if new:
                    bulk_insert(w, _T[table], [v for v, _ in new], exclude=("id",))
                    have.update(self._ids(w, table, column, [v[column] for v, _ in new]))
            for v, _ in batch:
                mapping[int(v["id"])] = have[v[column]]
            self._added(table, new)
            self.report.tables[table].skipped += len(batch) - len(new)
            self._tick(table, batch)

    # -- tables keyed by their own natural key -----------------------------------------------

    def _keyed(self, table: str, natural: Callable[[dict[str, Any]], tuple],
               remap: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
        """Insert the rows whose natural key DST lacks (DST's rows are kept). DST's keys are
        read for the batch's values of :data:`_NARROW` (the leading columns of an index)."""
        t = _T[table]
        key_cols = [t.c[name] for name in NATURAL_KEY_COLUMNS[table]]
        narrow = _NARROW[table]
        stamps = [i for i, c in enumerate(key_cols) if isinstance(c.type, DateTime)]
        for batch in self._batches(table):
            mapped = [(m, n) for m, n in ((remap(v), n) for v, n in batch) if m is not None]
            if self.fresh:
                with self._write() as w:
                    bulk_insert(w, t, [m for m, _ in mapped], exclude=("id",))
                self._added(table, mapped)
                self.report.tables[table].skipped += len(batch) - len(mapped)
                self._tick(table, batch)
                continue
            with self._write() as w:
                have: set[tuple] = set()
                values = list({tuple([m[c] for c in narrow]) for m, _ in mapped})
                for start in range(0, len(values), _KEYS_PER_QUERY):
                    chunk = values[start:start + _KEYS_PER_QUERY]
                    for row in w.execute(_matching(w, select(*key_cols), t, narrow, chunk)).all():
                        key = list(row)  # key_cols: the natural key's order
                        for i in stamps:
                            key[i] = _utc(key[i])
                        have.add(tuple(key))
                new = []
                for m, n in mapped:
                    k = natural(m)
                    if k not in have:
                        have.add(k)
                        new.append((m, n))
                if new:
                    bulk_insert(w, t, [m for m, _ in new], exclude=("id",))
            self._added(table, new)
            self.report.tables[table].skipped += len(batch) - len(new)
            self._tick(table, batch)

    def _newest_wins(self, table: str, key: tuple[str, ...], remap: Callable[[dict[str, Any]], dict[str, Any] | None],
                     same: Callable[[dict[str, Any], Any], bool], replace_columns: tuple[str, ...]) -> None:
        """Best configs, LocalCache values: insert what DST lacks; where DST has the key with
        other content, the row with the newer ``updated_at`` wins (a tie keeps DST's)."""
        t = _T[table]
        for batch in self._batches(table):
            mapped = [(m, n) for m, n in ((remap(v), n) for v, n in batch) if m is not None]
            new, replaced = [], []
            with self._write() as w:
                have: dict[tuple, Any] = {}
                seen: set[tuple] = set()  # added by this batch: a later duplicate is skipped
                values = list({tuple([m[k] for k in key]) for m, _ in mapped})
                cols = [t.c.id, *(t.c[k] for k in key), t.c.updated_at, *(t.c[c] for c in NEWEST_WINS_COMPARED[table])]
                for start in range(0, len(values), _KEYS_PER_QUERY):
                    for row in w.execute(_matching(w, select(*cols), t, key, values[start:start + _KEYS_PER_QUERY])).all():
                        have[tuple(row[1:1 + len(key)])] = row
                for m, n in mapped:
                    k = tuple(m[c] for c in key)
                    found = have.get(k)
                    if k in seen:
                        continue
                    if found is None:
                        new.append((m, n))
                        seen.add(k)
                    elif not same(m, found) and m["updated_at"] > _utc(found.updated_at):
                        w.execute(update(t).where(t.c.id == found.id).values({c: m[c] for c in replace_columns}))
                        replaced.append((m, n))
                if new:
                    bulk_insert(w, t, [m for m, _ in new], exclude=("id",))
            self._added(table, new)
            entry = self.report.tables[table]
            entry.replaced += len(replaced)
            entry.bytes += sum(n for _, n in replaced)
            entry.skipped += len(batch) - len(new) - len(replaced)
            self._tick(table, batch)

    # -- remapping -----------------------------------------------------------------------------

    def _fp_or_none(self, values: dict[str, Any]) -> dict[str, Any]:
        fid = values.get("fingerprint_id")
        values["fingerprint_id"] = self.fp.get(int(fid)) if fid is not None else None
        return values

    def _fp_required(self, values: dict[str, Any]) -> dict[str, Any] | None:
        fid = values.get("fingerprint_id")
        if fid is None or int(fid) not in self.fp:
            return None
        values["fingerprint_id"] = self.fp[int(fid)]
        return values

    def _positioned(self, values: dict[str, Any]) -> dict[str, Any] | None:
        out = self._fp_required(values)
        if out is not None:
            out["position"] = int(out["position"]) + self.position_offset
        return out

    def _guarded(self, values: dict[str, Any]) -> dict[str, Any]:
        values = self._fp_or_none(values)
        if not self.repack:
            return values
        where = f"{self.src.where}: guarded_entries {values['kind']}/{values['key']}/{values['variant']}"
        try:
            blob = repacked_guarded(values["payload"], int(values["size_bytes"]), values["checksum"], where=where,
                                    dialect=self.dst.engine.dialect.name)
        except CorruptPayloadError as exc:
            log.warning("%s; copied as stored", exc)
            self.report.not_repacked += 1
            return values
        if blob is not None:
            values["payload"] = blob
            self._repacked_rows.add(id(values))
        return values

    def _artifact(self, values: dict[str, Any]) -> dict[str, Any] | None:
        blob = self.blob.get(int(values["blob_id"]))
        if blob is None:
            return None
        values["blob_id"] = blob
        return self._fp_or_none(values)

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> None:
        self._by_natural_key("system_fingerprints", "fingerprint_key", self.fp)
        self._by_natural_key("kernel_blobs", "sha256", self.blob)
        self._keyed("kernel_artifacts", _natural("kernel_artifacts"), self._artifact)
        self._keyed("guarded_entries", _natural("guarded_entries"), self._guarded)
        self._entry_factors()
        if self.mode == "merge" and self.shared is not None:
            self.position_offset = timings_repo.next_position(self.shared)
        elif self.mode == "merge":
            with self.dst.read() as repos:
                self.position_offset = timings_repo.next_position(repos.session)
        self._timings()
        self._keyed("autotune_choices", _natural("autotune_choices"), lambda v: v)
        self._newest_wins("local_cache_values", ("fingerprint_id", "key_path"), self._positioned,
                          lambda m, row: m["value_json"] == row.value_json, ("value_json", "updated_at"))
        self._newest_wins(
            "best_configs", ("key",), self._fp_or_none, lambda m, row: m["content"] == row.content,
            ("content", "configs_hash", "num_warps", "num_stages", "found_by_coordesc", "time_taken_ms",
             "triton_cache_hash", "kernel_kwargs", "signature", "fingerprint_id", "updated_at"),
        )
        self._cutlass()
        self._keyed("quarantined_entries", _natural("quarantined_entries"), lambda v: v)
        for table in DYNAMO_TABLES.values():  # Dynamo's caches: one pickle per key, the newer wins
            self._newest_wins(
                table, ("key",), self._fp_or_none, lambda m, row: m["checksum"] == row.checksum,
                ("payload", "size_bytes", "checksum", "signature", "fingerprint_id", "updated_at",
                 "last_used_at", "hit_count"),
            )

    def _entry_factors(self) -> None:
        """The key factors of SRC's entries (``entry_factors``, revision 0013): per batch, each
        ``(kind, key)`` DST has no factors for is added with its ids remapped to DST's, the
        ``key_factors`` rows it names read from SRC and found in DST by ``(factor, hash)``
        (added where DST lacks them, DST's kept). ``key_factors`` rows no entry copied names
        stay behind (those only the miss log names: the miss log is a database's own)."""
        if not self.src.has("entry_factors") or not self.src.has("key_factors"):
            return
        ef = _T["entry_factors"]
        read = [0, 0]  # key_factors rows and bytes read
        for batch in self._batches("entry_factors", prefetch=False):  # SRC's key_factors read on the way
            with self._write() as w:
                have: set[tuple[str, str]] = set()
                if not self.fresh:
                    keys = sorted({v["key"] for v, _ in batch})
                    for start in range(0, len(keys), _KEYS_PER_QUERY):
                        have.update((k, key) for k, key in w.execute(select(ef.c.kind, ef.c.key).where(
                            ef.c.key.in_(keys[start:start + _KEYS_PER_QUERY]))))
                todo = []
                for v, n in batch:
                    natural = (v["kind"], v["key"])
                    if natural not in have:
                        have.add(natural)
                        todo.append((v, n, id_list(v["factor_ids"])))
                wanted = sorted({i for _, _, ids in todo for i in ids} - self.factor.keys())
                src_rows = KeyFactorRepository(self.conn).by_id(wanted)
                order = list(src_rows)
                dst_ids, added = KeyFactorRepository(w).map_ids([src_rows[i] for i in order])
                mapping = dict(zip(order, dst_ids))
                new = []
                for v, n, ids in todo:
                    remapped = [mapping.get(i, self.factor.get(i)) for i in ids]
                    new.append(({"kind": v["kind"], "key": v["key"],
                                 "factor_ids": id_text([i for i in remapped if i is not None])}, n))
                if new:
                    bulk_insert(w, ef, [m for m, _ in new])
            self.factor.update(mapping)
            nbytes = sum(_factor_bytes(f) for f in src_rows.values())
            factors = self.report.tables["key_factors"]
            factors.read += len(src_rows)
            factors.added += len(added)
            factors.skipped += len(src_rows) - len(added)
            factors.bytes += sum(_factor_bytes(f) for f in added)
            read[0] += len(src_rows)
            read[1] += nbytes
            self.done[0] += len(src_rows)
            self.done[1] += nbytes
            self._added("entry_factors", new)
            self.report.tables["entry_factors"].skipped += len(batch) - len(new)
            self._tick("entry_factors", batch)
        rows, nbytes = self.src.count(self.conn, "key_factors")  # the rest (the miss log's) counts as done
        self.done[0] += max(0, rows - read[0])
        self.done[1] += max(0, nbytes - read[1])

    def _timings(self) -> None:
        """Timings, read flat (the view, or an older revision's table) and written through
        the keys and runs they need (:func:`cachedb.repositories.timings.insert_flat`). A
        benchmark DST holds (same key, ``recorded_at`` and choice) is skipped: history is
        kept, never doubled."""
        table = "autotune_timings"
        for batch in self._batches(table):
            mapped = [(m, n) for m, n in ((self._positioned(v), n) for v, n in batch) if m is not None]
            with self._write() as w:
                stored = timings_repo.insert_flat(w, [m for m, _ in mapped], skip_stored=not self.fresh)
            new = [mapped[i] for i in stored]
            self._added(table, new)
            self.report.tables[table].skipped += len(batch) - len(new)
            self._tick(table, batch)

    def _cutlass(self) -> None:
        """Each op list with its ops in one DST transaction (a list is there whole or not)."""
        if not self.src.has("cutlass_op_lists"):
            return
        lists = _T["cutlass_op_lists"]
        has_ops = self.src.has("cutlass_ops")
        for batch in self._batches("cutlass_op_lists", prefetch=False):
            for values, n in batch:
                with self._write() as w:
                    found = w.execute(select(lists.c.id).where(lists.c.request_key == values["request_key"])).scalar()
                    if found is None:
                        w.execute(insert(lists), [self._strip(values)])
                        new_id = int(w.execute(
                            select(lists.c.id).where(lists.c.request_key == values["request_key"])).scalar_one())
                        if has_ops:
                            self._copy_ops(w, int(values["id"]), new_id)
                if found is None:
                    self._added("cutlass_op_lists", [(values, n)])
                else:
                    self.report.tables["cutlass_op_lists"].skipped += 1
                    self._skip_ops(int(values["id"]))
                self._tick("cutlass_op_lists", [(values, n)])

    def _copy_ops(self, w: Connection, src_list_id: int, dst_list_id: int) -> None:
        ops = _T["cutlass_ops"]
        stmt = self.src.select("cutlass_ops").where(ops.c.op_list_id == src_list_id).order_by(ops.c.id)
        for op_batch in self._batches("cutlass_ops", stmt, prefetch=False):
            rows = []
            for v, _ in op_batch:
                v = self._strip(v)
                v["op_list_id"] = dst_list_id
                rows.append(v)
            bulk_insert(w, ops, rows)
            self._added("cutlass_ops", op_batch)
            self.report.tables["cutlass_ops"].read += len(op_batch)
            self.done[0] += len(op_batch)
            self.done[1] += sum(k for _, k in op_batch)

    def _skip_ops(self, src_list_id: int) -> None:
        if not self.src.has("cutlass_ops"):
            return
        ops = _T["cutlass_ops"]
        n = int(self.conn.execute(select(func.count()).select_from(ops).where(ops.c.op_list_id == src_list_id)).scalar_one())
        self.report.tables["cutlass_ops"].read += n
        self.report.tables["cutlass_ops"].skipped += n
        self.done[0] += n


#: The columns of each table :meth:`_Transfer._keyed` handles whose values in a batch select (a
#: superset of) the DST rows its natural keys could match: an index's leading columns (the
#: small ``quarantined_entries`` has none).
_NARROW = {
    "autotune_choices": ("choice_hash",),
    "kernel_artifacts": ("kind", "host_key", "key"),
    "guarded_entries": ("kind", "key"),
    "quarantined_entries": ("kind", "key"),
}


def _factor_bytes(factor: Factor) -> int:
    """A ``key_factors`` row's bytes as a report counts them: its text, 8 for its id."""
    return len(factor.factor) + len(factor.hash) + len(factor.value) + 8


def _natural(table: str) -> Callable[[dict[str, Any]], tuple]:
    """The natural key of a row whose timestamps are already UTC (:meth:`_Source.fill`), a
    tuple (of one value for a key of one column)."""
    columns = NATURAL_KEY_COLUMNS[table]
    if len(columns) == 1:
        name = columns[0]
        return lambda row: (row[name],)
    return operator.itemgetter(*columns)

