"""Keys of torch/_inductor/runtime/triton_heuristics.py: the hash of a kernel's candidate configs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from .._errors import BadInputError


def _config_fields(config: object, index: int) -> tuple[Mapping[str, Any], Any, Any]:
    if isinstance(config, (tuple, list)):
        if len(config) != 3:
            raise BadInputError(f"configs[{index}]", "expected (kwargs, num_warps, num_stages)")
        kwargs, num_warps, num_stages = config
    else:
        try:
            kwargs = config.kwargs  # type: ignore[attr-defined]
            num_warps = config.num_warps  # type: ignore[attr-defined]
            num_stages = config.num_stages  # type: ignore[attr-defined]
        except AttributeError as exc:
            raise BadInputError(f"configs[{index}]", f"not a Triton config: {exc}") from exc
    if not isinstance(kwargs, Mapping):
        raise BadInputError(f"configs[{index}]", f"kwargs is not a mapping: {type(kwargs).__name__}")
    return kwargs, num_warps, num_stages


def configs_hash(configs: Iterable[object]) -> str:
    """Hash of a kernel's candidate Triton configs (stored as ``"configs_hash"`` in a best config).

    Mirrors torch/_inductor/runtime/triton_heuristics.py: hash_configs (2.13 hashes only
    ``kwargs``, ``num_warps`` and ``num_stages``):
    ``hex("".join(f"{sorted(kwargs.items())} {num_warps} {num_stages}\\n" for each config))``.
    Values are formatted with Python's ``repr``/``str``, exactly as torch formats them.

    Args:
        configs: each either a tuple (or list, as JSON gives it) ``(kwargs: dict,
            num_warps: int, num_stages: int)`` or an object with ``.kwargs``,
            ``.num_warps``, ``.num_stages`` (a ``triton.Config``).

    Returns:
        64 lower-case hex characters.

    Raises:
        BadInputError: a config has the wrong shape or its kwargs are not a mapping.
    """
    hasher = hashlib.sha256()
    for index, config in enumerate(configs):
        kwargs, num_warps, num_stages = _config_fields(config, index)
        hasher.update(f"{sorted(kwargs.items())} {num_warps} {num_stages}\n".encode())
    return hasher.hexdigest()
