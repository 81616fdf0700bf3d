"""One warm-start sample of §1, in a fresh interpreter (torch keeps in-process caches).

``python -m benchmarks._warm_child MODE --cache-dir DIR --t0 EPOCH [--db PATH] [--mega FILE]
[--save-mega FILE] [--models mlp,dynamic,gemm]`` where ``MODE`` is

- ``files``: compile with ``TORCHINDUCTOR_CACHE_DIR=DIR`` (cold if DIR is empty, warm from
  local files if it is populated);
- ``mega``: ``torch.compiler.load_cache_artifacts(FILE bytes)`` into the empty DIR, then
  compile;
- ``cachedb``: compile with the database: ``with cachedb.installed(db)`` (or, if the parent
  passes ``--cachedb-via export``, ``cachedb.layout.exporter.export_cache_dir(db, DIR)`` first);
- ``cachedb-cold``: like ``cachedb`` with an empty database (cold compile writing to it).

``--precompile`` (``cachedb`` and ``cachedb-cold``): ``cachedb.installed(db, precompile=True)``,
torch's caching precompile on (the packages compiled are stored when the block ends); for
``files`` the parent sets ``TORCH_CACHING_PRECOMPILE=1`` and ``--save-precompile`` calls
``torch.compiler.save_cache_artifacts()`` after the workloads (untimed), the only call in which
torch writes them. The workload ``rows`` (the Dynamo section, :mod:`benchmarks.s10_dynamo`) is a function
called with 7, 33 and 1,024 rows, compiled static first: with a PGO profile
(``TORCH_COMPILE_JOB_ID`` set by the parent) Dynamo compiles it dynamic at once. The report
holds Dynamo's counters: ``frames`` compiled, ``unique_graphs``, ``dynamo_cache`` hits and misses.

``--device cuda`` runs the GPU workloads (:mod:`benchmarks._gpu_workloads`) with Inductor's
parallel compile workers; ``cpu`` (default) runs ``examples/build_cache.py``'s workloads with
one compile thread. ``first_call_s`` is the sum of the workloads' first calls (compile and
run): the "compile time of first calls" the issues compare.

On ``cuda`` the report's ``tuning_calls`` counts the calls of ``CoordescTuner.autotune`` and
``InductorBenchmarker.benchmark_gpu`` (:mod:`benchmarks._tuning_calls`), beside the counter
growth ``runtime_*`` measures.

``--t0`` is the parent's ``time.time()`` just before it started this process, so the reported
``wall_s`` covers interpreter start, imports, setup and the compiles (not the teardown, nor
``--save-mega``). Prints one JSON line with the breakdown: imports, setup, each model, time in
C++ builds (``CppBuilder.build``: the kernels' ``.so`` files are not in any cache but the
directory's own), cache hit/miss counters, Inductor's top ``dynamo_timed`` phases and those of
:data:`NAMED_PHASES`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
#: Inductor's ``dynamo_timed`` phases every report holds (seconds, summed over the process):
#: Dynamo's tracing of bytecode, which no compile cache serves (precompile skips it), and the
#: compiler backend (AOTAutograd and Inductor), what the FX graph and AOTAutograd caches serve.
NAMED_PHASES = ("bytecode_tracing", "OutputGraph.call_user_compiler")


def _load_build_cache() -> Any:
    """examples/build_cache.py as a module (its workload functions are reused)."""
    spec = importlib.util.spec_from_file_location("_bench_build_cache", REPO_ROOT / "examples" / "build_cache.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record_launchers(out: dict[str, str]) -> None:
    """After each ``CachingAutotuner.run``, ``out[kernel name] = str(config of the launcher it
    ran)`` (torch/_inductor/runtime/triton_heuristics.py): the configs a run ended up with."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    original = CachingAutotuner.run

    def run(self: Any, *a: Any, **k: Any) -> Any:
        result = original(self, *a, **k)
        if self.launchers:
            name = f"{self.inductor_meta.get('kernel_name')}:{os.path.basename(self.filename or '')}"
            out[name] = str(self.launchers[0].config)
        return result

    CachingAutotuner.run = run  # type: ignore[method-assign]


def _trace_coordesc(path: str) -> None:
    """Record each runtime coordinate descent (``CachingAutotuner.coordinate_descent_tuning``,
    torch/_inductor/runtime/triton_heuristics.py): kernel, start config, what the autotune
    cache said, whether the autotuner came statically launchable from a bundle."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    original = CachingAutotuner.coordinate_descent_tuning

    def traced(self: Any, launcher: Any, *a: Any, **k: Any) -> Any:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({
                "kernel": self.inductor_meta.get("kernel_name"),
                "start_config": str(launcher.config),
                "found_by_coordesc": getattr(launcher.config, "found_by_coordesc", None),
                "autotune_cache_info": {k2: str(v) for k2, v in (getattr(self, "autotune_cache_info", None) or {}).items()},
                "n_configs": len(self.configs or []),
                "static": self.is_statically_launchable() if self.compile_results else None,
                "filename": os.path.basename(self.filename or ""),
            }) + "\n")
        return original(self, launcher, *a, **k)

    CachingAutotuner.coordinate_descent_tuning = traced  # type: ignore[method-assign]


def _count_runtime_tuning(runtime: dict[str, int]) -> None:
    """Count the benchmarks tuning really runs in this process: the growth of Inductor's
    ``coordesc_tuning_bench`` and ``benchmark_gpu`` counters *inside*
    ``CachingAutotuner._coordinate_descent_tuning`` and ``autotune_to_one_config``
    (torch/_inductor/runtime/triton_heuristics.py). The counters alone cannot say it: an FX
    graph cache hit adds the cached graph's compile-time counts to them
    (``counters["inductor"] += graph.counter_deltas``, codecache.py), so a warm start that
    tunes nothing still reports the cold compile's benchmarks."""
    from torch._dynamo.utils import counters
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    def total() -> tuple[int, int]:
        c = counters["inductor"]
        return c["coordesc_tuning_bench"], sum(v for k, v in c.items() if "benchmark_gpu" in k)

    for name in ("_coordinate_descent_tuning", "autotune_to_one_config"):
        original = getattr(CachingAutotuner, name, None)
        if original is None:
            continue

        def counted(self: Any, *a: Any, _original: Any = original, **k: Any) -> Any:
            before = total()
            try:
                return _original(self, *a, **k)
            finally:
                after = total()
                runtime["runtime_coordesc_tuning_bench"] += after[0] - before[0]
                runtime["runtime_benchmark_gpu"] += after[1] - before[1]

        setattr(CachingAutotuner, name, counted)


def _rows(x: Any) -> Any:
    return (x.sin() * 2).sum(0)


def _workload_rows(torch: Any) -> dict[str, Any]:
    """A function called with 7, 33 and 1,024 rows, compiled without ``dynamic=True``: Dynamo
    compiles it static, then recompiles it dynamic at the second size, unless a PGO profile
    says so from the start."""
    compiled = torch.compile(_rows)
    ok = True
    for n in (7, 33, 1024):
        x = torch.randn(n, 8)
        ok &= bool(torch.allclose(compiled(x), _rows(x), atol=1e-4, rtol=1e-4))
    return {"ok": ok}


def _tiny(x: Any) -> Any:
    return x.sin() * 2 + 1


def _workload_tiny(torch: Any) -> dict[str, Any]:
    """The smallest real compile, for ``--quick`` runs: one pointwise graph of one static shape
    (one FX graph, one C++ kernel on CPU)."""
    x = torch.randn(64, 8)
    return {"ok": bool(torch.allclose(torch.compile(_tiny)(x), _tiny(x), atol=1e-4, rtol=1e-4))}


#: The factories of the seams of cachedb's misses (cachedb/live/_misses.py): each is given the
#: torch function it wraps last, and returns the function installed in its place.
MISS_SEAMS = ("wrap_prepare_key", "wrap_load_with_key", "wrap_aot_debug_lines", "wrap_aot_lookup",
              "wrap_aot_try_load", "wrap_aot_cache_key")


def _time_miss_seams(spent: dict[str, float]) -> None:
    """Have each seam cachedb installs to record misses and key factors add, to
    ``spent["s"]``, the seconds it takes less those of the torch function it calls (what the
    feature costs a process; ``spent["calls"]``: its calls). Done before cachedb installs its
    seams: the factories of :data:`MISS_SEAMS` are wrapped."""
    import functools

    from cachedb.live import _misses

    def timed_factory(factory: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(factory)
        def make(*args: Any) -> Any:
            *head, original = args
            inner_s = [0.0]

            @functools.wraps(original)
            def inner(*a: Any, **k: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return original(*a, **k)
                finally:
                    inner_s[0] += time.perf_counter() - t0

            wrapper = factory(*head, inner)

            @functools.wraps(wrapper)
            def outer(*a: Any, **k: Any) -> Any:
                t0, before = time.perf_counter(), inner_s[0]
                try:
                    return wrapper(*a, **k)
                finally:
                    spent["s"] += time.perf_counter() - t0 - (inner_s[0] - before)
                    spent["calls"] += 1

            return outer

        return make

    for name in MISS_SEAMS:
        factory = getattr(_misses, name, None)
        if factory is not None:
            setattr(_misses, name, timed_factory(factory))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["files", "mega", "cachedb", "cachedb-cold"])
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--t0", type=float, required=True)
    parser.add_argument("--db")
    parser.add_argument("--remote", help="cachedb's remote tier URL (with --db: the local file)")
    parser.add_argument("--mega")
    parser.add_argument("--save-mega")
    parser.add_argument("--cachedb-via", choices=["installed", "export"], default="installed")
    parser.add_argument("--models", default="mlp,dynamic,gemm")
    parser.add_argument("--precompile", action="store_true",
                        help="cachedb modes: cachedb.installed(db, precompile=True)")
    parser.add_argument("--save-precompile", action="store_true",
                        help="files: torch.compiler.save_cache_artifacts() after the workloads (writes the packages)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--trace-coordesc", help="write a JSON line per runtime coordinate descent to this file")
    parser.add_argument("--dump-launchers", help="write {kernel name: config of its launcher} after the workloads")
    args = parser.parse_args(argv)

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.abspath(args.cache_dir)
    if args.device == "cpu":
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    seconds: dict[str, float] = {}

    t = time.perf_counter()
    import torch
    import torch._inductor.codecache  # noqa: F401  (part of what any compile imports)
    from torch._dynamo.utils import compilation_time_metrics, counters
    from torch._inductor import cpp_builder

    seconds["import_torch"] = time.perf_counter() - t

    # Time spent compiling C++ (kernels and their wrappers): every build goes through here.
    cpp = {"s": 0.0, "n": 0}
    original_build = cpp_builder.CppBuilder.build

    def timed_build(self: Any) -> Any:
        t_b = time.perf_counter()
        try:
            return original_build(self)
        finally:
            cpp["s"] += time.perf_counter() - t_b
            cpp["n"] += 1

    cpp_builder.CppBuilder.build = timed_build  # type: ignore[method-assign]

    runtime_tuning = {"runtime_coordesc_tuning_bench": 0, "runtime_benchmark_gpu": 0}
    tuning_calls: dict[str, Any] = {}
    if args.device == "cuda":
        from benchmarks._tuning_calls import count_tuning_calls

        _count_runtime_tuning(runtime_tuning)
        tuning_calls = count_tuning_calls()
    if args.trace_coordesc:
        _trace_coordesc(args.trace_coordesc)
    launchers: dict[str, str] = {}
    if args.dump_launchers:
        _record_launchers(launchers)

    t = time.perf_counter()
    bc = _load_build_cache()
    workloads: dict[str, Callable[[Any], dict[str, Any]]] = {
        "mlp": bc._workload_mlp,
        "dynamic": bc._workload_dynamic,
        "gemm": bc._workload_gemm_autotune,
        "rows": _workload_rows,
        "tiny": _workload_tiny,
    }
    if args.device == "cuda":
        from benchmarks._gpu_workloads import WORKLOADS

        workloads.update(WORKLOADS)
    seconds["import_workloads"] = time.perf_counter() - t

    scope: AbstractContextManager[Any] = nullcontext()
    miss_seams = {"s": 0.0, "calls": 0}
    t = time.perf_counter()
    if args.mode == "mega":
        info = torch.compiler.load_cache_artifacts(Path(args.mega).read_bytes())
        assert info is not None, "load_cache_artifacts loaded nothing"
        seconds["setup"] = time.perf_counter() - t
    elif args.mode in ("cachedb", "cachedb-cold"):
        import cachedb

        seconds["import_cachedb"] = time.perf_counter() - t
        _time_miss_seams(miss_seams)
        t = time.perf_counter()
        if args.cachedb_via == "export" and args.mode == "cachedb":
            from cachedb.layout.exporter import export_cache_dir

            with cachedb.CacheDB(args.db) as db:
                export_cache_dir(db, args.cache_dir)
        else:
            scope = cachedb.installed(args.db, remote=args.remote,
                                      **({"precompile": True} if args.precompile else {}))
        seconds["setup"] = time.perf_counter() - t

    results: dict[str, Any] = {}
    remote_counts: dict[str, int] = {}
    with scope as store:
        for name in args.models.split(","):
            t = time.perf_counter()
            results[name] = workloads[name](torch)
            seconds[name] = time.perf_counter() - t
        if store is not None and getattr(store, "remote", None) is not None:
            t = time.perf_counter()
            store.remote.flush()
            seconds["remote_flush"] = time.perf_counter() - t
            remote_counts = dict(store.remote.counts)
    wall = time.time() - args.t0

    if args.dump_launchers:
        Path(args.dump_launchers).write_text(json.dumps(launchers, indent=1, sort_keys=True))

    if args.save_precompile:
        torch.compiler.save_cache_artifacts()  # None when nothing new was compiled (all hits)
    if args.save_mega:
        saved = torch.compiler.save_cache_artifacts()
        assert saved is not None, "save_cache_artifacts returned nothing"
        Path(args.save_mega).write_bytes(saved[0])

    phases = sorted(
        ((k, sum(v)) for k, v in compilation_time_metrics.items()), key=lambda kv: -kv[1]
    )[:8]
    named = {k: round(sum(compilation_time_metrics.get(k, [])), 3) for k in NAMED_PHASES}
    flat = {k: int(v) for k, v in counters["inductor"].items()
            if any(w in k for w in ("cache", "autotune", "coordesc", "benchmark"))}
    flat.update({k: int(v) for k, v in counters["aot_autograd"].items() if k.startswith("autograd_cache")})
    if args.device == "cuda":
        flat.update(runtime_tuning)
    print(
        json.dumps(
            {
                "wall_s": wall,
                "first_call_s": round(sum(seconds[name] for name in args.models.split(",")), 4),
                "seconds": {k: round(v, 4) for k, v in seconds.items()},
                "cpp_build_s": round(cpp["s"], 4),
                "miss_seams_s": round(miss_seams["s"], 6),
                "miss_seam_calls": int(miss_seams["calls"]),
                "cpp_builds": cpp["n"],
                "counters": flat,
                "remote_counts": remote_counts,
                "tuning_calls": tuning_calls,
                "frames": int(counters["frames"]["total"]),
                "unique_graphs": int(counters["stats"]["unique_graphs"]),
                "dynamo_cache": {k: int(v) for k, v in counters["dynamo_cache"].items()},
                "phases_s": {k: round(v, 3) for k, v in phases},
                "named_phases_s": named,
                "ok": all(r.get("ok") for r in results.values()),
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
