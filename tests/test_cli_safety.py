"""A typo never empties a cache: option values checked before the database is opened,
``--dry-run`` on every command that deletes or overwrites, a confirmation before a big prune,
and a property test over every command (bounded here; more examples in
tests/reliability/test_fuzz_cli.py).

Everything runs on copies of a real database: the real Inductor cache of ``real_cache``
(torch 2.13: FX graph and AOTAutograd entries, C++ kernel libraries, a best config, timings)
imported, its entries aged from now to 40 days.
"""

from __future__ import annotations

import datetime as dt
import re
import shutil
import sqlite3
import stat
from pathlib import Path

import click
import pytest

from cachedb import CacheDB
from cachedb.cli import _common, _output
from cachedb.cli._common import AgeType, DurationType, SizeType
from cachedb.fleet.copy import copy_database, merge_databases
from cachedb.store import migrate
from cachedb.tools import prune as pruning
from cachedb.tools.recover import recover

from . import _cli_safety as S

#: Examples of the property test per command and backend in the normal suite (the reliability
#: suite runs more).
EXAMPLES = {"sqlite": 8, "postgresql": 4}


@pytest.fixture(scope="module")
def master(real_cache: tuple[Path, dict], tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache_dir, _ = real_cache
    return S.build_master(cache_dir, tmp_path_factory.mktemp("safety") / "master.db")


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return S.build_other(tmp_path_factory.mktemp("other"))


@pytest.fixture
def db(master: Path, tmp_path: Path) -> Path:
    path = tmp_path / "inductor.db"
    shutil.copyfile(master, path)
    return path


def run(*args: str, input: str | None = None):
    result = S.CliRunner().invoke(_common.main, list(args), input=input,
                                  env={"CACHEDB_URL": None, "CACHEDB_PATH": None, "COLUMNS": "200"})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def error_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def held(db: Path | str, days: float | None = None) -> tuple[int, int]:
    """``(entries, kernel files)`` the database holds (with ``days``: those last used longer ago)."""
    with CacheDB(db) as cdb, cdb.read() as repos:
        if days is None:
            return repos.guarded.count(), repos.artifacts.count()
        cutoff = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=days)
        plan = pruning.plan(repos, older_than=cutoff)
        return plan.entries, plan.files


# --------------------------------------------------------------------------- the option types


@pytest.mark.parametrize(("text", "expected"), [
    ("1M", 1 << 20), ("512K", 512 << 10), ("2G", 2 << 30), ("0", 0), ("4096", 4096), ("1.5M", 3 << 19),
    ("10KB", 10 << 10), ("1MiB", 1 << 20), (" 4k ", 4096), ("1T", 1 << 40), ("64b", 64), ("+5", 5),
])
def test_sizes(text: str, expected: int) -> None:
    assert SizeType().convert(text, None, None) == expected


@pytest.mark.parametrize(("text", "says"), [
    ("-5", "negative"), ("-1M", "negative"), ("-0", "negative"), ("nan", "not a finite number"),
    ("inf", "not a finite number"), ("-inf", "not a finite number"), ("", "empty"), ("  ", "empty"),
    ("5X", "unknown unit 'X'"), ("1e999", "too large"), ("9E", "unknown unit"), ("M", "not a number"),
    ("0x10", "unknown unit 'x10'"), ("\u0661", "not a number"), ("5M!", "unknown unit"),
])
def test_sizes_refused(text: str, says: str) -> None:
    with pytest.raises(click.BadParameter, match=re.escape(says)):
        SizeType().convert(text, None, None)


@pytest.mark.parametrize(("text", "seconds"), [
    ("7d", 7 * 86400), ("12h", 43200), ("30m", 1800), ("2w", 1209600), ("90s", 90), ("1.5d", 129600),
    ("2 days", 172800), ("45min", 2700), ("1H", 3600),
])
def test_ages(text: str, seconds: float) -> None:
    assert AgeType().convert(text, None, None) == dt.timedelta(seconds=seconds)


@pytest.mark.parametrize(("text", "says"), [
    ("-1d", "negative"), ("0d", "zero"), ("30", "no unit"), ("", "empty"), ("nan", "not a finite number"),
    ("infd", "not a finite number"), ("1y", "unknown unit 'y'"), ("-0s", "negative"), ("1e999d", "too large"),
    ("99999999d", "too large"), ("1e-9s", "zero"), ("7dd", "unknown unit"),
])
def test_ages_refused(text: str, says: str) -> None:
    with pytest.raises(click.BadParameter, match=re.escape(says)):
        AgeType().convert(text, None, None)


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "", "-1", "86401"])
def test_durations_refused(text: str) -> None:
    with pytest.raises(click.BadParameter):
        DurationType(min=0, max=86400).convert(text, None, None)


# --------------------------------------------------------------------------- the examples


@pytest.mark.parametrize(("option", "value"), [("--older-than", "-1d"), ("--max-bytes", "-5"),
                                               ("--max-bytes", "nan"), ("--older-than", "30"),
                                               ("--max-bytes", ""), ("--older-than", "5 fortnights")])
def test_a_typo_is_one_line_and_removes_nothing(db: Path, option: str, value: str) -> None:
    before = S.file_digest(str(db))
    result = run("--db", str(db), "prune", option, value)
    assert result.exit_code == 2
    lines = error_lines(result)
    assert len(lines) == 1 and lines[0].startswith(f"error: Invalid value for '{option}': "), lines
    assert S.file_digest(str(db)) == before


def test_a_typo_is_refused_before_the_database_is_opened(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such.db"
    for args in (["prune", "--max-bytes", "-5"], ["--timeout", "nan", "stats"], ["stats", "--timeout", "inf"],
                 ["import", str(tmp_path), "--workers", "-1"], ["merge", "x.db", "--batch-rows", "0"],
                 ["report", "--max-charts", "-1"]):
        result = run("--db", str(missing), *args)
        assert result.exit_code == 2, (args, result.output)
        assert len(error_lines(result)) == 1, result.output
    assert not missing.parent.exists()


def test_dry_run_prints_the_plan_and_leaves_the_file_byte_identical(db: Path) -> None:
    before = S.file_digest(str(db))
    result = run("--db", str(db), "prune", "--max-bytes", "1M", "--dry-run")
    assert result.exit_code == 0, result.output
    assert S.file_digest(str(db)) == before and not Path(f"{db}-wal").exists()
    for kind in ("fxgraph", "aotautograd", "cpp_kernel"):
        assert kind in result.stdout
    m = re.search(r"would remove (\d+) of (\d+) entries and (\d+) of (\d+) kernel files: (\d+) of (\d+) stored bytes",
                  result.stdout)
    assert m, result.stdout
    entries, total_entries, files, total_files, removed, total = map(int, m.groups())
    assert 0 < removed < total and total - removed <= 1 << 20 and (total_entries, total_files) == held(db)
    # the run removes what the dry run listed (here, under half: no question asked)
    done = run("--db", str(db), "prune", "--max-bytes", "1M")
    assert done.exit_code == 0, done.output
    n = re.search(r"removed (\d+) entries, (\d+) stored bytes .*; (\d+) kernel files, (\d+) stored bytes", done.stdout)
    assert n, done.stdout
    assert (int(n[1]), int(n[3]), int(n[2]) + int(n[4])) == (entries, files, removed)


def test_the_plan_is_what_the_run_deletes(db: Path) -> None:
    cutoff = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=15)
    with CacheDB(db) as cdb:
        with cdb.read() as repos:
            plan = pruning.plan(repos, max_bytes=600_000, older_than=cutoff)
        with cdb.transaction() as repos:
            done = pruning.apply(repos, plan)
    assert (done.entries, done.files, done.entry_bytes + done.kernel_bytes) == (plan.entries, plan.files, plan.bytes)
    assert plan.entries and plan.files


def test_evict_is_plan_then_apply(db: Path, tmp_path: Path) -> None:
    twin = tmp_path / "twin.db"
    shutil.copyfile(db, twin)
    with CacheDB(db) as a, CacheDB(twin) as b:
        with a.transaction() as repos:
            evicted = (repos.guarded.evict(max_bytes=300_000), repos.artifacts.evict(max_bytes=100_000))
        with b.transaction() as repos:
            g = repos.guarded.plan_evict(max_bytes=300_000)
            k = repos.artifacts.plan_evict(max_bytes=100_000)
            applied = (repos.guarded.apply_evict(g), repos.artifacts.apply_evict(k))
    assert evicted == applied
    assert applied[0] == (len(g.ids), sum(g.stored_bytes.values()))
    assert applied[1] == (sum(k.files.values()), sum(k.stored_bytes.values()) + k.unreferenced)


# --------------------------------------------------------------------------- the guard


def test_a_big_prune_needs_yes_when_not_on_a_terminal(db: Path) -> None:
    before = S.table_digests(str(db))
    result = run("--db", str(db), "prune", "--older-than", "1d")
    assert result.exit_code == 1
    lines = error_lines(result)
    assert len(lines) == 1 and "more than half of the stored bytes" in lines[0] and "--yes" in lines[0], lines
    (entries, files), (total_entries, total_files) = held(db, 1), held(db)
    assert f"would remove {entries} of {total_entries} entries and {files} of {total_files} kernel files" in lines[0]
    assert S.table_digests(str(db)) == before
    result = run("--db", str(db), "prune", "--older-than", "1d", "--yes")
    assert result.exit_code == 0 and f"removed {entries} entries" in result.stdout, result.output


def test_a_big_prune_asks_on_a_terminal(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_output, "stdin_is_terminal", lambda: True)  # what confirm() asks
    before = S.table_digests(str(db))
    entries, files = held(db)
    result = run("--db", str(db), "prune", "--max-bytes", "0", input="n\n")
    assert result.exit_code == 1 and "Go ahead?" in result.output and "nothing was changed" in result.output
    assert re.search(rf"would remove {entries} of {entries} entries and {files} of {files} kernel files: "
                     r"(\d+) of \1 stored bytes", result.output), result.output
    assert S.table_digests(str(db)) == before
    result = run("--db", str(db), "prune", "--max-bytes", "0", input="y\n")
    assert result.exit_code == 0 and f"removed {entries} entries" in result.stdout, result.output
    assert f"{files} kernel files" in result.stdout and held(db) == (0, 0)


def test_a_small_prune_does_not_ask(db: Path) -> None:
    assert held(db, 75) == (1, 0)  # the oldest entry, 80 days
    result = run("--db", str(db), "prune", "--older-than", "75d")
    assert result.exit_code == 0 and "removed 1 entries" in result.stdout, result.output


def test_any_prune_of_postgresql_asks(master: Path, pg_url: str) -> None:
    copy_database(str(master), pg_url)
    before = S.table_digests(pg_url)
    dry = run("--db", pg_url, "prune", "--older-than", "75d", "--dry-run")
    assert dry.exit_code == 0 and f"would remove 1 of {held(master)[0]} entries" in dry.stdout, dry.output
    refused = run("--db", pg_url, "prune", "--older-than", "75d")
    assert refused.exit_code == 1 and "rows of a shared PostgreSQL database" in refused.output
    assert S.table_digests(pg_url) == before
    done = run("--db", pg_url, "prune", "--older-than", "75d", "--yes")
    assert done.exit_code == 0 and "removed 1 entries" in done.stdout, done.output
    nothing = run("--db", pg_url, "prune", "--older-than", "75d")  # removes nothing: no question
    assert nothing.exit_code == 0 and "removed 0 entries" in nothing.stdout


# --------------------------------------------------------------------------- the other dry runs


def test_merge_dry_run_counts_what_the_merge_writes(db: Path, other: Path) -> None:
    before = S.file_digest(str(db))
    dry = merge_databases([str(other)], str(db), dry_run=True)
    assert S.file_digest(str(db)) == before and dry.dry_run
    real = merge_databases([str(other)], str(db))
    assert [t.as_row() for t in dry.tables.values()] == [t.as_row() for t in real.tables.values()]
    assert dry.rows_written > 0
    again = run("merge", str(other), "--into", str(db), "--dry-run")  # a second merge adds nothing
    assert again.exit_code == 0 and "would merge 0 rows" in again.stdout, again.output


def test_merge_dry_run_into_postgresql(master: Path, other: Path, pg_url: str) -> None:
    copy_database(str(master), pg_url)
    before = S.table_digests(pg_url)
    result = run("--db", pg_url, "merge", str(other), "--dry-run")
    assert result.exit_code == 0 and "nothing was written (--dry-run)" in result.stdout, result.output
    assert S.table_digests(pg_url) == before


def test_copy_dry_run_creates_nothing(db: Path, tmp_path: Path) -> None:
    target = tmp_path / "sub" / "copy.db"
    result = run("copy", str(db), str(target), "--dry-run")
    assert result.exit_code == 0 and "would copy" in result.stdout, result.output
    assert not target.exists() and not target.parent.exists()
    dry_rows = re.search(r"would copy (\d+) rows", result.stdout)[1]
    real = run("copy", str(db), str(target))
    assert real.exit_code == 0 and f"copied {dry_rows} rows" in real.stdout, real.output


def test_copy_dry_run_of_an_interrupted_copy(db: Path, tmp_path: Path) -> None:
    target = tmp_path / "half.db"

    def stop(p):
        if p.rows_done > 20:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        copy_database(str(db), str(target), progress=stop, batch_rows=10)
    before = S.file_digest(str(target))
    dry = copy_database(str(db), str(target), dry_run=True, batch_rows=10)
    assert dry.resumed and S.file_digest(str(target)) == before
    real = copy_database(str(db), str(target), batch_rows=10)
    assert [t.as_row() for t in dry.tables.values()] == [t.as_row() for t in real.tables.values()]


def test_recover_dry_run_writes_nothing(master: Path, tmp_path: Path) -> None:
    damaged = tmp_path / "damaged.db"
    shutil.copyfile(master, damaged)
    S.damage(damaged)
    before = S.file_digest(str(damaged))
    new = tmp_path / "saved.db"
    result = run("recover", "--method", "scan", "--dry-run", str(damaged), str(new))
    assert "would save" in result.stdout and "nothing was written" in result.stdout, result.output
    assert not new.exists() and S.file_digest(str(damaged)) == before
    dry = recover(damaged, new, method="scan", dry_run=True)
    real = recover(damaged, new, method="scan")
    assert [t.as_row() for t in dry.tables] == [t.as_row() for t in real.tables] and real.saved > 0


def test_upgrade_dry_run_lists_the_migrations_and_changes_nothing(db: Path) -> None:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(migrate.alembic_config()).get_revision(migrate.HEAD_REVISION)
    previous = head.down_revision
    with CacheDB(db) as cdb:
        migrate.downgrade(cdb.engine, previous)
    con = sqlite3.connect(db)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    before = S.file_digest(str(db))
    result = run("--db", str(db), "upgrade", "--dry-run")
    assert result.exit_code == 0, result.output
    assert f"from schema revision {previous} to {migrate.HEAD_REVISION}" in result.stdout, result.stdout
    assert S.file_digest(str(db)) == before
    for args in (["prune", "--max-bytes", "1", "--dry-run"], ["merge", str(db), "--into", str(db), "--dry-run"]):
        refused = run("--db", str(db), *args)
        assert refused.exit_code == 1 and S.file_digest(str(db)) == before, refused.output
    done = run("--db", str(db), "upgrade")
    assert done.exit_code == 0 and done.stdout.strip().endswith(migrate.HEAD_REVISION)


def test_upgrade_dry_run_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "new" / "x.db"
    result = run("--db", str(path), "upgrade", "--dry-run")
    assert result.exit_code == 0 and "would create it" in result.stdout
    assert not path.parent.exists()


@pytest.mark.skipif(not Path("/dev/null").exists(), reason="no /dev/null")
@pytest.mark.parametrize("args", [["export-artifacts", "/dev/null"], ["report", "--out", "/dev/null"],
                                  ["--db", "/dev/null", "init"], ["--db", "/dev/null", "stats"],
                                  ["merge", "{db}", "--into", "/dev/null"]])
def test_a_device_is_never_replaced_or_written_beside(db: Path, args: list[str]) -> None:
    result = run(*["--db", str(db)] * (args[0] != "--db"), *[a.format(db=db) for a in args])
    assert result.exit_code == 1 and "not a regular file" in result.output, result.output
    assert stat.S_ISCHR(Path("/dev/null").stat().st_mode)
    assert not Path("/dev/null-journal").exists() and not Path("/dev/null.lock").exists()


def test_every_destructive_command_has_dry_run_and_every_help_an_example() -> None:
    for command in ("prune", "merge", "copy", "recover", "upgrade"):
        result = run(command, "--help")
        assert "--dry-run" in result.stdout and "Example:" in result.stdout and "--dry-run" in result.stdout.split(
            "Example:")[1], command


# --------------------------------------------------------------------------- the property


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_no_command_line_loses_data(backend: str, master: Path, other: Path, real_cache: tuple[Path, dict],
                                    tmp_path: Path, request: pytest.FixtureRequest) -> None:
    pg = request.getfixturevalue("pg_url") if backend == "postgresql" else None
    sandbox = S.Sandbox(tmp_path, master, other, real_cache[0], pg_url=pg)
    S.check_every_command(sandbox, EXAMPLES[backend])
    assert sandbox.counts["refused_values"] > 0 and sandbox.counts["exit_0"] > 0
