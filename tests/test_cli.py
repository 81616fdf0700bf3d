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
from cachedb.store.models import GuardedEntry

COMMANDS = ["init", "import", "export", "stats", "query", "upgrade", "verify", "prune", "run"]


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.mark.parametrize("command", [*COMMANDS, "recover"])
def test_every_command_has_help_with_an_example(command: str) -> None:
    result = run(command, "--help")
    assert result.exit_code == 0
    assert "Example:" in result.output and "cachedb --db" in result.output


def test_python_dash_m(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    out = subprocess.run(
        [sys.executable, "-m", "cachedb", "--db", str(db), "init"], capture_output=True, text=True, check=True
    )
    from cachedb.store.migrate import head_revision

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
    # stored as they are (under 1 MiB): each in a zstd frame and a 40-byte trailer
    assert sum(r["entries"] for r in fx) > 0 and all(0 < r["stored_bytes"] <= r["bytes"] + 100 * r["entries"] for r in fx)

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


# --------------------------------------------------------------------------- CLI habits

import os  # noqa: E402
import shutil  # noqa: E402
import sqlite3  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402

from rich.console import Console  # noqa: E402

from cachedb.cli._common import ProgressBar  # noqa: E402
from cachedb.layout.importer import Importer  # noqa: E402

from .reliability import _synth  # noqa: E402

#: Commands that read (or trim) a database and so must never create one, with their arguments.
READ_COMMANDS = {
    "stats": [],
    "query": ["SELECT count(*) AS n FROM best_configs"],
    "verify": [],
    "export": ["{tmp}/out"],
    "export-artifacts": ["{tmp}/blob.bin"],
    "prune": ["--max-bytes", "1", "--yes"],
}


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    """The CLI in this process; an exception other than SystemExit fails the test (a traceback)."""
    return CliRunner().invoke(main, list(args), catch_exceptions=False, env=env)


def _args(command: str, tmp_path: Path) -> list[str]:
    return [command, *(a.format(tmp=tmp_path) for a in READ_COMMANDS.get(command, []))]


def _error_lines(result: Result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real database: a synthetic Inductor cache (torch 2.13 layout) imported, WAL checkpointed."""
    root = tmp_path_factory.mktemp("populated")
    synth = _synth.build(root / "inductor", seed=13, fx_keys=25, aot_keys=10, best_configs=10, docs=1)
    path = root / "cache.db"
    with CacheDB(path) as db:
        assert Importer(db).run(synth.root).problems == []
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return path


def _copy(src: Path, dst: Path) -> Path:
    shutil.copy(src, dst)
    return dst


def test_db_after_the_command(populated: Path, tmp_path: Path) -> None:
    db = str(_copy(populated, tmp_path / "x.db"))
    before = invoke("--db", db, "stats", "--format", "json")
    after = invoke("stats", "--db", db, "--format", "json")  # the issue's `cachedb stats --db x.db`
    assert before.exit_code == after.exit_code == 0, after.output
    assert json.loads(after.stdout) == json.loads(before.stdout) and json.loads(after.stdout)
    # after the command wins over before it
    other = tmp_path / "other.db"
    invoke("--db", str(other), "init")
    assert invoke("--db", str(other), "stats", "--db", db, "--format", "json").stdout == before.stdout
    assert json.loads(invoke("--db", db, "stats", "--db", str(other), "--format", "json").stdout) == []
    # every command takes it, the nested one too, and says so in its help
    for command in [*COMMANDS, "export-artifacts", "import-artifacts"]:
        assert "--db PATH|URL" in run(command, "--help").output, command
    assert "--db PATH|URL" in run("cutlass", "generate", "--help").output
    fresh = tmp_path / "fresh.db"
    result = invoke("init", "--db", str(fresh))
    assert result.exit_code == 0 and result.stdout.startswith(f"{fresh}: schema revision")


def test_run_takes_db_after_the_command(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    cachedb = Path(sys.executable).with_name("cachedb")
    out = subprocess.run(
        [str(cachedb), "run", "--db", str(db), "--", sys.executable, "-c",
         "import os; print(os.environ['CACHEDB_PATH'])", "--db", "not-for-cachedb"],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(db)


def test_read_command_on_a_missing_database_creates_nothing() -> None:
    assert not Path("/nonexistent").exists()
    cachedb = Path(sys.executable).with_name("cachedb")
    # the exact input, as a user types it
    out = subprocess.run([str(cachedb), "--db", "/nonexistent/dir/x.db", "stats"], capture_output=True, text=True)
    assert out.returncode == 1
    assert out.stderr.strip() == "error: no database at /nonexistent/dir/x.db" and out.stdout == ""
    assert "Traceback" not in out.stderr and not Path("/nonexistent").exists()


@pytest.mark.parametrize("command", sorted(READ_COMMANDS))
def test_read_commands_never_create_a_database(command: str, tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent" / "dir" / "x.db"
    result = invoke("--db", str(missing), *_args(command, tmp_path))
    assert result.exit_code == 1
    assert _error_lines(result) == [f"error: no database at {missing}"]
    assert not (tmp_path / "nonexistent").exists()
    assert not (tmp_path / "out").exists() and not (tmp_path / "blob.bin").exists()
    # an empty file is no database either, and stays empty
    empty = tmp_path / "empty.db"
    empty.touch()
    result = invoke(*_args(command, tmp_path), "--db", str(empty))
    assert result.exit_code == 1 and _error_lines(result) == [f"error: no database at {empty} (the file is empty)"]
    assert empty.stat().st_size == 0
    # another program's SQLite database is not turned into a cachedb one
    foreign = tmp_path / "foreign.db"
    con = sqlite3.connect(foreign)
    con.execute("CREATE TABLE notes (t TEXT)")
    con.commit()
    con.close()
    before = foreign.read_bytes()
    result = invoke("--db", str(foreign), *_args(command, tmp_path))
    assert result.exit_code == 1
    assert _error_lines(result) == [f"error: no cachedb database at {foreign}: it has no cachedb schema "
                                    f"(`cachedb --db {foreign} init` creates one)"]
    assert foreign.read_bytes() == before


def test_write_commands_still_create(tmp_path: Path) -> None:
    inductor = _synth.build(tmp_path / "inductor", seed=1, fx_keys=2, aot_keys=1, best_configs=1, docs=1).root
    db = tmp_path / "new" / "dir" / "x.db"
    result = invoke("--db", str(db), "import", str(inductor))
    assert result.exit_code == 0 and db.is_file()
    assert (db.parent.stat().st_mode & 0o777) == 0o700


def _damage_roots(path: Path, tables: tuple[str, ...]) -> None:
    """Overwrite the b-tree page headers of ``tables`` (a real damaged page, as a bad disk leaves)."""
    con = sqlite3.connect(path)
    page_size = con.execute("PRAGMA page_size").fetchone()[0]
    roots = [con.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (t,)).fetchone()[0] for t in tables]
    con.close()
    with open(path, "r+b") as f:
        for root in roots:
            f.seek((root - 1) * page_size)
            f.write(b"\xff" * 16)


@pytest.mark.parametrize("command", ["stats", "query", "export", "export-artifacts", "import", "prune"])
def test_damaged_database_is_one_line(command: str, populated: Path, tmp_path: Path) -> None:
    path = _copy(populated, tmp_path / "damaged.db")
    _damage_roots(path, ("guarded_entries", "best_configs"))
    args = _args(command, tmp_path)
    if command == "query":
        args = ["query", "SELECT key, content FROM best_configs"]
    if command == "import":
        args = ["import", str(_synth.build(tmp_path / "ind", seed=2, fx_keys=3, aot_keys=1, best_configs=2,
                                           docs=1).root)]
    result = invoke("--db", str(path), *args)
    assert result.exit_code == 1, result.output
    lines = _error_lines(result)
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(path) in lines[0], lines
    assert "malformed" in lines[0] and "Traceback" not in result.output


def test_stats_on_damaged_pages_names_the_file_and_the_problem(populated: Path, tmp_path: Path) -> None:
    path = _copy(populated, tmp_path / "damaged.db")
    _damage_roots(path, ("best_configs",))
    cachedb = Path(sys.executable).with_name("cachedb")
    out = subprocess.run([str(cachedb), "stats", "--db", str(path)], capture_output=True, text=True)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip() == (
        f"error: {path}: the database is damaged (database disk image is malformed); `cachedb verify` lists "
        "the damage, `cachedb recover` salvages the readable rows")
    result = invoke("verify", "--db", str(path), "--format", "json")  # verify reports it as a problem row
    assert result.exit_code == 1
    assert {"what": "database", "where": str(path), "problem": "unreadable: database disk image is malformed"} \
        in json.loads(result.stdout)


_LOCKER = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None)
if sys.argv[2] == "exclusive":   # no reader gets in either (WAL without shared memory)
    con.execute("PRAGMA locking_mode = EXCLUSIVE")
    con.execute("BEGIN EXCLUSIVE")
else:                            # a writer holding the write lock
    con.execute("BEGIN IMMEDIATE")
con.execute("DELETE FROM best_configs WHERE 0")
print("locked", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize(("mode", "command"), [("exclusive", "stats"), ("exclusive", "verify"),
                                               ("write", "import"), ("write", "prune")])
def test_locked_past_the_timeout_is_one_line(mode: str, command: str, populated: Path, tmp_path: Path) -> None:
    path = _copy(populated, tmp_path / "locked.db")
    locker = subprocess.Popen([sys.executable, "-c", _LOCKER, str(path), mode], stdout=subprocess.PIPE, text=True)
    try:
        assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
        args = _args(command, tmp_path)
        if command == "import":
            args = ["import", str(_synth.build(tmp_path / "ind", seed=3, fx_keys=2, aot_keys=1, best_configs=1,
                                               docs=1).root)]
        result = invoke(*args, "--db", str(path), "--timeout", "0.5")
    finally:
        locker.kill()
        locker.wait()
    assert result.exit_code == 1, result.output
    assert _error_lines(result) == [f"error: {path}: database is locked: another process held it longer than "
                                    "the 0.5 s timeout (--timeout SECONDS)"]


@pytest.mark.parametrize("command", ["stats", "query", "verify", "export", "import", "prune", "init", "upgrade",
                                     "export-artifacts"])
def test_not_sqlite_is_one_line(command: str, tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    args = _args(command, tmp_path)
    if command == "import":
        args = ["import", str(tmp_path)]
    result = invoke(*args, "--db", str(notes))
    assert result.exit_code == 1
    assert _error_lines(result) == [f"error: {notes}: not an SQLite database (file header is not 'SQLite format "
                                    "3'); the file was left untouched"]
    assert notes.read_text() == "hello"


@pytest.fixture
def request_cleanup() -> Iterator[list[Path]]:
    paths: list[Path] = []
    yield paths
    for p in paths:
        shutil.rmtree(p, ignore_errors=True)


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0,
                    reason="needs root to act as another user (fork + setuid)")
@pytest.mark.parametrize("command", ["stats", "import", "init"])
def test_foreign_owned_database_is_one_line(command: str, populated: Path, request_cleanup: list[Path]) -> None:
    """Another user's database (root's, mode 0644, in root's directory), used by `nobody`."""
    import cachedb.store.migrate  # noqa: F401  (imported before the fork: nobody cannot read /root)
    import cachedb.tools.stats  # noqa: F401

    import tempfile

    home = Path(tempfile.mkdtemp(prefix="cachedb-foreign-"))  # pytest's tmp dirs are root-only
    home.chmod(0o755)
    request_cleanup.append(home)
    path = _copy(populated, home / "team.db")
    path.chmod(0o644)
    before = path.read_bytes()
    inductor = _synth.build(home / "ind", seed=4, fx_keys=2, aot_keys=1, best_configs=1, docs=1).root
    args = {"stats": ["stats"], "import": ["import", str(inductor)], "init": ["init"]}[command]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nobody, running the CLI in-process
        try:
            os.close(r)
            os.setgid(65534)
            os.setuid(65534)
            result = CliRunner().invoke(main, ["--db", str(path), *args])
            report = {"exit_code": result.exit_code, "stderr": result.stderr,
                      "exception": None if isinstance(result.exception, SystemExit) else repr(result.exception)}
            os.write(w, json.dumps(report).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    report = json.loads(data)
    assert report["exception"] is None and report["exit_code"] == 1
    lines = [line for line in report["stderr"].splitlines() if line.strip()]
    assert lines == [f"error: {path}: cannot open or write the database (attempt to write a readonly database) "
                     "(the file is owned by uid 0, not by this user, uid 65534)"]
    assert path.read_bytes() == before


def test_format_on_stats_verify_query(populated: Path, tmp_path: Path) -> None:
    db = str(_copy(populated, tmp_path / "f.db"))
    stats_json = json.loads(invoke("stats", "--db", db, "--format", "json").stdout)
    stats_csv = list(csv.DictReader(io.StringIO(invoke("stats", "--db", db, "--format", "csv").stdout)))
    assert [r["kind"] for r in stats_csv] == [r["kind"] for r in stats_json]
    assert [int(r["entries"]) for r in stats_csv] == [r["entries"] for r in stats_json]
    assert {"fxgraph", "aotautograd", "autotune_timings", "best_config"} <= {r["kind"] for r in stats_json}
    table = invoke("stats", "--db", db, "--format", "table").stdout
    assert all(r["kind"] in table for r in stats_json) and "stored_bytes" in table

    ok = invoke("verify", "--db", db, "--format", "json")
    assert ok.exit_code == 0 and json.loads(ok.stdout) == [] and "ok: integrity check passed" in ok.stderr
    ok = invoke("verify", "--db", db, "--format", "csv")
    assert ok.exit_code == 0 and ok.stdout == "what,where,problem\n"
    ok = invoke("verify", "--db", db)
    assert ok.exit_code == 0 and ok.stdout.startswith("ok: integrity check passed")

    sql = "SELECT kind, count(*) AS n FROM guarded_entries GROUP BY kind ORDER BY kind"
    as_json = json.loads(invoke("query", sql, "--db", db, "--format", "json").stdout)
    as_csv = list(csv.DictReader(io.StringIO(invoke("query", sql, "--db", db, "--format", "csv").stdout)))
    assert [(r["kind"], r["n"]) for r in as_json] == [(r["kind"], int(r["n"])) for r in as_csv]
    assert [r["kind"] for r in as_json] == ["aotautograd", "fxgraph"]


def test_progress_bar_counts_bytes_and_is_throttled() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160)
    total = 300_000
    start = time.monotonic()
    with ProgressBar("importing x", console=console) as bar:
        for i in range(1, total + 1):
            bar.update(count=i, total_count=total, done_bytes=i * 1000, total_bytes=total * 1000)
    elapsed = time.monotonic() - start
    # rich saw at most one update per 0.1 s (plus the first and the last), not 300,000
    assert 1 <= bar.refreshes <= elapsed / ProgressBar.interval + 2
    text = out.getvalue()
    assert "300000/300000 files" in text and "300.0/300.0 MB" in text


def test_import_draws_a_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    inductor = _synth.build(tmp_path / "inductor", seed=5, fx_keys=5, aot_keys=2, best_configs=3, docs=1).root
    cachedb = Path(sys.executable).with_name("cachedb")
    env = {**os.environ, "TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1", "COLUMNS": "160"}
    out = subprocess.run([str(cachedb), "import", str(inductor), "--db", str(tmp_path / "p.db")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"importing {inductor}" in out.stderr and " kB" in out.stderr  # bytes done / total
    plain = subprocess.run([str(cachedb), "import", str(inductor), "--db", str(tmp_path / "q.db")],
                           capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0 and plain.stderr == ""  # no bar where stderr is not a terminal


def test_shell_completion() -> None:
    cachedb = Path(sys.executable).with_name("cachedb")
    script = subprocess.run([str(cachedb)], env={**os.environ, "_CACHEDB_COMPLETE": "bash_source"},
                            capture_output=True, text=True, timeout=60)
    assert script.returncode == 0 and "complete -o nosort -F _cachedb_completion cachedb" in script.stdout
    env = {**os.environ, "_CACHEDB_COMPLETE": "bash_complete", "COMP_WORDS": "cachedb st", "COMP_CWORD": "1"}
    words = subprocess.run([str(cachedb)], env=env, capture_output=True, text=True, timeout=60).stdout.split()
    assert words == ["plain,stats"]
    env.update(COMP_WORDS="cachedb stats --format ", COMP_CWORD="3")
    words = subprocess.run([str(cachedb)], env=env, capture_output=True, text=True, timeout=60).stdout.split()
    assert words == ["plain,table", "plain,json", "plain,csv", "plain,prometheus"]
    assert "_CACHEDB_COMPLETE=bash_source cachedb" in run("--help").output


def test_ci_runs_the_readme_test_command() -> None:
    """README's test command is what .ci/run calls; it and the quickstart install what they need."""
    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    tests = readme[readme.index("## Tests\n"):]
    command = tests[tests.index("```bash\n") + 8:].splitlines()[0].split("#")[0].strip()
    assert command == "bash .ci/test"
    ci = [line.strip() for line in (root / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.strip().startswith("#")]
    assert command in ci  # the compatibility run on the newest torch follows it (.ci/compat)
    script = (root / ".ci" / "test").read_text()
    torch_pin, extras, pytest_run = (script.index("pip install -q torch==2.13.0"),
                                     script.index('pip install -q -e ".[torch,dev,cutlass]"'),
                                     script.index("python -m pytest -q"))
    assert torch_pin < extras < pytest_run  # torch pinned first: pip never resolves an unpinned torch
    quick = (root / "examples" / "quickstart.sh").read_text()
    assert quick.index("pip install -q torch==2.13.0") < quick.index('pip install -q -e ".[torch]"')
    assert "bash examples/quickstart.sh" in readme


def test_import_with_worker_processes_from_the_command_line(tmp_path: Path) -> None:
    """``cachedb import --workers 2`` (a real process with its progress bar's thread, forking its
    workers) stores the rows ``--workers 0`` stores, over several batches."""

    inductor = _synth.build(tmp_path / "inductor", seed=3, fx_keys=400, aot_keys=150, best_configs=20, docs=1).root
    rows = {}
    for workers in ("2", "0"):
        db = tmp_path / f"w{workers}.db"
        out = subprocess.run([sys.executable, "-m", "cachedb", "--db", str(db), "import", "--workers", workers,
                              str(inductor)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert "worker process failed" not in out.stderr
        con = sqlite3.connect(db)
        rows[workers] = con.execute("SELECT kind, key, variant, guards_expr, guards_known, guards_note, time_taken_ns,"
                                    " size_bytes, checksum FROM guarded_entries ORDER BY kind, key, variant").fetchall()
        con.close()
    assert len(rows["2"]) > 512  # more than two batches
    assert rows["2"] == rows["0"]


def test_ctrl_c_stops_an_import_with_workers_cleanly(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) during ``cachedb import``
    with workers: the command ends promptly with click's "Aborted!" and no traceback from it
    or its workers, leaves no process behind, and what it committed stays valid: importing
    again completes with the same rows as a clean import."""
    import signal

    inductor = _synth.build(tmp_path / "inductor", seed=5, fx_keys=400, aot_keys=100, best_configs=10, docs=1,
                            max_payload=400_000).root
    db = tmp_path / "x.db"
    cmd = [sys.executable, "-m", "cachedb", "--db", str(db), "import", "--workers", "2", str(inductor)]
    assert subprocess.run([*cmd[:5], "init"], capture_output=True).returncode == 0
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    stored = 0
    while stored == 0 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
        con = sqlite3.connect(db, timeout=5)
        stored = con.execute("SELECT count(*) FROM guarded_entries").fetchone()[0]
        con.close()
    if proc.poll() is not None:
        pytest.skip("the import finished before it could be interrupted")
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    if proc.returncode == 0 and "Aborted!" not in stderr:  # it ended between the poll and the signal
        pytest.skip("the import finished before it could be interrupted")
    assert proc.returncode == 1 and "Aborted!" in stderr and "Traceback" not in stderr, stderr
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)  # nothing of the group is left
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    clean = tmp_path / "clean.db"
    assert subprocess.run([*cmd[:3], "--db", str(clean), "import", str(inductor)], capture_output=True).returncode == 0
    query = "SELECT kind, key, variant, guards_expr, checksum FROM guarded_entries ORDER BY kind, key, variant"
    rows = []
    for path in (db, clean):
        con = sqlite3.connect(path)
        rows.append(con.execute(query).fetchall())
        con.close()
    assert rows[0] == rows[1] and len(rows[0]) > 500
