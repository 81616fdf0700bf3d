"""Property-based fuzzing of every importer input (hypothesis, deterministic and bounded).

Inputs: best-config JSON, ``cache/<system hash>`` JSON, pickled FX graph / AOTAutograd entries,
CUTLASS op lists, and the shape of the cache directory itself. Properties:

- only :class:`cachedb.CacheDBError` subclasses escape (the importer reports bad files as
  problems; the parsers raise ``BadInputError`` subclasses), never another exception type;
- a bad file is skipped and the rest of its directory imports (a valid companion file);
- nothing already stored is lost: a database populated before the fuzzing keeps every entry
  byte-identical.

Each test runs twice: ``clean`` (known bugs filtered out, must pass) and ``hostile`` (every
input, ``xfail(strict=True)`` naming the known bugs until they are fixed; see
``test_known_bugs.py`` for one minimal reproduction per bug).
"""

from __future__ import annotations

import re

import json
import pickle

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from sqlalchemy.exc import ProgrammingError

from cachedb import BadInputError, CacheDBError, CutlassOpListError, PickleScanError
from cachedb.formats.pickle_scan import read_entry_fields
from cachedb.formats.cutlass_ops import parse_op_list
from cachedb.keys import sha256_hash

from . import _strategies as S
from . import figures
from ._store import Store
from ._synth import CompiledFxGraph

EXAMPLES = {"import": 100, "pure": 200}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    scratch = tmp_path_factory.mktemp("fuzz_inputs")
    store = Store.create(scratch / "populated.db", scratch)
    yield store
    lost = store.lost()
    figures.add("fuzz_importer", entries_lost=lost, populated_entries_checked=len(store.guarded) + len(store.best_configs)
                + len(store.timings) + len(store.values))
    store.db.close()
    assert lost == 0, f"{lost} populated entries lost or changed by the fuzzing"


from .test_known_bugs import FIXED


def hostile_param(reason: str, *raises: type[BaseException]):
    ids = set(re.findall(r"\b([A-Z]\d(?:-[A-Z]\d)?)\b", reason))
    if ids and ids <= FIXED:  # every bug it names is fixed: hostile input must pass
        return pytest.param(True, id="hostile")
    return pytest.param(True, id="hostile", marks=pytest.mark.xfail(strict=True, raises=raises, reason=reason))


CLEAN = pytest.param(False, id="clean")


class _Counter:
    def __init__(self) -> None:
        self.n = 0
        self.refused = 0


def _companion(store: Store, counter: _Counter) -> tuple[str, bytes]:
    """A valid best config imported alongside each fuzzed file: the rest must import."""
    key = f"zz/czz{store.imports:06d}.best_config"
    return key, json.dumps({"XBLOCK": 64, "num_warps": 4, "n": store.imports}).encode()


def _fuzz_import(store: Store, counter: _Counter, rel: str, data: bytes) -> None:
    key, content = _companion(store, counter)

    def check(report) -> None:
        with store.db.read() as repos:
            assert repos.best_configs.get(key) == content.decode(), "a bad file stopped the rest of the import"
        counter.refused += bool(report.problems)

    counter.n += 1
    report = store.import_files({rel: data, key: content}, check)
    if report is None:
        counter.refused += 1


# --------------------------------------------------------------------------- best configs


@pytest.mark.parametrize("hostile", [CLEAN, hostile_param(
    "B1 RecursionError (deep JSON), B2 OverflowError (int > int64), B3 UnicodeEncodeError (lone surrogate): "
    "cachedb.repositories.best_configs.extract_columns / BestConfigRepository.put",
    RecursionError, OverflowError, UnicodeEncodeError)])
def test_fuzz_best_config(store: Store, hostile: bool) -> None:
    counter = _Counter()

    @S.fuzz_settings(EXAMPLES["import"], hostile=hostile)
    @given(data=S.best_config_bytes(hostile))
    @example(data=b"[" * 5000).via("B1") if hostile else (lambda f: f)
    @example(data=b'{"num_warps": 99999999999999999999}').via("B2") if hostile else (lambda f: f)
    def run(data: bytes) -> None:
        if not hostile:
            assume(S.best_config_bug(data) is None)
        _fuzz_import(store, counter, "fz/cfz.best_config", data)

    run()
    figures.add("fuzz_importer", fuzz_cases=counter.n, refused_as_bad_input=counter.refused)


# --------------------------------------------------------------------------- cache/<system hash>


@pytest.mark.parametrize("hostile", [CLEAN, hostile_param(
    "D1 RecursionError (deep JSON) in _local_cache_doc.parse; D2 AttributeError in Fingerprint.device_name "
    "for a non-object system.device; D3 InterfaceError for a non-string device name; D4 ValueError "
    "(hint override > 4300 digits) in keys.split_inputs_key; D5 OverflowError (hint override > int64); "
    "D6 UnicodeEncodeError (lone surrogate in an op / inputs / choice / namespace)",
    RecursionError, AttributeError, ValueError, OverflowError, UnicodeEncodeError, ProgrammingError)])
def test_fuzz_local_cache_doc(store: Store, hostile: bool) -> None:
    counter = _Counter()
    h = "e" * 64

    @S.fuzz_settings(EXAMPLES["import"], hostile=hostile)
    @given(doc=S.local_cache_doc(hostile))
    @example(doc=(h, json.dumps({"system": {"hash": h, "device": "cpu"}, "cache": {}}).encode())).via("D2") \
        if hostile else (lambda f: f)
    def run(doc: tuple[str, bytes]) -> None:
        system_hash, data = doc
        if not hostile:
            assume(S.local_cache_bug(data) is None)
        _fuzz_import(store, counter, f"cache/{system_hash}", data)

    run()
    figures.add("fuzz_importer", fuzz_cases=counter.n, refused_as_bad_input=counter.refused)


# --------------------------------------------------------------------------- pickles


@pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning")  # pickletools on STRING args
def test_fuzz_pickle_scan_raises_only_pickle_scan_error() -> None:
    """read_entry_fields never executes, never hangs, and only ever raises PickleScanError."""
    counter = _Counter()

    @S.fuzz_settings(EXAMPLES["pure"])
    @given(data=S.pickle_bytes(hostile=True))
    def run(data: bytes) -> None:
        counter.n += 1
        try:
            fields = read_entry_fields(data, where="fuzz")
        except PickleScanError as exc:
            counter.refused += 1
            assert exc.where == "fuzz"
            return
        assert fields.guards_expr is None or isinstance(fields.guards_expr, str)
        assert fields.time_taken_ns is None or isinstance(fields.time_taken_ns, int)

    run()
    figures.add("fuzz_pickle_scan", fuzz_cases=counter.n, refused_as_bad_input=counter.refused)


@pytest.mark.parametrize("hostile", [CLEAN, hostile_param(
    "P1 OverflowError (time taken > int64), P2 UnicodeEncodeError (lone surrogate in guards_expr or in the "
    "class name written to guards_note): cachedb.repositories.guarded.GuardedEntryRepository.put via Importer",
    OverflowError, UnicodeEncodeError)])
def test_fuzz_pickle_import(store: Store, hostile: bool) -> None:
    counter = _Counter()
    big = CompiledFxGraph()
    big.__dict__.update(guards_expr=None, _time_taken_ns=2**64)

    @S.fuzz_settings(EXAMPLES["import"], hostile=hostile)
    @given(data=S.pickle_bytes(hostile), kind=st.sampled_from(["fxgraph", "aotautograd"]))
    @example(data=pickle.dumps(big), kind="fxgraph").via("P1") if hostile else (lambda f: f)
    def run(data: bytes, kind: str) -> None:
        if not hostile:
            assume(S.pickle_bug(data) is None)
        variant = sha256_hash(data)
        key = ("f" if kind == "fxgraph" else "a") + sha256_hash(b"fuzz" + data)
        rel = f"fxgraph/{key[1:3]}/{key}/{variant}" if kind == "fxgraph" else f"aotautograd/{key}/{variant}"
        _fuzz_import(store, counter, rel, data)
        with store.db.read() as repos:
            stored = repos.guarded.candidates(kind, key)
        assert stored in ([], [(variant, data)]), "a stored pickle differs from its file"

    run()
    figures.add("fuzz_importer", fuzz_cases=counter.n, refused_as_bad_input=counter.refused)


# --------------------------------------------------------------------------- CUTLASS op lists


def test_fuzz_cutlass_parse_raises_only_op_list_error() -> None:
    counter = _Counter()

    @S.fuzz_settings(EXAMPLES["pure"] * 3 // 4)
    @given(data=S.cutlass_bytes(hostile=True))
    def run(data: bytes) -> None:
        counter.n += 1
        try:
            rows = parse_op_list(data, where="configs_fuzz.json")
        except CutlassOpListError as exc:
            counter.refused += 1
            assert exc.where == "configs_fuzz.json"
            return
        assert [r.position for r in rows] == list(range(len(rows)))

    run()
    figures.add("fuzz_cutlass_parse", fuzz_cases=counter.n, refused_as_bad_input=counter.refused)


@pytest.mark.parametrize("hostile", [CLEAN, hostile_param(
    "C1 OverflowError (arch / alignment / stages > int64), C2 UnicodeEncodeError (lone surrogate in an enum "
    "name): cachedb.repositories.cutlass.CutlassOpListRepository.put via Importer",
    OverflowError, UnicodeEncodeError)])
def test_fuzz_cutlass_import(store: Store, hostile: bool) -> None:
    counter = _Counter()

    @S.fuzz_settings(EXAMPLES["import"] // 2, hostile=hostile)
    @given(data=S.cutlass_bytes(hostile))
    def run(data: bytes) -> None:
        if not hostile:
            assume(S.cutlass_bug(data) is None)
        request_key = sha256_hash(data)[:8]
        _fuzz_import(store, counter, f"configs_{request_key}.json", data)
        with store.db.read() as repos:
            stored = repos.cutlass.get(request_key)
        assert stored in (None, data)

    run()
    figures.add("fuzz_importer", fuzz_cases=counter.n, refused_as_bad_input=counter.refused)


# --------------------------------------------------------------------------- directory layout

_COMPONENTS = st.one_of(
    st.sampled_from(["fxgraph", "aotautograd", "cache", "ab", "fab", "aab", "f", "a", "configs_1.json",
                     "x.best_config", "configs_.json", ".hidden", "0" * 64, "e" * 63, "lock"]),
    st.text("abcdef0123456789_.-", min_size=1, max_size=12).filter(lambda s: s not in (".", "..")),
)


@pytest.mark.parametrize("hostile", [CLEAN, hostile_param(
    "B4 UnicodeEncodeError: a file name that is not UTF-8 (os.walk gives surrogate escapes) is stored as a "
    "key: cachedb.layout.importer.Importer._import_one", UnicodeEncodeError)])
def test_fuzz_cache_dir_layout(store: Store, hostile: bool) -> None:
    """Random trees of names Inductor uses (and others), with random or valid contents."""
    counter = _Counter()
    names = _COMPONENTS if not hostile else st.one_of(
        _COMPONENTS, st.binary(min_size=1, max_size=6).filter(lambda b: b"/" not in b and b"\x00" not in b
                                                             and b not in (b".", b".."))
        .map(lambda b: b.decode("utf-8", "surrogateescape")))
    contents = st.one_of(st.binary(max_size=32), st.just(json.dumps({"XBLOCK": 1}).encode()),
                         st.just(pickle.dumps(CompiledFxGraph())))

    @S.fuzz_settings(EXAMPLES["import"] // 2, hostile=hostile)
    @given(files=st.dictionaries(st.lists(names, min_size=1, max_size=4).map("/".join), contents, max_size=5))
    @example(files={"\udcff.best_config": b"{}"}).via("B4") if hostile else (lambda f: f)
    def run(files: dict[str, bytes]) -> None:
        # A path that is both a file and a directory of another entry cannot exist.
        paths = sorted(files)
        assume(not any(b.startswith(a + "/") for a in paths for b in paths))
        counter.n += 1
        report = store.import_files({k: v for k, v in files.items()})
        counter.refused += report is None or bool(report.problems)

    run()
    figures.add("fuzz_importer", fuzz_cases=counter.n, refused_as_bad_input=counter.refused)


def test_bad_input_errors_name_their_file() -> None:
    """The refusals the fuzzing counts are BadInputError subclasses naming the input."""
    with pytest.raises(BadInputError) as info:
        parse_op_list(b"[1]", where="configs_x.json")
    assert info.value.where == "configs_x.json" and isinstance(info.value, CacheDBError)
