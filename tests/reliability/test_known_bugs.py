"""One minimal, deterministic reproduction per bug the reliability suite found in cachedb.

Each test asserts the correct behaviour. While its bug is open it is ``xfail(strict=True,
raises=<the exception that escapes today>)``: it fails for exactly that reason, and turns into an
XPASS (a failure, strict) once the bug is fixed; the bug's id then goes into ``FIXED`` and the
test must pass (marker ``fixed_bug``). The ids (B1, D2, ...) are the ones the fuzz tests and
RELIABILITY.md use.
"""

from __future__ import annotations

import json
import os
import pickle
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy.exc import ArgumentError, DatabaseError, DataError, IntegrityError, NoSuchModuleError, \
    OperationalError, ProgrammingError

from rich.errors import MarkupError

from cachedb import CacheDB, DatabaseOpenError
from cachedb.cli import main as cli
from cachedb.fingerprint import Fingerprint
from cachedb.layout.importer import Importer
from cachedb.keys import sha256_hash

from ._synth import CompiledFxGraph

H = "e" * 64
COMPANION = ("zz/czz.best_config", b'{"XBLOCK": 64, "num_warps": 4}')


#: Bugs found by this suite and fixed: their tests now assert the correct behaviour.
FIXED = {"L3", "L4", "V1", "B1", "B2", "B3", "B4", "D1", "D2", "D3", "D4", "D5", "D6", "P1", "P2", "C1", "C2", "G1-G4", "M1", "L1", "L2", "V2", "V3", "V4", "R1-R3"}


def bug(raises: type[BaseException] | tuple, reason: str):
    if reason.split()[0].rstrip(":") in FIXED:
        return pytest.mark.fixed_bug(reason)  # fixed: the test must pass
    return pytest.mark.xfail(strict=True, raises=raises, reason=reason)


def _import_reports_bad_file(db: CacheDB, root: Path, files: dict, bad: str) -> None:
    """The correct behaviour: the bad file is reported as a problem, the rest imports."""
    for rel, data in {**files, COMPANION[0]: COMPANION[1]}.items():
        path = root / rel if isinstance(rel, str) else Path(os.fsdecode(bytes(root) + b"/" + rel))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    report = Importer(db).run(root)
    assert [p.path for p in report.problems] == [bad]
    with db.read() as repos:
        assert repos.best_configs.get(COMPANION[0]) == COMPANION[1].decode()


def _doc(cache: dict, **system) -> bytes:
    return json.dumps({"system": {"hash": H, **system}, "cache": cache}, indent=4).encode()


def _timings(inputs: str = "[('cpu', 8)]", op: str = "mm", choice: str = "extern_mm") -> dict:
    return {op: {inputs: {"high": {choice: 0.5}}}}


def _pickle(**state) -> bytes:
    obj = CompiledFxGraph()
    obj.__dict__.update(state)
    return pickle.dumps(obj, protocol=4)


def _fx(data: bytes, key: str = "fabcdefgh") -> tuple[str, bytes]:
    return f"fxgraph/{key[1:3]}/{key}/{sha256_hash(data)}", data


def _enum(name) -> str:
    return json.dumps({"type": "X", "name": name})


def _op_list(arch=90, element="f16") -> bytes:
    tensor = json.dumps({"element": _enum(element), "layout": _enum("RowMajor"), "alignment": 8})
    math = json.dumps({"instruction_shape": [0, 0, 0], "element_a": _enum("f16"), "element_b": _enum("f16"),
                       "element_accumulator": _enum("f32"), "opcode_class": _enum("TensorOp"),
                       "math_operation": _enum("multiply_add")})
    tile = json.dumps({"threadblock_shape": [128, 128, 64], "stages": 4, "warp_count": [4, 1, 1],
                       "math_instruction": math})
    op = {"gemm_kind": _enum("Universal3x"), "arch": arch, "tile_description": tile, "element_epilogue": _enum("f32"),
          "A": tensor, "B": tensor}
    return json.dumps([json.dumps(op)]).encode()


# --------------------------------------------------------------------------- importer (SQLite)

IMPORTER_BUGS = [
    pytest.param({"ab/cx.best_config": b"[" * 5000}, "ab/cx.best_config", id="B1-best-config-deep-json",
                 marks=bug(RecursionError, "B1 cachedb/repositories/best_configs.py extract_columns: json.loads "
                           "RecursionError (nesting deeper than the recursion limit) is not caught (only ValueError)")),
    pytest.param({"ab/cx.best_config": b'{"num_warps": 18446744073709551616}'}, "ab/cx.best_config",
                 id="B2-best-config-int-out-of-int64",
                 marks=bug(OverflowError, "B2 BestConfigRepository.put: num_warps/num_stages/time_taken_ms outside "
                           "int64 reach the INSERT: OverflowError (SQLite)")),
    pytest.param({"ab/cx.best_config": b'{"configs_hash": "\\ud800"}'}, "ab/cx.best_config",
                 id="B3-best-config-lone-surrogate",
                 marks=bug(UnicodeEncodeError, "B3 BestConfigRepository.put: a JSON string with a lone surrogate "
                           "(configs_hash, triton_cache_hash) cannot be encoded for the INSERT")),
    pytest.param({b"ab/c\xff.best_config": b"{}"}, os.fsdecode(b"ab/c\xff.best_config"), id="B4-file-name-not-utf8",
                 marks=bug(UnicodeEncodeError, "B4 Importer._import_one: a file name that is not UTF-8 (os.walk gives "
                           "surrogate escapes) is used as the stored key: UnicodeEncodeError")),
    pytest.param({f"cache/{H}": b'{"system": {"hash": "' + H.encode() + b'"}, "cache": ' + b"[" * 5000},
                 f"cache/{H}", id="D1-local-cache-deep-json",
                 marks=bug(RecursionError, "D1 cachedb/formats/local_cache_doc.py parse: json.loads RecursionError is not "
                           "caught (only ValueError, UnicodeDecodeError)")),
    pytest.param({f"cache/{H}": _doc({"x": 1}, device="cpu")}, f"cache/{H}", id="D2-system-device-not-object",
                 marks=bug(AttributeError, "D2 cachedb/fingerprint.py Fingerprint.device_name (and triton_key, "
                           "cuda_version, hip_version for 'version'): (system.get('device') or {}).get on a str/list")),
    pytest.param({f"cache/{H}": _doc({"x": 1}, device={"name": ["H100"]})}, f"cache/{H}",
                 id="D3-device-name-not-string",
                 marks=bug(ProgrammingError, "D3 FingerprintRepository.ensure: a list/dict device name or version "
                           "reaches the INSERT: sqlalchemy ProgrammingError (type 'list' is not supported)")),
    pytest.param({f"cache/{H}": _doc(_timings("[('cpu', 8)]_" + "1" * 5000))}, f"cache/{H}",
                 id="D4-hint-override-over-4300-digits",
                 marks=bug(ValueError, "D4 cachedb/keys.py split_inputs_key: int() of a hint override with more "
                           "than 4300 digits raises ValueError")),
    pytest.param({f"cache/{H}": _doc(_timings("[('cpu', 8)]_" + "9" * 20))}, f"cache/{H}",
                 id="D5-hint-override-out-of-int64",
                 marks=bug(OverflowError, "D5 AutotuneTimingRepository.add_leaves: a hint override outside int64 "
                           "reaches the INSERT: OverflowError")),
    pytest.param({f"cache/{H}": _doc(_timings(op="\ud800"))}, f"cache/{H}", id="D6-lone-surrogate-op",
                 marks=bug(UnicodeEncodeError, "D6 AutotuneTimingRepository.add_leaves / LocalCacheValueRepository."
                           "add_leaves: a lone surrogate (JSON escape) in an op, inputs, choice or namespace key")),
    pytest.param(dict([_fx(_pickle(guards_expr=None, _time_taken_ns=2**64))]), _fx(_pickle(guards_expr=None,
                 _time_taken_ns=2**64))[0], id="P1-pickle-time-out-of-int64",
                 marks=bug(OverflowError, "P1 GuardedEntryRepository.put: _time_taken_ns (or forward+backward) "
                           "outside int64 read from the pickle reaches the INSERT: OverflowError")),
    pytest.param(dict([_fx(_pickle(guards_expr="\ud800", _time_taken_ns=1))]), _fx(_pickle(guards_expr="\ud800",
                 _time_taken_ns=1))[0], id="P2-pickle-guards-lone-surrogate",
                 marks=bug(UnicodeEncodeError, "P2 GuardedEntryRepository.put: guards_expr (or the class name "
                           "written to guards_note) with a lone surrogate: UnicodeEncodeError")),
    pytest.param({"configs_abc1.json": _op_list(arch=2**64)}, "configs_abc1.json", id="C1-cutlass-int-out-of-int64",
                 marks=bug(OverflowError, "C1 CutlassOpListRepository.put: arch/alignment/stages outside int64 "
                           "reach the INSERT of cutlass_ops: OverflowError")),
    pytest.param({"configs_abc2.json": _op_list(element="\ud800")}, "configs_abc2.json",
                 id="C2-cutlass-lone-surrogate",
                 marks=bug(UnicodeEncodeError, "C2 CutlassOpListRepository.put: an enum name with a lone surrogate "
                           "reaches the INSERT of cutlass_ops: UnicodeEncodeError")),
]


@pytest.mark.parametrize("files, bad", IMPORTER_BUGS)
def test_importer_reports_bad_file_instead_of_crashing(sqlite_db: CacheDB, tmp_path: Path, files: dict,
                                                       bad: str) -> None:
    _import_reports_bad_file(sqlite_db, tmp_path / "cache", files, bad)


POSTGRES_VALUES = [
    pytest.param({"ab/cx.best_config": json.dumps({"configs_hash": "a" * 100}).encode()}, "ab/cx.best_config",
                 id="G1-varchar-too-long"),
    pytest.param({"ab/cx.best_config": b'{"configs_hash": "a\\u0000b"}'}, "ab/cx.best_config", id="G2-nul-in-text"),
    pytest.param({"ab/cx.best_config": json.dumps({"num_warps": 2**40}).encode()}, "ab/cx.best_config",
                 id="G3-int32-column-overflow"),
    pytest.param({f"cache/{H}": _doc(_timings(op="m" * 300))}, f"cache/{H}", id="G4-op-longer-than-256"),
]


@pytest.mark.parametrize("files, bad", POSTGRES_VALUES)
@bug(DataError, "G1-G4 on PostgreSQL: values SQLite accepts but PostgreSQL refuses (VARCHAR(n) longer than n, "
     "NUL in text, > int32 in an Integer column) escape Importer.run as sqlalchemy DataError instead of being "
     "reported as bad input (best_configs.put, timings.add_leaves)")
def test_importer_on_postgresql_reports_values_it_cannot_store(pg_url: str, tmp_path: Path, files: dict,
                                                               bad: str) -> None:
    db = CacheDB(pg_url)
    try:
        _import_reports_bad_file(db, tmp_path / "cache", files, bad)
    finally:
        db.close()


@bug(OverflowError, "M1 cachedb/layout/mega_cache.py import_artifacts/_store_one: the P1/P2/B1-B3 errors are reachable "
     "through a Mega-Cache blob (only CacheDBError is caught per artifact)")
def test_m1_mega_cache_artifact_with_out_of_range_time(sqlite_db: CacheDB) -> None:
    pytest.importorskip("torch")
    from torch.utils._appending_byte_serializer import BytesWriter

    from cachedb.layout.mega_cache import import_artifacts

    writer = BytesWriter()
    writer.write_uint64(1)
    writer.write_str("inductor")
    writer.write_uint64(1)
    writer.write_str("fbig")
    writer.write_bytes(_pickle(guards_expr=None, _time_taken_ns=2**64))
    report = import_artifacts(sqlite_db, writer.to_bytes(), where="blob.bin")
    assert [p.path for p in report.problems] == ["inductor:fbig"]


# --------------------------------------------------------------------------- command line


@pytest.mark.parametrize("url, raises", [
    pytest.param("://", ArgumentError, id="unparsable"),
    pytest.param("nosuch://x", NoSuchModuleError, id="unknown-dialect"),
    pytest.param("mysql://u@h/db", ModuleNotFoundError, id="driver-not-installed"),
    pytest.param("sqlite://x:y@h:port/db", ValueError, id="bad-port"),
])
def test_l1_cli_bad_db_url_is_one_error_line(url: str, raises: type, request) -> None:
    request.applymarker(bug(raises, "L1 cachedb/db.py CacheDB.__init__ calls to_url() (make_url) and "
                                    "create_cachedb_engine() (create_engine) outside the try that turns errors into "
                                    "DatabaseOpenError, so `cachedb --db URL ...` prints a traceback"))
    result = CliRunner().invoke(cli, ["--db", url, "stats"])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 1 and "error:" in result.output


@pytest.mark.parametrize("args", [
    pytest.param(["query", "SELECT '[/]' AS x"], id="markup-in-a-value"),
    pytest.param(["query", 'SELECT 1 AS "[/x]"'], id="markup-in-a-column-name"),
    pytest.param(["query", "[/]"], id="markup-in-an-error-message"),
    pytest.param(None, id="markup-in-a-path-in-an-error-message"),
])
@bug(MarkupError, "L2 cachedb/cli/_output.py emit (table cells and headers) and cachedb/cli/_common.py _Group.invoke (err.print(..., markup=True) "
     "of the error message): text containing '[/...]' (a value, a column name, an SQL error quoting the SQL, a "
     "path) is parsed as rich markup: rich.errors.MarkupError and a traceback")
def test_l2_cli_prints_text_literally(args: list[str] | None, tmp_path: Path) -> None:
    if args is None:  # NotADatabaseError names the path .../[/notes]
        (tmp_path / "[").mkdir()
        path = tmp_path / "[" / "notes]"
        path.write_text("not a database")
        args = ["--db", str(path), "stats"]
    else:  # query reads an existing database (read commands never create one)
        CliRunner().invoke(cli, ["--db", str(tmp_path / "x.db"), "init"])
        args = ["--db", str(tmp_path / "x.db"), *args]
    result = CliRunner().invoke(cli, args)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code in (0, 1) and "[/" in result.output


# --------------------------------------------------------------------------- damaged database files


def _damaged(tmp_path: Path, sql: str) -> Path:
    path = tmp_path / "damaged.db"
    db = CacheDB(path)
    with db.transaction() as repos:
        repos.guarded.put("fxgraph", "fabc", b"payload", guards_expr=None)
        repos.best_configs.put("ab/cx.best_config", '{"XBLOCK": 64}')
    db.close()
    con = sqlite3.connect(path)
    con.execute("PRAGMA writable_schema = ON")
    con.execute(sql)
    con.commit()
    con.close()
    return path


@bug(OperationalError, "V1 cachedb/tools/verify.py verify: a damaged text value that is not UTF-8 (here guarded_entries.key) "
     "makes sqlite3 raise OperationalError('Could not decode to UTF-8 ...') while reading; `cachedb verify` crashes "
     "with a traceback instead of reporting the damage")
def test_v1_verify_reports_a_non_utf8_text_value(tmp_path: Path) -> None:
    path = _damaged(tmp_path, "UPDATE guarded_entries SET key = CAST(X'66ff' AS TEXT)")
    result = CliRunner().invoke(cli, ["--db", str(path), "verify"])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 1


@bug(OperationalError, "V2 best_configs.content has no checksum: `cachedb verify` passes a damaged best config, and "
     "when the damage is a non-UTF-8 byte `cachedb export` (BestConfigRepository.iter_all/get) crashes with "
     "OperationalError instead of a CacheDBError")
def test_v2_export_of_a_damaged_best_config_is_a_clean_error(tmp_path: Path) -> None:
    path = _damaged(tmp_path, "UPDATE best_configs SET content = CAST(X'7b22ff7d' AS TEXT)")
    result = CliRunner().invoke(cli, ["--db", str(path), "export", str(tmp_path / "out")])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 1 and "error:" in result.output


@bug(UnicodeDecodeError, "V3 cachedb/db.py CacheDB.__init__: a damaged schema entry whose name is not UTF-8 makes "
     "sqlite3's own error message undecodable; the UnicodeDecodeError is not turned into DatabaseOpenError")
def test_v3_open_with_a_damaged_schema_name_is_database_open_error(tmp_path: Path) -> None:
    path = _damaged(tmp_path, "UPDATE sqlite_master SET name = CAST(X'69ff' AS TEXT) "
                              "WHERE name = 'ix_autotune_keys_lookup'")
    with pytest.raises(DatabaseOpenError):
        CacheDB(path)


@pytest.mark.parametrize("command", [["verify"], ["export", "out"]])
@bug(DatabaseError, "V4 cachedb/tools/verify.py verify (PRAGMA integrity_check) and cachedb/layout/exporter.py: a damaged b-tree "
     "page makes SQLite raise 'database disk image is malformed' (sqlalchemy DatabaseError); `cachedb verify` and "
     "`cachedb export` crash with a traceback instead of reporting the damage / a CacheDBError")
def test_v4_damaged_btree_page_is_reported(tmp_path: Path, command: list[str]) -> None:
    path = _damaged(tmp_path, "SELECT 1")
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    (root,) = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'best_configs'").fetchone()
    page_size = con.execute("PRAGMA page_size").fetchone()[0]
    con.close()
    with open(path, "r+b") as f:  # the page header of the best_configs table
        f.seek((root - 1) * page_size)
        f.write(b"\xff" * 16)
    args = ["--db", str(path), *command[:1], *[str(tmp_path / c) for c in command[1:]]]
    result = CliRunner().invoke(cli, args)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 1


# --------------------------------------------------------------------------- concurrent first inserts


def _race(db: CacheDB, first, second) -> None:
    """Transaction 1 writes and stays open 0.5 s; transaction 2 writes the same row meanwhile."""
    barrier = threading.Barrier(2, timeout=30)
    errors: list[BaseException] = []

    def one() -> None:
        try:
            with db.transaction() as repos:
                first(repos)
                barrier.wait()
                time.sleep(0.5)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def two() -> None:
        try:
            barrier.wait()
            with db.transaction() as repos:
                second(repos)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=one), threading.Thread(target=two)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]


RACE_REASON = ("R1-R3 on PostgreSQL (READ COMMITTED): BestConfigRepository.put, GuardedEntryRepository.put and "
               "FingerprintRepository.ensure check for the row, then INSERT; two processes writing the same new "
               "key at once both miss it and the second INSERT fails with IntegrityError (UniqueViolation) that "
               "reaches the caller. On SQLite BEGIN IMMEDIATE serializes the writers.")
BACKENDS = ["sqlite", pytest.param("postgresql", marks=bug(IntegrityError, RACE_REASON))]


@pytest.fixture
def race_db(request, tmp_path: Path):
    backend = request.node.callspec.params["backend"]
    location = str(tmp_path / "race.db") if backend == "sqlite" else request.getfixturevalue("pg_url")
    db = CacheDB(location)
    yield db
    db.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_r1_concurrent_first_best_config_put(race_db: CacheDB, backend: str) -> None:
    _race(race_db, lambda r: r.best_configs.put("ab/cx.best_config", '{"w": 1}'),
          lambda r: r.best_configs.put("ab/cx.best_config", '{"w": 2}'))
    with race_db.read() as repos:
        assert repos.best_configs.get("ab/cx.best_config") == '{"w": 2}'


@pytest.mark.parametrize("backend", BACKENDS)
def test_r2_concurrent_first_put_of_one_variant(race_db: CacheDB, backend: str) -> None:
    put = lambda r: r.guarded.put("fxgraph", "fabc", b"same bytes", guards_expr=None)  # noqa: E731
    _race(race_db, put, put)
    with race_db.read() as repos:
        assert repos.guarded.candidates("fxgraph", "fabc") == [(sha256_hash(b"same bytes"), b"same bytes")]


@pytest.mark.parametrize("backend", BACKENDS)
def test_r3_concurrent_first_fingerprint(race_db: CacheDB, backend: str) -> None:
    fp = Fingerprint(system={"hash": "f" * 64})
    _race(race_db, lambda r: r.fingerprints.ensure(fp), lambda r: r.fingerprints.ensure(fp))
    with race_db.read() as repos:
        assert len(repos.fingerprints.ids_for_system_hash("f" * 64)) == 1


# --------------------------------------------------------------------------- undecodable bytes on the command line
# A real command line hands bytes that are not UTF-8 to Python as surrogate escapes
# (U+DC80..U+DCFF): `cachedb query $'SELECT \'\xff\''`, `cachedb --db $'/tmp/\xff.db' init`.


@bug(UnicodeEncodeError, "L3 cachedb/cli/cache.py query: SQL holding bytes that are not UTF-8 reaches sqlite3, whose "
     "UnicodeEncodeError is not a SQLAlchemyError (the only error turned into QueryError): a traceback. "
     "Real shell: cachedb query $'SELECT \\'\\xff\\''")
def test_l3_query_with_undecodable_bytes_is_one_error_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["--db", str(tmp_path / "x.db"), "query", "SELECT 'a\udcff'"])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 1 and "error:" in result.output


@bug(UnicodeEncodeError, "L4 cachedb/cli/cache.py init/upgrade/export (click.echo of db.where / the target directory): a "
     "path with bytes that are not UTF-8 cannot be written to a strict UTF-8 stdout (CliRunner; a real terminal "
     "under PYTHONIOENCODING=utf-8 or a UTF-8 locale other than C.UTF-8): a traceback after the work was done. "
     "Real shell: PYTHONIOENCODING=utf-8 cachedb --db $'/tmp/\\xff.db' init")
def test_l4_paths_with_undecodable_bytes_are_printable(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["--db", str(tmp_path / "\udcff.db"), "init"])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0
