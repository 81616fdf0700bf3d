"""A bundled AOTAutograd entry (caching precompile's) whose forward already ran is saved
(:mod:`cachedb.live._bundled_aot`).

The entry holds a real CompiledFxGraph (a CPU graph compiled by Inductor) carrying a TritonBundle
whose statically launchable autotuner holds real SM90 kernels, compiled by Triton without a GPU.
Making launchers needs a GPU, so the autotuner is given one as ``_make_launchers`` leaves it
(``launchers`` non-empty), the state in which torch's own ``pre_save`` cannot be pickled.
"""

from __future__ import annotations

import os
import pickle
import types
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.torch
triton = pytest.importorskip("triton")

#: An H200 as Inductor describes it (``DeviceProperties``).
_H200 = dict(type="cuda", index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536,
             max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32)


def _static_results(cache_dir: Path) -> list[Any]:
    """Two compiled SM90 kernels (BLOCK 64 and 32) as Inductor's ``StaticTritonCompileResult``."""
    import triton.language as tl
    from torch._inductor.runtime.runtime_utils import triton_hash_to_path_key
    from torch._inductor.runtime.static_triton_launcher import StaticallyLaunchedCudaKernel
    from torch._inductor.runtime.triton_heuristics import StaticTritonCompileResult
    from triton import Config
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    results = []
    for block in (64, 32):
        compiled = triton.compile(
            ASTSource(fn=_double, signature={"x_ptr": "*fp32", "n": "i32", "XBLOCK": "constexpr"},
                      constexprs={"XBLOCK": block}),
            target=GPUTarget("cuda", 90, 32))
        compiled._cubin_path = str(cache_dir / triton_hash_to_path_key(compiled.hash) / f"{compiled.name}.cubin")
        assert os.path.exists(compiled._cubin_path)
        results.append(StaticTritonCompileResult(StaticallyLaunchedCudaKernel(compiled), Config({"XBLOCK": block}),
                                                 {"device_type": "cuda", "device": 0}, {}))
    return results


@triton.jit
def _double(x_ptr, n, XBLOCK: triton.language.constexpr):  # type: ignore[no-untyped-def]
    offs = triton.language.program_id(0) * XBLOCK + triton.language.arange(0, XBLOCK)
    mask = offs < n
    triton.language.store(x_ptr + offs, triton.language.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)


def _entry_after_a_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """A ``BundledCompiledForward`` whose graph's bundle holds an autotuner that has run (its
    launchers made), as a forward that hit the FX graph cache leaves it; and that autotuner."""
    import torch

    result_module = pytest.importorskip("torch._functorch._aot_autograd.aot_autograd_result")
    if not hasattr(result_module, "BundledOutputCodeLoadable"):
        pytest.skip("this torch has no BundledOutputCodeLoadable (no seam)")
    from torch._functorch._aot_autograd.aot_autograd_result import BundledCompiledForward
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.runtime.hints import DeviceProperties, HeuristicType
    from torch._inductor.runtime.runtime_utils import triton_hash_to_path_key
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    from torch._inductor.triton_bundler import StaticallyLaunchedAutotuner, TritonBundle, TritonKernelArtifacts
    from torch.fx.experimental.proxy_tensor import make_fx

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    results = _static_results(tmp_path / "triton")
    tuner = CachingAutotuner(_double, {"device": DeviceProperties(**_H200), "signature": {}},
                             [r.config for r in results], None, [], False, HeuristicType.POINTWISE,
                             size_hints={"x": 1024}, inductor_meta={"kernel_name": "triton_poi_double_0"},
                             filename=str(tmp_path / "k.py"))
    tuner.compile_results = results
    tuner.launchers = [types.SimpleNamespace(config=results[0].config)]  # what _make_launchers leaves
    # The graph bundled the BLOCK 64 kernel; the BLOCK 32 one was compiled after (as
    # _dynamic_scale_rblock compiles a halved config), so no cubin of it travels with the graph.
    bundle = TritonBundle([TritonKernelArtifacts(triton_hash_to_path_key(results[0].kernel.hash), 0, [])],
                          [StaticallyLaunchedAutotuner("key", "triton_poi_double_0", tuner)])
    graph = compile_fx_inner(make_fx(lambda x: (x.sin() + 1,))(torch.randn(8)), [torch.randn(8)])
    graph._triton_bundle = bundle
    return BundledCompiledForward(result=graph), tuner


def test_torch_alone_cannot_pickle_the_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the seam is for: torch's ``pre_save`` leaves the running autotuner in the entry."""
    entry, _ = _entry_after_a_run(tmp_path, monkeypatch)
    entry.pre_save()
    with pytest.raises(AssertionError, match="after make_launchers"):
        pickle.dumps(entry)


def test_the_entry_is_saved_with_a_clean_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under cachedb the entry pickles; its autotuner is a copy as the FX graph cache bundles
    one (no launchers, no raw cubin, only the compile results whose cubins the bundle carries),
    and the running autotuner keeps its launchers, compile results and function."""
    import cachedb

    entry, tuner = _entry_after_a_run(tmp_path, monkeypatch)
    with cachedb.installed(tmp_path / "c.db"):
        entry.pre_save()
    loaded = pickle.loads(pickle.dumps(entry))
    [saved] = loaded.result._triton_bundle.static_autotuners
    assert saved.kernel_name == "triton_poi_double_0"
    assert saved.kernel.launchers == []
    assert [r.kernel.hash for r in saved.kernel.compile_results] == [tuner.compile_results[0].kernel.hash]
    assert saved.kernel.compile_results[0].kernel.cubin_raw is None
    assert saved.kernel._reload_kernel is None

    assert len(tuner.launchers) == 1 and len(tuner.compile_results) == 2
    assert tuner.fn.fn is _double.fn and tuner.fn.__globals__ is _double.__globals__
    assert entry.result._triton_bundle.static_autotuners[0].kernel is not tuner


def test_an_entry_whose_kernels_never_ran_is_left_as_torch_made_it(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A bundle without launchers (an entry saved right after its compile) is not copied."""
    import cachedb

    entry, tuner = _entry_after_a_run(tmp_path, monkeypatch)
    tuner.launchers = []
    bundle = entry.result._triton_bundle
    with cachedb.installed(tmp_path / "c.db"):
        entry.pre_save()
    assert entry.result._triton_bundle is bundle
    assert bundle.static_autotuners[0].kernel is tuner


def test_the_seam_is_installed_exactly_where_torch_has_the_loadable() -> None:
    """``patches`` wraps ``BundledOutputCodeLoadable.pre_save`` where this torch defines it (2.11
    to 2.15) and installs nothing where it does not: the tests above skip only in that case."""
    import importlib

    from cachedb.live import _bundled_aot

    try:
        loadable = getattr(importlib.import_module(_bundled_aot.MODULE), "BundledOutputCodeLoadable", None)
    except ImportError:
        loadable = None
    wrapped = [(owner, attr) for owner, attr, _ in _bundled_aot.patches()]
    assert wrapped == ([] if loadable is None else [(loadable, "pre_save")])
