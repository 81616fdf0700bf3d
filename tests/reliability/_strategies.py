"""Hypothesis strategies for every input cachedb reads, and the predicates of the known bugs.

Every strategy takes ``hostile``: ``False`` generates everything except the inputs that trigger
a known, reported bug (see ``test_known_bugs.py``); ``True`` generates those too. The clean fuzz
tests also filter with :func:`known_bug` so that a mutation that happens to produce such an
input is not counted against them; the hostile variants are ``xfail(strict=True)`` until the
bugs are fixed.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import pickletools
import struct
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from cachedb.formats import local_cache_doc as doc
from cachedb.formats.pickle_scan import read_entry_fields
from cachedb.formats.cutlass_ops import parse_op_list

from ._synth import AOTAutogradResult, CompiledFxGraph

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def fuzz_settings(max_examples: int, *, hostile: bool = False) -> settings:
    """Deterministic (derandomize), no deadline, bounded; hostile runs stop at the first failure."""
    return settings(
        max_examples=max_examples,
        derandomize=True,
        deadline=None,
        database=None,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=not hostile,
        phases=(Phase.explicit, Phase.generate) if hostile else (Phase.explicit, Phase.generate, Phase.shrink),
    )


# --------------------------------------------------------------------------- text, numbers, JSON


def texts(hostile: bool, max_size: int = 16, *, brackets: bool = True) -> st.SearchStrategy[str]:
    """Any text; lone surrogates (which JSON escapes and pickles can carry) only when hostile."""
    chars = st.characters(blacklist_categories=() if hostile else ("Cs",),
                          blacklist_characters="" if brackets else "[")
    base = st.text(chars, max_size=max_size)
    if hostile:
        return st.one_of(base, st.sampled_from(["\ud800", "a\udcff", "\udfff\ud800"]))
    return base


def ints(hostile: bool) -> st.SearchStrategy[int]:
    small = st.one_of(st.integers(-(2**31), 2**31), st.sampled_from([0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 1024]))
    if not hostile:
        return st.one_of(small, st.integers(INT64_MIN, INT64_MAX))
    return st.one_of(small, st.integers(), st.integers(INT64_MAX + 1, 2**200), st.integers(-(2**200), INT64_MIN - 1))


def json_values(hostile: bool, max_leaves: int = 12) -> st.SearchStrategy[Any]:
    scalars = st.one_of(st.none(), st.booleans(), ints(hostile), st.floats(), texts(hostile))
    return st.recursive(
        scalars,
        lambda children: st.one_of(
            st.lists(children, max_size=4), st.dictionaries(texts(hostile, 8), children, max_size=4)
        ),
        max_leaves=max_leaves,
    )


def dumps(draw: st.DrawFn, value: Any) -> bytes:
    """``value`` as JSON bytes in a drawn style (indent, ASCII or not, encoding)."""
    text = json.dumps(value, indent=draw(st.sampled_from([None, 4, 2])), ensure_ascii=draw(st.booleans()))
    return text.encode("utf-8", "surrogatepass")


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` with a few random edits: bit flips, truncation, insertions, deletions."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        edit = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "duplicate", "byte"]))
        pos = draw(st.integers(0, len(buf))) if buf else 0
        if edit == "flip" and buf:
            pos = min(pos, len(buf) - 1)
            buf[pos] ^= 1 << draw(st.integers(0, 7))
        elif edit == "truncate":
            del buf[pos:]
        elif edit == "insert":
            buf[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif edit == "delete":
            del buf[pos:pos + draw(st.integers(1, 8))]
        elif edit == "duplicate":
            buf[pos:pos] = buf[pos:pos + draw(st.integers(1, 32))]
        elif edit == "byte" and buf:
            buf[min(pos, len(buf) - 1)] = draw(st.sampled_from(b'{}[]",:0\\\x00\xff'))
    return bytes(buf)


def _deep(n: int, opener: str, closed: bool) -> bytes:
    if opener == "[":
        return ("[" * n + ("1" + "]" * n if closed else "")).encode()
    return ('{"a": ' * n + ("1" + "}" * n if closed else "")).encode()


def deep_json(hostile: bool) -> st.SearchStrategy[bytes]:
    """Nesting deeper than Python's recursion limit: hostile only."""
    if not hostile:
        return st.nothing()
    return st.builds(_deep, st.integers(1000, 20000), st.sampled_from(["[", "{"]), st.booleans())


def nesting_depth(data: bytes) -> int:
    """Maximum bracket depth of JSON text (strings skipped); cheap, never recursive."""
    depth = best = 0
    in_string = escape = False
    for byte in data:
        if in_string:
            if escape:
                escape = False
            elif byte == 0x5C:
                escape = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            best = max(best, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return best


def has_surrogate(value: Any) -> bool:
    return isinstance(value, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in value)


def out_of_int64(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX


# --------------------------------------------------------------------------- best configs

BEST_CONFIG_FIELDS = ["XBLOCK", "YBLOCK", "R0_BLOCK", "num_warps", "num_stages", "configs_hash",
                      "found_by_coordesc", "time_taken_ms", "triton_cache_hash", "extra_options"]


@st.composite
def best_config_bytes(draw: st.DrawFn, hostile: bool) -> bytes:
    value = json_values(hostile)
    kind = draw(st.sampled_from(["structured", "structured", "mutated", "any_json", "text", "binary", "deep"]))
    if kind == "deep" and not hostile:
        kind = "any_json"
    if kind == "deep":
        return draw(deep_json(True))
    if kind == "any_json":
        return dumps(draw, draw(value))
    if kind == "text":
        return draw(texts(hostile, 64)).encode("utf-8", "surrogatepass")
    if kind == "binary":
        return draw(st.binary(max_size=64))
    fields = draw(st.dictionaries(st.sampled_from(BEST_CONFIG_FIELDS), st.one_of(ints(hostile), value), max_size=8))
    fields.update(draw(st.dictionaries(texts(hostile, 8), value, max_size=3)))
    data = dumps(draw, fields)
    return draw(mutated(data)) if kind == "mutated" else data


def best_config_bug(data: bytes) -> str | None:
    """The known bug a best config's bytes trigger, if any (cachedb.repositories.best_configs)."""
    if nesting_depth(data) > 200:
        return "B1 deep JSON: RecursionError escapes extract_columns"
    try:
        value = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    if any(out_of_int64(value.get(f)) for f in ("num_warps", "num_stages", "time_taken_ms")):
        return "B2 integer column out of int64: OverflowError"
    if any(has_surrogate(value.get(f)) for f in ("configs_hash", "triton_cache_hash")):
        return "B3 lone surrogate in a string column: UnicodeEncodeError"
    return None


# --------------------------------------------------------------------------- cache/<system hash>

HEX = "0123456789abcdef"
PRECISIONS = ["high", "highest", "medium"]


def inputs_keys(hostile: bool) -> st.SearchStrategy[str]:
    listrepr = st.lists(st.tuples(st.sampled_from(["'cpu'", "'cuda'"]), st.integers(1, 4096)), min_size=1, max_size=3).map(
        lambda xs: "[" + ", ".join(f"({d}, {n})" for d, n in xs) + "]"
    )
    hinted = st.builds(lambda i, h: f"{i}_{h}", listrepr, ints(hostile))
    out = st.one_of(listrepr, hinted, texts(hostile, 24))
    if hostile:
        out = st.one_of(out, st.builds(lambda i, n: f"{i}_{'7' * n}", listrepr, st.integers(4301, 6000)))
    return out


@st.composite
def local_cache_doc(draw: st.DrawFn, hostile: bool) -> tuple[str, bytes]:
    """``(system hash, bytes of cache/<system hash>)``."""
    system_hash = draw(st.text(HEX, min_size=64, max_size=64))
    value = json_values(hostile, 8)
    kind = draw(st.sampled_from(["structured", "structured", "structured", "mutated", "any_json", "deep"]))
    if kind == "deep" and not hostile:
        kind = "any_json"
    if kind == "deep":
        return system_hash, draw(deep_json(True))
    if kind == "any_json":
        return system_hash, dumps(draw, draw(st.one_of(value, st.fixed_dictionaries({"system": value, "cache": value}))))
    device_value = st.one_of(
        st.fixed_dictionaries({}, optional={"name": st.one_of(texts(hostile), st.none(), value)}),
        value if hostile else st.one_of(st.none(), st.just({}), st.just([]), st.just(""), st.just(0)),
    )
    system = draw(st.fixed_dictionaries(
        {"hash": st.just(system_hash)},
        optional={"device": device_value, "version": device_value.map(
            lambda d: {"triton": d.get("name"), "cuda": "12.8"} if isinstance(d, dict) else d)},
    ))
    timings_entry = st.dictionaries(
        inputs_keys(hostile),
        st.dictionaries(st.sampled_from(PRECISIONS + ["low"]),
                        st.dictionaries(texts(hostile, 12), st.floats(allow_nan=draw(st.booleans())), min_size=1, max_size=4),
                        min_size=1, max_size=2),
        min_size=1, max_size=3,
    )
    cache = draw(st.dictionaries(st.one_of(st.sampled_from(["mm", "addmm", "pad_mm", "bmm"]), texts(hostile, 12)),
                                 st.one_of(timings_entry, value), max_size=4))
    data = dumps(draw, {"system": system, "cache": cache})
    return system_hash, draw(mutated(data)) if kind == "mutated" else data


def _walk_strings(value: Any, depth: int = 0) -> Any:
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _walk_strings(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            yield from _walk_strings(v, depth + 1)
    else:
        yield value


def local_cache_bug(data: bytes) -> str | None:
    """The known bug a ``cache/<hash>`` document triggers, if any (cachedb.layout.importer,
    cachedb.formats.local_cache_doc, cachedb.fingerprint)."""
    if nesting_depth(data) > 200:
        return "D1 deep JSON: RecursionError escapes _local_cache_doc.parse"
    try:
        system, cache = doc.parse(data, where="x")
    except Exception:
        return None
    for field in ("device", "version"):
        v = system.get(field)
        if v and not isinstance(v, dict):
            return "D2 system.device/version not an object: AttributeError in Fingerprint"
    fields = [(system.get("device") or {}).get("name")] + [
        (system.get("version") or {}).get(k) for k in ("triton", "cuda", "hip")]
    if any(v is not None and not isinstance(v, (str, int, float)) for v in fields):
        return "D3 system.device.name/version.* not a string: the insert fails (InterfaceError)"
    if any(out_of_int64(v) for v in fields):
        return "D5 integer out of int64: OverflowError"
    if any(has_surrogate(v) for v in fields):
        return "D6 lone surrogate: UnicodeEncodeError"
    for op, entry in cache.items():
        if has_surrogate(op):
            return "D6 lone surrogate in a key stored raw (op / namespace): UnicodeEncodeError"
        if doc._is_timings_op(entry):
            for inputs_key, per_inputs in entry.items():
                if has_surrogate(inputs_key) or any(has_surrogate(c) for p in per_inputs.values() for c in p):
                    return "D6 lone surrogate in inputs / choice: UnicodeEncodeError"
                head, sep, tail = inputs_key.rpartition("]_")
                digits = tail.lstrip("-")
                if sep and digits.isdigit() and digits.isascii() and (len(digits) > 4300 or out_of_int64(int(tail))):
                    return "D4/D5 hint override out of int64 (or > 4300 digits): OverflowError / ValueError"
    return None


# --------------------------------------------------------------------------- pickles


def _arg_bytes(draw: st.DrawFn, arg: pickletools.ArgumentDescriptor | None) -> bytes:
    if arg is None:
        return b""
    if arg.n >= 0:
        return draw(st.binary(min_size=arg.n, max_size=arg.n))
    if arg.n == pickletools.UP_TO_NEWLINE:
        return draw(st.text("0123456789.-LTruefalsNn 'abc_", max_size=12)).encode() + b"\n"
    if arg.n == pickletools.TAKEN_FROM_ARGUMENT1:
        data = draw(st.binary(max_size=12))
        return bytes([len(data)]) + data
    if arg.n == pickletools.TAKEN_FROM_ARGUMENT4:
        data = draw(st.binary(max_size=12))
        return struct.pack("<I", len(data)) + data
    if arg.n == pickletools.TAKEN_FROM_ARGUMENT4U:
        data = draw(st.binary(max_size=12))
        return struct.pack("<I", len(data)) + data
    if arg.n == pickletools.TAKEN_FROM_ARGUMENT8U:
        data = draw(st.binary(max_size=12))
        return struct.pack("<Q", len(data)) + data
    return b""


@st.composite
def opcode_soup(draw: st.DrawFn) -> bytes:
    """A raw stream of pickle opcodes with well-formed (random) arguments, then STOP."""
    ops = draw(st.lists(st.sampled_from(pickletools.opcodes), max_size=40))
    out = bytearray(b"\x80" + bytes([draw(st.integers(0, 6))]))
    for op in ops:
        out += op.code.encode("latin-1") + _arg_bytes(draw, op.arg)
    return bytes(out + b".")


def python_values(hostile: bool) -> st.SearchStrategy[Any]:
    scalars = st.one_of(st.none(), st.booleans(), ints(hostile), st.floats(), texts(hostile), st.binary(max_size=16))
    return st.recursive(
        scalars,
        lambda ch: st.one_of(st.lists(ch, max_size=3), st.tuples(ch, ch), st.dictionaries(texts(hostile, 6), ch, max_size=3),
                             st.frozensets(st.integers(), max_size=3), st.builds(bytearray, st.binary(max_size=8))),
        max_leaves=10,
    )


@st.composite
def entry_object(draw: st.DrawFn, hostile: bool) -> Any:
    cls = draw(st.sampled_from([CompiledFxGraph, AOTAutogradResult]))
    obj = cls()
    state: dict[str, Any] = {}
    if draw(st.booleans()):
        state["guards_expr"] = draw(st.one_of(st.none(), texts(hostile, 40), python_values(hostile)))
    time_value = st.one_of(ints(hostile), python_values(hostile))
    if cls is CompiledFxGraph and draw(st.booleans()):
        state["_time_taken_ns"] = draw(time_value)
    if cls is AOTAutogradResult:
        for name in ("forward_time_taken_ns", "backward_time_taken_ns"):
            if draw(st.booleans()):
                state[name] = draw(time_value)
    state.update(draw(st.dictionaries(texts(hostile, 8), python_values(hostile), max_size=3)))
    obj.__dict__.update(state)
    return obj


@st.composite
def pickle_bytes(draw: st.DrawFn, hostile: bool) -> bytes:
    kind = draw(st.sampled_from(["entry", "entry", "entry_mutated", "value", "soup", "binary"]))
    if kind == "soup":
        return draw(opcode_soup())
    if kind == "binary":
        return draw(st.binary(max_size=64))
    protocol = draw(st.integers(0, pickle.HIGHEST_PROTOCOL))
    value = draw(entry_object(hostile)) if kind.startswith("entry") else draw(python_values(hostile))
    data = pickle.dumps(value, protocol=protocol)
    return draw(mutated(data)) if kind == "entry_mutated" else data


def pickle_bug(data: bytes) -> str | None:
    """The known bug a pickled entry triggers when stored (cachedb.repositories.guarded)."""
    try:
        fields = read_entry_fields(data)
    except Exception:
        return None
    if out_of_int64(fields.time_taken_ns):
        return "P1 time taken out of int64: OverflowError"
    if has_surrogate(fields.guards_expr) or has_surrogate(fields.reason):
        return "P2 lone surrogate in guards_expr / the class name in guards_note: UnicodeEncodeError"
    return None


# --------------------------------------------------------------------------- CUTLASS op lists


def _enum(type_: str, name: Any) -> str:
    return json.dumps({"type": type_, "name": name})


@st.composite
def cutlass_op(draw: st.DrawFn, hostile: bool) -> Any:
    """One serialized op shaped like torch's CUTLASSOperationSerializer output (nested JSON
    strings), with random values; sometimes a random JSON value instead."""
    value = json_values(hostile, 6)
    maybe = lambda s: st.one_of(s, value) if draw(st.integers(0, 9)) == 0 else s  # noqa: E731
    names = maybe(st.one_of(st.sampled_from(["f16", "bf16", "f32", "e4m3", "RowMajor", "ColumnMajor", "Universal3x"]),
                            texts(hostile, 8)))
    tensor = st.builds(lambda e, l, a: json.dumps({"element": _enum("DataType", e), "layout": _enum("LayoutType", l),
                                                    "alignment": a}), names, names, maybe(ints(hostile)))
    math = json.dumps({"instruction_shape": [0, 0, 0], "element_a": _enum("DataType", "f16"),
                       "element_b": _enum("DataType", "f16"), "element_accumulator": _enum("DataType", draw(names)),
                       "opcode_class": _enum("OpcodeClass", "TensorOp"), "math_operation": _enum("MathOperation", "x")})
    tile = json.dumps({"threadblock_shape": draw(maybe(st.lists(ints(hostile), min_size=1, max_size=3))),
                       "stages": draw(maybe(ints(hostile))), "warp_count": [4, 1, 1], "math_instruction": math,
                       "cluster_shape": draw(maybe(st.lists(ints(hostile), min_size=1, max_size=3)))})
    op = {"gemm_kind": _enum("GemmKind", draw(names)), "arch": draw(maybe(ints(hostile))), "tile_description": tile,
          "A": draw(tensor), "B": draw(tensor), "C": draw(st.one_of(st.none(), tensor)), "D": draw(st.one_of(st.none(), tensor)),
          "element_epilogue": _enum("DataType", draw(names)),
          "kernel_schedule": draw(st.one_of(st.none(), names.map(lambda n: _enum("KernelScheduleType", n))))}
    for key in draw(st.lists(st.sampled_from(sorted(op)), max_size=2, unique=True)):
        del op[key]
    return json.dumps(op)


@st.composite
def cutlass_bytes(draw: st.DrawFn, hostile: bool) -> bytes:
    kind = draw(st.sampled_from(["ops", "ops", "mutated", "any_json", "deep", "binary"]))
    if kind == "deep" and not hostile:
        kind = "any_json"
    if kind == "deep":
        return draw(deep_json(True))
    if kind == "binary":
        return draw(st.binary(max_size=64))
    if kind == "any_json":
        return dumps(draw, draw(json_values(hostile)))
    ops = draw(st.lists(st.one_of(cutlass_op(hostile), cutlass_op(hostile), json_values(hostile, 4)), max_size=4))
    data = dumps(draw, ops)
    return draw(mutated(data)) if kind == "mutated" else data


def cutlass_bug(data: bytes) -> str | None:
    """The known bug an op list triggers when stored (cachedb.repositories.cutlass)."""
    try:
        rows = parse_op_list(data)
    except Exception:
        return None
    for row in rows:
        for value in (getattr(row, f.name) for f in dataclasses.fields(row)):
            if out_of_int64(value):
                return "C1 integer field out of int64: OverflowError"
            if has_surrogate(value):
                return "C2 lone surrogate in an enum name: UnicodeEncodeError"
    return None
