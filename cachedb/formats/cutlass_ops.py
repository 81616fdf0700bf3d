"""Parse a CUTLASS op list (``configs_<request_key>.json``) without torch or CUTLASS installed.

The file is what ``maybe_fetch_ops`` (torch/_inductor/codegen/cutlass/cache.py; torch 2.9/2.10:
codegen/cuda/cutlass_cache.py) reads: a JSON list whose elements are the strings
``CUTLASSOperationSerializer.serialize(op)`` returns (torch/_inductor/codegen/cutlass/
serialization.py). Each element is a JSON object whose enum and sub-object fields are themselves
JSON-encoded strings, two or three levels deep::

    {"gemm_kind": "{\\"type\\": \\"GemmKind\\", \\"name\\": \\"Universal3x\\"}",
     "arch": 90,
     "tile_description": "{\\"threadblock_shape\\": [128, 256, 64], \\"stages\\": 0,
                           \\"math_instruction\\": \\"{... \\\\\\"element_accumulator\\\\\\": ...}\\",
                           \\"cluster_shape\\": [1, 2, 1], ...}",
     "A": "{\\"element\\": \\"{...DataType...}\\", \\"layout\\": \\"{...LayoutType...}\\",
            \\"alignment\\": 8, \\"complex_transform\\": \\"{...}\\"}",
     "B": ..., "C": ..., "D": ... (or null),
     "element_epilogue": "{...DataType...}", "epilogue_functor": "{...}", ...}

:func:`parse_op_list` mirrors ``CUTLASSOperationSerializer.deserialize`` /
``_json_to_gemm_operation`` (and the helpers ``_json_to_tile_description``,
``_json_to_math_instruction``, ``_json_to_tensor_description``, ``_json_to_enum``) closely
enough that every column equals the matching attribute of the ``GemmOperation`` torch would
rebuild (an enum column holds the enum member's ``name``):

======================  ===================================================================
column                  serialized path (torch attribute it equals)
======================  ===================================================================
gemm_kind               ``gemm_kind.name``                        (``op.gemm_kind.name``)
arch                    ``arch``                                  (``op.arch``)
element_a/b/c/d         ``A|B|C|D.element.name``                  (``op.A.element.name`` …)
layout_a/b/c/d          ``A|B|C|D.layout.name``                   (``op.A.layout.name`` …)
alignment_a/b/c/d       ``A|B|C|D.alignment``                     (``op.A.alignment`` …)
element_accumulator     ``tile_description.math_instruction.element_accumulator.name``
                        (``op.tile_description.math_instruction.element_accumulator.name``;
                        the raw field, *not* ``op.accumulator_type()``, which promotes to the
                        complex type for complex math operations, e.g. f64 -> cf64)
element_epilogue        ``element_epilogue.name``
tile_shape              ``tile_description.threadblock_shape`` joined with ``x``
cluster_shape           ``tile_description.cluster_shape`` joined with ``x`` (absent: torch's
                        default ``[1, 1, 1]``; ``null``: None)
stages                  ``tile_description.stages`` (0 means "auto" for CUTLASS 3.x kernels)
kernel_schedule         ``kernel_schedule.name``
epilogue_schedule       ``epilogue_schedule.name``
tile_scheduler          ``tile_scheduler.name``
epilogue_functor        ``epilogue_functor.name`` (an enum, ``EpilogueFunctor3x`` for 3.x
                        kernels or ``EpilogueFunctor`` for 2.x ones, never an object)
swizzling_functor       ``swizzling_functor.name``
======================  ===================================================================

``D`` is ``null`` in the file when the op had no D; ``GemmOperation.__init__`` (cutlass_library/
gemm_operation.py) then sets ``D = C``, and so do the ``*_d`` columns here. The operand element
columns come from the tensor descriptions ``A``/``B``, which differ from
``math_instruction.element_a``/``element_b`` for mixed-input kernels.

The enum ``type`` written next to ``name`` is not checked (torch ignores it too: the target
enum class comes from the field). Fields torch reads with ``json_dict[...]`` or that
``GemmOperation.__init__`` dereferences are required (``gemm_kind``, ``arch``,
``tile_description`` with ``threadblock_shape``, ``stages``, ``warp_count`` and
``math_instruction``, ``A``, ``B``, ``element_epilogue``); optional fields torch reads with
``.get`` may be absent or ``null`` and give None.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .._errors import CutlassOpListError

__all__ = ["CutlassOpRow", "parse_op_list", "infer_arch"]


@dataclass(frozen=True, slots=True)
class CutlassOpRow:
    """The queryable fields of one serialized ``GemmOperation`` (see the module docstring for
    the serialized path behind each field). Strings are enum member names as serialized
    (``"f16"``, ``"ColumnMajor"``, ``"Universal3x"``); None where the op lacks the field."""

    position: int
    gemm_kind: str | None
    arch: int | None
    element_a: str | None
    element_b: str | None
    element_c: str | None
    element_d: str | None
    element_accumulator: str | None
    element_epilogue: str | None
    layout_a: str | None
    layout_b: str | None
    layout_c: str | None
    layout_d: str | None
    alignment_a: int | None
    alignment_b: int | None
    alignment_c: int | None
    alignment_d: int | None
    tile_shape: str | None
    cluster_shape: str | None
    stages: int | None
    kernel_schedule: str | None
    epilogue_schedule: str | None
    tile_scheduler: str | None
    epilogue_functor: str | None
    swizzling_functor: str | None


class _Bad(Exception):
    """Internal: a malformed field; turned into :class:`CutlassOpListError` with the op index."""


# (element, layout, alignment) of a TensorDescription; None for a null description.
_Tensor = tuple[str, str, int]
# (tile_shape, cluster_shape, stages, element_accumulator) of a TileDescription.
_Tile = tuple[str, str | None, int, str | None]

_NO_TENSOR: tuple[None, None, None] = (None, None, None)
_DEFAULT_CLUSTER = [1, 1, 1]  # _json_to_tile_description: tile_dict.get("cluster_shape", [1, 1, 1])


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _loads_object(text: object, what: str) -> dict[str, Any]:
    """``json.loads`` of a nested JSON-object string (torch's ``json.loads(json_dict)``)."""
    if not isinstance(text, str):
        raise _Bad(f"{what} is {type(text).__name__}, expected a JSON-encoded string")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise _Bad(f"{what} is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise _Bad(f"{what} is JSON {type(value).__name__}, expected an object")
    return value


class _Decoder:
    """Decodes the nested strings of one op list, memoizing each distinct string.

    Mirrors the ``functools.lru_cache`` torch puts on ``_json_to_enum``,
    ``_json_to_tensor_description``, ``_json_to_tile_description`` and
    ``_json_to_math_instruction``: an op list of ~21k ops holds only a few hundred distinct
    nested strings, so each is decoded once. The memo lives as long as one parse call."""

    __slots__ = ("_enums", "_tensors", "_tiles", "_math")

    def __init__(self) -> None:
        self._enums: dict[str, str] = {}
        self._tensors: dict[str, _Tensor] = {}
        self._tiles: dict[str, _Tile] = {}
        self._math: dict[str, str | None] = {}

    def enum(self, text: object, what: str) -> str | None:
        """``_json_to_enum``: ``{"type": <enum class>, "name": <member>}`` -> member name."""
        if text is None:
            return None
        try:
            return self._enums[text]  # type: ignore[index]
        except (KeyError, TypeError):
            pass
        d = _loads_object(text, what)
        name = d.get("name")
        if not isinstance(name, str):
            raise _Bad(f"{what} has no string 'name' (got {d!r:.80})")
        self._enums[text] = name  # type: ignore[index]
        return name

    def tensor(self, text: object, what: str) -> _Tensor | None:
        """``_json_to_tensor_description``: element, layout, alignment (complex_transform is
        not a column and not checked)."""
        if text is None:
            return None
        try:
            return self._tensors[text]  # type: ignore[index]
        except (KeyError, TypeError):
            pass
        d = _loads_object(text, what)
        for key in ("element", "layout", "alignment"):
            if key not in d:
                raise _Bad(f"{what} has no {key!r}")
        element = self.enum(d["element"], f"{what}.element")
        layout = self.enum(d["layout"], f"{what}.layout")
        alignment = d["alignment"]
        if element is None or layout is None:
            raise _Bad(f"{what}: element and layout must not be null")
        if not _is_int(alignment):
            raise _Bad(f"{what}.alignment is {alignment!r}, expected an integer")
        result = (element, layout, alignment)
        self._tensors[text] = result  # type: ignore[index]
        return result

    def math_accumulator(self, text: object, what: str) -> str | None:
        """``_json_to_math_instruction``: only ``element_accumulator`` becomes a column; the
        other fields torch indexes (``element_a``, ``element_b``, ``opcode_class``,
        ``math_operation``, ``instruction_shape``) must be present."""
        if text is None:
            return None
        try:
            return self._math[text]  # type: ignore[index]
        except (KeyError, TypeError):
            pass
        d = _loads_object(text, what)
        for key in ("instruction_shape", "element_a", "element_b", "element_accumulator",
                    "opcode_class", "math_operation"):
            if key not in d:
                raise _Bad(f"{what} has no {key!r}")
        acc = self.enum(d["element_accumulator"], f"{what}.element_accumulator")
        self._math[text] = acc  # type: ignore[index]
        return acc

    def tile(self, text: object, what: str) -> _Tile:
        """``_json_to_tile_description``: threadblock shape, cluster shape, stages and the
        math instruction's accumulator element."""
        try:
            return self._tiles[text]  # type: ignore[index]
        except (KeyError, TypeError):
            pass
        if text is None:
            raise _Bad(f"{what} is null")
        d = _loads_object(text, what)
        for key in ("threadblock_shape", "stages", "warp_count", "math_instruction"):
            if key not in d:
                raise _Bad(f"{what} has no {key!r}")
        tile_shape = _shape(d["threadblock_shape"], f"{what}.threadblock_shape")
        if tile_shape is None:
            raise _Bad(f"{what}.threadblock_shape is null")
        cluster = _shape(d.get("cluster_shape", _DEFAULT_CLUSTER), f"{what}.cluster_shape")
        stages = d["stages"]
        if not _is_int(stages):
            raise _Bad(f"{what}.stages is {stages!r}, expected an integer")
        acc = self.math_accumulator(d["math_instruction"], f"{what}.math_instruction")
        result = (tile_shape, cluster, stages, acc)
        self._tiles[text] = result  # type: ignore[index]
        return result


def _shape(value: object, what: str) -> str | None:
    """``[128, 256, 64]`` -> ``"128x256x64"``; None stays None."""
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(_is_int(v) for v in value):
        raise _Bad(f"{what} is {value!r:.80}, expected a list of integers")
    return "x".join(map(str, value))


def _row(position: int, d: dict[str, Any], dec: _Decoder) -> CutlassOpRow:
    """``_json_to_gemm_operation`` reduced to the columns of :class:`CutlassOpRow`."""
    for key in ("gemm_kind", "arch", "tile_description", "element_epilogue", "A", "B"):
        if key not in d:
            raise _Bad(f"no {key!r}")
    arch = d["arch"]
    if not _is_int(arch):
        raise _Bad(f"arch is {arch!r}, expected an integer")
    gemm_kind = dec.enum(d["gemm_kind"], "gemm_kind")
    if gemm_kind is None:
        raise _Bad("gemm_kind is null")
    tile_shape, cluster_shape, stages, acc = dec.tile(d["tile_description"], "tile_description")
    a = dec.tensor(d["A"], "A")
    b = dec.tensor(d["B"], "B")
    if a is None or b is None:
        raise _Bad("A and B must not be null")  # GemmOperation.is_mixed_input reads A/B.element
    c = dec.tensor(d.get("C"), "C")
    dd = dec.tensor(d.get("D"), "D")
    if dd is None:
        dd = c  # GemmOperation.__init__: if self.D == None: self.D = self.C
    c3 = c or _NO_TENSOR
    d3 = dd or _NO_TENSOR
    return CutlassOpRow(
        position=position,
        gemm_kind=gemm_kind,
        arch=arch,
        element_a=a[0],
        element_b=b[0],
        element_c=c3[0],
        element_d=d3[0],
        element_accumulator=acc,
        element_epilogue=dec.enum(d["element_epilogue"], "element_epilogue"),
        layout_a=a[1],
        layout_b=b[1],
        layout_c=c3[1],
        layout_d=d3[1],
        alignment_a=a[2],
        alignment_b=b[2],
        alignment_c=c3[2],
        alignment_d=d3[2],
        tile_shape=tile_shape,
        cluster_shape=cluster_shape,
        stages=stages,
        kernel_schedule=dec.enum(d.get("kernel_schedule"), "kernel_schedule"),
        epilogue_schedule=dec.enum(d.get("epilogue_schedule"), "epilogue_schedule"),
        tile_scheduler=dec.enum(d.get("tile_scheduler"), "tile_scheduler"),
        epilogue_functor=dec.enum(d.get("epilogue_functor"), "epilogue_functor"),
        swizzling_functor=dec.enum(d.get("swizzling_functor"), "swizzling_functor"),
    )


def parse_op_list(data: bytes, *, where: str = "<op list>") -> list[CutlassOpRow]:
    """Parse the bytes of a ``configs_<request_key>.json`` CUTLASS op list into one row per op,
    in list order (``position`` is the index in the list).

    Mirrors ``CUTLASSOperationSerializer.deserialize`` (torch/_inductor/codegen/cutlass/
    serialization.py) applied to each element, as ``maybe_fetch_ops``
    (torch/_inductor/codegen/cutlass/cache.py) does after ``json.load`` of the file.

    Raises :class:`~cachedb.CutlassOpListError` (``where``, reason) if the data is not JSON,
    not a list, or an element is not a JSON-object string with the structure torch requires.
    """
    try:
        ops = json.loads(data)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise CutlassOpListError(where, f"not valid JSON: {exc}") from None
    except TypeError as exc:
        raise CutlassOpListError(where, f"cannot decode {type(data).__name__}: {exc}") from None
    if not isinstance(ops, list):
        raise CutlassOpListError(where, f"top level is JSON {type(ops).__name__}, expected a list")
    dec = _Decoder()
    rows: list[CutlassOpRow] = []
    append = rows.append
    loads = json.loads
    for i, op in enumerate(ops):
        try:
            if not isinstance(op, str):
                raise _Bad(f"is JSON {type(op).__name__}, expected a string (a serialized op)")
            try:
                d = loads(op)
            except (ValueError, RecursionError) as exc:
                raise _Bad(f"is not valid JSON ({exc})") from None
            if not isinstance(d, dict):
                raise _Bad(f"is JSON {type(d).__name__}, expected an object")
            append(_row(i, d, dec))
        except _Bad as exc:
            raise CutlassOpListError(where, f"op {i}: {exc}") from None
    return rows


def infer_arch(rows: Iterable[CutlassOpRow]) -> int | None:
    """The ``arch`` shared by every row, or None if there are no rows, some row has no arch,
    or the rows disagree (torch writes one list per arch: ``get_config_request_key`` in
    torch/_inductor/codegen/cutlass/cache.py hashes the arch into the file name)."""
    archs = {row.arch for row in rows}
    if len(archs) == 1:
        (arch,) = archs
        return arch
    return None
