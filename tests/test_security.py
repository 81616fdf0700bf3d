"""Least privilege, trust and signing: owner-only files, no pickles from others' databases,
HMAC-signed entries."""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import text, update

from cachedb import CacheDB, CorruptPayloadError
from cachedb.store.signing import ENV_KEY, Signer
from cachedb.store.trust import untrusted_reason
from cachedb.cli import main
from cachedb.store.models import GuardedEntry

from ._realcache import seeded


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_database_and_its_files_are_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "new" / "dir" / "cache.db"
    db = CacheDB(path)  # creates the directories, the file, runs the migrations (lock file)
    with db.transaction() as repos:
        repos.guarded.put("fxgraph", "fk", b"x" * 100, guards_expr=None)
    files = {p.name: _mode(p) for p in path.parent.iterdir()}
    db.close()
    assert _mode(path.parent) == 0o700  # the database's own directory: owner only
    assert _mode(path.parent.parent) & 0o022 == 0  # parents created on the way: owner-writable only
    assert {"cache.db", "cache.db-wal", "cache.db-shm", "cache.db.lock"} <= set(files)
    assert all(mode == 0o600 for mode in files.values()), files


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="chown needs root")
def test_trust_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CACHEDB_TRUST", raising=False)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    db = home / "c.db"
    db.write_bytes(b"")
    db.chmod(0o600)
    assert untrusted_reason(db) is None
    db.chmod(0o664)
    assert "writable by group or others" in untrusted_reason(db)
    db.chmod(0o600)
    os.chown(db, 12345, 12345)
    assert "owned by uid 12345" in untrusted_reason(db)
    os.chown(db, 0, 0)
    home.chmod(0o777)
    assert "writable by others" in untrusted_reason(db)
    home.chmod(0o1777)  # sticky, like /tmp: others cannot replace our file
    assert untrusted_reason(db) is None
    monkeypatch.setenv("CACHEDB_TRUST", "1")
    home.chmod(0o777)
    assert untrusted_reason(db) is None


_LOAD = """
    import logging, sys, cachedb, torch
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
    from torch._dynamo.utils import counters
    cachedb.install(sys.argv[1])
    torch.compile(lambda x: torch.cos(x) + 2)(torch.ones(4))
    print(dict(counters["inductor"]))
"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="chown needs root")
def test_pickles_from_another_users_db_are_not_loaded(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "load.py"
    script.write_text(textwrap.dedent(_LOAD))
    db = tmp_path / "c.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_")}
    env["TORCHINDUCTOR_CACHE_DIR"] = seeded(tmp_path / "ind")

    def run(extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(script), str(db)], capture_output=True, text=True,
                              env={**env, **(extra or {})}, timeout=600)

    assert run().returncode == 0
    assert "fxgraph_cache_hit" in run().stdout  # our own database: served
    os.chown(db, 12345, 12345)
    refused = run()
    assert refused.returncode == 0, refused.stderr[-2000:]
    assert "fxgraph_cache_hit" not in refused.stdout
    assert "not loading pickled" in refused.stderr and "uid 12345" in refused.stderr
    trusted = run({"CACHEDB_TRUST": "1"})
    assert "fxgraph_cache_hit" in trusted.stdout


def test_signed_database_serves_only_signed_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "team.db"
    team = Signer(b"team secret")
    with CacheDB(path) as unsigned_db, unsigned_db.transaction() as repos:
        repos.guarded.put("fxgraph", "fk", b"unsigned" * 10, guards_expr=None)
        repos.best_configs.put("ab/unsigned.best_config", '{"XBLOCK": 1}')
    with CacheDB(path, signer=team) as db:
        with db.transaction() as repos:
            signed, _ = repos.guarded.put("fxgraph", "fk", b"signed" * 10, guards_expr=None)
            repos.best_configs.put("ab/signed.best_config", '{"XBLOCK": 2}')
        with db.read() as repos:
            loaders = dict(repos.guarded.raw_candidates("fxgraph", "fk"))
            assert loaders[signed]() == b"signed" * 10
            (unsigned,) = set(loaders) - {signed}
            with pytest.raises(CorruptPayloadError, match="signature"):
                loaders[unsigned]()
            assert repos.best_configs.get("ab/signed.best_config") == '{"XBLOCK": 2}'
            with pytest.raises(CorruptPayloadError, match="signature"):
                repos.best_configs.get("ab/unsigned.best_config")
    # Another team's key verifies nothing.
    with CacheDB(path, signer=Signer(b"other key")) as other, other.read() as repos:
        for _, load in repos.guarded.raw_candidates("fxgraph", "fk"):
            with pytest.raises(CorruptPayloadError):
                load()
    # verify (with the key from the environment) quarantines the unsigned entry.
    monkeypatch.setenv(ENV_KEY, "team secret")
    result = CliRunner().invoke(main, ["--db", str(path), "verify", "--format", "json"])
    assert result.exit_code == 1 and "signature" in result.output
    with CacheDB(path) as db, db.read() as repos:
        assert [v for v, _ in repos.guarded.candidates("fxgraph", "fk")] == [signed]


@pytest.mark.skipif(not hasattr(sqlite3.Connection, "blobopen"), reason="sqlite3 reads in place from Python 3.11")
def test_a_signed_database_checks_large_variants_read_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The live lookup reads a variant of 1 MiB or more in place (SQLite's incremental blob
    I/O); under a team key it still serves only the signed one, and refuses an unsigned one
    as it refuses a small one."""
    import cachedb
    from torch._dynamo.utils import counters
    from torch._inductor.codecache import FxGraphCache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    path = tmp_path / "team-large.db"
    key = "fsignedlarge" + "0" * 40
    import pickle

    unsigned_payload = pickle.dumps(("unsigned", os.urandom(1 << 19) + bytes(3 << 19)))
    signed_payload = pickle.dumps(("signed", os.urandom(1 << 19) + bytes(3 << 19)))
    with CacheDB(path) as db, db.transaction() as repos:  # written without the key
        repos.guarded.put("fxgraph", key, unsigned_payload, guards_expr=None)
    monkeypatch.setenv(ENV_KEY, "team secret")
    counters.clear()
    with cachedb.installed(path):
        FxGraphCache._write_to_local_cache(key, signed_payload)
        from cachedb.live import _seams

        served = [content for _, content in _seams._active_store().guarded_candidates("fxgraph", key)]
    assert served == [signed_payload]
    assert counters["inductor"]["cachedb_corrupt_payload"] == 1


def test_corrupt_entries_are_quarantined_not_deleted(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    with CacheDB(path) as db:
        with db.transaction() as repos:
            bad, _ = repos.guarded.put("aotautograd", "ak", b"will rot" * 50, guards_expr=None)
            good, _ = repos.guarded.put("aotautograd", "ak", b"stays good" * 50, guards_expr=None)
        with db.engine.begin() as conn:
            conn.execute(update(GuardedEntry).where(GuardedEntry.variant == bad).values(checksum="0" * 64))
    first = CliRunner().invoke(main, ["--db", str(path), "verify", "--format", "json"])
    assert first.exit_code == 1 and f"aotautograd/ak/{bad}" in first.output
    second = CliRunner().invoke(main, ["--db", str(path), "verify", "--format", "json"])
    assert second.exit_code == 1 and "quarantined aotautograd" in second.output
    with CacheDB(path) as db, db.read() as repos:
        assert [v for v, _ in repos.guarded.candidates("aotautograd", "ak")] == [good]
        kept = repos.session.execute(text("SELECT variant, reason FROM quarantined_entries")).all()
    assert [tuple(r) for r in kept] == [(bad, "SHA-256 checksum mismatch")]


def test_prune_evicts_least_recently_used(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    now = dt.datetime.now(dt.timezone.utc)
    with CacheDB(path) as db:
        with db.transaction() as repos:
            variants = [repos.guarded.put("fxgraph", f"f{i:02d}", os.urandom(10_000), guards_expr=None)[0]
                        for i in range(10)]
        with db.engine.begin() as conn:
            for i, v in enumerate(variants):  # entry i was last used i days ago
                conn.execute(update(GuardedEntry).where(GuardedEntry.variant == v)
                             .values(last_used_at=now - dt.timedelta(days=i)))
    result = CliRunner().invoke(main, ["--db", str(path), "prune", "--older-than", "7.5d"])
    assert result.exit_code == 0 and "removed 2 entries" in result.output  # 8 and 9 days old
    result = CliRunner().invoke(main, ["--db", str(path), "prune", "--max-bytes", "35K", "--vacuum", "--yes"])
    assert result.exit_code == 0, result.output
    with CacheDB(path) as db, db.read() as repos:
        left = repos.session.execute(text("SELECT key FROM guarded_entries ORDER BY key")).scalars().all()
    assert left == ["f00", "f01", "f02"]  # random bytes do not compress: 3 x ~10 KB <= 35 KiB
    bad = CliRunner().invoke(main, ["--db", str(path), "prune", "--max-bytes", "lots"])
    assert bad.exit_code == 2 and "expected a size" in bad.output


_HITS = """
    import sys, cachedb, torch
    cachedb.install(sys.argv[1])
    f = torch.compile(lambda x: torch.tan(x) - 1)
    f(torch.ones(3))
"""


@pytest.mark.slow
def test_hits_update_counts_and_last_use(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "hits.py"
    script.write_text(textwrap.dedent(_HITS))
    db = tmp_path / "h.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_")}
    env["TORCHINDUCTOR_CACHE_DIR"] = seeded(tmp_path / "ind")
    for _ in range(3):
        subprocess.run([sys.executable, str(script), str(db)], check=True, env=env, timeout=600,
                       capture_output=True)
    with CacheDB(db) as database, database.read() as repos:
        rows = repos.session.execute(
            text("SELECT kind, hit_count, last_used_at > created_at FROM guarded_entries ORDER BY kind")
        ).all()
    # Runs 2 and 3 each hit the AOTAutograd entry, which loads its FX graph entry by key.
    assert [(kind, hits, bool(later)) for kind, hits, later in rows] == [
        ("aotautograd", 2, True), ("fxgraph", 2, True)
    ]


def test_a_first_lookup_refuses_pickles_of_another_users_db(tmp_path: Path) -> None:
    """The first thing a process asks of a foreign-owned database may be an FX graph lookup:
    opening it (on that lookup) already decides that its pickles are not served."""
    import pickle
    from types import SimpleNamespace

    from cachedb.live._store import LiveStore

    db = tmp_path / "c.db"
    content = pickle.dumps(SimpleNamespace(guards_expr=None))
    store = LiveStore(str(db))
    store.guarded_put("fxgraph", "fkey", content)
    store.close()

    def first_lookup(trust: bool = False) -> list[bytes]:
        store = LiveStore(str(db), trust=trust)
        try:
            return [c for _, c in store.guarded_candidates("fxgraph", "fkey")]
        finally:
            store.close()

    assert first_lookup() == [content]
    os.chown(db, 12345, 12345)
    assert first_lookup() == []
    assert first_lookup(trust=True) == [content]
