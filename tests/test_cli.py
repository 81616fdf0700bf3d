"""The command line, end to end on a real cache directory and a real database."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from cachedb import CacheDB
from cachedb.cli import main
from cachedb.models import GuardedEntry

COMMANDS = ["init", "import", "export", "stats", "query", "upgrade", "verify", "prune", "run"]


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_an_example(command: str) -> None:
    result = run(command, "--help")
    assert result.exit_code == 0
    assert "Example:" in result.output and "cachedb --db" in result.output


def test_python_dash_m(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    out = subprocess.run(
        [sys.executable, "-m", "cachedb", "--db", str(db), "init"], capture_output=True, text=True, check=True
    )
    from cachedb._migrate import head_revision

    assert out.stdout.strip() == f"{db}: schema revision {head_revision()}"


@pytest.mark.slow
def test_import_stats_query_export_verify(real_cache: tuple[Path, dict], tmp_path: Path) -> None:
    cache_dir, _ = real_cache
    db = str(tmp_path / "cli.db")

    result = run("--db", db, "import", str(cache_dir))
    assert result.exit_code == 0, result.output
    assert "fxgraph" in result.output and "autotune_timings" in result.output

    stats = json.loads(run("--db", db, "stats", "--format", "json").output)
    kinds = {row["kind"] for row in stats}
    assert {"fxgraph", "aotautograd", "autotune_timings", "best_config"} <= kinds
    fx = [row for row in stats if row["kind"] == "fxgraph"]
    assert sum(r["entries"] for r in fx) > 0 and all(r["bytes"] > r["stored_bytes"] > 0 for r in fx)

    csv_out = run("--db", db, "query", "SELECT kind, count(*) AS n FROM guarded_entries GROUP BY kind ORDER BY kind",
                  "--format", "csv").output
    rows = list(csv.DictReader(io.StringIO(csv_out)))
    assert [r["kind"] for r in rows] == ["aotautograd", "fxgraph"] and all(int(r["n"]) > 0 for r in rows)

    table = run("--db", db, "query", "SELECT op, choice_hash, timing_ms FROM autotune_winners")
    assert table.exit_code == 0 and "choice_hash" in table.output

    out = tmp_path / "exported"
    assert run("--db", db, "export", str(out)).exit_code == 0
    assert any(out.glob("fxgraph/*/*/*"))

    verified = run("--db", db, "verify")
    assert verified.exit_code == 0 and "ok" in verified.output


def test_query_is_read_only(tmp_path: Path) -> None:
    db = str(tmp_path / "ro.db")
    run("--db", db, "init")
    result = CliRunner().invoke(main, ["--db", db, "query", "DELETE FROM best_configs"])
    assert result.exit_code == 1
    assert "readonly" in result.output.lower() or "read-only" in result.output.lower()
    result = CliRunner().invoke(main, ["--db", db, "query", "SELEC nonsense"])
    assert result.exit_code == 1 and "query failed" in result.output


def test_verify_finds_a_corrupt_payload(tmp_path: Path) -> None:
    path = tmp_path / "v.db"
    db = CacheDB(path)
    with db.transaction() as repos:
        variant, _ = repos.guarded.put("fxgraph", "fkey", b"payload" * 100, guards_expr=None)
    with db.engine.begin() as conn:
        conn.execute(GuardedEntry.__table__.update().values(checksum="f" * 64))
    db.close()
    result = CliRunner().invoke(main, ["--db", str(path), "verify", "--format", "json"])
    assert result.exit_code == 1
    problems = json.loads(result.stdout)
    assert problems == [{"what": "fxgraph", "where": f"fxgraph/fkey/{variant}", "problem": "SHA-256 checksum mismatch"}]


def test_errors_are_one_clear_line(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    result = CliRunner().invoke(main, ["--db", str(notes), "stats"])
    assert result.exit_code == 1
    assert "not an SQLite database" in result.output and "Traceback" not in result.output
    assert notes.read_text() == "hello"
    empty = tmp_path / "empty"
    empty.mkdir()
    result = CliRunner().invoke(main, ["--db", str(tmp_path / "x.db"), "import", str(empty)])
    assert result.exit_code == 1 and "not an Inductor cache" in result.output
