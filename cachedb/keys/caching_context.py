"""Keys of torch/_inductor/runtime/caching/context.py: the isolation key of the runtime-caching
memoizers.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from .._errors import BadInputError


def isolation_key(context: Mapping[str, Any]) -> str:
    """Isolation key of the runtime-caching memoizers: ``hex(json.dumps(context, sort_keys=True))[:32]``.

    Mirrors torch/_inductor/runtime/caching/context.py: _isolation_key (over the dict
    ``_isolation_context(ischema)`` returns: ``{"runtime_context": {...} | None,
    "compile_context": {...} | None}``).

    Args:
        context: the isolation context dict (JSON-serializable).

    Returns:
        32 lower-case hex characters.

    Raises:
        BadInputError: ``context`` is not a mapping or not JSON-serializable.
    """
    if not isinstance(context, Mapping):
        raise BadInputError("context", f"not a mapping: {type(context).__name__}")
    try:
        text = json.dumps(context, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise BadInputError("context", f"not JSON-serializable: {exc}") from exc
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def isolation_torch_version_hash(torch_key: bytes) -> str:
    """The ``compile_context["torch_version_hash"]`` entry: base64 of ``torch_key()``.

    Mirrors torch/_inductor/runtime/caching/context.py: _CompileContext.torch_version_hash.

    Args:
        torch_key: ``codecache.torch_key()`` (bytes).

    Returns:
        Standard base64 text (44 characters for a 32-byte key).

    Raises:
        TypeError: ``torch_key`` is not bytes.
    """
    if not isinstance(torch_key, (bytes, bytearray, memoryview)):
        raise TypeError("torch_key must be bytes")
    return base64.b64encode(bytes(torch_key)).decode()
