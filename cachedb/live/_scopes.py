"""torch's cache-directory scopes honoured: ``fresh_cache()`` and ``temporary_cache_dir()``.

torch points Inductor at another cache directory for a block in two places, and cachedb keeps
what each promises:

- ``fresh_cache(cache_entries=None, dir=None, delete=True)`` (torch/_inductor/utils.py; its
  alias ``fresh_inductor_cache``): a new, empty directory for the block, so that what it
  compiles starts cold and stays apart (``InductorTestCase.setUp`` enters one for every test;
  benchmark runners time cold compiles in one; ``compile_fx`` enters one per graph under
  ``force_disable_caches``), removed after it unless ``delete=False``. Under cachedb the block
  is served by a database of its own, :data:`DATABASE` in that directory, made when the block
  first stores something: nothing stored before the block is served inside it, what the block
  compiles is served inside it, and after the block that database goes where torch's files go:
  removed with the directory, or kept in it (and served again wherever that directory is made
  the cache dir). The processes started inside the block, and Inductor's compile workers, which
  torch hands the block's directory with each job (``extra_env``,
  torch/_inductor/async_compile.py), find the block by :data:`MARKER`, a file in the directory.
  A process started inside the block keeps its isolation whatever cache dir it is given
  (:data:`ENV_FRESH`): torch alone gives a new, empty directory an empty cache, and so does
  cachedb there, with a database in that directory; only the cache dir in use outside the block
  is served by the database in use. A remote tier is neither asked nor written inside.
- ``temporary_cache_dir(directory)`` (torch/_inductor/runtime/cache_dir_utils.py): the
  directory *is* the cache, its files included: ``CompiledArtifact.save(format="unpacked")``
  unpacks its entries into it and ``CompiledArtifact.load(format="unpacked")`` reads them back
  (torch/_inductor/standalone_compile.py). Under cachedb the block runs on torch's own files, and
  the processes started inside it run without cachedb (``CACHEDB_ENABLE=0``).

Every seam asks :func:`route` which store serves it now: the active store, a fresh block's, or
none, in which case torch's own code runs on its files. None is also the answer while a store
cannot serve (:meth:`cachedb.live._store.LiveStore.serving`: a database that does not open, one
on a network file system, one locked past the timeout).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ._store import LiveStore

log = logging.getLogger("cachedb.live")

#: The variable torch reads its cache directory from (``cache_dir()``,
#: torch/_inductor/runtime/cache_dir_utils.py); both scopes set it for their block.
ENV_CACHE_DIR = "TORCHINDUCTOR_CACHE_DIR"
#: The file that marks a ``fresh_cache()`` directory: its entries are in :data:`DATABASE` beside it.
MARKER = ".cachedb-fresh-cache"
#: Set in a ``fresh_cache()`` block for the processes started in it: the cache dir in use
#: outside the block (the only one the database in use serves in those processes).
ENV_FRESH = "CACHEDB_FRESH_CACHE"
#: The database of a ``fresh_cache()`` block, in its directory.
DATABASE = "cachedb.db"
#: Databases of fresh blocks this process did not enter (it was started inside one, or is a
#: compile worker given its directory) kept open at once; the least recently used is closed.
KEEP_OPEN = 4

#: The torch modules and functions the scopes wrap, with the parameters each must have.
UTILS = "torch._inductor.utils"
CACHE_DIR_UTILS = "torch._inductor.runtime.cache_dir_utils"
FRESH_PARAMETERS = ("cache_entries", "dir", "delete")
TEMPORARY_PARAMETERS = ("directory",)

_lock = threading.RLock()
#: Directories of the ``temporary_cache_dir`` blocks this process is in (torch's files serve).
_files: list[str] = []
#: The stores of fresh blocks by directory, most recently used last.
_fresh: collections.OrderedDict[str, LiveStore] = collections.OrderedDict()
#: The fresh blocks this process entered (their stores close when the block ends).
_entered: dict[str, int] = {}
#: ``(cache dir, active store, the store that serves them)`` of the last :func:`route`.
_memo: tuple[str | None, LiveStore | None, LiveStore | None] = ("\0", None, None)


def _reset_memo() -> None:
    global _memo
    _memo = ("\0", None, None)


def route(active: LiveStore) -> LiveStore | None:
    """The store that serves Inductor now in this process, whose active store is ``active``:
    the store of the fresh block whose directory is the cache dir, else ``active``; ``None``
    inside a ``temporary_cache_dir`` block, or while that store cannot serve (torch's files
    do then). Costs a read of ``$TORCHINDUCTOR_CACHE_DIR`` while the cache dir stays as it was."""
    env = os.environ.get(ENV_CACHE_DIR)
    memo = _memo
    if memo[0] != env or memo[1] is not active:
        memo = _resolve(active, env)
    store = memo[2]
    if store is not None and store.down_until and not store.serving():
        return None
    return store


def _resolve(active: LiveStore, env: str | None) -> tuple[str | None, LiveStore | None, LiveStore | None]:
    global _memo
    with _lock:
        target: LiveStore | None = active
        if env is not None:
            where = os.path.abspath(env)  # what torch's cache_dir() makes of it
            if where in _files:
                target = None
            elif where in _fresh:
                target = _fresh[where]
                _fresh.move_to_end(where)
            elif os.path.exists(os.path.join(where, MARKER)):
                target = _open_fresh(where, active)
            else:
                outer = os.environ.get(ENV_FRESH)  # started inside a fresh block: a dir of its own
                if outer and where != os.path.abspath(outer):
                    target = _open_fresh(where, active)
        memo = (env, active, target)
        _memo = memo
    return memo


def _open_fresh(directory: str, like: LiveStore | None) -> LiveStore:
    """The store of the fresh block in ``directory`` (its :data:`DATABASE`, opened when first
    used), with ``like``'s timeout and trust; no remote tier, and every write made before it
    returns (other processes of the block see it at once). Called with ``_lock`` held."""
    store = LiveStore(
        os.path.join(directory, DATABASE),
        timeout_s=like.timeout_s if like is not None else 10.0,
        trust=like.trust if like is not None else False,
        remote=None, write_behind=False,
    )
    _fresh[directory] = store
    others = [d for d in _fresh if d not in _entered]
    for old in others[:-KEEP_OPEN] if len(others) > KEEP_OPEN else ():
        _fresh.pop(old).close()
    return store


def _enter_fresh(directory: str) -> None:
    from . import active_store

    directory = os.path.abspath(directory)
    with open(os.path.join(directory, MARKER), "w", encoding="utf-8") as f:
        f.write(f"a torch fresh_cache() directory: cachedb serves it from {DATABASE} here\n")
    with _lock:
        _entered[directory] = _entered.get(directory, 0) + 1
        if directory not in _fresh:
            _open_fresh(directory, active_store())
        _reset_memo()
    log.debug("cachedb: fresh cache block %s", directory)


def _leave_fresh(directory: str) -> None:
    directory = os.path.abspath(directory)
    with _lock:
        count = _entered.get(directory, 0) - 1
        if count > 0:
            _entered[directory] = count
            return
        _entered.pop(directory, None)
        store = _fresh.pop(directory, None)
        _reset_memo()
    if store is not None:
        store.close()


def wrap_fresh_cache(original: Callable[..., Any]) -> Callable[..., Any]:
    """``fresh_cache`` (torch/_inductor/utils.py) whose block is served by its directory's own
    database (see the module docstring); torch's context manager runs as it is around it."""

    @functools.wraps(original)
    @contextlib.contextmanager
    def fresh_cache(cache_entries: dict[str, Any] | None = None, dir: str | None = None,
                    delete: bool = True) -> Iterator[None]:
        outer = os.environ.get(ENV_FRESH)
        if outer is None:
            outer = os.environ.get(ENV_CACHE_DIR) or _default_cache_dir()
        with original(cache_entries=cache_entries, dir=dir, delete=delete):
            directory = os.environ.get(ENV_CACHE_DIR)
            inherited = os.environ.get(ENV_FRESH)
            os.environ[ENV_FRESH] = os.path.abspath(outer)
            try:
                if directory is not None:
                    _enter_fresh(directory)
            except OSError as exc:  # an unwritable directory: the active store serves, as before
                log.warning("cachedb: fresh_cache directory %s not marked (%s); cachedb serves it "
                            "from the database in use", directory, exc)
                directory = None
            try:
                yield
            finally:
                if inherited is None:
                    os.environ.pop(ENV_FRESH, None)
                else:
                    os.environ[ENV_FRESH] = inherited
                if directory is not None:
                    _leave_fresh(directory)

    fresh_cache.__wrapped__ = original  # type: ignore[attr-defined]
    return fresh_cache


def wrap_temporary_cache_dir(original: Callable[..., Any]) -> Callable[..., Any]:
    """``temporary_cache_dir`` (torch/_inductor/runtime/cache_dir_utils.py) whose block runs on
    torch's own files (see the module docstring)."""

    @functools.wraps(original)
    @contextlib.contextmanager
    def temporary_cache_dir(directory: str) -> Iterator[None]:
        with original(directory=directory):
            where = os.path.abspath(os.environ.get(ENV_CACHE_DIR) or directory)
            enable = os.environ.get("CACHEDB_ENABLE")
            with _lock:
                _files.append(where)
                _reset_memo()
            os.environ["CACHEDB_ENABLE"] = "0"  # processes started inside: torch alone
            try:
                yield
            finally:
                if enable is None:
                    os.environ.pop("CACHEDB_ENABLE", None)
                else:
                    os.environ["CACHEDB_ENABLE"] = enable
                with _lock:
                    _files.remove(where)
                    _reset_memo()

    temporary_cache_dir.__wrapped__ = original  # type: ignore[attr-defined]
    return temporary_cache_dir


def _default_cache_dir() -> str:
    """torch's cache dir when ``$TORCHINDUCTOR_CACHE_DIR`` is unset (``default_cache_dir``,
    torch/_inductor/runtime/cache_dir_utils.py)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return str(default_cache_dir())


def parameters(fn: Any) -> tuple[str, ...] | None:
    """The parameter names of ``fn`` (through ``functools.wraps`` chains), ``None`` where
    Python cannot tell."""
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def holders(target: Any, names: tuple[str, ...] = ("fresh_cache", "fresh_inductor_cache", "temporary_cache_dir")
            ) -> list[tuple[Any, str]]:
    """``(module, name)`` of every imported module that holds ``target`` under one of ``names``
    (``from torch._inductor.utils import fresh_cache`` copies the function into the importing
    module: torch's own ``test_case`` and ``compile_fx`` do, and so do tests)."""
    import sys

    found = []
    for module in list(sys.modules.values()):
        try:
            attrs = vars(module)
        except TypeError:
            continue
        for name in names:
            if attrs.get(name) is target:
                found.append((module, name))
    return found


def close_all() -> None:
    """Close every fresh block's store (``uninstall`` and process exit)."""
    with _lock:
        stores = list(_fresh.values())
        _fresh.clear()
        _entered.clear()
        _files.clear()
        _reset_memo()
    for store in stores:
        store.close()
