"""Which torch a key formula follows: the installed one, or a version given explicitly.

Some formulas changed between torch releases (see :data:`FORMULA_CHANGES`). Every function
whose formula changed takes a ``torch_version`` keyword: the ``torch.__version__`` of the torch
whose keys are wanted (for stored data, the one recorded in its fingerprint). Left ``None``, it
is the installed torch's version, found without importing torch (``torch/version.py`` on
``sys.path``, or ``torch.__version__`` when torch is already imported); without torch, the
newest formula (:data:`NEWEST_TESTED`).
"""

from __future__ import annotations

import functools
import importlib.machinery
import os
import re
import sys

from .._errors import BadInputError

#: The oldest and newest torch releases (major, minor) cachedb's keys are checked against
#: (``.ci/compat``; results in docs/compatibility.md).
OLDEST_TESTED = (2, 9)
NEWEST_TESTED = (2, 15)

#: The formulas that changed, each with the first release (major, minor) of its new form.
FORMULA_CHANGES = {
    "get_hash: the XPU binary format is a binary kind (codegen XPU_KERNEL_FORMAT)": (2, 11),
    "best_config_local_path: os.path.join(dirname, name), not f'{dirname}/{name}'": (2, 13),
    "torch_key: also hashes _inductor/codegen/aoti_runtime/streams.h": (2, 14),
    "system_info/system_hash: 'version' recorded without a GPU too, 'device' only with one,"
    " optional 'device_interfaces'": (2, 15),
}


_VERSION = re.compile(r"\s*v?(\d+)\.(\d+)")


def parse_torch_version(torch_version: str) -> tuple[int, int]:
    """``(major, minor)`` of a ``torch.__version__`` (``"2.15.0+cu132"`` -> ``(2, 15)``).

    Raises :class:`~cachedb.BadInputError` for text that does not start with ``MAJOR.MINOR``."""
    if not isinstance(torch_version, str):
        raise TypeError(f"torch_version must be a str, not {type(torch_version).__name__}")
    match = _VERSION.match(torch_version)
    if match is None:
        raise BadInputError("torch_version", f"not a torch version: {torch_version!r}")
    return int(match.group(1)), int(match.group(2))


@functools.cache
def _version_from_files() -> str | None:
    # PathFinder looks at the files on sys.path only: it never imports torch.
    spec = importlib.machinery.PathFinder.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    version_py = os.path.join(os.path.dirname(spec.origin), "version.py")
    try:
        with open(version_py, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return match.group(1) if match else None


def installed_torch_version() -> str | None:
    """``torch.__version__`` of the torch this interpreter would import, or ``None``; torch is
    never imported here."""
    torch = sys.modules.get("torch")
    version = getattr(torch, "__version__", None) if torch is not None else None
    if version is not None:
        return str(version)
    return _version_from_files()


def formula_version(torch_version: str | None) -> tuple[int, int]:
    """``(major, minor)`` whose formulas a key function follows: ``torch_version``'s, else the
    installed torch's, else :data:`NEWEST_TESTED`."""
    if torch_version is None:
        torch_version = installed_torch_version()
        if torch_version is None:
            return NEWEST_TESTED
    return parse_torch_version(torch_version)


def untested_torch_warning(torch_version: str) -> str | None:
    """One line saying that ``torch_version`` is outside the releases cachedb was checked
    against, or ``None`` when it is inside them (or is not a version)."""
    try:
        version = parse_torch_version(torch_version)
    except (BadInputError, TypeError):
        return None
    if OLDEST_TESTED <= version <= NEWEST_TESTED:
        return None
    low, high = (".".join(map(str, v)) for v in (OLDEST_TESTED, NEWEST_TESTED))
    return (
        f"cachedb was checked against torch {low} to {high}; torch {torch_version} is outside "
        "that range, so cache keys may differ from torch's (docs/compatibility.md)"
    )
