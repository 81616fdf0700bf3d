"""Build a real Inductor cache directory with torch (examples/build_cache.py in a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BUILDER = Path(__file__).resolve().parents[1] / "examples" / "build_cache.py"
#: The Inductor cache kinds a compile under cachedb leaves no files of in its cache dir.
CACHE_KINDS = ("fxgraph", "aotautograd", "cache")
#: The ``TMPDIR`` of :func:`build_live_cache`'s runs: the machine that compiled, then a fresh one.
MACHINES = ("machine-a-tmp", "machine-b-tmp")

#: The builder takes ~30 s cold on 2 cores; leave ample room on slow machines.
TIMEOUT_S = 900


def build_real_cache(cache_dir: Path) -> dict:
    """Run ``examples/build_cache.py CACHE_DIR --json`` in a fresh interpreter (torch reads
    TORCHINDUCTOR_CACHE_DIR per process) and return its JSON summary (the last stdout line)."""
    cache_dir = Path(cache_dir)
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir.resolve())
    proc = subprocess.run(
        [sys.executable, str(BUILDER), str(cache_dir), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=TIMEOUT_S,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"{BUILDER.name} failed (exit {proc.returncode}) for {cache_dir}:\n"
            f"stdout tail:\n{proc.stdout[-2000:]}\nstderr tail:\n{proc.stderr[-4000:]}"
        )
    try:
        summary = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"{BUILDER.name}: last stdout line is not JSON: {lines[-1][:200]!r}") from exc
    if not isinstance(summary, dict):
        raise RuntimeError(f"{BUILDER.name}: summary is not a JSON object")
    return summary


def cachedb_run(db: Path, cache_dir: Path, machine_tmp: Path | None = None, **env_extra: str) -> dict:
    """``cachedb --db DB run -- python examples/build_cache.py CACHE_DIR --json``;
    ``machine_tmp``: the process's ``TMPDIR``, where torch keeps what lives outside the cache
    directory (``default_cache_dir()``: the C++ precompiled headers), as on its own machine.
    With ``PYTHONPROFILEIMPORTTIME=1`` in ``env_extra``, the summary's ``"imported"`` lists
    every module that a process of the run (the CLI, the program, the processes it starts
    that share its stderr) imported."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_")}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    if machine_tmp is not None:
        machine_tmp.mkdir(parents=True, exist_ok=True)
        env["TMPDIR"] = str(machine_tmp)
    env.update(env_extra)
    proc = subprocess.run(
        [sys.executable, "-m", "cachedb", "--db", str(db), "run", "--",
         sys.executable, str(BUILDER), str(cache_dir), "--json"],
        capture_output=True, text=True, env=env, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    if env_extra.get("PYTHONPROFILEIMPORTTIME"):
        summary["imported"] = sorted({line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
                                      if line.startswith("import time:") and line.count("|") == 2})
    return summary


def leftovers(cache_dir: Path) -> list[str]:
    found = [k for k in CACHE_KINDS if (cache_dir / k).exists()]
    found += [p.relative_to(cache_dir).as_posix() for p in cache_dir.rglob("*.best_config")]
    return found


def build_live_cache(root: Path) -> tuple[Path, dict, dict]:
    """A database filled by one ``cachedb run`` of examples/build_cache.py (cold, its own cache
    dir and ``TMPDIR``), then a second run on a new, empty cache dir and ``TMPDIR`` (a fresh
    machine, :data:`MACHINES`): ``(db path, cold summary, warm summary)``, each summary with the
    modules its processes imported. Both runs use two compile threads (the C++ libraries built
    in Inductor's thread pool, as on any machine of several cores; examples/build_cache.py
    alone uses one). Neither run leaves cache files in its directory."""
    db = root / "cache.db"
    threads = {"TORCHINDUCTOR_COMPILE_THREADS": "2"}
    cold = cachedb_run(db, root / "cold", root / MACHINES[0], PYTHONPROFILEIMPORTTIME="1", **threads)
    assert leftovers(root / "cold") == []
    warm = cachedb_run(db, root / "warm", root / MACHINES[1], PYTHONPROFILEIMPORTTIME="1", **threads)
    assert leftovers(root / "warm") == []
    return db, cold, warm


#: The directory :func:`build_isa_probes` filled for this test run (set by the session fixture
#: ``isa_probes`` of tests/conftest.py; ``None``: not built, :func:`seeded` copies nothing).
ISA_PROBES: Path | None = None


def build_isa_probes(cache_dir: Path) -> None:
    """Have torch probe this CPU's vector ISAs into ``cache_dir`` (``cpu_vec_isa.pick_vec_isa``:
    a C++ test program built per ISA, ~6 s on 2 cores), as the first compile in an empty cache
    dir does."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_")}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(Path(cache_dir).resolve())
    subprocess.run([sys.executable, "-c", "from torch._inductor import cpu_vec_isa; cpu_vec_isa.pick_vec_isa()"],
                   env=env, check=True, capture_output=True, timeout=TIMEOUT_S)


def probe_files() -> set[str]:
    """Paths, relative to a cache dir, of the files :func:`seeded` copies into it (empty when
    :data:`ISA_PROBES` is not built)."""
    if ISA_PROBES is None:
        return set()
    return {p.relative_to(ISA_PROBES).as_posix() for p in ISA_PROBES.rglob("*") if p.is_file()}


def seeded(cache_dir: Path) -> str:
    """``cache_dir`` (made if absent) holding a copy of torch's ISA probes (:data:`ISA_PROBES`),
    as a string for ``TORCHINDUCTOR_CACHE_DIR``. For a child whose test is about what cachedb
    does on a compile, not about an empty cache dir: it compiles its graphs and kernels as
    before but does not build the probes again (each built them in its own empty cache dir)."""
    import shutil

    cache_dir = Path(cache_dir)
    if ISA_PROBES is not None:
        shutil.copytree(ISA_PROBES, cache_dir, dirs_exist_ok=True)
    cache_dir.mkdir(parents=True, exist_ok=True)
    return str(cache_dir)
