"""Misses of every cause, one after another in one process under cachedb, each explained by
``cachedb misses --format json`` (run in-process) right after it; printed as JSON.

    python tests/_misses_child.py OUT.json DB [REMOTE_URL]

Each step resets Dynamo and compiles a perturbation of the first step's compile (real
``torch.compile``, CPU); the report holds per step its name, the newest miss's JSON and the
newest AOTAutograd miss's (``aot``). With REMOTE_URL the entries are also written to that
shared tier (machine A of ``cachedb misses --remote``), flushed before the report is written.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import sys
from unittest import mock

import torch

import cachedb
from cachedb.live import active_store

out_path, db_path = sys.argv[1], sys.argv[2]
cachedb.install(db_path, remote=sys.argv[3] if len(sys.argv) > 3 else None)

from click.testing import CliRunner  # noqa: E402

from cachedb.cli import main  # noqa: E402


def f(x):
    return torch.sin(x) * 2 + 1


def g(x):
    return torch.cos(x) * 2 + 1


def k(x, val):
    if val > 5:  # a guard on the size val, the same graph either way
        return x.sin() + val
    return x.sin() + val


def step(name, fn, *args, dynamic=False, patch=contextlib.nullcontext):
    torch._dynamo.reset()
    with patch():
        torch.compile(fn, dynamic=dynamic)(*args)
    active_store().flush()
    found = {}
    for kind in ("fxgraph", "aotautograd", "cpp"):
        res = CliRunner().invoke(main, ["--db", db_path, "misses", "-n", "1", "--kind", kind, "--format", "json"])
        assert res.exit_code == 0, res.output
        found[kind] = json.loads(res.stdout)
    report.append({"step": name, "misses": found["fxgraph"], "aot": found["aotautograd"], "cpp": found["cpp"]})


report: list[dict] = []
step("base", f, torch.randn(64))
step("dtype", f, torch.randn(64, dtype=torch.float64))
step("shape", f, torch.randn(32))
step("inductor_config", f, torch.randn(64),
     patch=lambda: torch._inductor.config.patch(max_autotune_pointwise=True))
step("function", g, torch.randn(64))
step("dynamo_config", f, torch.randn(64), dynamic=None,
     patch=lambda: torch._dynamo.config.patch(assume_static_by_default=False))
step("hit", f, torch.randn(64))
step("aot_config", f, torch.randn(64),  # functorch's config: the AOTAutograd key alone, the FX graphs hit
     patch=lambda: torch._functorch.config.patch(activation_memory_budget=0.5))
step("guard_base", k, torch.ones(2), 6, dynamic=True)
step("guard", k, torch.ones(2), 4, dynamic=True)
# Another torch (its sources' digest, `torch_key`) and another machine (`CacheBase.get_system`:
# a GPU where this CPU machine has none), each on the first step's compile.
codecache = torch._inductor.codecache
step("torch_key", f, torch.randn(64), patch=lambda: mock.patch.object(codecache, "torch_key", lambda: b"another torch"))
other_system = {"device": {"name": "NVIDIA H200"}, "version": {"triton": "3.6.0", "cuda": "13.0"}, "hash": "h200"}
step("system", f, torch.randn(64),
     patch=lambda: mock.patch.object(codecache.CacheBase, "get_system", staticmethod(lambda: other_system)))
# torch will not cache a graph compiled with freezing on: its AOTAutograd cache bypasses it
step("aot_bypass", f, torch.randn(64), patch=lambda: torch._inductor.config.patch(freezing=True))


# C++ kernel libraries: the first step's graph (an FX graph hit) on another host, one with
# another compiler version and CPU flags (what cachedb's host key of a library hashes), its
# library files gone from the cache dir as on a fresh machine of that host.
def another_host():
    from cachedb.fingerprint import cpp_host_parts
    from cachedb.live import _cpp_cache

    parts = cpp_host_parts()
    other = {**parts, "compiler_version": "gcc version 99.1.0 (another host)",
             "cpu_flags": " ".join(f for f in parts["cpu_flags"].split() if not f.startswith("avx512")) + " amx_tile"}
    for lib in glob.glob(os.path.join(torch._inductor.runtime.cache_dir_utils.cache_dir(), "*", "*.so")):
        os.unlink(lib)
    for cache in (codecache.CppCodeCache, codecache.CppPythonBindingsCodeCache, codecache.CppWrapperCodeCache):
        cache.cache_clear()  # each keeps its own loaded libraries
    codecache.PyCodeCache.cache_clear(purge=True)
    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.object(_cpp_cache, "host_key", lambda: "0" * 64))
    stack.enter_context(mock.patch.object(_cpp_cache, "cpp_host_parts", lambda: other))
    return stack


step("cpp_host", f, torch.randn(64), patch=another_host)


# Autotune timings: torch's own PersistentCache.lookup (what select_algorithm asks for a GEMM's
# choices), with choices that have what it reads of one (hash_key(); name, as Inductor's have).
class Choice:
    def __init__(self, choice_hash):
        self.choice_hash, self.name = choice_hash, f"{choice_hash} choice"

    def hash_key(self):
        return self.choice_hash


MM_64 = "[('cpu', 'torch.float32', 64, 32, 32, 1, 0), ('cpu', 'torch.float32', 32, 16, 16, 1, 0)]"
MM_128 = "[('cpu', 'torch.float32', 128, 32, 32, 1, 0), ('cpu', 'torch.float32', 32, 16, 16, 1, 0)]"


def timing_step(name, inputs, choices=("aten", "cpp"), precision="highest", patch=contextlib.nullcontext):
    torch.set_float32_matmul_precision(precision)
    try:
        with patch():
            codecache.PersistentCache().lookup([Choice(c) for c in choices], "mm", inputs,
                                               lambda cs: {c: 0.5 for c in cs})
    finally:
        torch.set_float32_matmul_precision("highest")
    active_store().flush()
    res = CliRunner().invoke(main, ["--db", db_path, "misses", "-n", "1", "--kind", "timings", "--format", "json"])
    assert res.exit_code == 0, res.output
    report.append({"step": name, "misses": json.loads(res.stdout), "aot": []})


timing_step("t_base", MM_64)
timing_step("t_hit", MM_64)
timing_step("t_shape", MM_128)
timing_step("t_choice", MM_64, choices=("aten", "cpp", "triton"))
timing_step("t_precision", MM_64, precision="high")
timing_step("t_system", MM_64,
            patch=lambda: mock.patch.object(codecache.CacheBase, "get_system", staticmethod(lambda: other_system)))

# Best configs: torch's own AutotuneCache (what a Triton kernel's CachingAutotuner asks for its
# best config) of two kernels' files, with candidate configs of their own (no GPU needed).
from torch._inductor.runtime.autotune_cache import AutotuneCache  # noqa: E402
from torch._inductor.runtime.triton_compat import Config  # noqa: E402

META = {"autotune_local_cache": True}
CONFIGS = [Config({"XBLOCK": 64}, num_warps=4, num_stages=1), Config({"XBLOCK": 128}, num_warps=4, num_stages=1)]
KERNEL_A = os.path.join(torch._inductor.runtime.cache_dir_utils.cache_dir(), "ka", "ckaernel0a.py")
KERNEL_B = os.path.join(torch._inductor.runtime.cache_dir_utils.cache_dir(), "kb", "ckbernel0b.py")


def best_config_step(name, filename, configs_hash, save=False, patch=contextlib.nullcontext):
    with patch():
        cache = AutotuneCache.create(META, filename, configs_hash)
        found = cache.read_best(META, CONFIGS)
        if save:
            cache.save(CONFIGS[1], 5_000_000)
    active_store().flush()
    res = CliRunner().invoke(main, ["--db", db_path, "misses", "-n", "1", "--kind", "best_config", "--format", "json"])
    assert res.exit_code == 0, res.output
    report.append({"step": name, "misses": json.loads(res.stdout), "aot": [],
                   "found": None if found is None else found.kwargs})


best_config_step("b_base", KERNEL_A, "h1" * 32, save=True)
best_config_step("b_hit", KERNEL_A, "h1" * 32)
best_config_step("b_configs", KERNEL_A, "h2" * 32)
best_config_step("b_torch_key", KERNEL_A, "h1" * 32,
                 patch=lambda: mock.patch.object(codecache, "torch_key", lambda: b"another torch"))
best_config_step("b_kernel", KERNEL_B, "h1" * 32)
active_store().flush_hits()
if active_store().remote is not None:
    assert active_store().remote.flush(60)
res = CliRunner().invoke(main, ["--db", db_path, "stats", "--format", "json"])
report.append({"step": "stats", "rows": json.loads(res.stdout)})
with open(out_path, "w") as fh:
    json.dump(report, fh, indent=1, default=str)
