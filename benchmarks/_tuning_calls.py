"""Count the tuning a process really runs: calls, not Inductor's counters.

An FX graph cache hit adds the cached graph's compile-time counter deltas to
``counters["inductor"]`` (``counter_deltas``, torch/_inductor/codecache.py), so
``coordesc_tuning_bench`` and ``benchmark_gpu`` overstate what a warm start ran. Here the two
functions every runtime tuning goes through are wrapped and their calls counted:

- ``CoordescTuner.autotune`` (torch/_inductor/runtime/coordinate_descent_tuner.py): one call
  per kernel that coordinate descent tunes (``CachingAutotuner._coordinate_descent_tuning``);
- ``InductorBenchmarker.benchmark_gpu`` (torch/_inductor/runtime/benchmarking.py): one call per
  GPU benchmark (coordinate descent's candidates, ``autotune_to_one_config``'s launchers and,
  in a compile, ``select_algorithm``'s choices).

``kernels``: the kernel names coordinate descent tuned; ``benchmarked``: those whose launchers
``CachingAutotuner.autotune_to_one_config`` benchmarked at run time (with how many), for the
report.
"""

from __future__ import annotations

from typing import Any


def count_tuning_calls() -> dict[str, Any]:
    """Wrap both functions in this process; returns the live counts
    (``coordesc_calls``, ``benchmark_gpu_calls``, ``kernels``)."""
    from torch._inductor.runtime import benchmarking, coordinate_descent_tuner
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    counts: dict[str, Any] = {"coordesc_calls": 0, "benchmark_gpu_calls": 0, "kernels": [], "benchmarked": []}

    def count(cls: Any, name: str, key: str) -> None:
        original = getattr(cls, name)

        def counted(self: Any, *a: Any, **k: Any) -> Any:
            counts[key] += 1
            return original(self, *a, **k)

        setattr(cls, name, counted)

    count(coordinate_descent_tuner.CoordescTuner, "autotune", "coordesc_calls")
    count(benchmarking.InductorBenchmarker, "benchmark_gpu", "benchmark_gpu_calls")

    coordesc = CachingAutotuner.coordinate_descent_tuning

    def named(self: Any, launcher: Any, *a: Any, **k: Any) -> Any:
        before = counts["coordesc_calls"]
        result = coordesc(self, launcher, *a, **k)
        if counts["coordesc_calls"] != before:
            counts["kernels"].append(str(self.inductor_meta.get("kernel_name")))
        return result

    CachingAutotuner.coordinate_descent_tuning = named  # type: ignore[method-assign]

    to_one = CachingAutotuner.autotune_to_one_config

    def named_to_one(self: Any, *a: Any, **k: Any) -> Any:
        launchers = len(self.launchers)
        result = to_one(self, *a, **k)
        counts["benchmarked"].append(f"{self.inductor_meta.get('kernel_name')} ({launchers} launchers)")
        return result

    CachingAutotuner.autotune_to_one_config = named_to_one  # type: ignore[method-assign]
    return counts
