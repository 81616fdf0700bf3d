"""A typo never empties a cache: the property test over the command line.

Hypothesis draws a whole command line for every ``cachedb`` command: option values (sizes,
ages, counts, durations: valid ones, and negative, NaN/inf, empty, unit-less or unknown-unit
ones), paths (missing files, missing directories, directories, ``/dev/null``, another user's
file, the database itself, a second real database, a damaged one) and database URLs (bad ports,
a refused port, a missing PostgreSQL database). Each runs through click's ``CliRunner`` on a
copy of a real database (a real Inductor cache imported, some entries aged), on SQLite or on
PostgreSQL, and :meth:`Sandbox.check` asserts:

- no traceback: every run ends in ``SystemExit`` (0, 1 or 2), never another exception;
- a value an option must refuse ends the run with exit status 2 and one line naming the option;
- the database's rows and bytes (``cachedb stats`` and a SHA-256 of every row of every table)
  are unchanged unless every value was valid, the run exited 0 and the command is meant to
  change that database (``prune``, ``import``, ``import-artifacts``, ``merge`` into it) without
  ``--dry-run``; after a ``--dry-run`` an SQLite file is byte-identical.

Used by ``tests/test_cli_safety.py`` (bounded, in the normal suite) and by
``tests/reliability/test_fuzz_cli.py`` (more examples). ``cachedb run`` (which would exec a
program) is drawn only with a refused value, and ``os.execvpe`` is replaced during the runs so
that a value wrongly accepted fails the test instead of replacing the test process.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, inspect, text, update

from cachedb import CacheDB
from cachedb.cli import main
from cachedb.store import tables

# --------------------------------------------------------------------------- values

SIZES_OK = ["1M", "512K", "2G", "0", "100", "1.5M", "10KB", "1MiB", " 4k ", "1e3", "300000", "1T", "64b"]
SIZES_BAD = ["-5", "-1M", "-0", "nan", "NaN", "-nan", "inf", "-inf", "Infinity", "", " ", "5X", "1e999", "M",
             "1..5M", "0x10", "10 GB extra", "1M5", "+", "--5", "\u0661\u0662", "5\u00a0M!", "1Y", "9E"]
AGES_OK = ["7d", "12h", "30m", "1w", "90s", "1.5d", "36500d", "2 days", "1H", "3weeks", "45min"]
AGES_BAD = ["-1d", "0d", "0", "30", "", " ", "nan", "infd", "1y", "-0s", "1e999d", "99999999d", "d", "5 fortnights",
            "-7d", "1e-9s", "1mo", "7dd"]
ROWS_OK = ["1", "500", "20000"]
ROWS_BAD = ["0", "-1", "", "nan", "1.5", "abc", "inf", "-20000"]
WORKERS_OK = ["0", "1", "2"]
WORKERS_BAD = ["-1", "65", "x", "", "1e3", "nan"]
CHARTS_OK = ["0", "3"]
CHARTS_BAD = ["-1", "", "many", "nan"]
TIMEOUT_OK = ["0", "0.5", "30", "86400"]
TIMEOUT_BAD = ["-1", "nan", "inf", "", "1e9", "abc", "-0.5", "86401", "-inf"]
REMOTE_TIMEOUT_BAD = ["0", "0.05", "-1", "nan", "inf", "", "3601", "x"]
ORDERS_OK = ["lru", "value"]
ORDERS_BAD = ["", "LRU", "Value", "cost", "values", "lru,value", "-1"]

#: Database URLs that name no usable database: bad ports, a refused port, a missing database.
BAD_URLS = [
    "postgresql+psycopg://postgres@127.0.0.1:99999/test",
    "postgresql+psycopg://postgres@127.0.0.1:65536/test",
    "postgresql+psycopg://postgres@127.0.0.1:1/test",
    "postgresql+psycopg://postgres@127.0.0.1:abc/test",
    "postgresql+psycopg://postgres@127.0.0.1:-1/test",
    "postgresql+psycopg://postgres@127.0.0.1:5432/cachedb_no_such_database",
    "sqlite:///no/such/dir/x.db",
    "nosuch://x",
    "://",
]


@dataclass
class Case:
    """One drawn command line and what it should do."""

    args: list[str]
    command: str
    #: Options given a value they must refuse (exit status 2, one line naming one of them).
    invalid: list[str] = field(default_factory=list)
    #: Whether the command, run with valid values and exiting 0, may change the database.
    mutates: bool = False
    dry_run: bool = False
    #: Paths click itself checks (a directory where a file goes, ``exists=True``): their refusal
    #: (exit status 2, one line naming them) may come before that of a drawn value.
    checked: list[str] = field(default_factory=list)


def _value(draw: st.DrawFn, case: Case, option: str, good: list[str], bad: list[str],
           generated: st.SearchStrategy[tuple[str, bool]] | None = None) -> None:
    """Append ``option VALUE`` to the case, the value valid or not (and remembered as such)."""
    choices: list[st.SearchStrategy[tuple[str, bool]]] = [
        st.sampled_from(good).map(lambda v: (v, True)), st.sampled_from(bad).map(lambda v: (v, False))]
    if generated is not None:
        choices.append(generated)
    value, ok = draw(st.one_of(choices))
    case.args += [option, value]
    if not ok:
        case.invalid.append(option)


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
#: Sizes built from a number and a unit: valid when not negative.
_GENERATED_SIZES = st.builds(lambda n, u: (f"{n}{u}", n >= 0), st.integers(-10**6, 10**6),
                             st.sampled_from(list(_SIZE_UNITS)))
#: Ages built from a number and a unit: valid when positive and the unit one of s, m, h, d, w.
_GENERATED_AGES = st.builds(lambda n, u: (f"{n}{u}", n > 0 and u in "smhdw" and u != ""),
                            st.integers(-1000, 1000), st.sampled_from(["s", "m", "h", "d", "w", "", "y", "x"]))


@dataclass(frozen=True)
class Paths:
    """Paths a command line may name (absolute, in the example's working directory)."""

    store: str  # the database under test (a path or a PostgreSQL URL)
    other: str  # a second real database (SQLite)
    damaged: str  # a damaged SQLite copy of the database
    foreign: str  # another user's database file (uid 65534, mode 0600)
    notadb: str
    emptydir: str
    cache_dir: str  # the real Inductor cache the database was imported from
    blob: str  # random bytes (not a Mega-Cache blob)
    work: str

    def databases(self) -> list[str]:
        w = self.work
        return [self.store, self.other, self.foreign, self.notadb, self.emptydir, "/dev/null", f"{w}/missing.db",
                f"{w}/no/such/dir/x.db", self.damaged, *BAD_URLS]

    def sources(self) -> list[str]:
        return [self.other, self.store, self.foreign, self.damaged, self.notadb, self.emptydir, "/dev/null",
                f"{self.work}/missing.db", *BAD_URLS[:4]]

    def targets(self) -> list[str]:
        w = self.work
        return [f"{w}/new.db", self.store, self.other, self.emptydir, "/dev/null", f"{w}/no/such/dir/new.db",
                self.notadb, self.foreign, *BAD_URLS[:4]]

    def files(self) -> list[str]:
        w = self.work
        return [f"{w}/out.bin", self.blob, "/dev/null", self.emptydir, f"{w}/missing.bin", f"{w}/no/dir/x.bin",
                self.notadb]

    def dirs(self) -> list[str]:
        w = self.work
        return [self.cache_dir, self.emptydir, f"{w}/export", "/dev/null", f"{w}/missing", self.notadb]


COMMANDS = ["prune", "merge", "copy", "recover", "upgrade", "init", "stats", "query", "verify", "export",
            "import", "export-artifacts", "import-artifacts", "report", "datasette-metadata", "cutlass", "run"]


@st.composite
def cases(draw: st.DrawFn, paths: Paths, command: str | None = None) -> Case:
    """A command line for ``command`` (default: any), its values valid or not."""
    command = command or draw(st.sampled_from(COMMANDS))
    case = Case([], command)
    # flags and rarer options are off in the simplest examples (hypothesis starts from those)
    flag = lambda name, p=2: draw(st.integers(0, p - 1)) == p - 1
    if flag("--timeout", 5):  # the global --timeout, before the command
        _value(draw, case, "--timeout", TIMEOUT_OK, TIMEOUT_BAD)
    target_is_store = True
    if command not in ("copy", "recover") and flag("--db", 4):
        db = draw(st.sampled_from(paths.databases()))
        case.args += ["--db", db]
        target_is_store = db == paths.store
    case.args.append(command)

    if command == "prune":
        given = draw(st.sampled_from(["size", "age", "both", "size", "age", "both", "none"]))
        if given in ("size", "both"):
            _value(draw, case, "--max-bytes", SIZES_OK, SIZES_BAD, _GENERATED_SIZES)
        if given in ("age", "both"):
            _value(draw, case, "--older-than", AGES_OK, AGES_BAD, _GENERATED_AGES)
        if flag("--order", 3):
            _value(draw, case, "--order", ORDERS_OK, ORDERS_BAD)
        case.dry_run = flag("--dry-run")
        case.args += ["--dry-run"] * case.dry_run + ["--yes"] * flag("--yes") + ["--vacuum"] * flag("--vacuum", 5)
        case.mutates = target_is_store and not case.dry_run
    elif command == "merge":
        case.args += draw(st.lists(st.sampled_from(paths.sources()), min_size=1, max_size=2, unique=True))
        if flag("--into", 3):
            into = draw(st.sampled_from(paths.targets()))
            case.args += ["--into", into]
            target_is_store = into == paths.store
        if flag("--batch-rows", 3):
            _value(draw, case, "--batch-rows", ROWS_OK, ROWS_BAD)
        case.dry_run = flag("--dry-run")
        case.args += ["--dry-run"] * case.dry_run
        case.mutates = target_is_store and not case.dry_run
    elif command == "copy":
        case.args += [draw(st.sampled_from(paths.sources())), draw(st.sampled_from(paths.targets()))]
        if flag("--batch-rows", 3):
            _value(draw, case, "--batch-rows", ROWS_OK, ROWS_BAD)
        case.dry_run = flag("--dry-run")
        case.args += ["--dry-run"] * case.dry_run
        case.mutates = False  # the store is never empty: a copy into it is refused
    elif command == "recover":
        damaged = draw(st.sampled_from([paths.damaged, paths.other, paths.notadb, paths.emptydir, "/dev/null",
                                        f"{paths.work}/missing.db"]
                                       + ([paths.store] if "://" not in paths.store else [])))
        case.args += [damaged, draw(st.sampled_from(paths.targets()))]
        case.checked += ["DAMAGED", "NEW"]
        case.args += draw(st.sampled_from([[], ["--method", "scan"], ["--method", "auto"]]))
        case.dry_run = flag("--dry-run")
        case.args += ["--dry-run"] * case.dry_run
    elif command == "upgrade":
        case.dry_run = flag("--dry-run")
        case.args += ["--dry-run"] * case.dry_run
    elif command in ("stats", "verify"):
        case.args += draw(st.sampled_from([[], ["--format", "json"], ["--format", "csv"]]
                                          + [["--format", "prometheus"]] * (command == "stats")))
    elif command == "query":
        case.args.append(draw(st.sampled_from([
            "SELECT count(*) FROM guarded_entries", "DELETE FROM guarded_entries", "DROP TABLE kernel_blobs",
            "UPDATE guarded_entries SET payload = x'00'", "SELECT length(payload) FROM kernel_blobs", ""])))
    elif command == "export":
        case.args.append(draw(st.sampled_from(paths.dirs())))
        case.checked.append("TARGET_DIR")
    elif command == "import":
        case.args.append(draw(st.sampled_from(paths.dirs())))
        case.checked.append("CACHE_DIR")
        if flag("--workers", 3):
            _value(draw, case, "--workers", WORKERS_OK, WORKERS_BAD)
        case.mutates = target_is_store
    elif command == "export-artifacts":
        case.args.append(draw(st.sampled_from(paths.files())))
        case.checked.append("FILE")
    elif command == "import-artifacts":
        case.args.append(draw(st.sampled_from(paths.files())))
        case.checked.append("FILE")
        case.mutates = target_is_store
    elif command == "report":
        case.args += ["--format", "text"] if flag("text") else ["--out", draw(st.sampled_from(paths.files()))]
        case.checked.append("--out")
        if flag("--max-charts"):
            _value(draw, case, "--max-charts", CHARTS_OK, CHARTS_BAD)
    elif command == "datasette-metadata":
        if flag("--out"):
            case.args += ["--out", draw(st.sampled_from(paths.files()))]
            case.checked.append("--out")
    elif command == "cutlass":  # a real generation takes ~20 s: only lines refused before it starts
        case.args += draw(st.sampled_from([["generate"], ["generate", "--arch", "90"],
                                           ["generate", "--arch", "90", "--cuda", "12.8", "--cutlass-dir",
                                            f"{paths.work}/missing"]]))
        case.checked += ["--arch", "--cuda", "--cutlass-dir"]
    elif command == "run":  # never reaches the exec: a refused value always comes first
        option = draw(st.sampled_from(["--remote-timeout", "--timeout"]))
        bad = REMOTE_TIMEOUT_BAD if option == "--remote-timeout" else TIMEOUT_BAD
        case.args += [option, draw(st.sampled_from(bad))]
        case.invalid.append(option)
        case.args += ["--", "true"]
    if command not in ("copy", "recover", "run", "cutlass") and flag("--timeout after", 6):
        _value(draw, case, "--timeout", TIMEOUT_OK, TIMEOUT_BAD)
    return case


# --------------------------------------------------------------------------- the databases


def age_entries(location: str) -> None:
    """Make the database look used over time: entries and kernels last used from now to 40 days
    ago, so that ``--older-than`` finds something to remove and something to keep."""
    now = dt.datetime.now(dt.timezone.utc)
    with CacheDB(location) as db, db.engine.begin() as conn:
        g, a = tables.guarded_entries, tables.kernel_artifacts
        ids = [r[0] for r in conn.execute(text("SELECT id FROM guarded_entries ORDER BY id"))]
        for i, row_id in enumerate(ids):
            conn.execute(update(g).where(g.c.id == row_id).values(last_used_at=now - dt.timedelta(days=10 * i)))
        keys = [tuple(r) for r in conn.execute(text("SELECT DISTINCT kind, host_key, key FROM kernel_artifacts "
                                                    "ORDER BY kind, host_key, key"))]
        for i, (kind, host, key) in enumerate(keys):
            conn.execute(update(a).where(a.c.kind == kind, a.c.host_key == host, a.c.key == key)
                         .values(last_used_at=now - dt.timedelta(hours=20 * i)))


def build_master(cache_dir: Path, path: Path) -> Path:
    """The real database every example starts from: ``cache_dir`` imported, entries aged, WAL
    checkpointed (one self-contained file)."""
    from cachedb.layout.importer import Importer

    with CacheDB(path) as db:
        report = Importer(db).run(cache_dir)
        assert report.problems == [], report.problems
    age_entries(str(path))
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return path


def build_other(root: Path) -> Path:
    """A second database, other entries (a synthetic cache in torch 2.13's layout), checkpointed."""
    from cachedb.layout.importer import Importer

    from .reliability import _synth

    synth = _synth.build(root / "inductor", seed=51, fx_keys=4, aot_keys=2, best_configs=3, docs=1)
    path = root / "other.db"
    with CacheDB(path) as db:
        assert Importer(db).run(synth.root).problems == []
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return path


def damage(path: Path, table: str = "best_configs") -> None:
    """Overwrite the first bytes of ``table``'s root page."""
    con = sqlite3.connect(path)
    page_size = con.execute("PRAGMA page_size").fetchone()[0]
    root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    con.close()
    with open(path, "r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(b"\xff" * 16)


def _norm(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "b:" + hashlib.sha256(bytes(value)).hexdigest()
    if isinstance(value, dt.datetime):
        return "t:" + (value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)).astimezone(
            dt.timezone.utc).isoformat()
    return repr(value)


def table_digests(location: str) -> dict[str, tuple[int, str]]:
    """``{table: (rows, SHA-256 of every row)}`` of every table (rows in any order), read-only."""
    if "://" in location:
        engine = create_engine(location)
    else:
        engine = create_engine("sqlite://", creator=lambda: sqlite3.connect(
            f"{Path(location).resolve().as_uri()}?mode=ro", uri=True))
    try:
        out: dict[str, tuple[int, str]] = {}
        with engine.connect() as conn:
            for name in sorted(inspect(conn).get_table_names()):
                rows = sorted("|".join(_norm(v) for v in row) for row in conn.execute(text(f'SELECT * FROM "{name}"')))
                out[name] = (len(rows), hashlib.sha256("\n".join(rows).encode()).hexdigest())
            conn.rollback()
        return out
    finally:
        engine.dispose()


@dataclass(frozen=True)
class State:
    stats: Any
    tables: dict[str, tuple[int, str]]


def state(location: str) -> State:
    result = invoke(["--db", location, "stats", "--format", "json"])
    assert result.exit_code == 0, result.output
    return State(json.loads(result.stdout), table_digests(location))


def file_digest(path: str) -> tuple[str, bool]:
    """The SHA-256 of an SQLite file's bytes, and whether a non-empty ``-wal`` sits beside it."""
    wal = Path(path + "-wal")
    return hashlib.sha256(Path(path).read_bytes()).hexdigest(), wal.exists() and wal.stat().st_size > 0


# --------------------------------------------------------------------------- running


def invoke(args: list[str], env: dict[str, str | None] | None = None) -> Result:
    base: dict[str, str | None] = {"CACHEDB_URL": None, "CACHEDB_PATH": None, "CACHEDB_HMAC_KEY": None,
                                   "CACHEDB_REMOTE_URL": None, "COLUMNS": "200"}
    return CliRunner().invoke(main, args, env={**base, **(env or {})})


class ExecReached(AssertionError):
    """``cachedb run`` reached ``os.execvpe``: a refused value was accepted."""


@contextmanager
def no_exec() -> Iterator[None]:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise ExecReached(f"cachedb run reached os.execvpe{args[:2]}")

    with mock.patch("os.execvpe", refuse):
        yield


class Sandbox:
    """The files and the database an example runs on. ``location`` is the database under test:
    an SQLite copy of ``master`` made afresh for every example, or a PostgreSQL schema filled
    from ``master`` (filled again after an example that changed it)."""

    def __init__(self, root: Path, master: Path, other: Path, cache_dir: Path, pg_url: str | None = None) -> None:
        self.root, self.master, self.other_master, self.cache_dir = root, master, other, cache_dir
        self.pg_url = pg_url
        self.fixtures = root / "fixtures"
        self.fixtures.mkdir(parents=True, exist_ok=True)
        (self.fixtures / "notadb.db").write_text("these are my notes\n" * 20)
        (self.fixtures / "random.bin").write_bytes(hashlib.sha256(b"x").digest() * 40)
        self.damaged_master = self.fixtures / "damaged.db"
        shutil.copyfile(master, self.damaged_master)
        damage(self.damaged_master)
        self.counts = {"examples": 0, "exit_0": 0, "exit_1": 0, "exit_2": 0, "refused_values": 0, "changed": 0,
                       "dry_runs": 0}
        self._baseline: State | None = None
        self._pg_dirty = True

    @property
    def location(self) -> str:
        return self.pg_url if self.pg_url is not None else str(self.root / "work" / "store.db")

    def paths(self) -> Paths:
        w = str(self.root / "work")
        return Paths(store=self.location, other=f"{w}/other.db", damaged=f"{w}/damaged.db",
                     foreign=f"{w}/foreign.db", notadb=f"{w}/notadb.db", emptydir=f"{w}/emptydir",
                     cache_dir=str(self.cache_dir), blob=f"{w}/random.bin", work=w)

    def reset(self) -> None:
        """A fresh working directory: the fixtures copied in, the database as ``master``."""
        work = self.root / "work"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        (work / "emptydir").mkdir()
        for name in ("notadb.db", "random.bin", "damaged.db"):
            shutil.copyfile(self.fixtures / name, work / name)
        shutil.copyfile(self.other_master, work / "other.db")
        shutil.copyfile(self.other_master, work / "foreign.db")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            os.chown(work / "foreign.db", 65534, 65534)
        os.chmod(work / "foreign.db", 0o600)
        if self.pg_url is None:
            shutil.copyfile(self.master, work / "store.db")
        elif self._pg_dirty:
            self._fill_postgresql()
            self._pg_dirty = False

    def _fill_postgresql(self) -> None:
        from cachedb.fleet.copy import copy_database

        assert self.pg_url is not None
        engine = create_engine(self.pg_url)
        try:
            with engine.begin() as conn:
                names = inspect(conn).get_table_names()
                views = inspect(conn).get_view_names()
                for view in views:
                    conn.execute(text(f'DROP VIEW IF EXISTS "{view}" CASCADE'))
                for name in names:
                    conn.execute(text(f'DROP TABLE IF EXISTS "{name}" CASCADE'))
        finally:
            engine.dispose()
        copy_database(str(self.master), self.pg_url)

    def baseline(self) -> State:
        if self._baseline is None:
            self.reset()
            self._baseline = state(self.location)
        return self._baseline

    def run(self, case: Case) -> None:
        """Run ``case`` on a fresh copy and check the properties (module docstring)."""
        before = self.baseline()
        self.reset()
        sqlite_before = file_digest(self.location) if self.pg_url is None else None
        env = {"CACHEDB_URL": self.pg_url, "CACHEDB_PATH": None if self.pg_url else self.location}
        cwd = os.getcwd()
        os.chdir(self.root / "work")
        try:
            with no_exec():
                result = invoke(case.args, env)
        finally:
            os.chdir(cwd)
        self.counts["examples"] += 1
        self.counts[f"exit_{result.exit_code}"] = self.counts.get(f"exit_{result.exit_code}", 0) + 1
        where = f"{case.args!r}: exit {result.exit_code}\n{result.output[-1500:]}"
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise AssertionError(f"traceback: {where}") from result.exception
        assert "Traceback" not in result.output, where
        assert result.exit_code in (0, 1, 2), where
        if case.invalid:
            self.counts["refused_values"] += 1
            assert result.exit_code == 2, f"a refused value was accepted: {where}"
            lines = [line for line in result.stderr.splitlines() if line.strip()]
            assert len(lines) == 1 and lines[0].startswith("error: "), where
            assert any(f"'{o}'" in lines[0] for o in case.invalid + case.checked), where
        elif result.exit_code == 1 and case.command != "verify":
            assert "error:" in result.output, where
        after = state(self.location)
        changed = after != before
        if changed:
            self.counts["changed"] += 1
            self._pg_dirty = True
            assert case.mutates and not case.invalid and result.exit_code == 0, f"the database changed: {where}"
        if case.dry_run and not case.invalid and result.exit_code == 0:
            self.counts["dry_runs"] += 1
            if sqlite_before is not None:
                assert file_digest(self.location) == sqlite_before, f"a dry run changed the file: {where}"


def check_every_command(sandbox: Sandbox, examples: int) -> None:
    """The property (module docstring): ``examples`` command lines drawn for each command."""
    for command in COMMANDS:
        @settings(max_examples=examples, derandomize=True, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=cases(sandbox.paths(), command))
        def check(case: Case) -> None:
            sandbox.run(case)

        check()
