"""A bundled AOTAutograd entry is saved even when its forward has already run.

With ``torch._dynamo.config.caching_precompile`` (``cachedb.install(precompile=True)``) or
``torch._functorch.config.bundled_autograd_cache`` on, torch (2.11 to 2.15) bundles the compiled
graphs into the AOTAutograd entry (``should_bundle_autograd_cache``,
torch/_functorch/_aot_autograd/autograd_cache.py). A training graph's entry is made and saved
once its backward is compiled, lazily at the first ``backward()``: its forward has run by then.
Where that forward's FX graph was an FX graph cache hit, its Triton kernels are the statically
launchable autotuners of the cached graph's ``TritonBundle`` themselves
(``TritonBundler.load_autotuners``, torch/_inductor/triton_bundler.py), and running them made
their launchers. ``BundledOutputCodeLoadable.pre_save``
(torch/_functorch/_aot_autograd/aot_autograd_result.py) copies the output code with that bundle,
and pickling it fails in ``CachingAutotuner.__getstate__`` ("pickle should not be called with
after make_launchers()"). torch logs "AOTAutograd cache unable to serialize compiled graph",
saves nothing, and every later process compiles the graph afresh: with GPT-2 under precompile on
an H200, the training graph of a function whose package torch cannot build (compiled without
its package, beside its FX graphs stored by the failed attempt), ~10 s of every warm start.

:func:`patches` wraps ``pre_save``: after torch's own, a static autotuner of the copy's bundle
whose kernel has launchers is replaced by :func:`clean_copy` of it, made as
``TritonBundler.put_static_autotuner`` makes the one it bundles at compile time. A bundle
without such a kernel is left as torch made it.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("cachedb.live")

#: The module of ``BundledOutputCodeLoadable`` (torch 2.11 to 2.15).
MODULE = "torch._functorch._aot_autograd.aot_autograd_result"


def clean_copy(kernel: Any, bundled_hashes: set[str]) -> Any | None:
    """A picklable copy of a ``CachingAutotuner`` (torch/_inductor/runtime/triton_heuristics.py)
    that has made its launchers, as ``TritonBundler.put_static_autotuner`` copies one for the FX
    graph cache: ``prepare_for_pickle``, ``copy.deepcopy``, ``prepare_for_caching``, no
    ``_reload_kernel``; ``kernel`` itself is restored and keeps running. The copy keeps the
    compile results whose cubins the bundle carries (``bundled_hashes``: its
    ``TritonKernelArtifacts.kernel_hash`` values, ``triton_hash_to_path_key`` of a kernel's hash),
    the only ones ``reload_cubin_path`` finds in a fresh cache directory; ``None`` where none is
    left (the kernel is then compiled from its source at load, as an unbundled one is)."""
    from torch._inductor.runtime.runtime_utils import triton_hash_to_path_key

    old = kernel.prepare_for_pickle()
    try:
        new = copy.deepcopy(kernel)
    finally:
        kernel.restore_after_unpickle(old)
    new.compile_results = [r for r in new.compile_results
                           if triton_hash_to_path_key(r.kernel.hash) in bundled_hashes]
    if not new.compile_results:
        return None
    new.prepare_for_caching()
    new._reload_kernel = None
    return new


def clean_bundle(bundle: Any) -> Any:
    """``bundle`` (a ``TritonBundle``, torch/_inductor/triton_bundler.py) with every static
    autotuner whose kernel has launchers replaced by :func:`clean_copy` (dropped where the copy
    keeps no compile result); ``bundle`` itself where none has launchers."""
    autotuners = getattr(bundle, "static_autotuners", None) or []
    if not any(getattr(a.kernel, "launchers", None) for a in autotuners):
        return bundle
    hashes = {a.kernel_hash for a in bundle.kernel_artifacts}
    kept = []
    for autotuner in autotuners:
        if not autotuner.kernel.launchers:
            kept.append(autotuner)
        elif (kernel := clean_copy(autotuner.kernel, hashes)) is not None:
            kept.append(dataclasses.replace(autotuner, kernel=kernel))
    return dataclasses.replace(bundle, static_autotuners=kept)


def patches() -> list[tuple[Any, str, Callable[..., Any]]]:
    """``(owner, attribute, replacement)``: ``BundledOutputCodeLoadable.pre_save``; none where
    this torch lacks it (debug log)."""
    try:
        module = importlib.import_module(MODULE)
        loadable = module.BundledOutputCodeLoadable
        original = loadable.pre_save
        importlib.import_module("torch._inductor.runtime.runtime_utils").triton_hash_to_path_key  # noqa: B018
    except (ImportError, AttributeError) as exc:
        log.debug("cachedb: no BundledOutputCodeLoadable.pre_save seam (%s)", exc)
        return []

    def pre_save(self: Any) -> None:
        """``BundledOutputCodeLoadable.pre_save``, then the copy's Triton bundle made
        picklable (:func:`clean_bundle`)."""
        original(self)
        bundle = getattr(self.result, "_triton_bundle", None)
        if bundle is not None:
            cleaned = clean_bundle(bundle)
            if cleaned is not bundle:
                self.result._triton_bundle = cleaned

    return [(loadable, "pre_save", pre_save)]
