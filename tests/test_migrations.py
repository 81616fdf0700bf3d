"""Schema migrations: upgrade from empty equals the models, one head, round trip, refusal of
newer schemas and of files that are not SQLite."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from cachedb import CacheDB, MigrationError, NotADatabaseError, SchemaTooNewError
from cachedb.store import migrate as _migrate
from cachedb.store.models import VIEW_NAMES, Base

ROOT = Path(__file__).resolve().parent.parent


def _diff(db: CacheDB) -> list:
    with db.engine.connect() as conn:
        return compare_metadata(MigrationContext.configure(conn), Base.metadata)


def test_upgrade_from_empty_equals_models(db: CacheDB) -> None:
    assert _diff(db) == []
    assert db.revision() == _migrate.head_revision()
    names = set(inspect(db.engine).get_view_names())
    assert set(VIEW_NAMES) <= names


def test_one_head() -> None:
    script = ScriptDirectory.from_config(_migrate.alembic_config())
    assert len(script.get_heads()) == 1
    assert (_migrate.migrations_dir() / "env.py").is_file()


def test_downgrade_upgrade_round_trip(db: CacheDB) -> None:
    _migrate.downgrade(db.engine, "base")
    assert db.revision() is None
    assert set(inspect(db.engine).get_table_names()) <= {"alembic_version"}
    assert inspect(db.engine).get_view_names() == []
    assert db.upgrade() is True
    assert db.upgrade() is False
    assert _diff(db) == []


def test_schema_newer_than_code_is_refused(db_url: str) -> None:
    CacheDB(db_url).close()
    db = CacheDB(db_url)
    with db.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999_future'"))
    db.close()
    with pytest.raises(SchemaTooNewError) as info:
        CacheDB(db_url)
    message = str(info.value)
    assert "9999_future" in message and _migrate.head_revision() in message


def test_not_sqlite_file_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    original = b"these are my notes, not a database\n" * 10
    path.write_bytes(original)
    with pytest.raises(NotADatabaseError) as info:
        CacheDB(path)
    assert str(path) in str(info.value)
    assert path.read_bytes() == original
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]


def test_sqlite_header_with_garbage_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "broken.db"
    original = b"SQLite format 3\x00" + b"\xff" * 4000
    path.write_bytes(original)
    with pytest.raises(NotADatabaseError):
        CacheDB(path)
    assert path.read_bytes() == original


def test_sqlite_setup(sqlite_db: CacheDB) -> None:
    with sqlite_db.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000


def test_wheel_carries_migrations_and_every_module(tmp_path: Path) -> None:
    """The wheel holds the migrations and every module of the source tree (a subpackage
    missing from pyproject's ``packages`` imports in an editable install but not from a wheel)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
    )
    (wheel,) = tmp_path.glob("cachedb-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    versions = {p.name for p in (ROOT / "migrations" / "versions").glob("*.py")}
    assert "cachedb/migrations/env.py" in names
    assert "cachedb/migrations/script.py.mako" in names
    assert {f"cachedb/migrations/versions/{v}" for v in versions} <= names
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "cachedb").rglob("*.py")}
    assert modules - names == set()


def test_head_revision_constant_matches_alembic() -> None:
    """Opening a database at head skips Alembic entirely, trusting this constant."""
    assert _migrate.HEAD_REVISION == _migrate.head_revision()


#: The columns the timing views have had since revision 0001 (``autotune_timings`` since 0004).
_REVISION_0001_COLUMNS = {
    "autotune_timings": ("id", "fingerprint_id", "op", "inputs", "hint_override", "precision", "choice_hash",
                         "timing_ms", "position", "recorded_at"),
    "autotune_current": ("fingerprint_id", "op", "inputs", "hint_override", "precision", "choice_hash",
                         "timing_ms", "recorded_at"),
    "autotune_winners": ("fingerprint_id", "system_hash", "device_name", "torch_version", "cpu_model", "op",
                         "inputs", "hint_override", "precision", "choice_hash", "timing_ms", "candidates",
                         "recorded_at"),
    "autotune_history": ("id", "op", "inputs", "hint_override", "precision", "choice_hash", "timing_ms",
                         "recorded_at", "system_hash", "device_name", "cuda_version", "hip_version", "triton_key",
                         "torch_version", "torch_key", "cpu_model", "isa"),
}


def _timing_state(db: CacheDB) -> dict[str, list[tuple]]:
    """The flat timings and the tuning-history views, the columns every revision shows (those
    of revision 0001; 0011 adds the choices' after them), as plain tuples (timestamps as text)."""
    out = {}
    with db.engine.connect() as conn:
        for name, order in (
            ("autotune_timings", "id"),
            ("autotune_current", "fingerprint_id, op, inputs, precision, choice_hash"),
            ("autotune_winners", "fingerprint_id, op, inputs, precision"),
            ("autotune_history", "id"),
        ):
            columns = ", ".join(_REVISION_0001_COLUMNS[name])
            rows = conn.execute(text(f"SELECT {columns} FROM {name} ORDER BY {order}")).all()
            out[name] = [tuple(str(v) if v is not None else None for v in row) for row in rows]
    return out


def test_compact_timings_migration_keeps_every_benchmark(db: CacheDB) -> None:
    """0004 moves the flat ``autotune_timings`` rows (history, hint overrides, two
    fingerprints) into keys, runs and run timings and back, on SQLite and PostgreSQL: the view
    of the old name, the history views and the live lookups read the same before and after."""
    from cachedb.fingerprint import Fingerprint

    mm = "[('cuda', 'torch.float16', 64, 64, 64, 1, 0)]"
    with db.transaction() as repos:
        a = repos.fingerprints.ensure(Fingerprint(system={"hash": "s" * 64, "device": {"name": "H100"}}))
        b = repos.fingerprints.ensure(Fingerprint(system={"hash": "t" * 64, "device": {"name": "A100"}}))
        repos.timings.record(a, "mm", mm, "highest", {"triton_mm_1": 0.5, "aten_mm": 0.4})
        repos.timings.record(a, "mm", mm, "high", {"aten_mm": 0.3})
        repos.timings.record(a, "mm", mm, "highest", {"triton_mm_1": 0.6}, hint_override=128)
        repos.timings.record(b, "addmm", mm, "highest", {"aten_addmm": 1.25})
    with db.transaction() as repos:  # a re-benchmark: history
        repos.timings.record(a, "mm", mm, "highest", {"triton_mm_1": 0.2, "aten_mm": 0.45})
    before = _timing_state(db)
    assert len(before["autotune_timings"]) == 7 and len(before["autotune_current"]) == 5

    _migrate.downgrade(db.engine, "0003")
    tables = set(inspect(db.engine).get_table_names())
    assert "autotune_timings" in tables and "autotune_keys" not in tables
    assert _timing_state(db) == before

    assert db.upgrade() is True
    assert _timing_state(db) == before
    with db.engine.connect() as conn:
        counts = [conn.execute(text(f"SELECT COUNT(*) FROM {t}")).scalar_one()
                  for t in ("autotune_keys", "autotune_runs", "autotune_run_timings")]
    assert counts == [4, 5, 7]
    with db.transaction() as repos:  # ids continue after the moved ones (PostgreSQL sequences)
        repos.timings.record(a, "mm", mm, "highest", {"aten_mm": 0.1})
    with db.read() as repos:
        ids = repos.fingerprints.ids_for_system_hash("s" * 64)
        assert repos.timings.lookup(ids, "mm", mm, "highest") == {"triton_mm_1": 0.2, "aten_mm": 0.1}
        assert repos.timings.lookup(ids, "mm", mm, "highest", hint_override=128) == {"triton_mm_1": 0.6}
        assert repos.timings.lookup(ids, "mm", mm, "high") == {"aten_mm": 0.3}
    after = _timing_state(db)["autotune_timings"]
    assert after[:7] == before["autotune_timings"] and int(after[7][0]) > int(after[6][0])


def _best_config_state(db: CacheDB) -> tuple[set[str], list[tuple]]:
    """The index names of ``best_configs`` and its rows (timestamps as text; the columns of
    revision 0004, which 0005 reshapes: ``ed25519_signature`` comes with 0009)."""
    indexes = {ix["name"] for ix in inspect(db.engine).get_indexes("best_configs")}
    with db.engine.connect() as conn:
        rows = conn.execute(text("SELECT * FROM best_configs ORDER BY id")).mappings().all()
    return indexes, [tuple(str(v) if v is not None else None for k, v in row.items() if k != "ed25519_signature")
                     for row in rows]


def test_lean_best_configs_migration_keeps_every_config(db: CacheDB) -> None:
    """0005 drops the ``configs_hash`` index and nothing else, on SQLite and PostgreSQL: the
    rows read the same down at 0004 (index back) and up again (index gone), and a best config
    written after the upgrade is found by its key."""
    first = '{"XBLOCK": 128, "num_warps": 4, "num_stages": 1, "configs_hash": "' + "a" * 64 + '"}'
    second = '{"XBLOCK": 64, "R0_BLOCK": 8, "num_warps": 2, "num_stages": 2, "configs_hash": "' + "b" * 64 + '"}'
    with db.transaction() as repos:
        repos.best_configs.put("ab/first.best_config", first)
        repos.best_configs.put("cd/second.best_config", second)
    indexes, rows = _best_config_state(db)
    assert "ix_best_configs_configs_hash" not in indexes and len(rows) == 2

    _migrate.downgrade(db.engine, "0004")
    assert _best_config_state(db) == (indexes | {"ix_best_configs_configs_hash"}, rows)

    assert db.upgrade() is True
    assert _best_config_state(db) == (indexes, rows)
    assert _diff(db) == []
    with db.transaction() as repos:
        repos.best_configs.put("ef/third.best_config", first)
    with db.read() as repos:
        assert repos.best_configs.get("ef/third.best_config") == first
        assert repos.best_configs.get("cd/second.best_config") == second


def test_timing_precisions_of_torch_2_15_fit_after_0008(db: CacheDB) -> None:
    """torch 2.15 keys timings by backend precisions (``"cuda:none,mkldnn:none"``, 21
    characters): PostgreSQL refused them under revision 0007's VARCHAR(16). Timings stored
    before the upgrade keep their rows, history and winners; a 2.15 precision is stored and
    looked up after it, on SQLite and PostgreSQL."""
    from cachedb.fingerprint import Fingerprint

    inputs = "[('cuda', 'torch.bfloat16', 64, 64)]"
    with db.transaction() as repos:
        fp = repos.fingerprints.ensure(Fingerprint(system={"hash": "s" * 64, "device": {"name": "H100"}}))
    _migrate.downgrade(db.engine, "0007")
    with db.engine.begin() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == "0007"
    with db.transaction() as repos:
        repos.timings.record(fp, "mm", inputs, "highest", {"aten": 0.5, "triton_a": 0.25})
    before = _timing_rows(db)

    assert db.upgrade() is True
    assert _diff(db) == []
    assert _timing_rows(db) == before
    precision = "cuda:none,mkldnn:none"
    with db.transaction() as repos:
        repos.timings.record(fp, "mm", inputs, precision, {"aten": 0.75, "triton_b": 0.125})
    with db.read() as repos:
        assert repos.timings.lookup([fp], "mm", inputs, precision) == {"aten": 0.75, "triton_b": 0.125}
        assert repos.timings.lookup([fp], "mm", inputs, "highest") == {"aten": 0.5, "triton_a": 0.25}
    with db.engine.connect() as conn:
        winners = conn.execute(text("SELECT precision, choice_hash FROM autotune_winners ORDER BY precision")).all()
    assert [tuple(w) for w in winners] == [(precision, "triton_b"), ("highest", "triton_a")]


def test_downgrade_below_0008_refuses_long_precisions_on_postgresql(db: CacheDB) -> None:
    """On PostgreSQL, narrowing the column back would truncate torch 2.15's precisions: the
    downgrade raises MigrationError and the schema and the rows stay as they were. SQLite
    enforces no declared length, so there the downgrade goes through with the rows intact."""
    from cachedb.fingerprint import Fingerprint

    with db.transaction() as repos:
        fp = repos.fingerprints.ensure(Fingerprint(system={"hash": "s" * 64, "device": {"name": "H100"}}))
        repos.timings.record(fp, "mm", "[()]", "cuda:none,mkldnn:none", {"aten": 0.5})
    before = _timing_rows(db)
    if db.engine.dialect.name == "postgresql":
        with pytest.raises(MigrationError, match="precision holds a value of 21 characters"):
            _migrate.downgrade(db.engine, "0007")
        expected = _migrate.HEAD_REVISION
    else:
        _migrate.downgrade(db.engine, "0007")
        expected = "0007"
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == expected
    assert _timing_rows(db) == before


def _timing_rows(db: CacheDB) -> list[tuple]:
    with db.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            "SELECT op, inputs, precision, choice_hash, timing_ms FROM autotune_timings ORDER BY id"
        ))]


def test_choice_descriptions_migration_up_and_down(db: CacheDB) -> None:
    """0011 on SQLite and PostgreSQL: down at 0010 the timing views read as revision 0001 made
    them (the same rows, no choice columns) and ``autotune_choices`` is gone; up again, the
    views show the choices' columns, ``NULL`` until a choice is described."""
    from cachedb.fingerprint import Fingerprint
    from cachedb.repositories.choices import describe

    mm = "[('cuda', 'torch.bfloat16', 64, 64, 64, 1, 0)]"
    with db.transaction() as repos:
        fp = repos.fingerprints.ensure(Fingerprint(system={"hash": "s" * 64, "device": {"name": "H200"}}))
        repos.timings.record(fp, "mm", mm, "high", {"triton_mm-ca": 0.5, "mm-cb": 0.4})
        repos.choices.put_new([describe("mm-cb", "mm", "", {"backend": "extern"})])
    before = _timing_state(db)
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT choice_name, backend, runner_up_choice_hash FROM autotune_winners")).one() == (
            "mm", "extern", "triton_mm-ca")

    _migrate.downgrade(db.engine, "0010")
    assert "autotune_choices" not in inspect(db.engine).get_table_names()
    for view in ("autotune_current", "autotune_winners", "autotune_history"):
        columns = [c["name"] for c in inspect(db.engine).get_columns(view)]
        assert tuple(columns) == _REVISION_0001_COLUMNS[view], view
    assert _timing_state(db) == before

    assert db.upgrade() is True
    assert _diff(db) == [] and _timing_state(db) == before
    with db.engine.connect() as conn:
        columns = [c["name"] for c in inspect(db.engine).get_columns("autotune_history")]
        assert columns[len(_REVISION_0001_COLUMNS["autotune_history"]):] == [
            "choice_name", "backend", "description", "kernel_name", "tile_shape", "num_stages", "num_warps", "group_m"]
        assert conn.execute(text("SELECT choice_name FROM autotune_winners")).scalar_one() is None
    with db.transaction() as repos:
        assert repos.choices.put_new([describe("mm-cb", "mm", "", {"backend": "extern"})]) == 1
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT choice_name FROM autotune_winners")).scalar_one() == "mm"


def test_entry_value_migration_up_and_down(db: CacheDB) -> None:
    """0014 on SQLite and PostgreSQL: ``entry_value`` gives each variant's compile seconds,
    hits, seconds saved and bytes; down at 0013 the view is gone and every entry row is kept;
    up again, the view reads the same rows."""
    with db.transaction() as repos:
        repos.guarded.put("fxgraph", "fcheap", b"c" * 2_000, guards_expr=None, time_taken_ns=250_000_000)
        repos.guarded.put("aotautograd", "aexpensive", b"e" * 5_000, guards_expr=None, time_taken_ns=40_000_000_000)
        repos.guarded.put("fxgraph", "funknown", b"u" * 100, guards_expr=None)
        for key, kind, hits in (("fcheap", "fxgraph", 4), ("aexpensive", "aotautograd", 3), ("funknown", "fxgraph", 2)):
            (variant,) = repos.guarded.variant_names(kind, key)
            for _ in range(hits):
                repos.guarded.record_hit(kind, key, variant)

    def value_rows() -> list[tuple]:
        with db.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(
                "SELECT kind, key, compile_seconds, hits, seconds_saved, size_bytes, stored_bytes > 0 "
                "FROM entry_value ORDER BY key"))]

    def entry_rows() -> list[tuple]:
        with db.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(
                "SELECT kind, key, variant, time_taken_ns, hit_count, size_bytes, checksum FROM guarded_entries "
                "ORDER BY key"))]

    expected = [("aotautograd", "aexpensive", 40.0, 3, 120.0, 5_000, True),
                ("fxgraph", "fcheap", 0.25, 4, 1.0, 2_000, True), ("fxgraph", "funknown", None, 2, 0.0, 100, True)]
    assert value_rows() == expected
    before = entry_rows()
    _migrate.downgrade(db.engine, "0013")
    assert "entry_value" not in inspect(db.engine).get_view_names()
    assert entry_rows() == before
    assert db.upgrade() is True
    assert _diff(db) == [] and entry_rows() == before and value_rows() == expected
