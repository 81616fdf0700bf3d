"""The re-tuning seams: installed by default (Triton's ``Config.__setstate__`` on every
release, the backports of torch's fixes on 2.9 to 2.12), left out with retune=True or
CACHEDB_RETUNE=1, restored on uninstall. Its effect (no runtime coordinate descent for stored
winners) needs a GPU: benchmarks/s1_warm_start.py --device cuda measures it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

_CHILD = r"""
import sys, os
import torch
import cachedb
from cachedb.live import _autotune
from torch._inductor.runtime.triton_heuristics import CachingAutotuner, Config
torch_own = (CachingAutotuner.recheck_autotune_cache, Config.__setstate__)
kwargs = {} if sys.argv[2] == "default" else {"retune": sys.argv[2] == "retune"}
cachedb.install(sys.argv[1], **kwargs)
patched = Config.__setstate__ is not torch_own[1]
backport = CachingAutotuner.recheck_autotune_cache is _autotune.recheck_autotune_cache
assert backport == (patched and _autotune.backports_needed()), (backport, patched)
cachedb.uninstall()
restored = (CachingAutotuner.recheck_autotune_cache, Config.__setstate__) == torch_own
print(patched, restored)
"""


def _run(db: Path, mode: str, env_retune: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_")}
    if env_retune is not None:
        env["CACHEDB_RETUNE"] = env_retune
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(db), mode], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def test_recheck_seam_is_installed_by_default_and_restored(tmp_path: Path) -> None:
    assert _run(tmp_path / "a.db", "default") == "True True"


def test_retune_keeps_torch_behaviour(tmp_path: Path) -> None:
    assert _run(tmp_path / "a.db", "retune") == "False True"
    assert _run(tmp_path / "a.db", "default", env_retune="1") == "False True"
    assert _run(tmp_path / "a.db", "no-retune", env_retune="1") == "True True"  # the argument wins


_WORKER_ENV_CHILD = r"""
import subprocess, sys
import torch
import cachedb
from torch._inductor.utils import python_subprocess_env
cachedb.install(sys.argv[1])
env = python_subprocess_env()  # what Inductor gives its compile workers
# a compile worker's __main__ (torch/_inductor/compile_worker/__main__.py) starts with these
probe = ("import torch._inductor.async_compile, torch._inductor.codecache, cachedb.live as l, os; "
         "print(l.is_installed(), os.environ.get('TRITON_CACHE_MANAGER'))")
print(subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout.strip())
"""


def test_inductor_compile_workers_activate_cachedb(tmp_path: Path) -> None:
    """Inductor starts its workers with PYTHONPATH = the parent's sys.path (not $PYTHONPATH):
    the bootstrap must be on sys.path, or workers keep torch's own best-config files."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CACHEDB_", "TRITON_"))}
    proc = subprocess.run([sys.executable, "-c", _WORKER_ENV_CHILD, str(tmp_path / "w.db")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "True cachedb.live._triton_cache:CacheDBTritonCacheManager"


# --- A served winner stays the winner: across a pickle, not widened, found outside the configs.
# torch's own functions on the CPU (check_autotune_cache, AutotuneCache.save, _dynamic_scale_rblock,
# Triton's Config pickling), the best configs in a real database; the GPU half (no tuning at a
# warm start) is measured by `python -m benchmarks --device cuda` (docs/autotune-seam.md).

#: an H200 as Inductor describes it (torch/_inductor/runtime/hints.py DeviceProperties fields)
_H200 = dict(type="cuda", index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536,
             max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32)


def _reduction_configs() -> list:
    from triton import Config

    return [Config({"XBLOCK": 1, "R0_BLOCK": 2048}, num_warps=16, num_stages=1),
            Config({"XBLOCK": 8, "R0_BLOCK": 512}, num_warps=8, num_stages=1)]


def _kernel_path(tmp_path: Path) -> str:
    """Where Inductor writes a generated kernel (its name is the hash of its source)."""
    path = tmp_path / "inductor" / "ab" / "cabcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstu.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    return str(path)


def _save_winner(filename: str, configs: list, winner, *, coordesc: bool) -> None:
    """Store ``winner`` as torch does at the end of tuning (``AutotuneCache.save``)."""
    from torch._inductor.runtime.autotune_cache import AutotuneCache
    from torch._inductor.runtime.triton_heuristics import hash_configs

    cache = AutotuneCache.create({"coordinate_descent_tuning": coordesc}, filename, hash_configs(configs))
    assert cache is not None
    cache.save(winner, 1_000_000, found_by_coordesc=coordesc)


@pytest.mark.torch
def test_a_served_coordesc_winner_keeps_its_mark_across_a_compile_workers_pickle(tmp_path: Path) -> None:
    """A compile worker reads the winner (``check_autotune_cache``) and sends the compiled
    autotuner back pickled: the parent's config must still say ``found_by_coordesc``, or
    ``CachingAutotuner.run`` tunes it again. Triton's own ``Config.__setstate__`` drops it."""
    import pickle

    import cachedb
    from triton import Config
    from torch._inductor.runtime.triton_heuristics import check_autotune_cache

    meta = {"coordinate_descent_tuning": True}
    filename = _kernel_path(tmp_path)
    configs = _reduction_configs()[:1]
    winner = Config({"XBLOCK": 2, "R0_BLOCK": 1024}, num_warps=8, num_stages=1)

    marked = Config({"XBLOCK": 2}, num_warps=4, num_stages=1)
    marked.found_by_coordesc = True
    assert not getattr(pickle.loads(pickle.dumps(marked)), "found_by_coordesc", False)  # torch/Triton alone

    with cachedb.installed(tmp_path / "w.db"):
        _save_winner(filename, configs, winner, coordesc=True)
        served, _, info = check_autotune_cache(list(configs), filename, meta)
        assert info["autotune_cache_state"] == "hit"
        assert served[0].kwargs == winner.kwargs and served[0].found_by_coordesc is True
        back = pickle.loads(pickle.dumps(served))  # the worker -> parent pipe
        assert back[0].found_by_coordesc is True and back[0] == served[0]
        unmarked = pickle.loads(pickle.dumps(configs[0]))
        assert not hasattr(unmarked, "found_by_coordesc")  # nothing added to an unmarked config
    assert not getattr(pickle.loads(pickle.dumps(marked)), "found_by_coordesc", False)  # restored


def _served_in_worker(filename: str, configs: list, meta: dict) -> tuple:
    """What a compile worker does for a kernel: ``check_autotune_cache``; returned through the
    pool's pipe (pickled)."""
    import os

    from torch._inductor.runtime.triton_heuristics import check_autotune_cache

    served, _, info = check_autotune_cache(list(configs), filename, meta)
    return served, info["autotune_cache_state"], os.getpid()


@pytest.mark.torch
def test_a_fork_compile_worker_serves_the_winner_with_its_mark(tmp_path: Path) -> None:
    """Inductor's fork pool (``worker_start_method="fork"``, ``AsyncCompile.process_pool``): the
    worker reads the winner from the database it inherited the path of, and the parent gets it
    back with ``found_by_coordesc``, so ``CachingAutotuner.run`` does not tune it again."""
    import os

    import cachedb
    from torch._inductor import config as inductor_config
    from torch._inductor.async_compile import AsyncCompile
    from triton import Config

    meta = {"coordinate_descent_tuning": True}
    filename = _kernel_path(tmp_path)
    configs = _reduction_configs()[:1]
    winner = Config({"XBLOCK": 2, "R0_BLOCK": 1024}, num_warps=8, num_stages=1)
    with cachedb.installed(tmp_path / "w.db"):
        _save_winner(filename, configs, winner, coordesc=True)
        with inductor_config.patch(worker_start_method="fork", compile_threads=2):
            pool = AsyncCompile.process_pool()
            try:
                served, state, pid = pool.submit(_served_in_worker, filename, configs, meta).result(timeout=120)
            finally:
                pool.shutdown()
    assert pid != os.getpid() and state == "hit"
    assert served[0].kwargs == winner.kwargs and served[0].found_by_coordesc is True


@pytest.mark.torch
def test_a_served_reduction_winner_is_not_widened_again(tmp_path: Path) -> None:
    """``_dynamic_scale_rblock`` (torch 2.11 runs it on every precompile) adds a halved-RBLOCK
    launcher to a register-bound reduction; for a winner the cache served it must add nothing
    (two launchers mean ``autotune_to_one_config`` benchmarks on the GPU). A kernel the cache
    did not serve is still widened by torch's own method."""
    import types

    import cachedb
    import triton
    import triton.language as tl
    from torch._inductor.runtime.hints import DeviceProperties, HeuristicType
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner, check_autotune_cache

    @triton.jit
    def kernel(in_ptr, out_ptr, XBLOCK: tl.constexpr, R0_BLOCK: tl.constexpr):
        pass

    meta = {"coordinate_descent_tuning": True, "kernel_name": "triton_red_fused_sum_0"}
    filename = _kernel_path(tmp_path)
    configs = _reduction_configs()[:1]
    compiled: list = []

    def autotuner(served: list, info: dict) -> CachingAutotuner:
        tuner = CachingAutotuner(kernel, {"device": DeviceProperties(**_H200), "signature": {}}, served, None, [],
                                 False, HeuristicType.REDUCTION, size_hints={"x": 65536, "r0": 2048},
                                 inductor_meta=dict(meta), filename=filename, autotune_cache_info=info)
        # A compiled binary as _dynamic_scale_rblock reads it (n_regs); compiling one needs a GPU.
        tuner.compile_results = [types.SimpleNamespace(config=c, kernel=types.SimpleNamespace(n_regs=128))
                                 for c in served]
        tuner._precompile_config = lambda config: compiled.append(config) or types.SimpleNamespace(
            config=config, kernel=types.SimpleNamespace(n_regs=32))
        tuner._make_launchers = lambda: None
        return tuner

    with cachedb.installed(tmp_path / "w.db"):
        fresh, _, miss = check_autotune_cache(list(configs), filename, meta)
        assert miss["autotune_cache_state"] == "miss"
        autotuner(fresh, miss)._dynamic_scale_rblock()
        assert [c.kwargs["R0_BLOCK"] for c in compiled] == [1024]  # torch widens what it must tune

        compiled.clear()
        _save_winner(filename, configs, configs[0], coordesc=True)
        served, _, hit = check_autotune_cache(list(configs), filename, meta)
        assert hit["autotune_cache_state"] == "hit"
        tuner = autotuner(served, hit)
        tuner._dynamic_scale_rblock()
        assert compiled == [] and len(tuner.compile_results) == 1
        assert tuner.compile_results[0].config.found_by_coordesc is True


@pytest.mark.torch
def test_a_winner_outside_the_configs_is_served(tmp_path: Path) -> None:
    """A winner of plain autotuning that ``_dynamic_scale_rblock`` added (R0_BLOCK halved, not
    one of the kernel's configs, not marked by coordinate descent) is a hit, rebuilt from the
    stored fields (torch 2.11 alone finds only configs of the list: a miss, and every config
    benchmarked again)."""
    import cachedb
    from triton import Config
    from torch._inductor.runtime.triton_heuristics import check_autotune_cache

    meta: dict = {}
    filename = _kernel_path(tmp_path)
    configs = _reduction_configs()
    halved = Config({"XBLOCK": 1, "R0_BLOCK": 1024}, num_warps=16, num_stages=1)
    with cachedb.installed(tmp_path / "w.db"):
        _save_winner(filename, configs, halved, coordesc=False)
        served, _, info = check_autotune_cache(list(configs), filename, meta)
    assert info["autotune_cache_state"] == "hit"
    assert len(served) == 1 and served[0] == halved
    assert not getattr(served[0], "found_by_coordesc", False)
