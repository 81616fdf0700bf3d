"""Build a REAL PyTorch Inductor cache directory (torch 2.13, CPU) with a few tiny workloads.

Usage::

    python examples/build_cache.py CACHE_DIR [--json]

``TORCHINDUCTOR_CACHE_DIR`` is set to ``CACHE_DIR`` before torch is imported (torch reads it
lazily through ``torch._inductor.runtime.cache_dir_utils.cache_dir()``, and a few things derived
from it are cached per process, so one process builds one directory). The workloads:

a) ``mlp``: a small MLP, inference under ``torch.no_grad()``.
b) ``dynamic``: a dynamic-shape function (``dynamic=True``) whose Python code branches on
   ``x.size(0) <= 4096`` with the same ops on both sides. The branch puts the shape guard
   ``L['t0'] <= 4096`` into the ShapeEnv; it is not part of the FX/AOT cache keys (they hash
   the symbolic graph, not the guards), so calling with 64 and then 5000 rows makes Dynamo
   recompile the frame, the same FX and AOT keys get a ``guard_miss``, and each key ends up
   with two leaves: ``"2 <= L['t0'] and L['t0'] <= 4096 and 2 <= L['t1']"`` and
   ``"4097 <= L['t0'] and 2 <= L['t1']"``.
c) ``train``: forward + backward of a small module with ``requires_grad`` parameters, so
   ``aotautograd/`` holds an entry that references a forward and a backward FX entry.
d) ``gemm_autotune``: a Linear under ``torch.no_grad()`` compiled with ``max_autotune=True``,
   ``max_autotune_gemm_backends="ATEN,CPP"``, ``freezing=True``: select_algorithm benchmarks
   the ATen and C++ GEMM-template choices and ``PersistentCache`` writes the timings to
   ``cache/<system hash>``. This graph bypasses both graph caches (AOTAutograd: "Cannot
   cache a graph with freezing enabled"; FX: "mkldnn tensors unpickleable", the packed
   weight), so it is recompiled on every run, and its generated ``.py`` embeds object
   addresses (a new file each run); a warm run still skips benchmarking by reading the
   timings back from ``cache/<system hash>``.
e) ``best_config``: a best config saved through torch's own
   ``torch._inductor.runtime.autotune_cache.AutotuneCache`` next to a real generated kernel
   module (the ``.py`` of the MLP's compiled graph). Without Triton,
   ``triton_compat.Config`` is ``object``, so a minimal stand-in with the attributes
   ``AutotuneCache.save`` and ``hash_configs`` read (``kwargs``, ``num_warps``,
   ``num_stages``) and Triton's constructor signature is used; with Triton, triton's Config.

The summary (``--json``: one JSON object on the last stdout line) holds the counters of
``torch._dynamo.utils.counters["inductor"]`` plus the ``autograd_cache_*`` counters, which
torch keeps in ``counters["aot_autograd"]`` (flat under ``"counters"``; both whole groups
under ``"counter_groups"``), the files written per kind (new or changed by this run) and in
the directory, timings, and the compile threads the run used (``compile_threads``: one unless
``TORCHINDUCTOR_COMPILE_THREADS`` says otherwise).

Import this module and call :func:`run_workloads` only in a process that has not imported
torch yet, or whose ``TORCHINDUCTOR_CACHE_DIR`` already names the target directory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: One compile worker: no subprocess pool to start on a 2-core machine, and fewer moving parts.
_ENV_DEFAULTS = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}

#: The Triton-style configs offered to AutotuneCache in workload (e); the first one is "best".
_BEST_CONFIG_CANDIDATES: list[tuple[dict[str, int], int, int]] = [
    ({"XBLOCK": 512}, 2, 1),
    ({"XBLOCK": 1024}, 4, 1),
]
_BEST_CONFIG_TIME_TAKEN_NS = 1_497_000_000


def _prepare_env(cache_dir: Path) -> None:
    target = str(cache_dir.resolve())
    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if "torch" in sys.modules and (current is None or os.path.abspath(current) != target):
        raise RuntimeError(
            "torch is already imported in this process with another TORCHINDUCTOR_CACHE_DIR; "
            "run examples/build_cache.py in a subprocess instead"
        )
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = target
    for key, value in _ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)


# --------------------------------------------------------------------------- file inventory


def classify(rel: str) -> str:
    """The kind of a file under an Inductor cache dir, from its path relative to the dir."""
    parts = rel.split("/")
    name = parts[-1]
    if parts[0] == "fxgraph":
        return "fxgraph"
    if parts[0] == "aotautograd":
        return "aotautograd"
    if parts[0] == "cache" and len(parts) == 2:
        return "cache"
    if parts[0] == "locks":
        return "lock"
    if name.endswith(".best_config"):
        return "best_config"
    if name.endswith(".py"):
        return "py"
    if name.endswith(".cpp") or name.endswith(".h"):
        return "cpp"
    if name.endswith(".so"):
        return "so"
    return "other"


def _walk(root: Path) -> Iterator[Path]:
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            yield Path(dirpath, name)


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """``{relative path: (size, mtime_ns)}`` of every file under ``root``."""
    out: dict[str, tuple[int, int]] = {}
    if not root.exists():
        return out
    for path in _walk(root):
        try:
            st = path.stat()
        except OSError:
            continue
        out[path.relative_to(root).as_posix()] = (st.st_size, st.st_mtime_ns)
    return out


def _by_kind(paths: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for rel in sorted(paths):
        out.setdefault(classify(rel), []).append(rel)
    return out


# --------------------------------------------------------------------------- workloads


def _workload_mlp(torch: Any) -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)
    ).eval()
    compiled = torch.compile(model)
    x = torch.randn(4, 16)
    with torch.no_grad():
        out = compiled(x)
        ref = model(x)
    return {"ok": bool(torch.allclose(out, ref, atol=1e-5, rtol=1e-4))}


def _branchy(x: Any) -> Any:
    # Same ops on both sides: the branch only adds the guard `L['t0'] <= 4096` (or its
    # negation) to the ShapeEnv, which Dynamo, FX and AOTAutograd guards then carry.
    if x.size(0) <= 4096:
        return (x.sin() * 2).sum(0)
    return (x.sin() * 2).sum(0)


def _workload_dynamic(torch: Any) -> dict[str, Any]:
    compiled = torch.compile(_branchy, dynamic=True)
    ok = True
    for rows in (64, 128, 5000):  # 128 reuses the first variant; 5000 fails its guard
        x = torch.randn(rows, 8)
        ok &= bool(torch.allclose(compiled(x), _branchy(x), atol=1e-4, rtol=1e-4))
    return {"ok": ok, "rows": [64, 128, 5000]}


def _workload_train(torch: Any) -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    compiled = torch.compile(model)
    x = torch.randn(4, 8)
    loss = compiled(x).pow(2).mean()
    loss.backward()
    grads = [p.grad is not None for p in model.parameters()]
    return {"ok": all(grads)}


def _workload_gemm_autotune(torch: Any) -> dict[str, Any]:
    from torch._inductor import config as inductor_config

    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64).eval()
    x = torch.randn(32, 64)
    with inductor_config.patch(
        max_autotune=True, max_autotune_gemm_backends="ATEN,CPP", freezing=True
    ):
        compiled = torch.compile(model)
        with torch.no_grad():
            out = compiled(x)
            ref = model(x)
    return {"ok": bool(torch.allclose(out, ref, atol=1e-4, rtol=1e-4))}


class TritonConfigStandIn:
    """What ``AutotuneCache.save`` and ``hash_configs`` need of a ``triton.Config``.

    torch's ``triton_compat`` binds ``Config = object`` where Triton is not installed, which
    cannot carry a config, so this mirrors ``triton.Config(kwargs, num_warps=4, num_stages=3,
    num_ctas=1, maxnreg=None, pre_hook=None)``: the attributes torch reads are ``kwargs``,
    ``num_warps``, ``num_stages`` (and, with warp specialization, which needs Triton,
    ``num_consumer_groups``/``num_buffers_warp_spec``).
    """

    def __init__(
        self,
        kwargs: dict[str, Any],
        num_warps: int = 4,
        num_stages: int = 3,
        num_ctas: int = 1,
        maxnreg: int | None = None,
        pre_hook: Any = None,
    ) -> None:
        self.kwargs = kwargs
        self.num_warps = num_warps
        self.num_stages = num_stages
        self.num_ctas = num_ctas
        self.maxnreg = maxnreg
        self.pre_hook = pre_hook

    def __repr__(self) -> str:
        return f"Config({self.kwargs!r}, num_warps={self.num_warps}, num_stages={self.num_stages})"


def _config_class() -> Any:
    """triton.Config where Triton is installed, else :class:`TritonConfigStandIn`."""
    from torch._inductor.runtime import triton_compat

    if triton_compat.HAS_TRITON:
        return triton_compat.Config
    return TritonConfigStandIn


def _workload_best_config(torch: Any, kernel_py: str | None) -> dict[str, Any]:
    from torch._inductor.runtime.autotune_cache import AutotuneCache, inductor_meta_from_config
    from torch._inductor.runtime.triton_heuristics import hash_configs

    if kernel_py is None:
        return {"ok": False, "reason": "no generated kernel module to attach a best config to"}
    config_cls = _config_class()
    configs = [config_cls(dict(kw), num_warps=w, num_stages=s) for kw, w, s in _BEST_CONFIG_CANDIDATES]
    meta = inductor_meta_from_config()
    configs_hash = hash_configs(configs)
    cache = AutotuneCache.create(meta, kernel_py, configs_hash)
    if cache is None or cache.local_cache is None:
        return {"ok": False, "reason": "AutotuneCache.create gave no local cache"}
    path = cache.local_cache[1]
    # What a warm process would get (None on a cold dir).
    before = cache.read_best(meta, configs)
    read_before = None if before is None else {"kwargs": before.kwargs, "num_warps": before.num_warps}
    cache.save(configs[0], _BEST_CONFIG_TIME_TAKEN_NS, found_by_coordesc=False)
    after = cache.read_best(meta, configs)
    cache_dir = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    return {
        "ok": after is configs[0],
        "kernel_py": os.path.relpath(kernel_py, cache_dir),
        "best_config": os.path.relpath(path, cache_dir),
        "configs_hash": configs_hash,
        "config_class": config_cls.__qualname__,
        "read_before_save": read_before,
    }


def _loaded_module_files() -> set[str]:
    from torch._inductor.codecache import PyCodeCache

    files: set[str] = set()
    for mod in list(PyCodeCache.modules):
        f = getattr(mod, "__file__", None)
        if f:
            files.add(os.path.abspath(f))
    return files


def run_workloads(cache_dir: str | Path | None = None) -> dict[str, Any]:
    """Run workloads (a)-(e) against ``cache_dir`` (default: ``$TORCHINDUCTOR_CACHE_DIR``)
    and return the summary (counters, files written per kind, timings)."""
    if cache_dir is None:
        env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        if not env:
            raise RuntimeError("no cache dir given and TORCHINDUCTOR_CACHE_DIR is not set")
        cache_dir = env
    root = Path(cache_dir).resolve()
    _prepare_env(root)
    root.mkdir(parents=True, exist_ok=True)
    before = snapshot(root)

    t_start = time.perf_counter()
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    t_import = time.perf_counter() - t_start
    torch._dynamo.reset()
    counters.clear()

    seconds: dict[str, float] = {"import_torch": round(t_import, 3)}
    results: dict[str, Any] = {}

    def timed(name: str, fn: Any, *args: Any) -> None:
        t0 = time.perf_counter()
        results[name] = fn(*args)
        seconds[name] = round(time.perf_counter() - t0, 3)

    mods_before = _loaded_module_files()
    timed("mlp", _workload_mlp, torch)
    mlp_modules = sorted(_loaded_module_files() - mods_before)
    timed("dynamic", _workload_dynamic, torch)
    timed("train", _workload_train, torch)
    timed("gemm_autotune", _workload_gemm_autotune, torch)
    kernel_py = next((m for m in mlp_modules if Path(m).is_relative_to(root)), None)
    timed("best_config", _workload_best_config, torch, kernel_py)
    seconds["total"] = round(time.perf_counter() - t_start, 3)

    after = snapshot(root)
    written = [rel for rel, st in after.items() if before.get(rel) != st]
    groups = {
        group: {k: int(v) for k, v in sorted(counters[group].items())}
        for group in ("inductor", "aot_autograd")
    }
    # Flat view: every inductor counter plus AOTAutograd's cache counters (its other counters,
    # e.g. "ok"/"total", stay in counter_groups only).
    flat = dict(groups["inductor"])
    flat.update({k: v for k, v in groups["aot_autograd"].items() if k.startswith("autograd_cache")})
    written_by_kind = _by_kind(written)
    all_by_kind = _by_kind(list(after))
    return {
        "cache_dir": str(root),
        "torch": torch.__version__,
        "compile_threads": torch._inductor.config.compile_threads,
        "counters": flat,
        "counter_groups": groups,
        "files_written": written_by_kind,
        "files_written_count": {k: len(v) for k, v in written_by_kind.items()},
        "files_total_count": {k: len(v) for k, v in all_by_kind.items()},
        "workloads": results,
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cache_dir", type=Path)
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    args = parser.parse_args(argv)
    summary = run_workloads(args.cache_dir)
    if args.json:
        sys.stdout.flush()
        print(json.dumps(summary, sort_keys=True))
    else:
        print(f"cache dir: {summary['cache_dir']} (torch {summary['torch']})")
        print("counters:", json.dumps(summary["counters"], sort_keys=True))
        print("files written:", json.dumps(summary["files_written_count"], sort_keys=True))
        print("files in dir: ", json.dumps(summary["files_total_count"], sort_keys=True))
        for name, res in summary["workloads"].items():
            print(f"  {name:14s} {summary['seconds'][name]:7.2f}s  {json.dumps(res, sort_keys=True)}")
        print(f"total {summary['seconds']['total']:.1f}s")
    failed = [n for n, r in summary["workloads"].items() if not r.get("ok")]
    if failed:
        print(f"workloads failed: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
