"""The database key of a precompiled Dynamo package: the function's source id and the system
it was built for.

torch keeps one package per function (``DiskDynamoCache``, torch/_dynamo/package.py: the
file ``dynamo/<source id>/entry``, ``CompilePackage.source_id_from_fn``) and refuses, when it
loads one, a package built on another system (``_DynamoCacheEntry.check_versions``:
``SystemInfo.check_compatibility`` compares the Python and torch versions and, on a GPU, the
toolkit version, Triton version and GPU name). Machines of a mixed fleet sharing one database
under torch's key would replace each other's package and each recompile; keyed with the
system as well, each finds its own.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

#: Between the source id and the system tag (a source id is 64 hex digits).
SEPARATOR = "."
#: Hex digits of the system tag.
TAG_LENGTH = 16


def package_system_tag(system_info: Mapping[str, Any]) -> str:
    """The first 16 hex digits of the SHA-256 of the canonical JSON of a package's
    ``SystemInfo`` fields.

    Mirrors torch/_dynamo/package.py: SystemInfo (the fields ``SystemInfo.current()`` fills:
    ``python_version``, ``torch_version``, ``toolkit_version``, ``triton_version``,
    ``gpu_name``; ``dataclasses.asdict`` of it).

    Args:
        system_info: the fields, by name (tuples and lists hash alike).

    Returns:
        16 lowercase hex digits.

    Raises:
        TypeError: a value JSON cannot encode.
    """
    text = json.dumps({k: system_info[k] for k in sorted(system_info)}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:TAG_LENGTH]


def package_key(source_id: str, system_info: Mapping[str, Any]) -> str:
    """The key of the package of ``source_id`` built on ``system_info``:
    ``<source id>.<package_system_tag(system_info)>``.

    Mirrors torch/_dynamo/package.py: CompilePackage.source_id_from_fn (its result is the
    first part, as torch names the package's directory), with the system torch checks at load.

    Args:
        source_id: ``CompilePackage.source_id_from_fn(fn)`` (64 hex digits).
        system_info: as :func:`package_system_tag` takes it.

    Returns:
        ``source_id``, ``"."``, 16 hex digits.

    Raises:
        ValueError: ``source_id`` contains the separator.
    """
    if SEPARATOR in source_id:
        raise ValueError(f"not a package source id: {source_id!r}")
    return f"{source_id}{SEPARATOR}{package_system_tag(system_info)}"


def package_source_id(key: str) -> str:
    """The source id a package key names: the key before its system tag, or the whole key
    for a package stored without one (imported from torch's files or a Mega-Cache blob).

    Mirrors (inverts) torch/_dynamo/package.py: CompilePackage.source_id_from_fn (as
    :func:`package_key` extends it).

    Args:
        key: a key of ``dynamo_packages``.

    Returns:
        The source id: ``dynamo/<source id>/entry`` is torch's file of it.

    Raises:
        Nothing: any string is split at its first separator, if any.
    """
    return key.split(SEPARATOR, 1)[0]
