"""``cachedb prune`` and Dynamo's caches: PGO profiles and precompiled packages go by their last
use, as guarded entries do, and take their share of a --max-bytes excess."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from click.testing import CliRunner
from sqlalchemy import text

from cachedb import CacheDB
from cachedb.cli import main
from cachedb.tools import prune


def _fill(db: CacheDB) -> None:
    old = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    with db.transaction() as repos:
        repos.pgo.put("old_None_", os.urandom(3000))
        repos.pgo.put("new_None_", os.urandom(3000))
        repos.dynamo("precompile").put("a" * 64, os.urandom(20_000))
        repos.session.execute(text("UPDATE pgo_profiles SET last_used_at = :t WHERE key = 'old_None_'"), {"t": old})


def test_prune_older_than_removes_unused_profiles_and_the_dry_run_nothing(tmp_path: Path) -> None:
    db_path = tmp_path / "c.db"
    with CacheDB(db_path) as db:
        _fill(db)
    runner = CliRunner()
    dry = runner.invoke(main, ["--db", str(db_path), "prune", "--older-than", "30d", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "pgo_profile" in dry.output
    with CacheDB(db_path) as db, db.read() as repos:
        assert repos.pgo.count() == 2
    done = runner.invoke(main, ["--db", str(db_path), "prune", "--older-than", "30d", "--yes"])
    assert done.exit_code == 0, done.output
    with CacheDB(db_path) as db, db.read() as repos:
        assert repos.pgo.keys() == ["new_None_"]
        assert repos.dynamo("precompile").count() == 1


def test_max_bytes_takes_each_kind_s_share(db: CacheDB) -> None:
    _fill(db)
    with db.transaction() as repos:
        total = prune.plan(repos).total_bytes
        plan = prune.plan(repos, max_bytes=total // 2)
        by_kind = {row["kind"]: row for row in plan.rows()}
        assert by_kind["dynamo_package"]["entries"] == 1  # the package holds most of the bytes
        result = prune.apply(repos, plan)
    assert result.entries == plan.entries >= 1
    with db.read() as repos:
        assert repos.dynamo("precompile").count() == 0
