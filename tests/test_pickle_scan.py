"""cachedb.formats.pickle_scan: fields of pickled FX graph / AOTAutograd entries, read without unpickling.

The scanner itself never unpickles. These tests do (``pickle.loads``), but only on data they
built themselves: real entries torch just wrote, and pickles of the dataclasses below.
"""

from __future__ import annotations

import dataclasses
import pickle
import random
import re
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cachedb.formats.pickle_scan as pickle_scan
from cachedb._errors import PickleScanError
from cachedb.formats.pickle_scan import EntryFields, read_entry_fields

PROTOCOLS = list(range(pickle.HIGHEST_PROTOCOL + 1))


# --------------------------------------------------------------------------- look-alike entries


@dataclasses.dataclass
class FakeCompiledFxGraph:
    """Shaped like torch's CompiledFxGraph: guards_expr and _time_taken_ns in its __dict__."""

    guards_expr: Any
    source_code: str = "def call(args): pass\n"
    payload: Any = None
    _time_taken_ns: Any = None


@dataclasses.dataclass
class FakeCompiledForward:
    fx_graph_cache_info: tuple[str, list[str]]
    fx_graph_guard_expr: Any = None


@dataclasses.dataclass
class FakeAOTAutogradResult:
    """Shaped like AOTAutogradResult / BundledAOTAutogradResult (which nests whole graphs)."""

    compiled_fw: Any
    compiled_bw: Any
    guards_expr: Any
    forward_time_taken_ns: Any
    backward_time_taken_ns: Any
    extra: Any = None


@dataclasses.dataclass
class Plain:
    a: Any = None
    b: Any = None


def _nested_graph(expr: str, ns: int) -> FakeCompiledFxGraph:
    return FakeCompiledFxGraph(guards_expr=expr, _time_taken_ns=ns, payload=b"\x00" * 300)


def _scan(obj: object, protocol: int) -> EntryFields:
    return read_entry_fields(pickle.dumps(obj, protocol=protocol), where="t")


def _expected_time(entry: Any) -> int:
    if hasattr(entry, "forward_time_taken_ns"):
        return entry.forward_time_taken_ns + entry.backward_time_taken_ns
    return entry._time_taken_ns


# --------------------------------------------------------------------------- real entries


def _real_entry_files(cache_dir: Path) -> list[tuple[str, Path]]:
    out = [("fxgraph", p) for p in sorted((cache_dir / "fxgraph").glob("*/*/*")) if p.is_file()]
    out += [("aotautograd", p) for p in sorted((cache_dir / "aotautograd").glob("*/*")) if p.is_file()]
    return [(kind, p) for kind, p in out if not p.name.startswith(".")]


@pytest.mark.slow
@pytest.mark.torch
def test_real_entries_match_unpickled_truth(real_cache: tuple[Path, dict]) -> None:
    cache_dir, summary = real_cache
    files = _real_entry_files(cache_dir)
    kinds = {kind for kind, _ in files}
    assert kinds == {"fxgraph", "aotautograd"}, files
    assert summary["files_total_count"]["fxgraph"] == sum(k == "fxgraph" for k, _ in files)
    assert summary["files_total_count"]["aotautograd"] == sum(k == "aotautograd" for k, _ in files)

    guarded = 0
    variants: dict[tuple[str, str], set[str | None]] = {}
    for kind, path in files:
        data = path.read_bytes()
        fields = read_entry_fields(data, where=str(path))
        truth = pickle.loads(data)  # trusted: torch wrote it a moment ago, in this test
        assert fields.guards_known, (path, fields)
        assert fields.reason is None, (path, fields)
        assert fields.guards_expr == truth.guards_expr, path
        assert fields.time_taken_ns == _expected_time(truth), path
        assert fields.time_taken_ns is not None and fields.time_taken_ns > 0
        guarded += truth.guards_expr is not None
        variants.setdefault((kind, path.parent.name), set()).add(truth.guards_expr)
    assert guarded > 0, "the dynamic-shape workload must write entries with guards"
    # The branch on x.size(0) <= 4096 gives one FX key and one AOT key two guarded variants.
    for kind in ("fxgraph", "aotautograd"):
        assert any(
            len(exprs) >= 2 and None not in exprs for (k, _), exprs in variants.items() if k == kind
        ), variants


@pytest.mark.slow
@pytest.mark.torch
def test_real_entries_truncated_raise(real_cache: tuple[Path, dict]) -> None:
    cache_dir, _ = real_cache
    for _kind, path in _real_entry_files(cache_dir)[:4]:
        data = path.read_bytes()
        n = len(data)
        for cut in sorted({0, 1, 2, 3, 11, 64, 200, n // 3, n // 2, (2 * n) // 3, n - 2, n - 1}):
            with pytest.raises(PickleScanError) as info:
                read_entry_fields(data[:cut], where=path.name)
            assert info.value.where == path.name and info.value.reason


@pytest.mark.slow
@pytest.mark.torch
def test_builder_summary_shape(real_cache: tuple[Path, dict]) -> None:
    cache_dir, summary = real_cache
    counters = summary["counters"]
    assert counters.get("fxgraph_cache_miss", 0) + counters.get("fxgraph_cache_hit", 0) > 0
    assert counters.get("autograd_cache_miss", 0) + counters.get("autograd_cache_hit", 0) > 0
    assert all(r.get("ok") for r in summary["workloads"].values()), summary["workloads"]
    best = cache_dir / summary["workloads"]["best_config"]["best_config"]
    kernel_py = cache_dir / summary["workloads"]["best_config"]["kernel_py"]
    # The best config lands next to the kernel's module: <cache_dir>/<k[1:3]>/<hash>.best_config
    assert best.is_file() and best.suffix == ".best_config" and best.parent == kernel_py.parent
    assert list((cache_dir / "cache").iterdir())


# --------------------------------------------------------------------------- synthetic entries


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_fx_like_entry(protocol: int) -> None:
    entry = FakeCompiledFxGraph(guards_expr="2 <= L['t0'] and L['t0'] <= 4096", _time_taken_ns=123_456_789)
    assert _scan(entry, protocol) == EntryFields("2 <= L['t0'] and L['t0'] <= 4096", True, 123_456_789, None)
    entry = FakeCompiledFxGraph(guards_expr=None, _time_taken_ns=2**70)  # LONG1 / LONG
    assert _scan(entry, protocol) == EntryFields(None, True, 2**70, None)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_nested_fields_are_not_confused_with_the_top_level(protocol: int) -> None:
    # Nested graphs come before AND after the top-level fields in the stream, and are shared
    # through the memo; only the top-level object's own state counts.
    inner = _nested_graph("2 <= L['t0']", 7)
    entry = FakeAOTAutogradResult(
        compiled_fw=inner,
        compiled_bw=FakeCompiledForward(("fkey", ["line"]), fx_graph_guard_expr="3 <= L['t1']"),
        guards_expr=None,
        forward_time_taken_ns=1_000,
        backward_time_taken_ns=2_000,
        extra=[inner, _nested_graph("L['t0'] <= 8", 9), {"guards_expr": "dict value"}],
    )
    assert _scan(entry, protocol) == EntryFields(None, True, 3_000, None)

    outer_fx = FakeCompiledFxGraph(guards_expr="4097 <= L['t0']", payload=[inner, inner], _time_taken_ns=11)
    assert _scan(outer_fx, protocol) == EntryFields("4097 <= L['t0']", True, 11, None)


def test_self_reference_and_shared_state() -> None:
    entry = FakeCompiledFxGraph(guards_expr="2 <= L['t0']", _time_taken_ns=5)
    entry.payload = [entry, {"me": entry}]
    for protocol in PROTOCOLS:
        assert _scan(entry, protocol) == EntryFields("2 <= L['t0']", True, 5, None)


def test_unreadable_fields_give_a_reason() -> None:
    fields = _scan(FakeCompiledFxGraph(guards_expr=42, _time_taken_ns=None), 4)
    assert not fields.guards_known and fields.guards_expr is None and fields.time_taken_ns is None
    assert "guards_expr" in (fields.reason or "") and "_time_taken_ns" in (fields.reason or "")

    fields = _scan(FakeAOTAutogradResult(None, None, "x", 1, None), 4)
    assert fields.guards_known and fields.guards_expr == "x" and fields.time_taken_ns is None
    assert "backward_time_taken_ns" in (fields.reason or "")

    for value in ({"guards_expr": "x", "_time_taken_ns": 1}, ["guards_expr"], 7, "s", None):
        fields = _scan(value, 4)
        assert not fields.guards_known and fields.reason, value

    fields = _scan(Plain(a=1), 4)
    assert not fields.guards_known and "guards_expr" in (fields.reason or "")


@pytest.mark.slow
@pytest.mark.torch
def test_real_entries_cut_at_every_opcode_raise_truncated(real_cache: tuple[Path, dict]) -> None:
    # The hot loop has no bounds checks: Python's IndexError at the end of the data is turned
    # into the error. Cut a real FX and a real AOT entry before every opcode and inside every
    # argument (e.g. between a string and the MEMOIZE read together with it).
    import pickletools

    cache_dir, _ = real_cache
    files = _real_entry_files(cache_dir)
    for kind in ("fxgraph", "aotautograd"):
        path = next(p for k, p in files if k == kind)
        data = path.read_bytes()
        cuts = set()
        for _op, _arg, pos in pickletools.genops(data):
            cuts.update((pos, pos + 1, pos + 2))
        for cut in sorted(c for c in cuts if 0 < c < len(data)):
            with pytest.raises(PickleScanError) as info:
                read_entry_fields(data[:cut], where=path.name)
            assert info.value.where == path.name
            assert "truncated" in info.value.reason or "ended before STOP" in info.value.reason, (cut, info.value)


@pytest.mark.parametrize(
    "bad, reason",
    [
        (b"\x80\x04\x94.", "stack underflow"),  # MEMOIZE on an empty stack
        (b"\x80\x04.", "stack underflow"),  # STOP on an empty stack
        (b"\x80\x04N\x85\x85\x86.", "stack underflow"),  # TUPLE2 with one item
        (b"\x80\x04N\x94", "ended before STOP"),
        (b"\x80\x04\x8c", "truncated"),  # SHORT_BINUNICODE without its length
        (b"\x80\x04\x8c\x05ab", "truncated"),  # ... without all of its string
        (b"\x80\x04\x8c\x02ab", "ended before STOP"),  # a whole string, then nothing
        (b"\x80", "truncated"),  # PROTO without its version
        (b"\x80\x04K", "truncated"),  # BININT1 without its byte
        (b"\x80\x04N\x94h", "truncated"),  # BINGET without its index
        (b"\x80\x04Nq", "truncated"),  # BINPUT without its index
        (b"\x80\x04h\x00.", "never stored"),
        (b"\x80\x04\x8c\x02\xff\xfe\x94.", "malformed"),  # not UTF-8
    ],
)
def test_broken_pickles_raise_with_the_reason(bad: bytes, reason: str) -> None:
    with pytest.raises(PickleScanError) as info:
        read_entry_fields(bad, where="w")
    assert reason in info.value.reason, info.value


def test_strings_and_their_memo_slots_read_exactly() -> None:
    # SHORT_BINUNICODE reads the MEMOIZE after it at once: the memo indexes must stay those of
    # the unpickler when strings are memoized, repeated (BINGET) and mixed with BINPUT.
    for protocol in PROTOCOLS:
        shared = "2 <= L['t0']"
        entry = FakeCompiledFxGraph(guards_expr=shared, payload=[shared, "x", "x", {shared: shared}], _time_taken_ns=5)
        assert _scan(entry, protocol) == EntryFields(shared, True, 5, None)
    # A BINPUT to a slot ahead of len(memo): the MEMOIZEs after it overwrite that slot (the
    # unpickler memoizes at len(memo)), so BINGET 4 reads the last string memoized there.
    def string(text: str) -> bytes:
        return b"\x8c" + bytes([len(text)]) + text.encode()

    data = (
        b"\x80\x04" + string(__name__) + b"\x94" + string("Plain") + b"\x94\x93)\x81}("
        + string("x") + b"\x94" + string("a<b") + b"q\x04"  # memo slots 0, 1, 2 and 4
        + string("_time_taken_ns") + b"\x94" + b"K\x03"  # MEMOIZE: slot len(memo) = 4
        + string("guards_expr") + b"\x94" + b"h\x04"  # slot 4 again; BINGET 4
        + b"ub."
    )
    truth = pickle.loads(data)  # built here: Plain from this module
    assert truth.guards_expr == "guards_expr" and truth.x == "a<b"
    assert read_entry_fields(data) == EntryFields("guards_expr", True, 3, None)


@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        b"garbage",
        b"\x00" * 16,
        b"\xff\xfe\xfd",
        b"\x80\x09N.",  # unknown protocol
        b"(.",  # STOP on an empty stack (only a mark)
        b".",  # STOP on an empty stack
        b"\x80\x04h\x05.",  # BINGET of a memo slot never stored
        b"\x80\x04N\x94u.",  # SETITEMS without a MARK
        b"\x80\x04(N\x94}u.",  # MARK, items, EMPTY_DICT, SETITEMS: odd number of items
        b"\x80\x04\x8c\x05abc",  # short string, then the data ends
        bytes(random.Random(0).randrange(256) for _ in range(4096)),
        b"{\"XBLOCK\": 512}",  # a best_config's JSON
    ],
)
def test_garbage_raises(garbage: bytes) -> None:
    with pytest.raises(PickleScanError) as info:
        read_entry_fields(garbage, where="somewhere/key/variant")
    assert info.value.where == "somewhere/key/variant"
    assert str(info.value).startswith("somewhere/key/variant: ")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_prefix_of_a_pickle_raises(protocol: int) -> None:
    entry = FakeAOTAutogradResult(
        compiled_fw=_nested_graph("2 <= L['t0']", 7), compiled_bw=None,
        guards_expr="2 <= L['t0']", forward_time_taken_ns=3, backward_time_taken_ns=4,
        extra={"k": (1.5, b"bytes", bytearray(b"ba"), frozenset({1}), {2}, "é")},
    )  # fmt: skip
    data = pickle.dumps(entry, protocol=protocol)
    assert read_entry_fields(data) == EntryFields("2 <= L['t0']", True, 7, None)
    for cut in range(len(data)):
        with pytest.raises(PickleScanError):
            read_entry_fields(data[:cut])


def test_trailing_bytes_after_stop_are_ignored_like_pickle() -> None:
    data = pickle.dumps(FakeCompiledFxGraph(guards_expr=None, _time_taken_ns=1), protocol=4)
    assert read_entry_fields(data + b"\x00junk") == EntryFields(None, True, 1, None)


def test_hostile_keys_are_never_hashed() -> None:
    # x = (x, x) sixty times: hashing it would take 2**60 steps.
    bomb = b"\x80\x04}N" + b"2\x86" * 60 + b"Ns."
    start = time.perf_counter()
    fields = read_entry_fields(bomb)
    assert time.perf_counter() - start < 5
    assert not fields.guards_known


def test_large_payload_is_fast() -> None:
    # GPU entries: tens of MB, most of it in a few bytes objects (cubins in _triton_bundle).
    entry = FakeCompiledFxGraph(
        guards_expr="2 <= L['t0']",
        payload={"cubins": [bytes(8_000_000) for _ in range(5)], "names": [f"k{i}" for i in range(20_000)]},
        _time_taken_ns=99,
    )
    data = pickle.dumps(entry, protocol=4)
    assert len(data) > 40_000_000
    start = time.perf_counter()
    assert read_entry_fields(data) == EntryFields("2 <= L['t0']", True, 99, None)
    assert time.perf_counter() - start < 5


def test_accepts_bytes_like_and_rejects_other_types() -> None:
    data = pickle.dumps(FakeCompiledFxGraph(guards_expr=None, _time_taken_ns=3))
    assert read_entry_fields(bytearray(data)) == read_entry_fields(memoryview(data))
    with pytest.raises(PickleScanError):
        read_entry_fields("not bytes")  # type: ignore[arg-type]


def test_the_scanner_never_unpickles() -> None:
    source = Path(pickle_scan.__file__).read_text()
    code = "\n".join(line.split("#", 1)[0] for line in source.splitlines())
    assert not re.search(r"\bimport pickle\b|\bpickle\.|Unpickler|\bloads\(|__import__|importlib", code)


# --------------------------------------------------------------------------- property tests

_leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True)
    | st.text(max_size=20)
    | st.binary(max_size=40)
    | st.builds(bytearray, st.binary(max_size=10))
)
_hashables = st.none() | st.booleans() | st.integers() | st.text(max_size=10) | st.binary(max_size=10)


def _extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return (
        st.lists(children, max_size=5)
        | st.tuples(children)
        | st.tuples(children, children, children, children)
        | st.dictionaries(_hashables | st.tuples(_hashables, _hashables), children, max_size=5)
        | st.frozensets(_hashables, max_size=4)
        | st.sets(_hashables, max_size=4)
        | st.builds(Plain, children, children)
        | st.builds(FakeCompiledForward, st.tuples(st.text(max_size=8), st.lists(st.text(max_size=5))), children)
    )


_values = st.recursive(_leaves, _extend, max_leaves=25)
_guards = st.none() | st.text(max_size=60)
_times = st.integers(min_value=0, max_value=2**80)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=_values, protocol=st.sampled_from(PROTOCOLS))
def test_any_wellformed_pickle_is_scanned_without_error(value: Any, protocol: int) -> None:
    fields = read_entry_fields(pickle.dumps(value, protocol=protocol))
    assert isinstance(fields, EntryFields)
    assert not fields.guards_known and fields.reason  # none of these is an entry


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    guards=_guards, fw=_times, bw=_times, nested=_values, nested_guards=_guards,
    protocol=st.sampled_from(PROTOCOLS), aot=st.booleans(),
)  # fmt: skip
def test_entries_with_random_content_read_exactly(
    guards: str | None, fw: int, bw: int, nested: Any, nested_guards: str | None, protocol: int, aot: bool
) -> None:
    inner = FakeCompiledFxGraph(guards_expr=nested_guards, payload=nested, _time_taken_ns=fw + 1)
    entry: Any
    if aot:
        entry = FakeAOTAutogradResult(inner, nested, guards, fw, bw, extra=inner)
        expected = EntryFields(guards, True, fw + bw, None)
    else:
        entry = FakeCompiledFxGraph(guards_expr=guards, payload=[nested, inner], _time_taken_ns=fw)
        expected = EntryFields(guards, True, fw, None)
    assert read_entry_fields(pickle.dumps(entry, protocol=protocol)) == expected


# pickletools (like pickle) decodes a protocol-0 STRING with a bad escape, with a warning.
@pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), value=_values, protocol=st.sampled_from(PROTOCOLS))
def test_damaged_pickles_raise_only_pickle_scan_error(data: st.DataObject, value: Any, protocol: int) -> None:
    raw = bytearray(pickle.dumps(Plain(value, FakeCompiledFxGraph("g", _time_taken_ns=1)), protocol=protocol))
    how = data.draw(st.sampled_from(["cut", "flip", "splice"]))
    if how == "cut":
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    elif how == "flip":
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] = data.draw(st.integers(0, 255))
    else:
        i = data.draw(st.integers(0, len(raw)))
        raw[i:i] = data.draw(st.binary(min_size=1, max_size=16))
    try:
        fields = read_entry_fields(bytes(raw))
    except PickleScanError as exc:
        assert exc.reason
    else:
        assert isinstance(fields, EntryFields)
        if how == "cut":
            pytest.fail("a truncated pickle must not scan")


@pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning")
@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=300))
def test_random_bytes_raise_only_pickle_scan_error(raw: bytes) -> None:
    try:
        fields = read_entry_fields(raw)
    except PickleScanError:
        return
    assert isinstance(fields, EntryFields)
