"""Caching precompile never fails a compile under cachedb: a function torch cannot package, or
whose stored package torch cannot load, is compiled without one, with one warning naming it.

Where torch (2.13) fails, with ``torch._dynamo.config.caching_precompile`` on:

- **Building a package.** ``ConvertFrameAssert.__call__`` (torch/_dynamo/convert_frame.py)
  calls ``_compile(..., package=<the function's CompilePackage>)``, which enters
  ``CompilePackage.code_context(code)`` (torch/_dynamo/package.py) before tracing. A frame
  Dynamo compiles apart from the function's own (a callee it could not inline, e.g. one with a
  graph break inside) is recorded by a qualified name, ``_add_user_function`` ->
  ``_get_code_source``, which raises ``PackageError("Cannot resolve a fully qualified name for
  <code object ...>")`` for a code object torch cannot name from its module, e.g. a property's
  getter (``PreTrainedModel.loss_function`` in transformers: the lookup from the module ends at
  the ``property`` object). ``_compile`` lets it through, ``ConvertFrame.__call__`` re-raises it
  (not a graph break, ``suppress_errors`` off), and the user's call fails.
- **Loading one.** ``_optimize_catch_errors.__call__`` (torch/_dynamo/eval_frame.py) takes the
  package from ``DynamoCache.load(fn)``, then ``CompilePackage.initialize(fn, entry.dynamo)``
  (``_DynamoCacheEntry.check_versions`` -> ``SystemInfo.check_compatibility``, the inlined
  sources' checksums) and ``CompilePackage.install(backends)`` (the backends, the guards loaded
  and built). It catches ``RuntimeError`` alone, and after a failed ``install`` its fallback,
  ``initialize`` again, raises ``AssertionError("CompilePackage is already initialized")``.
- **Compiling beside an installed package.** ``install`` sets globals in the function's module
  named by the building process's ``unique_id`` counter (``__builtins_dict___0``, resume
  functions); a frame compiled afresh there (a recompile, a function without a package) draws
  the same name from this process's counter and fails (:func:`_reserve_names`).

:func:`patches` (installed and removed with the other seams of :mod:`cachedb.live._precompile`):

- ``convert_frame._compile``: a ``PackageError`` drops the function's package (not recorded,
  not saved) and the frame is compiled again with ``package=None`` and ``caching_precompile``
  off for that frame, as torch compiles it without precompile; so are the function's later
  frames. So does an ``AssertionError``: under ``caching_precompile`` torch 2.11 filters every frame's guards
  (``CheckFunctionManager.__init__``, torch/_dynamo/guards.py), which builds them twice, and
  ``Guard.set_export_info`` (torch/_guards.py) asserts that a guarded object is the same both
  times, which fails for an object made anew on each access (transformers'
  ``_PerLayerConfigView``: GPT-2 under precompile fails there with torch alone). An assertion
  that is not the package's fails the compile again without it, as torch would.
  ``strict_precompile`` keeps torch's error.
- ``DiskDynamoCache.record_package`` (``DynamoStore.record_package``): a dropped package is not
  recorded in the ``PrecompileContext``.
- Refusals (:class:`Refusals`, the database's ``precompile_refusal`` rows): a function whose
  package was dropped, once its frame has compiled without it, is recorded for this system with
  its :func:`code_identity`. A later process that finds no package but that record for the
  same code (``CompilePackage.initialize(fn, None)``) drops the package before Dynamo starts:
  every frame compiles once, without a package and ``caching_precompile`` off, as without
  precompile, with one warning naming the function. Without a refusal each start would build
  the package up to the failure again, then compile the failing frame a second time (with torch
  2.11, GPT-2's whole model traced twice, and the failed attempt's AOTAutograd graph, which
  torch does not save, compiled afresh). A changed function (its bytecode, or its library's
  version) is tried again.
- ``CompilePackage.initialize`` / ``install``, for a package that cachedb's ``load`` returned
  (:func:`note_loaded`): a failure leaves the package fresh, as a miss does (``initialize(fn,
  None)``; what ``install`` had installed is removed), the lookup counts as
  ``dynamo_cache_error``, and the function compiles afresh; the package it then builds replaces
  the stored one at exit.
  A package that installs has its globals' numbers reserved (:func:`_reserve_names`).

Each warning (logger ``cachedb.live``) is given once per function and process. A patch whose
torch function this torch lacks is left out (debug log).
"""

from __future__ import annotations

import collections
import hashlib
import inspect
import itertools
import json
import logging
import re
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger("cachedb.live")

#: ``_DynamoCacheEntry`` objects cachedb's ``DiskDynamoCache.load`` handed torch, by ``id``.
_loaded: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
#: Packages initialized from one of them: their ``install`` falls back on failure.
_from_db: weakref.WeakSet[Any] = weakref.WeakSet()
#: Packages whose ``initialize`` fell back: torch's ``install`` of the loaded backends is skipped.
_fell_back: weakref.WeakSet[Any] = weakref.WeakSet()
#: Packages dropped by a ``PackageError``: compiled with ``package=None``, never recorded.
_dropped: weakref.WeakSet[Any] = weakref.WeakSet()
#: Source ids of the functions warned about in this process.
_warned: set[str] = set()


class Refusals(Protocol):
    """Where the functions torch could not package are recorded (cachedb's store: rows of
    ``precompile_refusal`` keyed as the function's package on this system)."""

    def get(self, source_id: str) -> bytes | None:
        """The refusal recorded for ``source_id`` on this system (JSON), or ``None``."""

    def put(self, source_id: str, data: bytes) -> None:
        """Record the refusal ``data`` (JSON) for ``source_id`` on this system."""


def _const_text(const: Any) -> str:
    """A constant's text, the same in every process: a ``frozenset``'s elements sorted (its
    ``repr`` follows string hashing, which differs per process)."""
    if isinstance(const, (frozenset, set)):
        return "frozenset({" + ", ".join(sorted(_const_text(c) for c in const)) + "})"
    if isinstance(const, tuple):
        return "(" + ", ".join(_const_text(c) for c in const) + ",)"
    return repr(const)


def _code_digest(code: types.CodeType, digest: Any) -> None:
    for part in (code.co_code, code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars):
        digest.update(repr(part).encode("utf-8", "backslashreplace"))
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code_digest(const, digest)
        else:
            digest.update(_const_text(const).encode("utf-8", "backslashreplace"))


def code_identity(fn: Any) -> str | None:
    """What a refusal of ``fn`` (the function or bound method ``DynamoCache.load`` is given)
    holds for: the first 16 hex digits of a SHA-256 over its bytecode (``co_code``, names and
    constants, nested code objects included; not its file or line numbers, which differ between
    machines) and the ``__version__`` of its top-level package (a library upgrade changes what
    it calls). ``None`` for an object without ``__code__``."""
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType):
        return None
    digest = hashlib.sha256()
    _code_digest(code, digest)
    top = str(getattr(fn, "__module__", None) or "").split(".", 1)[0]
    digest.update(f"|{top}|{getattr(sys.modules.get(top), '__version__', '')}".encode())
    return digest.hexdigest()[:16]


def note_loaded(dynamo_entry: Any) -> None:
    """Mark ``dynamo_entry`` (a loaded package's ``_DynamoCacheEntry``) as cachedb's."""
    try:
        _loaded[id(dynamo_entry)] = dynamo_entry
    except TypeError:  # not weakly referenceable: torch's own behaviour for it
        pass


def _function_name(pkg: Any) -> str:
    fn = getattr(pkg, "_innermost_fn", None)
    if fn is None:
        return "<unknown function>"
    return f"{getattr(fn, '__module__', None) or '?'}.{getattr(fn, '__qualname__', repr(fn))}"


def _source_id(pkg: Any) -> str:
    try:
        return str(pkg.source_id)
    except Exception:  # noqa: BLE001 - only names the warning
        return _function_name(pkg)


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _warn_once(pkg: Any, message: str, exc: BaseException | str) -> None:
    source_id = _source_id(pkg)
    text = exc if isinstance(exc, str) else _one_line(exc)
    if source_id in _warned:
        log.debug("cachedb: " + message, _function_name(pkg), text)
        return
    _warned.add(source_id)
    log.warning("cachedb: " + message, _function_name(pkg), text)


#: The number ``unique_id`` (torch/_dynamo/bytecode_transformation.py) ends a name with.
_COUNTED = re.compile(r"_(\d{1,7})$")
#: The builtins dict a package's guards read (``OutputGraph.install_builtins_dict_in_fglobals``).
_BUILTINS_DICT = re.compile(r"__builtins_dict___\d+")


def _reserve_names(pkg: Any) -> None:
    """Advance ``unique_id``'s counter past the numbers of the globals an installed package set
    in its modules: its resume functions (``__resume_at_<offset>_<n>``, the code entries
    installed to globals) and its guards' builtins dict (``__builtins_dict___<n>``). The process
    that built the package numbered them; a frame compiled here afresh in the same module (a
    recompile of the function, another function) would draw the same name from this process's
    counter, and ``OutputGraph.install_global`` -> ``CleanupHook.create`` (torch/_dynamo/utils.py)
    raises ``AssertionError("Name '__builtins_dict___0' already exists in scope")``."""
    transformation = sys.modules.get("torch._dynamo.bytecode_transformation")
    counter = getattr(transformation, "_unique_id_counter", None)
    if counter is None:
        return
    names: list[str] = []
    modules = set()
    for entry in getattr(pkg, "_codes", {}).values():
        modules.add(getattr(entry, "python_module", None))
        if getattr(entry, "install_to_global", False):
            names += getattr(entry, "function_names", [])
    for module_name in modules:
        module = sys.modules.get(module_name) if module_name else None
        names += [name for name in list(vars(module)) if _BUILTINS_DICT.fullmatch(name)] if module else []
    numbers = [int(m.group(1)) for m in (_COUNTED.search(str(name)) for name in names) if m]
    highest = max(numbers, default=-1)
    if highest >= 0:
        current = next(counter)
        if current < highest:
            collections.deque(itertools.islice(counter, highest - current), maxlen=0)


def _refuse(refusals: Refusals | None, pkg: Any, exc: BaseException) -> None:
    """Record that torch could not package ``pkg``'s function (never raises)."""
    if refusals is None:
        return
    fn = getattr(pkg, "_innermost_fn", None)
    identity = code_identity(fn)
    if identity is None:
        return
    text = _one_line(exc)[:2000]
    data = json.dumps({"function": _function_name(pkg), "error": text, "code": identity}, sort_keys=True)
    try:
        refusals.put(_source_id(pkg), data.encode("utf-8"))
    except Exception as exc2:  # noqa: BLE001 - the compile already ran
        log.debug("cachedb: recording the precompile refusal of %s: %s", _function_name(pkg), exc2)


def _refused(refusals: Refusals | None, pkg: Any, fn: Any) -> str | None:
    """The stored error of a refusal of ``fn`` (``pkg``'s function) whose code identity is
    ``fn``'s, else ``None`` (never raises)."""
    if refusals is None:
        return None
    try:
        data = refusals.get(_source_id(pkg))
        if data is None:
            return None
        record = json.loads(data)
        if record.get("code") != code_identity(fn):
            return None
        return str(record.get("error") or "")
    except Exception as exc:  # noqa: BLE001 - a refusal that cannot be read is none
        log.debug("cachedb: reading the precompile refusal of %s: %s", _function_name(pkg), exc)
        return None


def _compile_patch(convert_frame: Any, package_error: type[BaseException],
                   refusals: Refusals | None) -> list[tuple[Any, str, Any]]:
    original = getattr(convert_frame, "_compile", None)
    try:
        parameters = inspect.signature(original).parameters if original is not None else {}
    except (TypeError, ValueError):
        parameters = {}
    if "package" not in parameters:
        log.debug("cachedb: torch._dynamo.convert_frame has no _compile(package=...): no precompile fallback")
        return []

    def drop(pkg: Any, exc: BaseException) -> None:
        _dropped.add(pkg)
        context = sys.modules.get("torch._dynamo.precompile_context")
        entries = getattr(getattr(context, "PrecompileContext", None), "_dynamo_cache_entries", None)
        if isinstance(entries, dict):
            entries.pop(_source_id(pkg), None)
        _warn_once(pkg, "torch cannot package %s for precompile (%s); it is compiled without a package", exc)

    def without_precompile(*args: Any, **kwargs: Any) -> Any:
        """``_compile`` with ``package=None`` and ``caching_precompile`` off for this frame:
        torch (2.11) filters every frame's guards under ``caching_precompile``, package or
        not, and that filtering builds the guards twice."""
        kwargs["package"] = None
        config = sys.modules.get("torch._dynamo.config")
        patch = getattr(config, "patch", None)
        if patch is None or not getattr(config, "caching_precompile", False):
            return original(*args, **kwargs)
        with patch(caching_precompile=False):
            return original(*args, **kwargs)

    def _compile(*args: Any, **kwargs: Any) -> Any:
        """``_compile`` (torch/_dynamo/convert_frame.py); a ``PackageError``, or an
        ``AssertionError`` (torch 2.11's guards under precompile), drops the function's package
        and the frame compiles as torch would without precompile (``package=None``,
        ``caching_precompile`` off), which raises the error again if it is not the package's."""
        if "skip" in kwargs:
            kwargs["skip"] += 1  # this frame, in the stack torch logs
        pkg = kwargs.get("package")
        if pkg is None:
            return original(*args, **kwargs)
        if pkg in _dropped:
            return without_precompile(*args, **kwargs)
        try:
            return original(*args, **kwargs)
        except (package_error, AssertionError) as exc:
            config = sys.modules.get("torch._dynamo.config")
            if getattr(config, "strict_precompile", False):
                raise
            drop(pkg, exc)
            failure = exc
        result = without_precompile(*args, **kwargs)
        _refuse(refusals, pkg, failure)  # the frame compiles without the package: the package's failure
        return result

    return [(convert_frame, "_compile", _compile)]


def _record_patch(package: Any) -> list[tuple[Any, str, Any]]:
    cls = package.DiskDynamoCache
    original = getattr(cls, "record_package", None)
    if original is None:
        log.debug("cachedb: DiskDynamoCache has no record_package: dropped packages may be saved")
        return []

    def record_package(self: Any, pkg: Any) -> Any:
        """``DynamoStore.record_package`` (torch/_dynamo/package.py), less a dropped package."""
        if pkg in _dropped:
            return None
        return original(self, pkg)

    return [(cls, "record_package", record_package)]


def _load_patches(package: Any, refusals: Refusals | None) -> list[tuple[Any, str, Any]]:
    cls = package.CompilePackage
    original_initialize = getattr(cls, "initialize", None)
    original_install = getattr(cls, "install", None)
    original_init = cls.__init__
    if original_initialize is None or original_install is None:
        log.debug("cachedb: CompilePackage has no initialize/install: no fallback for a package that fails to load")
        return []

    def fresh(pkg: Any, fn: Any) -> None:
        """The package as ``_optimize_catch_errors.__call__`` makes it on a miss:
        ``CompilePackage(fn=None)``, then ``initialize(fn, None)``."""
        original_init(pkg, None)
        original_initialize(pkg, fn, None)

    def failed(pkg: Any, exc: BaseException) -> None:
        counters = package.counters["dynamo_cache"]  # cachedb's load counted a hit
        counters["dynamo_cache_hit"] -= 1
        if counters["dynamo_cache_hit"] <= 0:
            del counters["dynamo_cache_hit"]
        counters["dynamo_cache_error"] += 1
        _warn_once(pkg, "the precompiled package of %s could not be loaded (%s); it is compiled afresh", exc)

    def undo_install(pkg: Any) -> None:
        """What ``install`` may have set: precompile entries on the package's code objects
        (``uninstall`` resets the function's own), the globals it installed."""
        try:
            from torch._C._dynamo.eval_frame import _reset_precompile_entries

            for code, entry in list(getattr(pkg, "_codes", {}).items()):
                _reset_precompile_entries(code)
                if getattr(entry, "code_source", None) and hasattr(package, "_lookup_code"):
                    _reset_precompile_entries(package._lookup_code(entry))
        except Exception as exc:  # noqa: BLE001 - best effort, uninstall below still runs
            log.debug("cachedb: resetting precompile entries: %s", exc)
        try:
            pkg.uninstall()
        except Exception as exc:  # noqa: BLE001
            log.debug("cachedb: uninstalling a package that failed to install: %s", exc)

    def initialize(self: Any, fn: Any, dynamo: Any = None, *args: Any, **kwargs: Any) -> Any:
        """``CompilePackage.initialize`` (torch/_dynamo/package.py); for a package cachedb
        loaded, a failure (``check_versions``, the sources' checksums) leaves it fresh; a
        fresh package of a function with a stored refusal is dropped at once."""
        if dynamo is None:
            result = original_initialize(self, fn, dynamo, *args, **kwargs)
            config = sys.modules.get("torch._dynamo.config")
            if not getattr(config, "strict_precompile", False) and (error := _refused(refusals, self, fn)) is not None:
                _dropped.add(self)
                _warn_once(self, "torch could not package %s on this system (%s, recorded); it is compiled "
                                 "without a package", error)
            return result
        if _loaded.get(id(dynamo)) is not dynamo:
            return original_initialize(self, fn, dynamo, *args, **kwargs)
        try:
            result = original_initialize(self, fn, dynamo, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a package that fails to load is a miss
            fresh(self, fn)
            _fell_back.add(self)
            failed(self, exc)
            return None
        _from_db.add(self)
        return result

    def install(self: Any, backends: Any, *args: Any, **kwargs: Any) -> Any:
        """``CompilePackage.install`` (torch/_dynamo/package.py); for a package cachedb
        loaded, a failure (guards that cannot be loaded or built, a backend or code not
        found) is undone and leaves it fresh."""
        if self in _fell_back:
            _fell_back.discard(self)
            return None
        if self not in _from_db:
            return original_install(self, backends, *args, **kwargs)
        _from_db.discard(self)
        try:
            result = original_install(self, backends, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a package that fails to load is a miss
            fn = self._innermost_fn
            undo_install(self)
            fresh(self, fn)
            failed(self, exc)
            return None
        _reserve_names(self)
        return result

    return [(cls, "initialize", initialize), (cls, "install", install)]


def patches(package: Any, refusals: Refusals | None = None) -> list[tuple[Any, str, Callable[..., Any]]]:
    """``(owner, attribute, replacement)`` of each fallback seam of ``package`` (the imported
    ``torch._dynamo.package``) and ``torch._dynamo.convert_frame``; those this torch lacks are
    left out. ``refusals``: where the functions torch could not package are recorded and read
    (``None``: nowhere, each process tries again)."""
    found: list[tuple[Any, str, Callable[..., Any]]] = []
    if not hasattr(package, "CompilePackage") or not hasattr(package, "DiskDynamoCache"):
        log.debug("cachedb: torch._dynamo.package has no CompilePackage: no precompile fallback")
        return found
    convert_frame = sys.modules.get("torch._dynamo.convert_frame")
    package_error = getattr(package, "PackageError", None)
    if convert_frame is None or not isinstance(package_error, type):
        log.debug("cachedb: torch._dynamo.convert_frame or PackageError missing: no precompile fallback")
    else:
        found += _compile_patch(convert_frame, package_error, refusals)
        if found:
            found += _record_patch(package)
    if hasattr(package, "counters"):
        found += _load_patches(package, refusals)
    return found
