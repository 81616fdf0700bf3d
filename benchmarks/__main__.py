"""``python -m benchmarks [--quick] [--only NAME,...] [--jobs N] [--device cpu|cuda] [--nproc N] [--out DIR] [--merge] [--keep-scratch]``.

Runs the selected sections in one process (warm starts and concurrency use subprocesses),
prints the Markdown table of ratios and writes it with the JSON document to ``--out``
(default ``benchmarks/results/``): ``cpu.md`` / ``cpu.json`` for a full CPU run, ``gpu.md`` /
``gpu.json`` for a run with ``--device cuda``, ``cpu-<sections>.md`` / ``.json`` for a CPU
run of some sections (``-quick`` added for ``--quick``); ``--name`` chooses another stem, and
``--merge`` adds the run's sections to those files instead of replacing them. ``--nproc N``
runs §13's DDP workload on N GPUs. A quick run (a smoke test: each section at its smallest
size, checking that it runs and writes its rows) runs its sections in the two lanes of
:data:`QUICK_LANES` at once (``--jobs 1``: one at a time), each lane a ``python -m benchmarks``
process; a full run
runs one section at a time, so that no section's figures share the machine with another's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from . import (
    s1_warm_start,
    s2_timings,
    s3_best_configs,
    s4_guarded,
    s5_import,
    s6_concurrency,
    s7_disk,
    s8_fleet,
    s9_startup,
    s10_dynamo,
    s11_herd,
    s12_gpt2,
    s13_ddp,
    s14_singleflight,
)
from ._context import Context
from ._report import (
    SectionResult,
    cachedb_source_digest,
    load_sections,
    machine_info,
    merged,
    now_iso,
    result_name,
    write,
)

#: name -> module with NAME, TITLE and run(ctx), in the order sections run (§1 first: §7
#: reuses its cold cache directory in quick runs).
SECTIONS: dict[str, object] = {
    m.NAME: m
    for m in (s1_warm_start, s2_timings, s3_best_configs, s4_guarded, s5_import, s6_concurrency, s7_disk,
              s8_fleet, s9_startup, s10_dynamo, s11_herd, s12_gpt2, s13_ddp, s14_singleflight)
}
#: Display order (§ numbers of the issue).
ORDER = ["warm_start", "timings", "best_configs", "guarded", "import", "concurrency", "disk", "fleet", "startup",
         "pgo", "herd", "singleflight", "gpt2", "ddp"]

#: The lanes of a quick run (unless ``--jobs 1``), each run in order by its own process: a
#: section that reads what another leaves in ``Context.shared`` is in that one's lane (§4 and
#: §7 read §1's cold cache dir, §7 §5's generated dir), and the lanes take about as long.
#: (§10 reads §1's samples where it runs the same workloads, on the GPU; in another lane it
#: measures its own baseline.)
QUICK_LANES = [
    ["warm_start", "timings", "best_configs", "guarded", "import", "concurrency", "disk", "startup", "gpt2"],
    ["fleet", "pgo", "herd", "singleflight", "ddp"],
]

DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and of the children it has waited for."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smallest sizes, one repetition (CI smoke test)")
    parser.add_argument("--jobs", type=int, default=None, metavar="N",
                        help="a quick run: 2 (default) runs its sections in the two lanes of QUICK_LANES at once, "
                             "1 one section at a time (more acts as 2; full runs: always 1)")
    parser.add_argument("--only", default="", help=f"comma-separated sections: {','.join(ORDER)}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results directory (default: %(default)s)")
    parser.add_argument("--name", default=None,
                        help="stem of the files written (default: cpu, gpu, or cpu-<sections> for a partial CPU run)")
    parser.add_argument("--scratch", type=Path, default=None, help="parent of the scratch directory (default: $TMPDIR)")
    parser.add_argument("--keep-scratch", action="store_true", help="do not delete the scratch directory")
    parser.add_argument("--quick-root", type=Path, default=None, help=argparse.SUPPRESS)  # a lane: its parent's scratch
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="§1 warm start and §10 Dynamo: CPU workloads, or the GPU workloads on a CUDA machine")
    parser.add_argument("--nproc", type=int, default=0, metavar="N",
                        help="§13 ddp: the DDP training workload on N GPUs through torch.distributed.run (default: not run)")
    parser.add_argument("--merge", action="store_true",
                        help="add this run's sections to the files of the same name in --out (a section run again "
                             "replaces its old figures) instead of replacing the files")
    args = parser.parse_args(argv)
    if args.nproc < 0:
        parser.error("--nproc must be >= 0")
    if args.jobs is not None and args.jobs < 1:
        parser.error("--jobs must be >= 1")
    return args


def _compile_bytecode() -> str:
    """Write the bytecode of cachedb's and the benchmarks' modules (``__pycache__``), as ``pip
    install`` leaves an installed package, and say so for the report. A checkout (an editable
    install) has none until a process writes it, and on machines that set
    ``PYTHONDONTWRITEBYTECODE=1`` no process does: every child of the run would compile
    cachedb from source (``import cachedb`` 0.33 s instead of 0.27 s on a 2-core AMD EPYC VM),
    a cost no user's install pays, on cachedb's side only."""
    import compileall

    import cachedb

    ok = all(
        compileall.compile_dir(str(Path(pkg.__file__).parent), quiet=1, workers=0)
        for pkg in (cachedb, sys.modules[__package__ or "benchmarks"])
    )
    written = "compiled before the run" if ok else "NOT all compiled (see stderr)"
    return f"{written}{' (PYTHONDONTWRITEBYTECODE is set)' if sys.dont_write_bytecode else ''}"


def _installed_bytecode() -> str:
    """Give the run the bytecode of torch and every other installed module, as ``pip install``
    leaves them, where the installation has none; say which for the report.

    The GPU machine's torch comes without ``__pycache__`` and that machine sets
    ``PYTHONDONTWRITEBYTECODE=1``, so without this every process of a §1 sample there compiles
    ~2,200 torch modules from source: ~9 s of a warm start's wall on every side (measured on
    an H100 host), which no ``pip install``ed torch pays. Where torch's own bytecode is
    missing, the standard library, every ``site-packages`` and ``PYTHONPATH`` directory on
    ``sys.path`` are compiled (all CPUs) under a pycache prefix in the temporary directory
    (kept, so a later run on the machine reuses it), and ``PYTHONPYCACHEPREFIX`` sends every
    child there; nothing installed is written to."""
    import compileall
    import importlib.util
    import sysconfig

    spec = importlib.util.find_spec("torch")
    origin = spec.origin if spec is not None else None
    if origin is None or Path(importlib.util.cache_from_source(origin)).exists():
        return "as installed"
    prefix = Path(tempfile.gettempdir()) / f"cachedb-bench-pyc-{sys.implementation.cache_tag}"
    sys.pycache_prefix = str(prefix)
    os.environ["PYTHONPYCACHEPREFIX"] = str(prefix)
    repo = Path(__file__).resolve().parent.parent
    roots = {sysconfig.get_path("stdlib"), sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    roots.update(p for p in sys.path if p and Path(p).is_dir() and Path(p).resolve() != repo)
    t0 = time.perf_counter()
    for root in sorted(roots):
        compileall.compile_dir(root, quiet=2, workers=0)
    return f"compiled under PYTHONPYCACHEPREFIX={prefix} in {time.perf_counter() - t0:.0f} s (torch had none)"


def _run_lanes(args: argparse.Namespace, lanes: list[list[str]], scratch: Path, ctx: Context) -> dict[str, SectionResult]:
    """Each lane's sections run in order by a ``python -m benchmarks --jobs 1`` process of its
    own, the lanes at once; their sections, read back from each lane's JSON document. A lane
    that wrote none gives each of its sections the error."""
    procs = []
    for i, lane in enumerate(lanes):
        out = scratch / f"lane-{i}"
        cmd = [sys.executable, "-m", "benchmarks", "--quick", "--jobs", "1", "--only", ",".join(lane), "--out",
               str(out), "--name", "lane", "--scratch", str(scratch), "--quick-root", str(scratch), "--device", args.device,
               "--nproc", str(args.nproc)]
        cmd += ["--quiet"] if args.quiet else []
        ctx.log(f"lane {i + 1}/{len(lanes)}: {', '.join(lane)}")
        procs.append((lane, out, subprocess.Popen(cmd, cwd=Path(__file__).resolve().parent.parent,
                                                  stdout=subprocess.DEVNULL)))
    results: dict[str, SectionResult] = {}
    for lane, out, proc in procs:
        rc = proc.wait()
        doc = out / "lane.json"
        if doc.exists():
            results.update((r.name, r) for r in load_sections(json.loads(doc.read_text())))
        for name in lane:
            if name not in results:
                results[name] = SectionResult(name, SECTIONS[name].TITLE,  # type: ignore[attr-defined]
                                              error=f"its lane's process exited {rc} without results")
    return results


def main(argv: list[str] | None = None) -> int:
    # Compile workers: one, in-process (a 2-core machine gains nothing from a pool, and each
    # warm-start subprocess would pay for starting it); the sections' processes inherit it.
    # Set here, not at import, so that importing this module changes no environment.
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    args = parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(ORDER)
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        print(f"unknown section(s): {', '.join(unknown)}; known: {', '.join(ORDER)}", file=sys.stderr)
        return 2
    scratch = Path(tempfile.mkdtemp(prefix="cachedb-bench-", dir=args.scratch))
    ctx = Context(quick=args.quick, scratch=scratch, verbose=not args.quiet, device=args.device, nproc=args.nproc,
                  quick_root=args.quick_root)
    installed_bytecode = _installed_bytecode()  # first: it may move every module's bytecode
    bytecode = _compile_bytecode()
    load_start = _loadavg()
    source_start = cachedb_source_digest()
    results: dict[str, SectionResult] = {}
    t_run = time.perf_counter()
    jobs = args.jobs if args.jobs is not None else (2 if args.quick else 1)
    lanes = [kept for kept in ([n for n in lane if n in names] for lane in QUICK_LANES) if kept]
    lanes = lanes if args.quick and jobs > 1 and len(lanes) > 1 else []
    try:
        if lanes:
            results = _run_lanes(args, lanes, scratch, ctx)
        for name, module in SECTIONS.items():
            if name not in names or name in results:
                continue
            run: Callable[[Context], SectionResult] = module.run  # type: ignore[attr-defined]
            ctx.log(f"== {name}: {module.TITLE}")  # type: ignore[attr-defined]
            t0 = time.perf_counter()
            cpu0 = _cpu_seconds()
            load_before = _loadavg()
            try:
                res = run(ctx)
            except Exception as exc:  # one failed section must not lose the others' numbers
                traceback.print_exc()
                res = SectionResult(name, module.TITLE, error=f"{type(exc).__name__}: {exc}")  # type: ignore[attr-defined]
            res.seconds = time.perf_counter() - t0
            res.cpu_seconds = _cpu_seconds() - cpu0
            res.load_average = (load_before, _loadavg())
            results[name] = res
            ctx.log(f"== {name} done in {res.seconds:.1f}s")
    finally:
        if not args.keep_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            ctx.log(f"scratch kept at {scratch}")
    ordered = [results[n] for n in ORDER if n in results]
    meta = {
        "created": now_iso(),
        "quick": args.quick,
        "sections_run": [r.name for r in ordered],
        "partial": set(names) != set(ORDER),
        "total_seconds": round(time.perf_counter() - t_run, 1),
        "command": "python -m benchmarks " + " ".join(argv if argv is not None else sys.argv[1:]),
        "device": args.device,
        "machine": machine_info(),
        "cachedb_source_sha256": source_start,
        "cachedb_source_changed_during_run": cachedb_source_digest() != source_start,
        "bytecode": bytecode,
        "installed_bytecode": installed_bytecode,
        # A quick run's lanes (sections run at once, each lane in order): their figures share the machine.
        "lanes": lanes,
        # Other processes on the machine skew timings: the 1-minute load average at start/end.
        "load_average_1min": {"start": load_start, "end": _loadavg()},
    }
    stem = args.name or result_name(args.device, [n for n in ORDER if n in names], list(ORDER), args.quick)
    if args.merge:
        ordered, meta = merged(args.out / f"{stem}.json", ordered, meta, list(ORDER))
    json_path, md_path, md = write(args.out, ordered, meta, stem)
    print(md)
    print(f"wrote {json_path} and {md_path}", file=sys.stderr)
    return 1 if any(r.error for r in ordered) else 0


if __name__ == "__main__":
    sys.exit(main())
