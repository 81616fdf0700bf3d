"""cachedb.formats.own_pickle: the C unpickler over inert stand-ins gives exactly what the opcode walk
(cachedb.formats.pickle_scan) gives, on real torch entries and on every generated pickle, and never
imports or calls anything the pickle names."""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cachedb._errors import PickleScanError
from cachedb.formats.own_pickle import read_own_entry_fields
from cachedb.formats.pickle_scan import read_entry_fields

from .test_pickle_scan import (
    PROTOCOLS,
    FakeAOTAutogradResult,
    FakeCompiledFxGraph,
    Plain,
    _guards,
    _real_entry_files,
    _times,
    _values,
)


def _outcome(read: Any, data: bytes) -> Any:
    try:
        return read(data)
    except PickleScanError as exc:
        return ("PickleScanError", exc.reason)


def test_real_entries_read_as_the_opcode_walk_reads_them(real_cache: tuple[Path, dict]) -> None:
    cache_dir, _ = real_cache
    entries = _real_entry_files(cache_dir)
    assert entries
    for _kind, path in entries:
        data = path.read_bytes()
        own = read_own_entry_fields(data)
        assert own == read_entry_fields(data), path
        assert own.guards_known and own.time_taken_ns is not None and own.reason is None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    guards=_guards, fw=_times, bw=_times, nested=_values, nested_guards=_guards,
    protocol=st.sampled_from(PROTOCOLS), aot=st.booleans(), slots=st.booleans(),
)  # fmt: skip
def test_entries_read_as_the_opcode_walk_reads_them(
    guards: str | None, fw: int, bw: int, nested: Any, nested_guards: str | None, protocol: int, aot: bool,
    slots: bool,
) -> None:
    inner = FakeCompiledFxGraph(guards_expr=nested_guards, payload=nested, _time_taken_ns=fw + 1)
    entry: Any = (
        FakeAOTAutogradResult(inner, nested, guards, fw, bw, extra=inner) if aot
        else FakeCompiledFxGraph(guards_expr=guards, payload=[nested, inner], _time_taken_ns=fw)
    )  # fmt: skip
    data = pickle.dumps(entry, protocol=protocol)
    assert read_own_entry_fields(data) == read_entry_fields(data)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=_values, protocol=st.sampled_from(PROTOCOLS))
def test_other_values_read_as_the_opcode_walk_reads_them(value: Any, protocol: int) -> None:
    data = pickle.dumps(Plain(value, FakeCompiledFxGraph("g", _time_taken_ns=1)), protocol=protocol)
    assert read_own_entry_fields(data) == read_entry_fields(data)
    data = pickle.dumps(value, protocol=protocol)
    assert read_own_entry_fields(data) == read_entry_fields(data)


@pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), value=_values, protocol=st.sampled_from(PROTOCOLS))
def test_damaged_entries_give_what_the_opcode_walk_gives(data: st.DataObject, value: Any, protocol: int) -> None:
    raw = bytearray(pickle.dumps(FakeCompiledFxGraph("L['x'].size()[0] <= 8", payload=value, _time_taken_ns=7),
                                 protocol=protocol))
    how = data.draw(st.sampled_from(["cut", "flip", "splice"]))
    if how == "cut":
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    elif how == "flip":
        for _ in range(data.draw(st.integers(1, 4))):
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    else:
        i = data.draw(st.integers(0, len(raw)))
        raw[i:i] = data.draw(st.binary(min_size=1, max_size=16))
    assert _outcome(read_own_entry_fields, bytes(raw)) == _outcome(read_entry_fields, bytes(raw))


@pytest.mark.parametrize("inserted", [b"\xc2\x80", b"\\x41"])
def test_a_global_name_the_opcode_walk_decodes_otherwise(inserted: bytes) -> None:
    """Protocol 0's GLOBAL names its module and class on text lines: the C unpickler reads them
    as UTF-8, the opcode walk as pickletools does (escapes undone, then ASCII), so bytes spliced
    into the module's name (a non-ASCII character; an escape) give the opcode walk's outcome."""
    raw = bytearray(pickle.dumps(FakeCompiledFxGraph("L['x'].size()[0] <= 8", payload=None, _time_taken_ns=7),
                                 protocol=0))
    assert raw[:1] == b"c"  # GLOBAL: "c<module>\n<name>\n"
    raw[1:1] = inserted
    assert _outcome(read_own_entry_fields, bytes(raw)) == _outcome(read_entry_fields, bytes(raw))


class _Boom:
    """Unpickling this runs ``os.system`` (a REDUCE of a real function)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


def test_nothing_the_pickle_names_is_imported_or_called(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    entry = FakeCompiledFxGraph("s0 > 1", payload=_Boom(marker), _time_taken_ns=5)
    fields = read_own_entry_fields(pickle.dumps(entry))  # names posix.system, REDUCEs it
    assert fields.guards_expr == "s0 > 1" and fields.time_taken_ns == 5
    assert not marker.exists()
    module = FakeCompiledFxGraph.__module__.encode()
    absent = b"x" * len(module)  # same length: the pickle stays well-formed
    data = pickle.dumps(entry).replace(module, absent)
    assert absent in data
    fields = read_own_entry_fields(data)
    assert fields.guards_expr == "s0 > 1" and fields.time_taken_ns == 5
    assert not marker.exists()
    assert absent.decode() not in sys.modules
    with pytest.raises(ModuleNotFoundError):  # the real unpickler would import it
        pickle.loads(data)
