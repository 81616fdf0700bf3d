"""Shared fixtures: databases on SQLite and PostgreSQL, and a real Inductor cache directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from cachedb import CacheDB

#: The local PostgreSQL server (trust auth). Override with CACHEDB_TEST_PG_URL.
PG_URL = os.environ.get("CACHEDB_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _pg_available() -> bool:
    try:
        engine = create_engine(PG_URL)
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
        return True
    except Exception:
        return False


_PG = _pg_available()


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A URL to a fresh, empty PostgreSQL schema, dropped afterwards.

    Fails (does not skip) where PostgreSQL is unreachable, unless CACHEDB_TEST_NO_PG=1.
    """
    yield from _fresh_pg_schema()


@pytest.fixture(scope="module")
def module_pg_url() -> Iterator[str]:
    """:func:`pg_url`, one schema for a module's tests (a shared tier that a module fixture's
    child process fills once for all of them)."""
    yield from _fresh_pg_schema()


def _fresh_pg_schema() -> Iterator[str]:
    """A fresh schema's URL while the generator runs; skips or fails as :func:`pg_url` says."""
    if not _PG:
        if os.environ.get("CACHEDB_TEST_NO_PG") == "1":
            pytest.skip("PostgreSQL disabled by CACHEDB_TEST_NO_PG=1")
        pytest.fail(f"PostgreSQL not reachable at {PG_URL}")
    schema = f"cachedb_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_URL)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{PG_URL}?options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database location on each backend."""
    if request.param == "sqlite":
        return str(tmp_path / "cache.db")
    return request.getfixturevalue("pg_url")


#: Stands for the schema's name in :func:`pg_head_schema_sql`.
_SCHEMA = "@@SCHEMA@@"


@pytest.fixture(scope="session")
def pg_head_schema_sql() -> str | None:
    """SQL that fills an empty PostgreSQL schema (named :data:`_SCHEMA` in it) with the head
    revision: ``pg_dump`` of one schema the migrations made, once per session (and xdist
    worker): a test's migrated schema takes one script (~0.1 s) instead of every revision's
    steps (~0.6 s). ``None`` without PostgreSQL or ``pg_dump`` (each test migrates)."""
    pg_dump = shutil.which("pg_dump")
    if not _PG or pg_dump is None:
        return None
    from sqlalchemy.engine import make_url

    name = f"cachedb_head_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_URL)
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{name}"'))
        CacheDB(f"{PG_URL}?options=-csearch_path%3D{name}").close()
        url = make_url(PG_URL)
        args = [pg_dump, "--no-owner", "--no-privileges", "--inserts", "-n", name, "-h", url.host or "127.0.0.1",
                "-p", str(url.port or 5432), "-U", url.username or "postgres", url.database or "postgres"]
        dump = subprocess.run(args, capture_output=True, text=True, timeout=60,
                              env={**os.environ, **({"PGPASSWORD": url.password} if url.password else {})})
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
        admin.dispose()
    if dump.returncode != 0:
        return None
    lines = [line for line in dump.stdout.splitlines() if not line.startswith(("CREATE SCHEMA", "--", "\\"))]
    return "\n".join(lines).replace(name, _SCHEMA)


@pytest.fixture
def db(request: pytest.FixtureRequest, db_url: str) -> Iterator[CacheDB]:
    """A migrated, empty :class:`CacheDB` on SQLite (a copy of a database at the head revision,
    as ``CacheDB`` makes every new file) and on PostgreSQL (the session's head schema,
    :func:`pg_head_schema_sql`, replayed into the test's own schema)."""
    if "search_path" in db_url:
        sql = request.getfixturevalue("pg_head_schema_sql")
        if sql is not None:
            schema = db_url.rsplit("%3D", 1)[1]
            engine = create_engine(PG_URL)
            try:
                raw = engine.raw_connection()
                try:
                    raw.cursor().execute(sql.replace(_SCHEMA, schema))
                    raw.commit()
                finally:
                    raw.close()
            finally:
                engine.dispose()
    database = CacheDB(db_url)
    try:
        yield database
    finally:
        database.close()


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[CacheDB]:
    database = CacheDB(tmp_path / "cache.db")
    try:
        yield database
    finally:
        database.close()


def _built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Any) -> Any:
    """``build(directory)`` run once per test run, its JSON-able result shared by every xdist
    worker (the first to get ``<run's base temp>/name.lock`` builds; the others read what it
    left). Tests read what it built and never change it (they copy it first)."""
    import json

    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by the workers of this run
    target, done = root / name, root / f"{name}.json"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            target.mkdir(exist_ok=True)
            done.write_text(json.dumps(build(target)))
        return json.loads(done.read_text())


@pytest.fixture(scope="session")
def real_cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A real Inductor cache directory built by torch alone (examples/build_cache.py, run in a
    subprocess), and the builder's JSON summary. Built once per test run (every worker
    shares it)."""
    pytest.importorskip("torch")
    from ._realcache import build_real_cache

    def build(target: Path) -> list[Any]:
        return [str(target / "inductor"), build_real_cache(target / "inductor")]

    cache_dir, summary = _built_once(tmp_path_factory, "real_cache", build)
    return Path(cache_dir), summary


@pytest.fixture(scope="session", autouse=True)
def isa_probes(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """torch's vector-ISA probes (C++ test programs) built once per test run into a cache dir
    that :func:`tests._realcache.seeded` copies into a child's fresh one (``None`` without
    torch)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    from . import _realcache

    def build(target: Path) -> str:
        _realcache.build_isa_probes(target)
        return str(target)

    _realcache.ISA_PROBES = Path(_built_once(tmp_path_factory, "isa_probes", build))
    return _realcache.ISA_PROBES


@pytest.fixture(scope="session")
def live_cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, dict]:
    """The same workloads compiled under ``cachedb run`` into a database, then run again on a
    fresh machine's empty cache dir (tests/_realcache.py ``build_live_cache``): ``(db path, cold
    summary, warm summary)``. Built once per test run (every worker shares it)."""
    pytest.importorskip("torch")
    from ._realcache import build_live_cache

    def build(target: Path) -> list[Any]:
        db, cold, warm = build_live_cache(target)
        return [str(db), cold, warm]

    db, cold, warm = _built_once(tmp_path_factory, "live_cache", build)
    return Path(db), cold, warm


@pytest.fixture(scope="module")
def pgbouncer() -> Iterator[Any]:
    """A real PgBouncer in transaction pooling mode (10 server connections per database) in
    front of this machine's PostgreSQL; fails (does not skip) where ``pgbouncer`` is missing,
    unless CACHEDB_TEST_NO_PGBOUNCER=1."""
    from benchmarks._pgbouncer import PgBouncer, binary

    if binary() is None:
        if os.environ.get("CACHEDB_TEST_NO_PGBOUNCER") == "1":
            pytest.skip("PgBouncer disabled by CACHEDB_TEST_NO_PGBOUNCER=1")
        pytest.fail("pgbouncer is not installed (apt-get install pgbouncer; .ci/test installs it)")
    bouncer = PgBouncer(pool_size=10)
    try:
        yield bouncer
    finally:
        bouncer.close()


@pytest.fixture
def database(pg_url: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database (PgBouncer passes no ``search_path`` option, so its
    tests get a database of their own rather than a schema), dropped afterwards."""
    name = f"cachedb_fleet_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield name
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
