"""``cachedb copy`` and ``cachedb merge`` (cachedb/fleet/copy.py, cachedb/cli/copy.py) on real databases:
a real Inductor cache (examples/build_cache.py, torch 2.13 CPU) imported, plus kernel files, a
real CUTLASS op list and a quarantined entry, on SQLite and on the local PostgreSQL."""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import json
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import inspect, select, text

from cachedb import CacheDB, SchemaTooNewError
from cachedb.store import migrate as _migrate
from cachedb.formats.local_cache_doc import ValueLeaf
from cachedb.keys.factors import Factor
from cachedb.store.payload import unpack
from cachedb.store.signing import ENV_KEY, Signer
from cachedb.cli import main
from cachedb.fleet.copy import (
    MARKER_TABLE,
    TABLES,
    CopyProgress,
    DamagedSourceError,
    TargetNotEmptyError,
    UnsignedInputError,
    copy_database,
    merge_databases,
)
from cachedb.formats.cutlass_ops import parse_op_list
from cachedb.layout.importer import Importer
from cachedb.repositories.choices import describe
from cachedb.store.models import AUTOTUNE_TIMINGS, Base
from cachedb.repositories.timings import next_position

pytestmark = pytest.mark.slow

CORPUS = Path(__file__).resolve().parent / "data" / "configs_b15d29dd.json.gz"


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


# --------------------------------------------------------------------------- building real databases


def _op_list(n: int) -> bytes:
    """The first ``n`` ops of the real CUTLASS op list in tests/data, as torch writes the file."""
    ops = json.loads(gzip.decompress(CORPUS.read_bytes()))
    return json.dumps(ops[:n]).encode()


def fill(db: CacheDB, cache_dir: Path, *, tag: str = "a", quarantine: bool = True) -> None:
    """The real cache, key factors of its FX graph / AOTAutograd keys (a function of the key,
    one factor shared by all), kernel files (one blob shared by two keys), a CUTLASS op list
    and, with ``quarantine``, one FX entry moved to quarantine."""
    report = Importer(db).run(cache_dir)
    assert report.problems == []
    rng = random.Random(tag)
    cubin = rng.randbytes(40_000)
    data = _op_list(150)
    with db.transaction() as repos:
        repos.artifacts.put_files("triton", f"TRITONKEY{tag.upper()}", [
            (f"k{tag}.cubin", cubin), (f"k{tag}.json", json.dumps({"name": tag}).encode()),
            (f"k{tag}.ptx", rng.randbytes(3000))])
        repos.artifacts.put_files("triton", "TRITONSHARED", [("s.cubin", cubin)])
        repos.artifacts.put_files("cpp", f"c{tag}xyz", [(f"c{tag}xyz.main.so", rng.randbytes(9000))], host_key="h1")
        repos.cutlass.put(f"req{tag}", data, parse_op_list(data), arch=90, cuda_version="12.8")
        fingerprint = repos.session.execute(text("SELECT min(id) FROM system_fingerprints")).scalar_one()
        repos.pgo.put(f"job_{tag}_None_", rng.randbytes(700), fingerprint_id=fingerprint)  # a PGO profile
        repos.dynamo("precompile").put(f"{tag * 64}", rng.randbytes(5000), fingerprint_id=fingerprint)  # a package
        repos.dynamo("precompile_refusal").put(f"{tag * 64}.0123456789abcdef", b'{"error": "PackageError"}',
                                               fingerprint_id=fingerprint)  # a function torch cannot package
        repos.local_values.add_leaves(fingerprint, [
            ValueLeaf(("pad_mm", f"shape-{tag}"), True, next_position(repos.session)),
            ValueLeaf(("pad_mm", "shared"), False, next_position(repos.session) + 1)])
        # what a live tuning says of the real cache's GEMM choices (cachedb/live/_choices.py)
        repos.choices.put_new([
            describe(h, h.split("-", 1)[0], "", {"backend": "extern" if h.startswith("_") else "CPP"})
            for h in repos.session.execute(text("SELECT DISTINCT choice_hash FROM autotune_timings")).scalars()])
        for kind, key in repos.session.execute(text("SELECT DISTINCT kind, key FROM guarded_entries")).all():
            repos.key_factors.put(kind, key, [Factor("gm", hashlib.sha256(key.encode()).hexdigest()[:16], key[:8]),
                                              Factor("inductor_config.max_autotune", "h" * 16, "False")])
        if quarantine:
            kind, key, variant = repos.session.execute(text(
                "SELECT kind, key, variant FROM guarded_entries WHERE kind = 'fxgraph' ORDER BY key, variant")).first()
            assert repos.guarded.quarantine(kind, key, variant, "test: quarantined on purpose")


def filled(location: str | Path, cache_dir: Path, **kwargs: Any) -> str:
    with CacheDB(location) as db:
        fill(db, cache_dir, **kwargs)
    return str(location)


_PARENTS = {"fingerprint_id": ("system_fingerprints", "fingerprint_key"), "blob_id": ("kernel_blobs", "sha256"),
            "op_list_id": ("cutlass_op_lists", "request_key")}


def dump(location: str | Path, *, positions: bool = True) -> dict[str, list[tuple]]:
    """Every row of every table, ids left out and foreign keys replaced by the parent's
    natural key (an entry's key factor ids by each factor's ``(factor, hash)``), timestamps in
    UTC, guarded entries' payloads as their content (verified), sorted: equal dumps = the same
    content."""
    out: dict[str, list[tuple]] = {}
    with CacheDB(location, upgrade=False) as db, db.engine.connect() as conn:
        names = set(inspect(conn).get_table_names()) | set(inspect(conn).get_view_names())
        keys = {col: dict(conn.execute(select(Base.metadata.tables[t].c.id, Base.metadata.tables[t].c[c])).all())
                for col, (t, c) in _PARENTS.items() if t in names}
        factors = {i: (f, h) for i, f, h in conn.execute(text("SELECT id, factor, hash FROM key_factors"))} \
            if "key_factors" in names else {}
        for table in TABLES:
            if table not in names:
                continue
            t = Base.metadata.tables.get(table, AUTOTUNE_TIMINGS)  # timings: flat, table or view
            rows = []
            for row in conn.execute(select(t)).mappings():
                values = []
                for name, value in row.items():
                    if name == "id" or (name == "position" and not positions):
                        continue
                    if name in _PARENTS and value is not None:
                        value = keys[name][value]
                    if name == "factor_ids":
                        value = tuple(factors[int(i)] for i in json.loads(value))
                    if isinstance(value, dt.datetime):
                        value = (value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None
                                 else value.astimezone(dt.timezone.utc))
                    values.append((name, bytes(value) if isinstance(value, memoryview) else value))
                if table == "guarded_entries":  # by content: SQLite's and PostgreSQL's frames differ
                    row_values = dict(values)
                    content = unpack(row_values["payload"], row_values["size_bytes"], row_values["checksum"], where=table)
                    values = [(n, content if n == "payload" else v) for n, v in values]
                rows.append(tuple(values))
            out[table] = sorted(rows, key=repr)
    return out


def export_files(location: str, out: Path) -> dict[str, bytes]:
    result = run("--db", location, "export", str(out))
    assert result.exit_code == 0, result.output
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def stats(location: str) -> list[dict]:
    result = run("--db", location, "stats", "--format", "json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def file_state(path: Path) -> dict[str, str]:
    """SHA-256 of an SQLite file and its -wal (the bytes a modification would change; an empty
    -wal, which a read-only reader of a WAL database may create, holds nothing)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in (path, path.with_name(path.name + "-wal")) if p.exists() and p.stat().st_size}


# --------------------------------------------------------------------------- copy


def test_copy_sqlite_to_postgresql_and_back_is_identical(real_cache: tuple[Path, dict], tmp_path: Path,
                                                           pg_url: str) -> None:
    cache_dir, _ = real_cache
    src = tmp_path / "src.db"
    filled(src, cache_dir)
    before = file_state(src)
    original = dump(src)
    assert all(original[t] for t in TABLES), {t: len(r) for t, r in original.items()}

    to_pg = run("copy", str(src), pg_url, "--format", "json")
    assert to_pg.exit_code == 0, to_pg.output
    moved = {row["table"]: row for row in json.loads(to_pg.stdout)}
    assert set(moved) == set(TABLES)
    for table in TABLES:
        assert moved[table]["read"] == moved[table]["added"] == len(original[table]) > 0, table
    assert moved["guarded_entries"]["bytes"] > 0
    back = tmp_path / "back.db"
    to_sqlite = run("copy", pg_url, str(back))
    assert to_sqlite.exit_code == 0, to_sqlite.output
    assert "copied" in to_sqlite.output and "guarded_entries" in to_sqlite.output

    assert dump(pg_url) == original
    assert dump(back) == original
    # FX graph / AOTAutograd payloads change form between the two: compressed in PostgreSQL,
    # as they are (these are all under 1 MiB) in the SQLite files, byte for byte the source's
    from cachedb.store.payload import STORED_LEVEL, ZSTD_LEVEL, pack

    for location, level in ((pg_url, ZSTD_LEVEL), (str(back), STORED_LEVEL), (str(src), STORED_LEVEL)):
        with CacheDB(location, upgrade=False) as db, db.engine.connect() as conn:
            for blob, size, checksum in conn.execute(text("SELECT payload, size_bytes, checksum FROM guarded_entries")):
                content = unpack(bytes(blob), size, checksum, where=location)
                assert bytes(blob) == pack(content, level=level).blob, location
    assert export_files(str(back), tmp_path / "x_back") == export_files(str(src), tmp_path / "x_src")
    assert stats(str(back)) == stats(str(src))

    def entries_and_bytes(location: str) -> list[dict]:  # PostgreSQL stores guarded payloads compressed
        return [{k: v for k, v in row.items() if k != "stored_bytes"} for row in stats(location)]

    assert entries_and_bytes(pg_url) == entries_and_bytes(str(src))
    assert file_state(src) == before, "the source was modified"
    # Rows go through the drivers (cachedb/store/bulk.py), not SQLAlchemy: SQLite's stored forms
    # (timestamps as SQLAlchemy's UTC text, booleans as 0/1, payloads as blobs) are unchanged.
    raw = "SELECT {} FROM {} ORDER BY {}"
    for table, cols, order in (("autotune_timings", "recorded_at, typeof(timing_ms), timing_ms", "position, choice_hash"),
                               ("best_configs", "created_at, updated_at, found_by_coordesc", "key"),
                               ("guarded_entries", "created_at, last_used_at, guards_known, typeof(payload), payload",
                                "kind, key, variant")):
        with sqlite3.connect(src) as a, sqlite3.connect(back) as b:
            assert a.execute(raw.format(cols, table, order)).fetchall() == b.execute(raw.format(cols, table, order)).fetchall()
    for location in (pg_url, str(back)):
        with CacheDB(location) as db:
            assert MARKER_TABLE not in db.table_names()
            assert db.revision() == _migrate.head_revision()


def test_copy_of_clean_database_verifies(real_cache: tuple[Path, dict], tmp_path: Path) -> None:
    cache_dir, _ = real_cache
    src = filled(tmp_path / "src.db", cache_dir, quarantine=False)
    dst = tmp_path / "compact.db"
    report = copy_database(src, dst, batch_rows=7)  # many small batches
    assert report.rows_written == sum(len(rows) for rows in dump(src).values())
    result = run("--db", str(dst), "verify")
    assert result.exit_code == 0, result.output
    assert "ok: integrity check passed" in result.output


def test_copy_of_a_4_kib_page_database_takes_the_new_page_size(real_cache: tuple[Path, dict], tmp_path: Path) -> None:
    """A database made at SQLite's default page size (cachedb before 16 KiB pages) keeps it;
    ``cachedb copy`` into a new file gives the copy PAGE_SIZE pages and every row."""
    from cachedb.store.engine import PAGE_SIZE

    cache_dir, _ = real_cache
    src = filled(tmp_path / "src.db", cache_dir, quarantine=False)
    raw = sqlite3.connect(src, isolation_level=None)
    raw.execute("PRAGMA journal_mode = DELETE")
    raw.execute("PRAGMA page_size = 4096")
    raw.execute("VACUUM")
    raw.execute("PRAGMA journal_mode = WAL")
    raw.close()
    dst = tmp_path / "paged.db"
    result = run("copy", str(src), str(dst))
    assert result.exit_code == 0, result.output

    def page_size(path: Path) -> int:
        con = sqlite3.connect(path)
        try:
            return int(con.execute("PRAGMA page_size").fetchone()[0])
        finally:
            con.close()

    assert (page_size(src), page_size(dst)) == (4096, PAGE_SIZE)
    assert dump(dst) == dump(src)


def _payloads(location: str | Path) -> dict[tuple[str, str, str], tuple[bytes, int, bytes]]:
    """``(stored frame, size, verified content)`` of every guarded entry."""
    with CacheDB(location) as db, db.read() as repos:
        frames = {(k, key, v): (bytes(blob), int(size)) for k, key, v, blob, size in repos.session.execute(
            text("SELECT kind, key, variant, payload, size_bytes FROM guarded_entries"))}
        return {(e.kind, e.key, e.variant): (*frames[(e.kind, e.key, e.variant)], e.payload)
                for e in repos.guarded.iter_all()}


def test_repack_stores_an_older_databases_small_entries_as_they_are_and_keeps_signatures(
    real_cache: tuple[Path, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signed database written as cachedb wrote it before small entries were stored as they
    are (every payload compressed: CACHEDB_COMPRESSION_LEVEL=1), plus a 2 MB entry. ``copy
    --repack`` writes the real cache's small entries as they are, leaves the large one's frame
    as stored, and every entry keeps its content; the copy verifies under the same key, and a
    second ``--repack`` finds nothing to re-encode. A plain copy keeps every frame byte for
    byte."""
    from cachedb.store.payload import LEVEL_ENV, STORED_LEVEL, pack

    def stored_as_is(frame: bytes, content: bytes) -> bool:
        return frame == pack(content, level=STORED_LEVEL).blob

    cache_dir, _ = real_cache
    team = Signer(b"team secret")
    src = tmp_path / "old.db"
    monkeypatch.setenv(LEVEL_ENV, "1")
    with CacheDB(src, signer=team) as db:
        assert Importer(db).run(cache_dir).problems == []
        large = random.Random(5).randbytes(1000) * 2000  # 2 MB, compressible
        with db.transaction() as repos:
            repos.guarded.put("fxgraph", "f" + "l" * 51, large, guards_expr=None)
    monkeypatch.delenv(LEVEL_ENV)
    before = _payloads(src)
    small = {k for k, (_, size, _) in before.items() if size < 1 << 20}
    assert len(small) >= 6 and len(before) == len(small) + 1
    assert not any(stored_as_is(frame, content) for frame, _, content in before.values())

    monkeypatch.setenv(ENV_KEY, "team secret")
    result = run("copy", "--repack", str(src), str(tmp_path / "new.db"))
    assert result.exit_code == 0, result.output
    assert f"; {len(small)} FX graph/AOTAutograd entries re-encoded" in result.output
    after = _payloads(tmp_path / "new.db")
    assert after.keys() == before.keys()
    for k, (frame, size, content) in after.items():
        assert (size, content) == before[k][1:]
        assert stored_as_is(frame, content) == (k in small)
        if k not in small:
            assert frame == before[k][0]
    verified = run("--db", str(tmp_path / "new.db"), "verify")
    assert verified.exit_code == 0, verified.output
    assert copy_database(tmp_path / "new.db", tmp_path / "again.db", repack=True).repacked == 0  # already in form
    # a merge into a database that holds them all writes none, so it re-encodes none
    assert merge_databases([src], tmp_path / "new.db", repack=True).repacked == 0

    plain = copy_database(src, tmp_path / "plain.db")
    assert plain.repacked == 0
    assert {k: v[0] for k, v in _payloads(tmp_path / "plain.db").items()} == {k: v[0] for k, v in before.items()}


def test_repack_copies_a_payload_that_fails_its_checks_as_stored(
    real_cache: tuple[Path, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One compressed small entry with a flipped byte in its frame: ``--repack`` copies it as
    stored (counted, the summary says so), re-encodes the others, and ``verify`` on the copy
    still finds the damage."""
    from cachedb.store.payload import LEVEL_ENV

    cache_dir, _ = real_cache
    src = tmp_path / "old.db"
    monkeypatch.setenv(LEVEL_ENV, "1")
    with CacheDB(src) as db:
        assert Importer(db).run(cache_dir).problems == []
    monkeypatch.delenv(LEVEL_ENV)
    raw = sqlite3.connect(src, isolation_level=None)
    row_id, blob = raw.execute("SELECT id, payload FROM guarded_entries ORDER BY id LIMIT 1").fetchone()
    n = raw.execute("SELECT count(*) FROM guarded_entries").fetchone()[0]
    damaged = bytearray(blob)
    damaged[len(blob) // 3] ^= 0xFF
    raw.execute("UPDATE guarded_entries SET payload = ? WHERE id = ?", (bytes(damaged), row_id))
    raw.close()

    dst = tmp_path / "new.db"
    result = run("copy", "--repack", str(src), str(dst))
    assert result.exit_code == 0, result.output
    assert f"; {n - 1} FX graph/AOTAutograd entries re-encoded" in result.output
    assert "; 1 failed their checks and were copied as stored" in result.output
    copied = sqlite3.connect(dst)
    try:
        (kept,) = copied.execute("SELECT payload FROM guarded_entries WHERE payload = ?", (bytes(damaged),)).fetchone()
    finally:
        copied.close()
    assert kept == bytes(damaged)
    verified = run("--db", str(dst), "verify")
    assert verified.exit_code != 0


def test_copy_refuses_a_non_empty_target_and_itself(real_cache: tuple[Path, dict], tmp_path: Path) -> None:
    cache_dir, _ = real_cache
    src = filled(tmp_path / "src.db", cache_dir, quarantine=False)
    other = tmp_path / "other.db"
    with CacheDB(other) as db, db.transaction() as repos:
        repos.best_configs.put("ab/x.best_config", '{"num_warps": 4}')
    content = dump(other)
    result = run("copy", src, str(other))
    assert result.exit_code == 1
    assert "not empty (1 rows)" in result.output and str(other) in result.output and "merge" in result.output
    assert dump(other) == content
    with pytest.raises(TargetNotEmptyError):
        copy_database(src, other)
    same = run("copy", src, src)
    assert same.exit_code == 1 and "same database" in same.output
    missing = run("copy", str(tmp_path / "absent.db"), str(tmp_path / "new.db"))
    assert missing.exit_code == 1 and "no database at" in missing.output
    assert not (tmp_path / "absent.db").exists() and not (tmp_path / "new.db").exists()


def test_interrupted_copy_continues_without_duplicates(real_cache: tuple[Path, dict], tmp_path: Path,
                                                        db_url: str) -> None:
    cache_dir, _ = real_cache
    src = filled(tmp_path / "src.db", cache_dir)
    original = dump(src)
    seen: list[CopyProgress] = []

    class Stop(Exception):
        pass

    def stop_midway(p: CopyProgress) -> None:
        seen.append(p)
        if p.table == "guarded_entries":
            raise Stop  # after the first batch of guarded entries

    with pytest.raises(Stop):
        copy_database(src, db_url, progress=stop_midway, batch_rows=3)
    partial = dump(db_url)
    assert partial["kernel_artifacts"] == original["kernel_artifacts"]  # committed before the stop
    assert len(partial["guarded_entries"]) == 3 < len(original["guarded_entries"])
    assert partial["autotune_timings"] == partial["best_configs"] == []
    assert seen[-1].rows_done < seen[-1].rows_total
    with CacheDB(db_url) as db:
        assert MARKER_TABLE in db.table_names()

    # another source may not finish someone else's copy
    other = filled(tmp_path / "other.db", cache_dir, tag="b")
    with pytest.raises(TargetNotEmptyError, match="unfinished copy of"):
        copy_database(other, db_url)

    report = copy_database(src, db_url, batch_rows=3)
    assert report.resumed
    assert report.tables["kernel_artifacts"].added == 0
    assert report.tables["guarded_entries"].skipped == 3
    assert report.tables["guarded_entries"].added == len(original["guarded_entries"]) - 3
    assert report.tables["autotune_timings"].added == len(original["autotune_timings"])
    assert dump(db_url) == original
    with CacheDB(db_url) as db:
        assert MARKER_TABLE not in db.table_names()


def test_reader_thread_hands_over_errors_and_stops_with_the_consumer() -> None:
    """copy's read-ahead (``_prefetched``, used for PostgreSQL targets): an exception of the
    reader reaches the consumer after the items before it; a consumer that stops early stops
    the reader and closes the source iterator."""
    from cachedb.fleet.copy import _prefetched

    def failing():
        yield 1
        yield 2
        raise ValueError("bad row 3")

    got = []
    with pytest.raises(ValueError, match="bad row 3"):
        for item in _prefetched(failing()):
            got.append(item)
    assert got == [1, 2]

    closed = []

    def endless():
        try:
            n = 0
            while True:
                n += 1
                yield n
        finally:
            closed.append(True)

    reader = _prefetched(endless())
    assert [next(reader) for _ in range(3)] == [1, 2, 3]
    reader.close()
    assert closed == [True]


def test_older_source_revision_is_read_as_is(real_cache: tuple[Path, dict], tmp_path: Path) -> None:
    cache_dir, _ = real_cache
    src = tmp_path / "old.db"
    with CacheDB(src) as db:
        assert Importer(db).run(cache_dir).problems == []
        with db.engine.begin() as conn:  # kernels do not exist at revision 0001
            conn.execute(text("DELETE FROM kernel_artifacts"))
            conn.execute(text("DELETE FROM kernel_blobs"))
        expected = export_files(str(src), tmp_path / "x_head")
        _migrate.downgrade(db.engine, "0001")  # no signatures, no quarantine, no kernel tables
    before = file_state(src)
    dst = tmp_path / "new.db"
    report = copy_database(src, dst)
    assert report.source_revisions == {str(src): "0001"}
    assert file_state(src) == before
    con = sqlite3.connect(src)
    assert con.execute("SELECT version_num FROM alembic_version").fetchone() == ("0001",)
    con.close()
    with CacheDB(dst) as db:
        assert db.revision() == _migrate.head_revision()
        rows = db.engine.connect().execute(text(
            "SELECT count(*), sum(last_used_at = created_at), count(signature) FROM guarded_entries")).one()
    assert rows[0] > 0 and rows[1] == rows[0] and rows[2] == 0
    assert export_files(str(dst), tmp_path / "x_dst") == expected


def test_newer_source_revision_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "future.db"
    CacheDB(src).close()
    con = sqlite3.connect(src)
    con.execute("UPDATE alembic_version SET version_num = '9999_future'")
    con.commit()
    con.close()
    with pytest.raises(SchemaTooNewError):
        copy_database(src, tmp_path / "dst.db")
    assert not (tmp_path / "dst.db").exists()


# --------------------------------------------------------------------------- merge


_KEYED = {"system_fingerprints": ("fingerprint_key",), "kernel_blobs": ("sha256",),
          "kernel_artifacts": ("kind", "host_key", "key", "name"), "guarded_entries": ("kind", "key", "variant"),
          "cutlass_op_lists": ("request_key",), "local_cache_values": ("fingerprint_id", "key_path")}


def _keys(d: dict[str, list[tuple]], table: str) -> set[tuple]:
    return {tuple(v for k, v in row if k in _KEYED[table]) for row in d[table]}


def test_merge_is_the_union_and_idempotent(real_cache: tuple[Path, dict], tmp_path: Path, db_url: str) -> None:
    cache_dir, _ = real_cache
    a = filled(tmp_path / "a.db", cache_dir, tag="a")
    b = filled(tmp_path / "b.db", cache_dir, tag="b", quarantine=False)
    # Both hold the same real cache imported at different times (same guarded entries and
    # fingerprints, two timing histories); each also holds its own kernels, op list and a
    # best config the other changed later.
    with CacheDB(a) as db, db.transaction() as repos:
        keys = [k for k, _ in repos.best_configs.iter_all()]
        repos.best_configs.put("zz/only_a.best_config", '{"num_warps": 1}')
    assert keys, "the real cache holds a best config"
    with CacheDB(b) as db, db.transaction() as repos:
        repos.best_configs.put(keys[0], '{"num_warps": 8, "num_stages": 3}')  # newer than a's
        repos.best_configs.put("zz/both.best_config", '{"num_warps": 2}')
    with CacheDB(a) as db, db.transaction() as repos:
        repos.best_configs.put("zz/both.best_config", '{"num_warps": 16}')  # newer than b's
    da, db_ = dump(a), dump(b)

    first = run("merge", a, b, "--into", db_url, "--format", "json")
    assert first.exit_code == 0, first.output
    merged = dump(db_url, positions=False)
    for table in _KEYED:
        assert _keys(merged, table) == _keys(da, table) | _keys(db_, table), table
        assert len(merged[table]) == len(_keys(merged, table)), table  # no duplicates
    both = _keys(da, "kernel_artifacts") & _keys(db_, "kernel_artifacts")  # the real cache's, TRITONSHARED
    assert ("triton", "", "TRITONSHARED", "s.cubin") in both
    assert len(merged["kernel_artifacts"]) == len(da["kernel_artifacts"]) + len(db_["kernel_artifacts"]) - len(both)
    assert len(merged["system_fingerprints"]) == len(da["system_fingerprints"])  # unified
    # every benchmark of both histories, once
    assert set(merged["autotune_timings"]) == (set(dump(a, positions=False)["autotune_timings"])
                                               | set(dump(b, positions=False)["autotune_timings"]))
    assert len(merged["autotune_timings"]) == len(da["autotune_timings"]) + len(db_["autotune_timings"])
    assert len(merged["quarantined_entries"]) == 1
    configs = {dict(row)["key"]: dict(row)["content"] for row in merged["best_configs"]}
    assert configs[keys[0]] == '{"num_warps": 8, "num_stages": 3}'
    assert configs["zz/both.best_config"] == '{"num_warps": 16}'
    assert "zz/only_a.best_config" in configs
    assert len(merged["cutlass_ops"]) == 300
    report = {row["table"]: row for row in json.loads(first.stdout)}
    assert report["best_configs"]["replaced"] >= 1 and report["guarded_entries"]["skipped"] > 0

    second = merge_databases([a, b], db_url)
    assert second.rows_written == 0
    assert dump(db_url, positions=False) == merged
    with CacheDB(db_url) as db, db.engine.connect() as conn:  # the compact timings: a key, a run once
        keys, distinct_keys, runs, distinct_runs = conn.execute(text(
            "SELECT (SELECT COUNT(*) FROM autotune_keys), (SELECT COUNT(*) FROM (SELECT DISTINCT fingerprint_id, op, "
            "inputs, hint_override, precision FROM autotune_timings) k), (SELECT COUNT(*) FROM autotune_runs), "
            "(SELECT COUNT(*) FROM (SELECT DISTINCT fingerprint_id, op, inputs, hint_override, precision, recorded_at "
            "FROM autotune_timings) r)")).one()
    assert keys == distinct_keys > 0 and runs == distinct_runs >= keys
    result = run("--db", db_url, "verify")
    assert result.exit_code == 1 and "quarantined fxgraph" in result.output  # a's quarantine came over
    assert "problem(s)" in result.output


def test_merge_keeps_the_newer_best_config_and_document_order(real_cache: tuple[Path, dict], tmp_path: Path) -> None:
    cache_dir, _ = real_cache
    a = filled(tmp_path / "a.db", cache_dir, tag="a", quarantine=False)
    dst = tmp_path / "dst.db"
    copy_database(a, dst)
    expected = export_files(str(dst), tmp_path / "x1")
    merge_databases([a], dst)  # a's timings are already there: nothing moves, the export is unchanged
    assert export_files(str(dst), tmp_path / "x2") == expected
    with CacheDB(dst) as db, db.transaction() as repos:
        key = next(k for k, _ in repos.best_configs.iter_all())
        repos.best_configs.put(key, '{"num_warps": 32}')  # DST newer than a's
    report = merge_databases([a], dst)
    assert report.tables["best_configs"].replaced == 0
    with CacheDB(dst) as db, db.read() as repos:
        assert repos.best_configs.get(key) == '{"num_warps": 32}'


# --------------------------------------------------------------------------- signing


def test_signed_copy_verifies_and_require_signed_refuses(real_cache: tuple[Path, dict], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    cache_dir, _ = real_cache
    team = Signer(b"team secret")
    signed = tmp_path / "signed.db"
    with CacheDB(signed, signer=team) as db:
        assert Importer(db).run(cache_dir).problems == []
    monkeypatch.setenv(ENV_KEY, "team secret")
    ok = run("copy", str(signed), str(tmp_path / "copy.db"), "--require-signed")
    assert ok.exit_code == 0, ok.output
    verified = run("--db", str(tmp_path / "copy.db"), "verify")
    assert verified.exit_code == 0, verified.output

    foreign = tmp_path / "foreign.db"
    with CacheDB(foreign, signer=Signer(b"other key")) as db:
        assert Importer(db).run(cache_dir).problems == []
    unsigned = tmp_path / "unsigned.db"
    copy_database(signed, unsigned)
    with CacheDB(unsigned, signer=None) as db:
        db.signer = None
        with db.transaction() as repos:
            repos.best_configs.put("zz/unsigned.best_config", '{"num_warps": 4}')
    for bad, what in ((foreign, "0 unsigned and"), (unsigned, "1 unsigned and 0 foreign-signed")):
        dst = tmp_path / f"refused-{bad.stem}.db"
        result = run("copy", str(bad), str(dst), "--require-signed")
        assert result.exit_code == 1
        assert what in result.output and str(bad) in result.output and "nothing was written" in result.output
        assert not dst.exists()
        target = tmp_path / "copy.db"
        before = dump(target)
        with pytest.raises(UnsignedInputError):
            merge_databases([signed, bad], target, require_signed=True)
        assert dump(target) == before
    monkeypatch.delenv(ENV_KEY)
    no_key = run("copy", str(signed), str(tmp_path / "nokey.db"), "--require-signed")
    assert no_key.exit_code == 1 and ENV_KEY in no_key.output


# --------------------------------------------------------------------------- damage


def _damage(path: Path) -> None:
    """Overwrite the root page of guarded_entries and one page of the middle with random bytes."""
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page_size = con.execute("PRAGMA page_size").fetchone()[0]
    pages = con.execute("PRAGMA page_count").fetchone()[0]
    root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'guarded_entries'").fetchone()[0]
    con.execute("PRAGMA journal_mode = DELETE")
    con.close()
    rng = random.Random(5)
    with path.open("r+b") as f:
        for page in (root, pages // 2):
            f.seek((page - 1) * page_size)
            f.write(rng.randbytes(page_size))


def test_damaged_source_is_refused_with_nothing_written(real_cache: tuple[Path, dict], tmp_path: Path) -> None:
    cache_dir, _ = real_cache
    src = tmp_path / "damaged.db"
    filled(src, cache_dir)
    _damage(src)
    dst = tmp_path / "dst.db"
    result = run("copy", str(src), str(dst))
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert str(src) in lines[0] and "damaged" in lines[0] and "cachedb recover" in lines[0]
    assert not dst.exists()

    into = tmp_path / "into.db"
    filled(into, cache_dir, tag="b", quarantine=False)
    before = dump(into)
    with pytest.raises(DamagedSourceError):
        merge_databases([src], into)
    assert dump(into) == before


def test_help_has_examples() -> None:
    for command in ("copy", "merge"):
        result = run(command, "--help")
        assert result.exit_code == 0
        assert "Example:" in result.output and "cachedb " + command in result.output
