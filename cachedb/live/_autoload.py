"""Install cachedb in a process as soon as it has imported torch (``CACHEDB_ENABLE=1``).

Imports nothing but the standard library until torch is imported: the bootstrap
(``cachedb/_bootstrap/sitecustomize.py``) loads this file by its path in every Python process
started under an active cachedb.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import sys
from types import ModuleType
from typing import Any

log = logging.getLogger("cachedb.live")


def _install_from_environment() -> None:
    # absolute: the bootstrap loads this file by path (as ``_cachedb_autoload``), so that
    # ``cachedb`` itself is imported only here, once torch is
    from cachedb.live import install

    try:
        install()  # location from CACHEDB_URL / CACHEDB_PATH
    except Exception as exc:  # a wrong torch must not break the program
        log.warning("cachedb: not activated in process %d (%s): %s", os.getpid(), " ".join(sys.argv)[:200], exc)


class _AfterTorchImport(importlib.abc.MetaPathFinder):
    """Wraps the loader of the top-level ``torch`` package to install cachedb after it ran."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original_exec(module)
            _install_from_environment()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def arm() -> None:
    """Install now if torch is already imported, else right after ``import torch``."""
    if "torch" in sys.modules:
        _install_from_environment()
    elif not any(isinstance(f, _AfterTorchImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorchImport())
