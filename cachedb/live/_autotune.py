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

Three more seams keep a served winner the winner on every path a kernel takes to its first
run (docs/autotune-seam.md has the measurements):

- **Across a pickle.** Triton's ``Config.__setstate__`` (triton/runtime/autotuner.py) rebuilds
  a config from its seven fields and drops ``found_by_coordesc``. A kernel compiled by a
  compile worker (``_worker_compile_triton``, torch/_inductor/async_compile.py, subprocess or
  fork) comes back pickled, so the winner the worker read from the database reaches the parent
  unmarked and ``run`` tunes it again (pytorch#181292, first bug). :func:`config_setstate`
  keeps the mark.
- **Not widened again.** torch 2.11's ``CachingAutotuner._dynamic_scale_rblock`` adds
  halved-RBLOCK launchers to a reduction whatever the autotune cache said; two launchers send
  ``run`` to ``autotune_to_one_config`` (GPU benchmarks), and a halved copy that wins is
  ``deepcopy``'d without the mark, so coordinate descent runs as well (pytorch#181292, second
  bug). :func:`dynamic_scale_rblock` is 2.13's: nothing is added to a served winner
  (``autotune_cache_state == "hit"``).
- **A winner outside the configs.** torch 2.11's ``_load_cached_autotuning``
  (runtime/autotune_cache.py) finds a stored winner only among the kernel's configs unless it
  is marked ``found_by_coordesc``: a halved-RBLOCK winner of plain autotuning is a miss, and
  every config is benchmarked again. :func:`wrap_load_cached_autotuning` rebuilds it from the
  stored fields, as torch 2.13 does (pytorch#181789), the ``configs_hash`` already matched.

This picks exactly what torch 2.13 would pick: the stored winner of the same kernel source
and configs (``configs_hash``). The three torch fixes (``recheck_autotune_cache``,
``_dynamic_scale_rblock``, ``_load_cached_autotuning``) are installed only on the releases
that lack them, torch 2.9 to 2.12 (:data:`FIXED_IN`); from 2.13 on torch's own functions run,
whatever a later release changes in them. tests/test_backports.py pins, per release, a hash
of the source each replaces. Triton's ``Config.__setstate__`` drops the mark in every Triton
torch 2.9 to 2.15 uses (3.5 to 3.9): that one is kept on every release; it sets
``found_by_coordesc`` back on a config that was pickled with it and changes nothing else.
``CACHEDB_RETUNE=1`` or ``install(retune=True)`` leaves torch's and Triton's own methods in
place, for people who want to re-measure (the new timings and best configs are then stored as
usual; timings keep their history).
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, Callable

log = logging.getLogger("cachedb.live")

#: Environment variable: ``1`` keeps torch's own re-tuning behaviour.
ENV_RETUNE = "CACHEDB_RETUNE"
_MODULE = "torch._inductor.runtime.triton_heuristics"
_AUTOTUNE_CACHE = "torch._inductor.runtime.autotune_cache"
#: The attribute that marks a config as coordinate descent's winner (``run`` skips tuning).
MARK = "found_by_coordesc"
#: The first torch release (major, minor) with the fixes :func:`recheck_autotune_cache`,
#: :func:`wrap_dynamic_scale_rblock` and :func:`wrap_load_cached_autotuning` backport.
FIXED_IN = (2, 13)


def backports_needed(torch_version: str | None = None) -> bool:
    """Whether the torch release ``torch_version`` (default: the installed one) lacks the
    fixes of :data:`FIXED_IN`."""
    from ..keys._versions import installed_torch_version, parse_torch_version

    version = torch_version if torch_version is not None else installed_torch_version()
    return version is not None and parse_torch_version(version) < FIXED_IN


def recheck_autotune_cache(self: Any, reload_kernel_from_src: Callable[[], Any]) -> None:
    """torch 2.13's ``CachingAutotuner.recheck_autotune_cache``
    (torch/_inductor/runtime/triton_heuristics.py), installed on torch 2.9 to 2.12 (see the
    module docstring)."""
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


def wrap_config_setstate(setstate: Callable[[Any, dict[str, Any]], None]) -> Callable[[Any, dict[str, Any]], None]:
    """Triton's ``Config.__setstate__`` (triton/runtime/autotuner.py), keeping
    ``found_by_coordesc`` (see the module docstring). Only a config pickled with the mark set
    gets it back: nothing else changes."""

    def config_setstate(self: Any, state: dict[str, Any]) -> None:
        setstate(self, state=state)
        if state.get(MARK):
            setattr(self, MARK, True)

    config_setstate.__wrapped__ = setstate  # type: ignore[attr-defined]
    return config_setstate


def wrap_dynamic_scale_rblock(scale: Callable[[Any], None]) -> Callable[[Any], None]:
    """``CachingAutotuner._dynamic_scale_rblock`` as torch 2.13 has it: skipped when the
    autotune cache served this kernel's winner (``autotune_cache_info["autotune_cache_state"]
    == "hit"``, set by ``cached_autotune`` or ``recheck_autotune_cache``), else torch's own."""

    def dynamic_scale_rblock(self: Any) -> None:
        info = getattr(self, "autotune_cache_info", None)
        if info and info.get("autotune_cache_state") == "hit":
            return None
        return scale(self)

    dynamic_scale_rblock.__wrapped__ = scale  # type: ignore[attr-defined]
    return dynamic_scale_rblock


def wrap_load_cached_autotuning(load: Callable[..., Any]) -> Callable[..., Any]:
    """``_load_cached_autotuning`` (torch/_inductor/runtime/autotune_cache.py), finding a
    stored winner that is not among ``configs`` as torch 2.13 does: torch's own first; when it
    finds nothing and the stored ``configs_hash`` matches, the winner is rebuilt from the
    stored fields (marked ``found_by_coordesc`` when coordinate descent is on and the record
    says so)."""

    def load_cached_autotuning(best_config: Any, configs_hash: str, configs: list[Any], inductor_meta: Any) -> Any:
        stored = dict(best_config) if isinstance(best_config, dict) else None
        found = load(best_config=best_config, configs_hash=configs_hash, configs=configs, inductor_meta=inductor_meta)
        if found is not None or stored is None or stored.get("configs_hash") != configs_hash:
            return found
        return _rebuild(stored, inductor_meta)

    load_cached_autotuning.__wrapped__ = load  # type: ignore[attr-defined]
    return load_cached_autotuning


def _rebuild(stored: dict[str, Any], inductor_meta: Any) -> Any:
    """A Triton config from a best-config record (``AutotuneCache.save``'s fields), or None
    when the record lacks ``num_warps``/``num_stages``."""
    th = importlib.import_module(_MODULE)
    record = dict(stored)
    for key in ("configs_hash", "time_taken_ms", "triton_cache_hash"):
        record.pop(key, None)
    extra_options = record.pop("extra_options", None)
    marked = bool(record.pop(MARK, False)) and bool(inductor_meta.get("coordinate_descent_tuning"))
    if "num_warps" not in record or "num_stages" not in record:
        return None
    options: dict[str, Any] = {"num_warps": record.pop("num_warps"), "num_stages": record.pop("num_stages")}
    for key in ("num_consumer_groups", "num_buffers_warp_spec"):
        value = record.pop(key, None)
        if value:
            options[key] = value
    try:
        config = th.Config(record, **options)
    except TypeError:  # a Triton without warp specialization takes no such keywords
        config = th.Config(record, num_warps=options["num_warps"], num_stages=options["num_stages"])
    if extra_options:
        config.extra_options = extra_options
    if marked:
        setattr(config, MARK, True)
    return config


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


def _checked(owner: Any, name: str, params: tuple[str, ...]) -> Any:
    """``owner.name``, which must take the parameters ``params``; raises ``TypeError`` naming
    what it takes otherwise (a release cachedb does not know: no backport is installed)."""
    import inspect

    fn = vars(owner)[name] if isinstance(owner, type) and name in vars(owner) else getattr(owner, name)
    found = tuple(inspect.signature(fn).parameters)
    if found != params:
        where = getattr(owner, "__qualname__", getattr(owner, "__name__", "?"))
        raise TypeError(f"{where}.{name} takes ({', '.join(found)}), cachedb replaces it taking ({', '.join(params)})")
    return fn


def patches() -> list[tuple[Any, str, Any]]:
    """``(owner, name, new)`` for every autotune seam (see the module docstring): on torch 2.9
    to 2.12 the three backports (what :func:`seam_owner` checks is required; the two wrapped
    ones where the installed torch defines what they wrap), and on every release Triton's
    ``Config.__setstate__`` where Triton defines it. Raises ``AttributeError``, ``ImportError``
    or ``TypeError`` (another signature) naming what does not fit."""
    th = importlib.import_module(_MODULE)
    found: list[tuple[Any, str, Any]] = []
    if backports_needed():
        owner = seam_owner()
        _checked(owner, "recheck_autotune_cache", ("self", "reload_kernel_from_src"))
        found.append((owner, "recheck_autotune_cache", recheck_autotune_cache))
        scale = getattr(owner, "_dynamic_scale_rblock", None)
        if scale is not None:
            _checked(owner, "_dynamic_scale_rblock", ("self",))
            found.append((owner, "_dynamic_scale_rblock", wrap_dynamic_scale_rblock(scale)))
        autotune_cache = importlib.import_module(_AUTOTUNE_CACHE)
        load = getattr(autotune_cache, "_load_cached_autotuning", None)
        if load is not None and hasattr(th, "Config"):
            _checked(autotune_cache, "_load_cached_autotuning", ("best_config", "configs_hash", "configs", "inductor_meta"))
            found.append((autotune_cache, "_load_cached_autotuning", wrap_load_cached_autotuning(load)))
    config_cls = getattr(th, "Config", None)
    setstate = vars(config_cls).get("__setstate__") if config_cls is not None else None
    if setstate is not None:
        _checked(config_cls, "__setstate__", ("self", "state"))
        found.append((config_cls, "__setstate__", wrap_config_setstate(setstate)))
    return found
