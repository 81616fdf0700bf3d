"""The ``cache/<system hash>`` document: split into rows and rebuilt byte for byte.

Inductor keeps autotune timings (``PersistentCache``) and other ``LocalCache`` values in one
JSON document, ``{"system": ..., "cache": ...}`` written with ``json.dumps(..., indent=4)``
(``CacheBase.update_local_cache``, torch/_inductor/codecache.py). Here the ``"cache"`` object
becomes leaves, each with a ``position`` (depth-first order in the document); rebuilding the
leaves in position order recreates every dict's key order, hence the exact bytes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .._errors import BadInputError
from ..keys import persistent_cache_inputs_key, split_inputs_key

#: The third level of a timings entry, torch 2.9 to 2.14: ``torch.get_float32_matmul_precision()``
#: (torch/_inductor/codecache.py: PersistentCache.lookup).
PRECISIONS = frozenset({"highest", "high", "medium"})
#: The same level from torch 2.15 on: torch/_inductor/utils.py: fp32_matmul_precision_key,
#: ``f"cuda:{p},mkldnn:{p}"`` with each ``p`` a per-backend fp32 precision (``"none"``,
#: ``"ieee"``, ``"tf32"``, ``"bf16"``).
PRECISION_KEY_2_15 = re.compile(r"cuda:[a-z0-9]+,mkldnn:[a-z0-9]+")


def is_precision(text: Any) -> bool:
    """Whether ``text`` is a precision key some torch release (2.9 to 2.15) writes."""
    return isinstance(text, str) and (text in PRECISIONS or PRECISION_KEY_2_15.fullmatch(text) is not None)


@dataclass(frozen=True, slots=True)
class TimingLeaf:
    """``cache[op][inputs_key][precision][choice_hash] = timing_ms`` (milliseconds)."""

    op: str
    inputs: str
    hint_override: int | None
    precision: str
    choice_hash: str
    timing_ms: float
    position: int

    @property
    def inputs_key(self) -> str:
        return persistent_cache_inputs_key(self.inputs, self.hint_override)


@dataclass(frozen=True, slots=True)
class ValueLeaf:
    """A ``LocalCache`` value at ``key_path`` (keys from the top of ``"cache"``)."""

    key_path: tuple[str, ...]
    value: Any
    position: int


def _is_timing(value: Any) -> bool:
    return type(value) is float and not math.isnan(value)


def _is_timings_op(entry: Any) -> bool:
    """Whether a top-level ``cache`` entry has the exact shape ``PersistentCache`` writes."""
    if not isinstance(entry, dict) or not entry:
        return False
    for per_inputs in entry.values():
        if not isinstance(per_inputs, dict) or not per_inputs:
            return False
        for precision, per_choice in per_inputs.items():
            if not is_precision(precision) or not isinstance(per_choice, dict) or not per_choice:
                return False
            if not all(_is_timing(t) for t in per_choice.values()):
                return False
    return True


def _split_inputs(inputs_key: str) -> tuple[str, int | None]:
    inputs, hint = split_inputs_key(inputs_key)
    if persistent_cache_inputs_key(inputs, hint) != inputs_key:
        return inputs_key, None
    return inputs, hint


def split_cache(cache: dict[str, Any], *, start: int = 0) -> tuple[list[TimingLeaf], list[ValueLeaf]]:
    """Split a ``"cache"`` object into timing and value leaves, positions from ``start``."""
    timings: list[TimingLeaf] = []
    values: list[ValueLeaf] = []
    position = start

    def walk(path: tuple[str, ...], value: Any) -> None:
        nonlocal position
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(path + (k,), v)
        else:
            values.append(ValueLeaf(path, value, position))
            position += 1

    for op, entry in cache.items():
        if _is_timings_op(entry):
            for inputs_key, per_inputs in entry.items():
                inputs, hint = _split_inputs(inputs_key)
                for precision, per_choice in per_inputs.items():
                    for choice, timing in per_choice.items():
                        timings.append(
                            TimingLeaf(op, inputs, hint, precision, choice, timing, position)
                        )
                        position += 1
        else:
            walk((op,), entry)
    return timings, values


def build_cache(timings: Iterable[TimingLeaf], values: Iterable[ValueLeaf]) -> dict[str, Any]:
    """Rebuild a ``"cache"`` object from leaves (one per path), in position order."""
    leaves: list[TimingLeaf | ValueLeaf] = [*timings, *values]
    leaves.sort(key=lambda leaf: leaf.position)
    cache: dict[str, Any] = {}
    for leaf in leaves:
        if isinstance(leaf, TimingLeaf):
            per_precision = cache.setdefault(leaf.op, {}).setdefault(leaf.inputs_key, {})
            per_precision.setdefault(leaf.precision, {})[leaf.choice_hash] = leaf.timing_ms
        else:
            node = cache
            for key in leaf.key_path[:-1]:
                node = node.setdefault(key, {})
            node[leaf.key_path[-1]] = leaf.value
    return cache


def render(system: dict[str, Any], cache: dict[str, Any]) -> str:
    """The document text exactly as ``CacheBase.update_local_cache`` writes it."""
    return json.dumps({"system": system, "cache": cache}, indent=4)


def parse(text: str | bytes, *, where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(system, cache)`` of a document. Raises :class:`~cachedb.BadInputError` naming
    ``where`` when it is not JSON or lacks the ``system``/``cache`` objects."""
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadInputError(where, f"malformed JSON: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("system"), dict) or not isinstance(
        doc.get("cache"), dict
    ):
        raise BadInputError(where, 'not an Inductor local cache ({"system": {...}, "cache": {...}})')
    if not isinstance(doc["system"].get("hash"), str):
        raise BadInputError(where, "the system object has no 'hash'")
    return doc["system"], doc["cache"]
