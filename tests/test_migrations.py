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

from cachedb import CacheDB, NotADatabaseError, SchemaTooNewError
from cachedb import _migrate
from cachedb.models import VIEW_NAMES, Base

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


def test_wheel_carries_migrations(tmp_path: Path) -> None:
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


def test_head_revision_constant_matches_alembic() -> None:
    """Opening a database at head skips Alembic entirely, trusting this constant."""
    assert _migrate.HEAD_REVISION == _migrate.head_revision()
