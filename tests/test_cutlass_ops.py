"""cachedb.formats.cutlass_ops on the real CUTLASS op list (torch 2.13 ``gen_ops`` + serializer, arch 90),
checked against torch's own ``CUTLASSOperationSerializer.deserialize``
(torch/_inductor/codegen/cutlass/serialization.py) where torch and cutlass_library are present."""

from __future__ import annotations

import ast
import dataclasses
import gzip
import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import cachedb.formats.cutlass_ops as cutlass_ops_module
from cachedb._errors import BadInputError, CutlassOpListError
from cachedb.formats.cutlass_ops import CutlassOpRow, infer_arch, parse_op_list

#: The real op list, kept in the repository (tests/data/, 550 KB gzipped) so a plain clone passes.
CORPUS = Path(__file__).resolve().parent / "data" / "configs_b15d29dd.json.gz"
N_OPS = 21_268

FIELDS = [
    "position", "gemm_kind", "arch", "element_a", "element_b", "element_c", "element_d",
    "element_accumulator", "element_epilogue", "layout_a", "layout_b", "layout_c", "layout_d",
    "alignment_a", "alignment_b", "alignment_c", "alignment_d", "tile_shape", "cluster_shape",
    "stages", "kernel_schedule", "epilogue_schedule", "tile_scheduler", "epilogue_functor",
    "swizzling_functor",
]


@pytest.fixture(scope="module")
def corpus_bytes() -> bytes:
    return gzip.decompress(CORPUS.read_bytes())


@pytest.fixture(scope="module")
def corpus_ops(corpus_bytes: bytes) -> list[str]:
    """The raw serialized ops (each a JSON-object string)."""
    return json.loads(corpus_bytes)


@pytest.fixture(scope="module")
def parsed(corpus_bytes: bytes) -> tuple[list[CutlassOpRow], float]:
    start = time.perf_counter()
    rows = parse_op_list(corpus_bytes, where="configs_b15d29dd.json")
    return rows, time.perf_counter() - start


@pytest.fixture(scope="module")
def rows(parsed: tuple[list[CutlassOpRow], float]) -> list[CutlassOpRow]:
    return parsed[0]


def _decode_all(text: Any) -> Any:
    """Independent fully-recursive decoder: every string that holds a JSON object is decoded."""
    if isinstance(text, str) and text.startswith("{"):
        return _decode_all(json.loads(text))
    if isinstance(text, dict):
        return {k: _decode_all(v) for k, v in text.items()}
    return text


# -- structure and the API ----------------------------------------------------------------------


def test_row_fields_exact() -> None:
    assert [f.name for f in dataclasses.fields(CutlassOpRow)] == FIELDS
    params = CutlassOpRow.__dataclass_params__  # type: ignore[attr-defined]
    assert params.frozen
    assert hasattr(CutlassOpRow, "__slots__")


def test_module_imports_neither_torch_nor_cutlass() -> None:
    tree = ast.parse(Path(cutlass_ops_module.__file__).read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & {"torch", "cutlass_library", "cutlass"}, imported


# -- the real corpus ----------------------------------------------------------------------------


def test_corpus_row_count_and_arch(parsed: tuple[list[CutlassOpRow], float]) -> None:
    rows, seconds = parsed
    assert len(rows) == N_OPS
    assert [r.position for r in rows] == list(range(N_OPS))
    assert infer_arch(rows) == 90
    assert all(r.arch == 90 for r in rows)
    print(f"parse_op_list: {N_OPS} ops in {seconds:.2f} s")  # the benchmarks' import section times it


def test_corpus_first_row(rows: list[CutlassOpRow]) -> None:
    assert rows[0] == CutlassOpRow(
        position=0, gemm_kind="Universal3x", arch=90, element_a="f16", element_b="f16",
        element_c="f16", element_d="f16", element_accumulator="f16", element_epilogue="f16",
        layout_a="ColumnMajor", layout_b="ColumnMajor", layout_c="ColumnMajor", layout_d="ColumnMajor",
        alignment_a=8, alignment_b=8, alignment_c=8, alignment_d=8, tile_shape="128x256x64",
        cluster_shape="1x2x1", stages=0, kernel_schedule="ScheduleAuto", epilogue_schedule="ScheduleAuto",
        tile_scheduler="Default", epilogue_functor="LinearCombination", swizzling_functor="Identity1",
    )


def test_corpus_distinct_values(rows: list[CutlassOpRow]) -> None:
    gemm_kinds = Counter(r.gemm_kind for r in rows)
    assert gemm_kinds == {
        "Universal3x": 9856, "SparseUniversal3x": 5232, "GroupedUniversal3x": 2632,
        "BlockwiseUniversal3x": 2064, "GroupedBlockwiseUniversal3x": 1080, "Universal": 404,
    }
    schedules = Counter(r.kernel_schedule for r in rows)
    assert len(schedules) == 15 and None not in schedules
    assert schedules["TmaWarpSpecializedCooperative"] == 5264
    assert schedules["ScheduleAuto"] == 988
    assert set(Counter(r.element_a for r in rows)) == {
        "e5m2", "e4m3", "f16", "bf16", "u8", "s8", "s4", "u4", "cf64", "tf32", "f32", "s2", "u2", "f64",
    }
    assert Counter(r.element_accumulator for r in rows) == {"f32": 19048, "f16": 1264, "s32": 552, "f64": 404}
    assert Counter(r.element_c for r in rows)["void"] == 4784  # epilogues without a C source
    assert Counter(r.cluster_shape for r in rows) == {"1x2x1": 10016, "2x1x1": 10016, "1x1x1": 1236}
    assert Counter(r.tile_scheduler for r in rows) == {"Default": 16756, "StreamK": 4512}
    assert {r.epilogue_functor for r in rows} == {"LinearCombination"}
    assert Counter(r.stages for r in rows) == {0: 20864, 4: 204, 3: 188, 5: 12}
    assert len({r.tile_shape for r in rows}) == 39
    # CUTLASS 2.x ops (gemm_kind "Universal") keep the Identity8 swizzle and explicit stages.
    two_x = [r for r in rows if r.gemm_kind == "Universal"]
    assert {r.swizzling_functor for r in two_x} == {"Identity8"}
    assert all(r.stages > 0 for r in two_x)
    assert all(
        getattr(r, f) is not None for r in rows for f in FIELDS
    ), "every op of the corpus has every field"


def test_corpus_groups_by_element_and_layout_a(rows: list[CutlassOpRow], corpus_ops: list[str]) -> None:
    groups = Counter((r.element_a, r.layout_a) for r in rows)
    assert len(groups) == 20
    assert groups[("e4m3", "RowMajor")] == 5664
    assert groups[("e5m2", "RowMajor")] == 5664
    assert groups[("f16", "ColumnMajor")] == 1768
    assert groups[("f16", "RowMajor")] == 1768
    assert groups[("bf16", "RowMajor")] == 1136
    assert groups[("f64", "ColumnMajor")] == 26
    assert ("e4m3", "ColumnMajor") not in groups  # fp8 A is only ever K-major (RowMajor)
    assert sum(groups.values()) == N_OPS
    # Independently: fully decode every op and count the same pairs.
    expected: Counter[tuple[str, str]] = Counter()
    for text in corpus_ops:
        a = _decode_all(text)["A"]
        expected[(a["element"]["name"], a["layout"]["name"])] += 1
    assert groups == expected


def test_corpus_matches_independent_decoding_sample(rows: list[CutlassOpRow], corpus_ops: list[str]) -> None:
    """A torch-free cross-check of every column on 500 random ops."""
    for i in random.Random(1).sample(range(N_OPS), 500):
        op = _decode_all(corpus_ops[i])
        td = op["tile_description"]
        row = rows[i]
        assert row.gemm_kind == op["gemm_kind"]["name"]
        assert row.element_accumulator == td["math_instruction"]["element_accumulator"]["name"]
        assert row.tile_shape == "x".join(map(str, td["threadblock_shape"]))
        assert row.cluster_shape == "x".join(map(str, td["cluster_shape"]))
        assert row.stages == td["stages"]
        for t in "abcd":
            desc = op[t.upper()]
            assert getattr(row, f"element_{t}") == desc["element"]["name"]
            assert getattr(row, f"layout_{t}") == desc["layout"]["name"]
            assert getattr(row, f"alignment_{t}") == desc["alignment"]
        for f in ("element_epilogue", "kernel_schedule", "epilogue_schedule", "tile_scheduler",
                  "epilogue_functor", "swizzling_functor"):
            assert getattr(row, f) == op[f]["name"], (i, f)


def _torch_view(op: Any) -> dict[str, Any]:
    """The columns, read from a GemmOperation rebuilt by torch's deserializer."""

    def name(e: Any) -> str | None:
        return None if e is None else e.name

    def shape(s: Any) -> str | None:
        return None if s is None else "x".join(map(str, s))

    td = op.tile_description
    return {
        "gemm_kind": name(op.gemm_kind), "arch": op.arch,
        "element_a": name(op.A.element), "element_b": name(op.B.element),
        "element_c": name(op.C.element), "element_d": name(op.D.element),
        "element_accumulator": name(td.math_instruction.element_accumulator),
        "element_epilogue": name(op.element_epilogue),
        "layout_a": name(op.A.layout), "layout_b": name(op.B.layout),
        "layout_c": name(op.C.layout), "layout_d": name(op.D.layout),
        "alignment_a": op.A.alignment, "alignment_b": op.B.alignment,
        "alignment_c": op.C.alignment, "alignment_d": op.D.alignment,
        "tile_shape": shape(td.threadblock_shape), "cluster_shape": shape(td.cluster_shape),
        "stages": td.stages,
        "kernel_schedule": name(op.kernel_schedule), "epilogue_schedule": name(op.epilogue_schedule),
        "tile_scheduler": name(op.tile_scheduler), "epilogue_functor": name(op.epilogue_functor),
        "swizzling_functor": name(op.swizzling_functor),
    }


@pytest.mark.torch
def test_corpus_matches_torch_deserializer(rows: list[CutlassOpRow], corpus_ops: list[str]) -> None:
    """Every column of 50 random ops (plus the first and last, and every CUTLASS 2.x op's first)
    equals the attribute of the GemmOperation torch's own deserializer rebuilds."""
    pytest.importorskip("cutlass_library")
    pytest.importorskip("torch")
    serialization = pytest.importorskip("torch._inductor.codegen.cutlass.serialization")
    serializer = serialization.CUTLASSOperationSerializer
    first_2x = next(r.position for r in rows if r.gemm_kind == "Universal")
    first_complex = next(r.position for r in rows if r.element_a == "cf64")
    sample = random.Random(0).sample(range(N_OPS), 50) + [0, N_OPS - 1, first_2x, first_complex]
    for i in sample:
        op = serializer.deserialize(corpus_ops[i])
        row = dataclasses.asdict(rows[i])
        assert row.pop("position") == i
        assert row == _torch_view(op), f"op {i}"
        # element_accumulator is the raw math-instruction field, not accumulator_type():
        if row["element_a"] == "cf64":
            assert op.accumulator_type().name == "cf64" and row["element_accumulator"] == "f64"


# -- edge cases of valid input ----------------------------------------------------------------


def _enum(type_: str, name: str) -> str:
    return json.dumps({"type": type_, "name": name})


def _tensor(element: str, layout: str, alignment: int) -> str:
    return json.dumps({
        "element": _enum("DataType", element), "layout": _enum("LayoutType", layout),
        "alignment": alignment, "complex_transform": _enum("ComplexTransform", "none"),
    })


def _op(**overrides: Any) -> dict[str, Any]:
    math = json.dumps({
        "instruction_shape": [0, 0, 0], "element_a": _enum("DataType", "f16"),
        "element_b": _enum("DataType", "f16"), "element_accumulator": _enum("DataType", "f32"),
        "opcode_class": _enum("OpcodeClass", "TensorOp"),
        "math_operation": _enum("MathOperation", "multiply_add"), "element_scale_factor": None,
    })
    tile = {"threadblock_shape": [64, 128, 32], "stages": 0, "warp_count": [4, 1, 1],
            "math_instruction": math, "min_compute": 90, "max_compute": 90,
            "cluster_shape": [2, 1, 1], "explicit_vector_sizes": None}
    tile.update(overrides.pop("tile", {}))
    op = {
        "gemm_kind": _enum("GemmKind", "Universal3x"), "arch": 90, "tile_description": json.dumps(tile),
        "A": _tensor("f16", "RowMajor", 8), "B": _tensor("f16", "ColumnMajor", 8),
        "C": _tensor("bf16", "RowMajor", 4), "element_epilogue": _enum("DataType", "f32"),
        "epilogue_functor": _enum("EpilogueFunctor3x", "LinearCombination"),
        "swizzling_functor": _enum("SwizzlingFunctor", "Identity1"),
        "D": _tensor("f16", "RowMajor", 8),
        "kernel_schedule": _enum("KernelScheduleType", "TmaWarpSpecializedPingpong"),
        "epilogue_schedule": _enum("EpilogueScheduleType", "TmaWarpSpecialized"),
        "tile_scheduler": _enum("TileSchedulerType", "StreamK"),
        "mixed_input_mode": None, "mixed_input_shuffle": False, "is_3x": True,
    }
    op.update(overrides)
    return op


def _dump(*ops: dict[str, Any]) -> bytes:
    return json.dumps([json.dumps(op) for op in ops]).encode()


def test_synthetic_op() -> None:
    (row,) = parse_op_list(_dump(_op()))
    assert (row.element_c, row.layout_c, row.alignment_c) == ("bf16", "RowMajor", 4)
    assert (row.element_d, row.alignment_d) == ("f16", 8)
    assert (row.tile_shape, row.cluster_shape, row.element_accumulator) == ("64x128x32", "2x1x1", "f32")
    assert row.kernel_schedule == "TmaWarpSpecializedPingpong" and row.tile_scheduler == "StreamK"


def test_null_d_falls_back_to_c_like_gemm_operation() -> None:
    (row,) = parse_op_list(_dump(_op(D=None)))
    assert (row.element_d, row.layout_d, row.alignment_d) == ("bf16", "RowMajor", 4)


def test_optional_fields_absent_or_null() -> None:
    op = _op(C=None, D=None, kernel_schedule=None)
    for key in ("epilogue_functor", "swizzling_functor", "epilogue_schedule", "tile_scheduler"):
        del op[key]
    tile = json.loads(op["tile_description"])
    del tile["cluster_shape"]  # torch's default is [1, 1, 1]
    tile["math_instruction"] = None
    op["tile_description"] = json.dumps(tile)
    (row,) = parse_op_list(_dump(op))
    assert row.element_c is row.element_d is row.layout_d is row.alignment_d is None
    assert row.kernel_schedule is row.epilogue_functor is row.tile_scheduler is None
    assert row.element_accumulator is None
    assert row.cluster_shape == "1x1x1"


def test_empty_list_and_infer_arch() -> None:
    assert parse_op_list(b"[]") == []
    assert parse_op_list(b" [ ]\n") == []
    assert infer_arch([]) is None
    rows = parse_op_list(_dump(_op(), _op(arch=100)))
    assert [r.arch for r in rows] == [90, 100]
    assert infer_arch(rows) is None
    assert infer_arch(rows[:1]) == 90
    assert infer_arch(r for r in rows[1:]) == 100


# -- malformed input ----------------------------------------------------------------------------


def test_truncated_corpus_raises(corpus_bytes: bytes) -> None:
    with pytest.raises(CutlassOpListError) as info:
        parse_op_list(corpus_bytes[: len(corpus_bytes) // 3], where="configs_b15d29dd.json")
    assert info.value.where == "configs_b15d29dd.json"
    assert "not valid JSON" in info.value.reason
    assert isinstance(info.value, BadInputError)


def _bad_nested(field: str, value: Any) -> bytes:
    return _dump(_op(**{field: value}))


def _bad_tile(**tile: Any) -> bytes:
    return _dump(_op(tile=tile))


def _missing(key: str) -> bytes:
    op = _op()
    del op[key]
    return _dump(op)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "not valid JSON"),
        (b"\x00\xffgarbage\x80", "not valid JSON"),
        (b"not json at all", "not valid JSON"),
        (b'["{\\"gemm_kind\\": ', "not valid JSON"),
        (b"[" * 100_000, "not valid JSON"),
        (b'{"ops": []}', "expected a list"),
        (b'"a string"', "expected a list"),
        (b"null", "expected a list"),
        (b"[1, 2, 3]", "op 0: is JSON int"),
        (b"[null]", "op 0: is JSON NoneType"),
        (b'[{"gemm_kind": "x"}]', "op 0: is JSON dict"),
        (b'[["nested"]]', "op 0: is JSON list"),
        (b'["garbage"]', "op 0: is not valid JSON"),
        (b'["[1, 2]"]', "op 0: is JSON list, expected an object"),
        (b'["{}"]', "op 0: no 'gemm_kind'"),
        (_missing("A"), "no 'A'"),
        (_missing("tile_description"), "no 'tile_description'"),
        (_missing("arch"), "no 'arch'"),
        (_bad_nested("arch", "90"), "arch is '90'"),
        (_bad_nested("gemm_kind", "Universal3x"), "gemm_kind is not valid JSON"),
        (_bad_nested("gemm_kind", json.dumps({"type": "GemmKind"})), "gemm_kind has no string 'name'"),
        (_bad_nested("gemm_kind", {"type": "GemmKind", "name": "Universal3x"}), "gemm_kind is dict"),
        (_bad_nested("A", None), "A and B must not be null"),
        (_bad_nested("B", json.dumps({"element": _enum("DataType", "f16")})), "B has no 'layout'"),
        (_bad_nested("C", json.dumps({"element": _enum("DataType", "f16"), "layout": _enum("LayoutType", "RowMajor"),
                                      "alignment": "8"})), "C.alignment is '8'"),
        (_bad_nested("D", json.dumps([1])), "D is JSON list"),
        (_bad_nested("kernel_schedule", 7), "kernel_schedule is int"),
        (_bad_tile(threadblock_shape=None), "threadblock_shape is null"),
        (_bad_tile(threadblock_shape="128x128x64"), "threadblock_shape is '128x128x64'"),
        (_bad_tile(stages=None), "stages is None"),
        (_bad_tile(math_instruction="{}"), "math_instruction has no 'instruction_shape'"),
    ],
)
def test_malformed_raises(data: bytes, reason: str) -> None:
    with pytest.raises(CutlassOpListError) as info:
        parse_op_list(data, where="configs_bad.json")
    assert info.value.where == "configs_bad.json"
    assert reason in info.value.reason, info.value.reason
    assert str(info.value).startswith("configs_bad.json: ")


def test_error_names_the_failing_op(corpus_ops: list[str]) -> None:
    ops = corpus_ops[:5] + [json.dumps({k: v for k, v in json.loads(corpus_ops[5]).items() if k != "B"})]
    with pytest.raises(CutlassOpListError, match=r"op 5: no 'B'"):
        parse_op_list(json.dumps(ops).encode())
    assert len(parse_op_list(json.dumps(ops[:5]).encode())) == 5


def test_not_bytes_like() -> None:
    with pytest.raises(CutlassOpListError):
        parse_op_list(12345)  # type: ignore[arg-type]
