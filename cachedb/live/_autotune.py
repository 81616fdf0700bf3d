"""No runtime re-tuning when the database already knows the winner.

The seam: ``CachingAutotuner.recheck_autotune_cache`` (torch/_inductor/runtime/
triton_heuristics.py), which Inductor calls when a statically launchable autotuner comes back
from an FX graph cache hit (``StaticAutotunerFuture.result``, torch/_inductor/codecache.py). It
reads the stored best config (``check_autotune_cache`` → ``AutotuneCache.read_best``, served by
cachedb's best-config backend) and swaps it in.

Up to torch 2.11 the swap happens only when the autotuner holds several configs
(``if len(cached_configs) == 1 and len(configs) > 1``) and the matched config is not marked
``found_by_coordesc``. A pointwise or reduction kernel that coordinate descent started from a
single config therefore keeps its start config after an FX hit, and ``CachingAutotuner.run``
tunes it again (``coordinate_descent_tuning`` → ``CoordescTuner.autotune``), benchmarking on
the GPU each time a process starts. torch 2.12 fixed this upstream (pytorch#173391); 2.13's
``recheck_autotune_cache`` is what :func:`recheck_autotune_cache` mirrors:

- any stored best config is swapped in (one config or several), and the matched compile
  result is marked with the stored ``found_by_coordesc``, so ``run`` does not tune again;
- a winner that is not among the bundled compile results (found by coordinate descent after
  the FX entry was saved) is compiled with ``_precompile_config``; its Triton binary is then a
  cache hit from the database (:mod:`cachedb.live._triton_cache`), not a compile.

This picks exactly what torch 2.13 would pick: the stored winner of the same kernel source
and configs (``configs_hash``). ``CACHEDB_RETUNE=1`` or ``install(retune=True)`` leaves
torch's own method in place, for people who want to re-measure (the new timings and best
configs are then stored as usual; timings keep their history).
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, Callable

log = logging.getLogger("cachedb.live")

#: Environment variable: ``1`` keeps torch's own re-tuning behaviour.
ENV_RETUNE = "CACHEDB_RETUNE"
_MODULE = "torch._inductor.runtime.triton_heuristics"


def recheck_autotune_cache(self: Any, reload_kernel_from_src: Callable[[], Any]) -> None:
    """torch 2.13's ``CachingAutotuner.recheck_autotune_cache``, for every torch cachedb
    supports (see the module docstring)."""
    th = importlib.import_module(_MODULE)
    assert self.is_statically_launchable()
    configs = [result.config for result in self.compile_results]
    cached_configs, _, autotune_cache_info = th.check_autotune_cache(configs, self.filename, self.inductor_meta)
    self.autotune_cache_info = autotune_cache_info
    if len(cached_configs) != 1:
        return
    best_config = cached_configs[0]
    found_by_coordesc = getattr(best_config, "found_by_coordesc", False)
    best_config_hash = th.triton_config_to_hashable(best_config)
    for compile_result in self.compile_results:
        if th.triton_config_to_hashable(compile_result.config) == best_config_hash:
            compile_result.config.found_by_coordesc = found_by_coordesc
            self.compile_results = [compile_result]
            return
    # The winner was found after the bundle was saved (coordinate descent, or
    # _dynamic_scale_rblock): compile it now; its binary comes from Triton's cache.
    with th.dynamo_timed("CachingAutotuner.slow_precompile_config"):
        if self.fn.fn is None:
            self.fn = reload_kernel_from_src().fn
        self.compile_results = [self._precompile_config(best_config)]
    log.debug("best config of %s compiled from the stored winner", getattr(self, "filename", "?"))


def seam_owner() -> Any:
    """``CachingAutotuner``, checked for what :func:`recheck_autotune_cache` uses. Raises
    ``AttributeError``/``ImportError`` naming what is missing."""
    th = importlib.import_module(_MODULE)
    owner = th.CachingAutotuner
    for attr in ("recheck_autotune_cache", "is_statically_launchable", "_precompile_config"):
        getattr(owner, attr)
    for attr in ("check_autotune_cache", "triton_config_to_hashable", "dynamo_timed"):
        getattr(th, attr)
    return owner
