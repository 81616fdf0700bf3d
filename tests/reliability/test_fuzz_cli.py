"""Property-based fuzzing of the command line: generated argument lists (commands, options,
paths, SQL, database locations) run through click's CliRunner on ``cachedb.cli.main``.

Properties: a run ends with exit status 0, 1 (a cachedb error printed as one line, or
``verify`` finding problems) or 2 (a click usage error) and never with a traceback of another
exception type; the database populated before the fuzzing keeps every entry byte-identical
(``query`` is read-only, bad imports are skipped).

Everything runs inside a sandbox directory (the working directory during the test), every
generated path is relative to it, ``$CACHEDB_PATH`` points into it, and ``cachedb run`` (which
would exec a program) is never generated.

``test_fuzz_cli_safety`` runs the property of ``tests/_cli_safety.py`` (a typo never empties a
cache: every command, refused values exit 2 in one line, the database's rows and bytes unchanged
unless a valid command that changes it ran, dry runs byte-identical) with more examples than the
normal suite's ``tests/test_cli_safety.py``, on a real database on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import assume, example, given
from hypothesis import strategies as st

from cachedb.cli import main as cli

from .. import _cli_safety as safety
from . import _strategies as S
from . import _synth, figures
from ._store import Store

EXAMPLES = 200
#: Command lines per command and backend for the safety property (tests/_cli_safety.py).
SAFETY_EXAMPLES = {"sqlite": 30, "postgresql": 12}
TABLES = ["guarded_entries", "autotune_timings", "local_cache_values", "best_configs", "cutlass_op_lists",
          "cutlass_ops", "system_fingerprints", "autotune_current", "autotune_winners", "autotune_history",
          "quarantined_entries", "alembic_version", "sqlite_master", "no_such_table"]
COLUMNS = ["*", "count(*)", "key", "kind", "variant", "payload", "op", "timing_ms", "content", "id", "length(payload)",
           "hex(checksum)", "1/0", "NULL", "'x'", "max(id)", "nosuchcolumn"]
WRITES = ["DELETE FROM guarded_entries", "DELETE FROM best_configs WHERE 1", "DROP TABLE guarded_entries",
          "UPDATE guarded_entries SET payload = x'00'", "INSERT INTO best_configs (key) VALUES ('x')",
          "CREATE TABLE t (x)", "PRAGMA query_only = 0", "PRAGMA journal_mode = DELETE", "VACUUM", "REINDEX",
          "ATTACH DATABASE 'attached.db' AS a", "DETACH DATABASE main", "PRAGMA writable_schema = 1",
          "SELECT 1; DELETE FROM guarded_entries", "BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT s",
          "ANALYZE", "DELETE FROM alembic_version", "REPLACE INTO best_configs (id, key) VALUES (1, 'x')"]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("fuzz_cli")
    (root / "scratch").mkdir()
    store = Store.create(root / "store.db", root / "scratch", seed=13)
    _synth.build(root / "cache_ok", seed=14, fx_keys=3, aot_keys=2, best_configs=3, docs=1)
    (root / "notadb.db").write_bytes(b"these are my notes\n" * 20)
    (root / "truncated.db").write_bytes(b"SQLite format 3\x00" + b"\x00" * 50)
    (root / "emptydir").mkdir()
    (root / "random.bin").write_bytes(os.urandom(200))
    try:  # a valid Mega-Cache blob (torch's own writer), when torch is there
        from torch.utils._appending_byte_serializer import BytesWriter

        writer = BytesWriter()
        writer.write_uint64(1)
        writer.write_str("inductor")
        writer.write_uint64(1)
        writer.write_str("fblobkey")
        writer.write_bytes(pickle.dumps(_synth.CompiledFxGraph()))
        (root / "blob.bin").write_bytes(writer.to_bytes())
    except ImportError:
        pass
    (root / "cache_bad" / "fxgraph" / "ab" / "fabc").mkdir(parents=True)
    (root / "cache_bad" / "fxgraph" / "ab" / "fabc" / "notahash").write_bytes(b"\x80\x04K\x01.")
    (root / "cache_bad" / "ab").mkdir()
    (root / "cache_bad" / "ab" / "x.best_config").write_text('{"XBLOCK": ')
    yield root, store
    lost = store.lost()
    figures.add("fuzz_cli", entries_lost=lost)
    store.db.close()
    assert lost == 0


def _component(hostile: bool) -> st.SearchStrategy[str]:
    names = S.texts(hostile, 10, brackets=hostile).filter(
        lambda s: s and "/" not in s and "\x00" not in s and s not in (".", "..") and not s.startswith("~"))
    return st.one_of(names, st.sampled_from(["store.db", "new.db", "cache_ok", "cache_bad", "notadb.db", "truncated.db",
                                             "emptydir", "random.bin", "out", "x.bin", "scratch"]))


def _paths(hostile: bool) -> st.SearchStrategy[str]:
    return st.lists(_component(hostile), min_size=1, max_size=3).map("/".join)


def _sql(hostile: bool) -> st.SearchStrategy[str]:
    select = st.builds(
        lambda cols, table, where, limit: f"SELECT {', '.join(cols)} FROM {table}{where}{limit}",
        st.lists(st.sampled_from(COLUMNS), min_size=1, max_size=3), st.sampled_from(TABLES),
        st.sampled_from(["", " WHERE id > 2", " WHERE key LIKE 'f%'", " WHERE 1 = ", " ORDER BY 1 DESC"]),
        st.sampled_from(["", " LIMIT 3", " LIMIT -1", " LIMIT 'x'"]),
    )
    literal = st.builds(lambda v: f"SELECT {json.dumps(v)}", S.texts(hostile, 20, brackets=hostile))
    return st.one_of(select, st.sampled_from(WRITES), literal, S.texts(hostile, 30, brackets=hostile),
                     st.sampled_from(["", " ", ";", "SELECT :x", "SELECT ?", "SELECT %s", "SELECT zeroblob(5)",
                                      "SELECT x'ff'", "SELECT 1e999", "SELECT -9223372036854775808 - 1",
                                      "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c LIMIT 50) "
                                      "SELECT x FROM c"]))


def _db_values(root: Path, hostile: bool) -> st.SearchStrategy[str]:
    store = str(root / "store.db")
    values = st.one_of(st.sampled_from([store, "store.db", "sqlite:///" + store, "notadb.db", "truncated.db",
                                        "emptydir", "", "new/nested/fresh.db", "sqlite://"]), _paths(hostile))
    if hostile:  # URLs SQLAlchemy cannot parse or has no driver for
        values = st.one_of(values, st.builds(lambda s, r: f"{s}://{r}", S.texts(False, 8), S.texts(False, 16)),
                           st.sampled_from(["://", "nosuch://x", "mysql://u@h/db", "sqlite://x:y@h:port/db"]))
    return values


@st.composite
def argv(draw: st.DrawFn, root: Path, hostile: bool) -> list[str]:
    args: list[str] = []
    if draw(st.integers(0, 9)) < 8:
        args += ["--db", draw(_db_values(root, hostile))]
    command = draw(st.sampled_from(["init", "import", "export", "stats", "query", "upgrade", "verify",
                                    "export-artifacts", "import-artifacts", "cutlass", "help", "--help", "--version",
                                    "", "impor", "VERIFY"]))
    if command:
        args.append(command)
    if command == "import":
        args.append(draw(st.one_of(st.sampled_from(["cache_ok", "cache_bad", "emptydir", "notadb.db", "missing", "."]),
                                   _paths(hostile))))
    elif command == "export":
        args.append(draw(st.one_of(st.sampled_from(["out", "notadb.db", "notadb.db/sub", "emptydir"]), _paths(hostile))))
    elif command == "query":
        args.append(draw(_sql(hostile)))
    if command in ("stats", "verify", "query") and draw(st.booleans()):
        args += ["--format", draw(st.sampled_from(["table", "json", "csv", "xml", ""]))]
    if command in ("export-artifacts", "import-artifacts"):
        args.append(draw(st.one_of(st.sampled_from(["random.bin", "x.bin", "missing.bin", "emptydir", "blob.bin"]),
                                   _paths(hostile))))
    elif command == "cutlass":
        args += draw(st.sampled_from([[], ["generate"], ["generate", "--level", "1"], ["--help"], ["nope"]]))
    for _ in range(draw(st.integers(0, 2)) if draw(st.integers(0, 4)) == 0 else 0):
        args.insert(draw(st.integers(0, len(args))), draw(st.one_of(
            st.sampled_from(["--format", "--help", "-h", "--this-machine", "--db", "--", "--bogus", "-x", "json"]),
            _component(hostile))))
    return args


def real_argv(args: list[str]) -> bool:
    """Whether a real command line can carry ``args``: no NUL, and text the OS can hand over
    (undecodable bytes arrive as surrogate escapes U+DC80..U+DCFF, nothing else)."""
    try:
        return all("\x00" not in a and os.fsencode(a) is not None for a in args)
    except UnicodeEncodeError:
        return False


def markup_bug(args: list[str]) -> bool:
    return any("[" in a for a in args)


def url_bug(args: list[str], root: Path) -> bool:
    for i, a in enumerate(args[:-1]):
        if a == "--db" and "://" in args[i + 1] and args[i + 1] not in ("sqlite:///" + str(root / "store.db"), "sqlite://"):
            return True
    return False


def _invoke(args: list[str], root: Path):
    return CliRunner().invoke(cli, args, env={"CACHEDB_PATH": str(root / "default.db"), "CACHEDB_URL": None,
                                             "CACHEDB_HMAC_KEY": None, "COLUMNS": "200"})


@pytest.mark.parametrize("hostile", [pytest.param(False, id="clean"), pytest.param(True, id="hostile")])
def test_fuzz_cli(sandbox, hostile: bool) -> None:
    root, store = sandbox
    counts = {"n": 0, "exit0": 0, "exit1": 0, "exit2": 0}
    cwd = os.getcwd()
    os.chdir(root)
    try:
        @S.fuzz_settings(EXAMPLES, hostile=hostile)
        @given(args=argv(root, hostile))
        @example(args=["--db", str(root / "store.db"), "query", "SELECT '[/]'"]).via("L2") if hostile else (lambda f: f)
        @example(args=["--db", "://", "stats"]).via("L1") if hostile else (lambda f: f)
        @example(args=["--db", "\udcff.db", "import", "x\udcff"]).via("undecodable argv bytes") if hostile else (lambda f: f)
        def run(args: list[str]) -> None:
            assume("run" not in args)  # `cachedb run` execs a program
            assume(real_argv(args))  # e.g. a lone U+D800 cannot come from a command line
            if not hostile:
                assume(not markup_bug(args) and not url_bug(args, root))
            counts["n"] += 1
            result = _invoke(args, root)
            if result.exception is not None and not isinstance(result.exception, SystemExit):
                raise result.exception
            assert result.exit_code in (0, 1, 2), (args, result.exit_code, result.output[-500:])
            counts[f"exit{result.exit_code}"] += 1
            if result.exit_code == 1 and "verify" not in args:
                assert "error:" in result.output, (args, result.output[-500:])

        run()
    finally:
        os.chdir(cwd)
    figures.add("fuzz_cli", fuzz_cases=counts["n"], exit_0=counts["exit0"], exit_1_cachedb_error=counts["exit1"],
                exit_2_usage=counts["exit2"])


@pytest.fixture(scope="module")
def real_master(real_cache: tuple[Path, dict], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return safety.build_master(real_cache[0], tmp_path_factory.mktemp("safety") / "master.db")


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_fuzz_cli_safety(backend: str, real_master: Path, real_cache: tuple[Path, dict],
                         tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> None:
    pg = request.getfixturevalue("pg_url") if backend == "postgresql" else None
    root = tmp_path_factory.mktemp(f"safety_{backend}")
    other = safety.build_other(root / "other")
    sandbox = safety.Sandbox(root / "sandbox", real_master, other, real_cache[0], pg_url=pg)
    safety.check_every_command(sandbox, SAFETY_EXAMPLES[backend])
    c = sandbox.counts
    figures.add(f"fuzz_cli_safety_{backend}", fuzz_cases=c["examples"], exit_0=c["exit_0"],
                exit_1_cachedb_error=c["exit_1"], exit_2_usage=c["exit_2"], refused_values=c["refused_values"],
                database_changed_by_a_valid_command=c["changed"], dry_runs_unchanged=c["dry_runs"])
    assert c["refused_values"] > 0 and c["dry_runs"] > 0
