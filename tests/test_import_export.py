"""Import of real Inductor cache directories (torch 2.13 CPU) and byte-identical export."""

from __future__ import annotations

import gzip
import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from cachedb import CacheDB, ExportError, NotAnInductorCacheError
from cachedb.layout.exporter import export_cache_dir
from cachedb.layout.importer import Importer, scan
from cachedb.keys import sha256_hash

from ._realcache import build_real_cache

#: The real op list, kept in the repository (tests/data/, 550 KB gzipped) so a plain clone passes.
CORPUS = Path(__file__).resolve().parent / "data" / "configs_b15d29dd.json.gz"


def _files(cache_dir: Path) -> dict[str, list[Path]]:
    items, problems, _ = scan(cache_dir)
    assert problems == []
    out: dict[str, list[Path]] = {}
    for item in items:
        out.setdefault(item.kind, []).append(item.path)
    return out


def _leaf_count(cache: dict) -> int:
    return sum(_leaf_count(v) if isinstance(v, dict) and v else 1 for v in cache.values())


@pytest.mark.slow
def test_import_real_cache(real_cache: tuple[Path, dict], db: CacheDB) -> None:
    cache_dir, _ = real_cache
    files = _files(cache_dir)
    assert files.get("fxgraph") and files.get("aotautograd") and files.get("cache") and files.get("best_config")

    report = Importer(db).run(cache_dir)

    assert report.problems == []
    assert report.added["fxgraph"] == len(files["fxgraph"])
    assert report.added["aotautograd"] == len(files["aotautograd"])
    assert report.added["best_config"] == len(files["best_config"])
    leaves = sum(_leaf_count(json.loads(p.read_text())["cache"]) for p in files["cache"])
    assert report.added["autotune_timings"] > 0
    assert report.added["autotune_timings"] + report.added["local_cache_values"] == leaves

    with db.read() as repos:
        stored = {(e.kind, e.key, e.variant): e for e in repos.guarded.iter_all()}
        winners = repos.session.execute(text("SELECT op, choice_hash, timing_ms FROM autotune_winners")).all()
    assert winners, "max-autotune timings must give at least one winner"
    guarded_seen = 0
    for kind in ("fxgraph", "aotautograd"):
        for path in files[kind]:
            entry = stored[(kind, path.parent.name, path.name)]
            assert entry.payload == path.read_bytes()
            # Trusted data we just built: unpickling here (only in the test) gives the truth.
            expected = pickle.loads(path.read_bytes()).guards_expr
            assert entry.guards_expr == expected
            guarded_seen += expected is not None
    assert guarded_seen > 0, "dynamic-shape workloads must store entries with guards"


@pytest.mark.slow
def test_reimport_is_idempotent(real_cache: tuple[Path, dict], sqlite_db: CacheDB) -> None:
    cache_dir, _ = real_cache
    first = Importer(sqlite_db).run(cache_dir)
    second = Importer(sqlite_db).run(cache_dir)
    assert sum(second.added.values()) == 0
    assert second.unchanged == first.added
    with sqlite_db.read() as repos:
        n_timings = repos.session.execute(text("SELECT count(*) FROM autotune_timings")).scalar()
    assert n_timings == first.added["autotune_timings"]


@pytest.mark.slow
def test_export_is_byte_identical(real_cache: tuple[Path, dict], db: CacheDB, tmp_path: Path) -> None:
    cache_dir, _ = real_cache
    Importer(db).run(cache_dir)
    out = tmp_path / "exported"
    report = export_cache_dir(db, out)
    originals = {p.relative_to(cache_dir).as_posix(): p for ps in _files(cache_dir).values() for p in ps}
    exported = {p.relative_to(out).as_posix(): p for ps in _files(out).values() for p in ps}
    assert exported.keys() == originals.keys()
    for rel, path in originals.items():
        assert exported[rel].read_bytes() == path.read_bytes(), rel
    assert sum(report.written.values()) == len(originals)
    again = export_cache_dir(db, out)
    assert sum(again.written.values()) == 0 and sum(again.unchanged.values()) == len(originals)


@pytest.mark.slow
def test_fresh_process_hits_from_exported_dir(
    real_cache: tuple[Path, dict], sqlite_db: CacheDB, tmp_path: Path
) -> None:
    cache_dir, built = real_cache
    Importer(sqlite_db).run(cache_dir)
    out = tmp_path / "exported"
    export_cache_dir(sqlite_db, out)
    warm = build_real_cache(out)
    counters = warm["counters"]
    assert counters.get("fxgraph_cache_hit", 0) > 0
    assert counters.get("fxgraph_cache_miss", 0) == 0
    assert counters.get("autograd_cache_hit", 0) > 0
    assert counters.get("autograd_cache_miss", 0) == 0


def _copy_real(cache_dir: Path, dst: Path) -> Path:
    shutil.copytree(cache_dir, dst)
    return dst


@pytest.mark.slow
def test_bad_files_are_reported_and_the_rest_imports(
    real_cache: tuple[Path, dict], sqlite_db: CacheDB, tmp_path: Path
) -> None:
    cache_dir = _copy_real(real_cache[0], tmp_path / "cache")
    files = _files(cache_dir)
    # A truncated pickle, named as Inductor would name its bytes (so only the pickle is bad).
    victim = files["fxgraph"][0]
    cut = victim.read_bytes()[: victim.stat().st_size // 2]
    victim.unlink()
    truncated = victim.parent / sha256_hash(cut)
    truncated.write_bytes(cut)
    # A renamed (or bit-flipped) entry: its name is not the hash of its bytes.
    original = files["aotautograd"][0]
    renamed = original.parent / (("y" if original.name[0] == "x" else "x") + original.name[1:])
    original.rename(renamed)  # another first character: the old "x" + name[1:] was a no-op 1 time in 32
    # Malformed JSON.
    bad_json = files["best_config"][0]
    bad_json.write_text('{"XBLOCK": 512, "num_warps"')
    (cache_dir / "cache" / ("0" * 64)).write_text("not json")
    # Unexpected names.
    (cache_dir / "fxgraph" / "stray.txt").write_text("?")
    (cache_dir / "cache" / "notes").write_text("?")

    report = Importer(sqlite_db).run(cache_dir)

    reasons = {p.path: p.reason for p in report.problems}
    rel = lambda p: p.relative_to(cache_dir).as_posix()  # noqa: E731
    assert set(reasons) == {
        rel(truncated),
        rel(renamed),
        rel(bad_json),
        f"cache/{'0' * 64}",
        "fxgraph/stray.txt",
        "cache/notes",
    }
    assert "pickle" in reasons[rel(truncated)].lower() or "truncat" in reasons[rel(truncated)].lower()
    assert "JSON" in reasons[rel(bad_json)]
    assert report.added["fxgraph"] == len(files["fxgraph"]) - 1
    assert report.added["aotautograd"] == len(files["aotautograd"]) - 1
    assert report.added["best_config"] == len(files["best_config"]) - 1
    assert report.added["autotune_timings"] > 0


class CompiledFxGraph:  # stand-in: pickled with the default __reduce_ex__, like torch's dataclass
    pass


def _fx_file(root: Path, key: str, **state: object) -> str:
    obj = CompiledFxGraph()
    obj.__dict__.update(state)
    data = pickle.dumps(obj, protocol=4)
    path = root / "fxgraph" / key[1:3] / key / sha256_hash(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path.relative_to(root).as_posix()


def test_a_row_the_database_refuses_skips_only_its_file(db: CacheDB, tmp_path: Path) -> None:
    # Guarded entries and best configs of a batch go in one bulk INSERT; PostgreSQL refuses
    # text with NUL (SQLite stores it): the batch is then stored file by file and only that
    # file is reported. Re-importing changes nothing.
    root = tmp_path / "cache"
    good = [_fx_file(root, f"fkey{i:02d}", guards_expr=f"{i} <= L['t0']", _time_taken_ns=i + 1) for i in range(3)]
    bad = _fx_file(root, "fkeynul", guards_expr="a\x00b", _time_taken_ns=7)
    (root / "zz").mkdir()
    (root / "zz" / "czz.best_config").write_text('{"XBLOCK": 64, "num_warps": 4}')
    (root / "zz" / "cnul.best_config").write_text('{"XBLOCK": 64, "triton_cache_hash": "a\\u0000b"}')
    refused = db.engine.dialect.name == "postgresql"

    report = Importer(db).run(root)

    assert [p.path for p in report.problems] == ([bad, "zz/cnul.best_config"] if refused else [])
    assert all("rejected by the database" in p.reason for p in report.problems)
    assert report.added["fxgraph"] == len(good) + (not refused)
    assert report.added["best_config"] == 1 + (not refused)
    with db.read() as repos:
        assert repos.guarded.count("fxgraph") == len(good) + (not refused)
        assert repos.best_configs.get("zz/czz.best_config") == '{"XBLOCK": 64, "num_warps": 4}'
    again = Importer(db).run(root)
    assert sum(again.added.values()) == 0
    assert again.unchanged["fxgraph"] == len(good) + (not refused)


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["0", "1"])
def test_cachedb_import_loads_no_orm(real_cache: tuple[Path, dict], tmp_path: Path, workers: str) -> None:
    """``cachedb import`` writes through the repositories on Core statements, each batch's
    kinds in a ``SAVEPOINT`` of the Connection (``Repos.savepoint``): the process never
    imports ``sqlalchemy.orm`` or the ORM models (~0.09 s of a 0.5 s import of 10k files on a
    2-core VM). Run as the command runs, in a fresh process, in-process and with a worker."""
    cache_dir, _ = real_cache
    db_path, modules = tmp_path / "import.db", tmp_path / "modules.json"
    script = (
        "import json, sys\n"
        "from cachedb.cli import main\n"
        "try:\n"
        "    main(sys.argv[2:], standalone_mode=False)\n"
        "finally:\n"
        "    open(sys.argv[1], 'w').write(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(modules), "--db", str(db_path), "import", "--workers", workers, str(cache_dir)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(modules.read_text())
    assert {"cachedb.layout.importer", "cachedb.repositories.guarded", "sqlalchemy.engine"} <= set(loaded)
    assert [m for m in loaded if m.startswith("sqlalchemy.orm") or m == "cachedb.store.models"] == []
    with CacheDB(db_path) as db, db.read() as repos:
        assert repos.guarded.count("fxgraph") == len(_files(cache_dir)["fxgraph"])
        assert repos.guarded.count("aotautograd") == len(_files(cache_dir)["aotautograd"])


def test_not_an_inductor_cache(tmp_path: Path, sqlite_db: CacheDB) -> None:
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(NotAnInductorCacheError, match="not an Inductor cache"):
        Importer(sqlite_db).run(tmp_path / "photos")
    with pytest.raises(NotAnInductorCacheError, match="not a directory"):
        Importer(sqlite_db).run(tmp_path / "missing")


def test_unwritable_export_target(tmp_path: Path, sqlite_db: CacheDB) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(ExportError, match="a_file"):
        export_cache_dir(sqlite_db, blocker / "sub")
    with pytest.raises(ExportError, match="not a directory|cannot create"):
        export_cache_dir(sqlite_db, blocker)
    assert blocker.read_text() == "x"


def test_cutlass_corpus_round_trip(tmp_path: Path, sqlite_db: CacheDB) -> None:
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    original = gzip.decompress(CORPUS.read_bytes())
    (cache_dir / "configs_b15d29dd.json").write_bytes(original)
    report = Importer(sqlite_db).run(cache_dir)
    assert report.problems == [] and report.added["cutlass_op_list"] == 1
    with sqlite_db.read() as repos:
        row = repos.session.execute(
            text("SELECT op_count, arch, size_bytes FROM cutlass_op_lists WHERE request_key = 'b15d29dd'")
        ).one()
        n_ops = repos.session.execute(text("SELECT count(*) FROM cutlass_ops")).scalar()
    assert tuple(row) == (21268, 90, 83_690_684) and n_ops == 21268
    out = tmp_path / "exported"
    export_cache_dir(sqlite_db, out)
    assert (out / "configs_b15d29dd.json").read_bytes() == original


@pytest.mark.slow
def test_no_import_query_scans_what_is_stored(real_cache: tuple[Path, dict], tmp_path: Path) -> None:
    """Every SELECT an import runs on SQLite (a first import, then a re-import that finds
    everything stored) is planned as index searches: a scan of a table or index per query
    would make importing N entries cost O(N**2)."""
    import re

    import sqlite3

    from sqlalchemy import event

    db = CacheDB(tmp_path / "plans.db")
    selects: list[tuple[str, object]] = []

    @event.listens_for(db.engine, "before_cursor_execute")
    def _grab(conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ANN001
        if statement.lstrip().upper().startswith(("SELECT", "WITH")) and not executemany:
            selects.append((statement, parameters))

    try:
        cache_dir, _ = real_cache
        Importer(db, workers=0).run(cache_dir)
        Importer(db, workers=0).run(cache_dir)
    finally:
        db.close()
    assert any("guarded_entries" in s for s, _ in selects) and any("autotune_keys" in s for s, _ in selects)
    scans = set()
    with sqlite3.connect(tmp_path / "plans.db") as conn:
        for statement, parameters in selects:
            for *_, detail in conn.execute("EXPLAIN QUERY PLAN " + statement, parameters):
                # constants and the batch of keys a query looks up are scanned; stored rows are not
                if re.match(r"SCAN (?!CONSTANT ROW|\d+ CONSTANT ROWS|batch_keys)", detail):
                    scans.add((detail, " ".join(statement.split())[:160]))
    assert not scans, scans


def test_a_batch_of_keys_is_looked_up_through_the_index(tmp_path: Path) -> None:
    """``_bulk.matching`` on SQLite (timings import, copy, merge): 500 keys of a table of
    2,000 are found by index searches, with the right rows, duplicates and absent keys
    included."""
    import sqlite3

    from sqlalchemy import event, select

    from cachedb.store.bulk import matching
    from cachedb.store.models import AutotuneKey

    path = tmp_path / "keys.db"
    CacheDB(path).close()
    with sqlite3.connect(path) as raw:  # no foreign keys on a raw connection: no fingerprint rows needed
        raw.executemany(
            "INSERT INTO autotune_keys (id, fingerprint_id, op, inputs, precision) VALUES (?, 1, ?, ?, 'fp32')",
            [(i, f"op{i % 7}", f"[{i}]") for i in range(1, 2001)],
        )
    t = AutotuneKey.__table__
    wanted = [(1, f"op{i % 7}", f"[{i}]") for i in range(1, 1000, 2)] + [(1, "op1", "[1]"), (1, "absent", "[]")]
    wanted += [(1, "op\u00e9\n\"\U0001f600", "[]")]  # not stored: JSON escapes do not match it by accident
    db = CacheDB(path)
    executed: list[tuple[str, object]] = []
    event.listen(db.engine, "before_cursor_execute", lambda *a: executed.append((a[2], a[3])))
    try:
        with db.read() as repos:
            conn = repos.session.connection()
            stmt = matching(conn, select(t.c.id, t.c.op, t.c.inputs), t, ["fingerprint_id", "op", "inputs"], wanted)
            found = conn.execute(stmt).all()
    finally:
        db.close()
    sql, params = next((s, p) for s, p in executed if "autotune_keys" in s)
    assert sorted(found) == [(i, f"op{i % 7}", f"[{i}]") for i in range(1, 1000, 2)]
    with sqlite3.connect(path) as raw:
        plan = [row[-1] for row in raw.execute("EXPLAIN QUERY PLAN " + sql, params)]
    assert any(p.startswith("SEARCH autotune_keys USING") for p in plan), plan
    assert not any(p.startswith("SCAN autotune_keys") for p in plan), plan
