"""cachedb's activation hook for child processes (``CACHEDB_ENABLE=1``).

This directory is put on ``PYTHONPATH`` by ``cachedb.install()`` and ``cachedb run``. When
``CACHEDB_ENABLE=1``, cachedb is activated when the process imports the first of Inductor's
cache modules (:mod:`cachedb.live._autoload`): nothing is imported before that, so Python
processes that never compile (or never use torch) pay nothing. Any other
``sitecustomize`` further down ``sys.path`` is still run.
"""

import importlib.machinery  # not importlib.util: it imports contextlib and more (~5 ms)
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name: str, path: str) -> object:
    """Execute the Python file ``path`` as a module named ``name`` (not put in ``sys.modules``),
    with its cached bytecode."""
    loader = importlib.machinery.SourceFileLoader(name, path)
    module = type(sys)(name)
    module.__file__ = path
    module.__loader__ = loader
    loader.exec_module(module)
    return module


def _run_next_sitecustomize() -> None:
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == _HERE:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            _load("_cachedb_next_sitecustomize", candidate)
            return


def _arm() -> None:
    """Load ``cachedb/live/_autoload.py`` by its path, not as ``cachedb.live._autoload``:
    importing the ``cachedb`` package (SQLAlchemy and all, ~0.4 s) is left to the moment the
    process imports Inductor's cache modules. Most Python processes started under cachedb
    never do (Inductor's CPU ISA probe, compiler checks, spawn DataLoader workers)."""
    path = os.path.join(os.path.dirname(_HERE), "live", "_autoload.py")
    _load("_cachedb_autoload", path).arm()  # type: ignore[attr-defined]


if os.environ.get("CACHEDB_ENABLE") == "1":
    try:
        _arm()
    except Exception as exc:  # never break the interpreter's start
        sys.stderr.write(f"cachedb: activation hook failed: {exc}\n")

_run_next_sitecustomize()
