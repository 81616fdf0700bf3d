"""Activate cachedb in a process started under ``CACHEDB_ENABLE=1`` once it needs Inductor.

The bootstrap (``cachedb/_bootstrap/sitecustomize.py``) loads this file by its path in every
Python process started under an active cachedb. It imports nothing but the standard library,
and neither does what it arms:

1. after ``import torch`` has run, :class:`SeamWatch` goes on ``sys.meta_path``;
2. right after each of :data:`SEAM_MODULES` has been executed, the watch hands it to
   ``cachedb.live`` (:func:`cachedb.live._on_seam_module`), which opens the database on the
   first one and patches each module's seams as it arrives. The C++ builder
   (:data:`PATCHED_AT_ACTIVATION`) does not activate cachedb by itself: ``torch._dynamo``
   imports it, and a process may import Dynamo and never compile (some libraries import it at
   their own import). Its seam is patched when a cache module activates cachedb, before any
   compile builds C++ (Inductor imports ``codecache`` before its first build).

A process that imports torch and never imports Inductor (a DataLoader worker started with
``spawn``, ``torchrun``'s launcher, a data-prep script under ``cachedb run``) so never imports
cachedb, SQLAlchemy or Inductor: ``import torch`` costs what it costs without cachedb
(``import torch._inductor`` for the seams and ``import cachedb`` cost ~2 s there). Patching a
module right after it ran, rather than importing the others, never touches a module that is
still being executed (``torch._dynamo`` imports ``cpp_builder`` half-way through its own
import).
"""

from __future__ import annotations

# Every Python process started under cachedb runs this module, including the short ones Inductor
# spawns (its CPU ISA probe starts one per ISA on each compiling process): it imports only what
# interpreter start-up has imported already (``_thread``, ``os``, ``sys``; ``importlib.machinery``
# with site-packages), ~1 ms in all. ``logging``, ``threading``, ``typing`` and
# ``importlib.abc`` cost ~15 ms more per process; the finders below are duck-typed
# (``sys.meta_path`` asks only for ``find_spec``).
import _thread
import importlib.machinery
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any


def _warn(message: str, *args: object) -> None:
    import logging

    logging.getLogger("cachedb.live").warning(message, *args)

#: The torch modules whose attributes cachedb patches (:mod:`cachedb.live._seams`), in the order
#: torch 2.13 finishes importing them for a first ``torch.compile``: the cache directory's
#: scopes (``temporary_cache_dir``, ``fresh_cache``), the C++ builder, Dynamo's PGO profiles and
#: its precompiled packages (imported by ``torch._dynamo``), the FX graph cache, the AOTAutograd
#: cache, ``LocalAutotuneCache``, the Triton autotuner, the CUTLASS op-list cache (torch >=
#: 2.11, then 2.9/2.10).
SEAM_MODULES = (
    "torch._inductor.runtime.cache_dir_utils",
    "torch._inductor.utils",
    "torch._inductor.cpp_builder",
    "torch._dynamo.pgo",
    "torch._dynamo.package",
    "torch._inductor.codecache",
    "torch._functorch._aot_autograd.autograd_cache",
    "torch._inductor.runtime.autotune_cache",
    "torch._inductor.runtime.triton_heuristics",
    "torch._inductor.codegen.cutlass.cache",
    "torch._inductor.codegen.cuda.cutlass_cache",
    "torch._functorch.aot_autograd",
    "torch._inductor.compile_fx",
)

#: Seam modules patched when cachedb activates, whose own import does not activate it:
#: ``torch._dynamo`` imports the C++ builder half-way through its import, so under
#: ``cachedb run`` every process importing Dynamo (some libraries built on torch do) paid for
#: importing cachedb and SQLAlchemy and opening the database (~0.2 s, §9), compiling or not.
#: ``CppBuilder.build`` is looked up on the class at each build, and every build of a compile
#: comes after ``torch._inductor.codecache`` has been imported (``CppCodeCache``,
#: ``VecISA.check_build``), which activates cachedb and patches the builder then.
#: Dynamo's PGO and package modules likewise: ``torch._dynamo`` imports them, the first profile
#: is read while Dynamo traces the first frame and the first package when ``torch.compile``
#: wraps a function, both after ``torch.compile`` with Inductor imported ``codecache``. And the
#: modules of the cache directory's scopes: ``import torch._dynamo`` imports them.
PATCHED_AT_ACTIVATION = frozenset({
    "torch._inductor.cpp_builder", "torch._dynamo.pgo", "torch._dynamo.package",
    "torch._inductor.utils", "torch._inductor.runtime.cache_dir_utils",
    "torch._functorch.aot_autograd", "torch._inductor.compile_fx",
})


class _AutomaticGCOff:
    """Python's automatic garbage collection off for the block (restored after; left alone if
    the program had turned it off), around an activation.

    Importing cachedb, SQLAlchemy and the ORM models allocates ~38,000 objects, enough to
    start one more full collection in a process that holds torch, and a full collection walks
    all of torch's ~300,000 objects: in a process importing ``torch._dynamo`` under cachedb
    (2 cores, AMD EPYC VM), 6 full collections in 0.48 s against 5 in 0.31-0.34 s without
    cachedb, 5 in 0.35-0.37 s with this. The objects stay tracked: later collections see them
    as they would have. ``gc`` is imported here: start-up does not import it. The importer's
    ``_automatic_gc_off`` (cachedb/layout/importer.py) does the same; this file cannot import it, since
    nothing of cachedb's is imported before the activation it wraps."""

    def __enter__(self) -> None:
        import gc

        self.collecting = gc.isenabled()
        if self.collecting:
            gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self.collecting:
            import gc

            gc.enable()


def _install_from_environment() -> None:
    with _AutomaticGCOff():
        # absolute: the bootstrap loads this file by path (as ``_cachedb_autoload``), so that
        # ``cachedb`` itself is imported only here
        from cachedb.live import install

        try:
            install()  # location from CACHEDB_URL / CACHEDB_PATH
        except Exception as exc:  # a wrong torch must not break the program
            _warn("cachedb: not activated in process %d (%s): %s", os.getpid(), " ".join(sys.argv)[:200], exc)


class SeamWatch:
    """A ``sys.meta_path`` finder that runs cachedb's activation right after each of
    :data:`SEAM_MODULES` is executed by its own loader (found by the other finders).

    ``in_flight``: the seam modules whose code or whose callback is running now (their
    patches are made by that callback, nobody else);
    ``disarmed``: set by ``cachedb.install``/``uninstall``, after which it does nothing.
    """

    #: What ``cachedb.live`` looks for on ``sys.meta_path`` (this file is loaded by path, so
    #: the class is not importable under one name).
    cachedb_seam_watch = True

    def __init__(self) -> None:
        self.in_flight: set[str] = set()
        self.disarmed = False
        self._lock = _thread.allocate_lock()
        self._warned = False
        if hasattr(os, "register_at_fork"):  # another thread may hold the lock at a fork
            os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._lock = _thread.allocate_lock()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in SEAM_MODULES or self.disarmed:
            return None
        spec = spec_from_others(self, fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_activate(module: ModuleType) -> None:
            # in flight until its own patches are made: an activation in another thread
            # leaves it to this callback (importing it there would wait on its import lock)
            with self._lock:
                self.in_flight.add(fullname)
            try:
                exec_module(module)
                if fullname in PATCHED_AT_ACTIVATION:
                    # Out of flight first: an activation from here on patches it itself. One
                    # already under way has imported cachedb.live: it is handed over below,
                    # and patched once that activation is done.
                    with self._lock:
                        self.in_flight.discard(fullname)
                    if "cachedb.live" not in sys.modules:
                        return
                self._loaded(fullname)
            finally:
                with self._lock:
                    self.in_flight.discard(fullname)

        spec.loader.exec_module = exec_then_activate  # type: ignore[method-assign]  # this loader instance only
        return spec

    def executing(self) -> frozenset[str]:
        """The seam modules whose code, or whose activation callback, is running now."""
        with self._lock:
            return frozenset(self.in_flight)

    def _loaded(self, name: str) -> None:
        if self.disarmed:
            return
        try:
            with _AutomaticGCOff():
                from cachedb.live import _on_seam_module

                _on_seam_module(name, self)
        except Exception as exc:  # never break the user's import
            if not self._warned:
                self._warned = True
                _warn("cachedb: not activated in process %d (%s): %s", os.getpid(),
                      " ".join(sys.argv)[:200], exc)

    def disarm(self) -> None:
        self.disarmed = True
        while self in sys.meta_path:
            sys.meta_path.remove(self)


def spec_from_others(finder: object, fullname: str, path: Any, target: Any) -> importlib.machinery.ModuleSpec | None:
    """The spec of ``fullname`` from the ``sys.meta_path`` finders other than ``finder`` (what
    the import system would find without it), or ``None``."""
    for other in sys.meta_path:
        if other is finder or not hasattr(other, "find_spec"):
            continue
        spec = other.find_spec(fullname, path, target)
        if spec is not None:
            return spec  # type: ignore[no-any-return]
    return None


def find_watch() -> SeamWatch | None:
    """The armed :class:`SeamWatch` on ``sys.meta_path``, if any (duck-typed: the bootstrap
    loads this file by path, so its class is not ``cachedb.live._autoload.SeamWatch``)."""
    for finder in sys.meta_path:
        if getattr(finder, "cachedb_seam_watch", False) and not getattr(finder, "disarmed", True):
            return finder  # type: ignore[no-any-return]
    return None


def _watch_seams() -> None:
    if find_watch() is None:
        sys.meta_path.insert(0, SeamWatch())


class _AfterTorchImport:
    """Wraps the loader of the top-level ``torch`` package to arm :class:`SeamWatch` after it ran."""

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
            _watch_seams()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def arm() -> None:
    """Watch for Inductor's seam modules from the end of ``import torch`` on; if torch is
    imported already (its modules may be too), install now."""
    if "torch" in sys.modules:
        _install_from_environment()
    elif not any(isinstance(f, _AfterTorchImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorchImport())
