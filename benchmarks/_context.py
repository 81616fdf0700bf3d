"""What every section gets: the run's options, a scratch directory and a logger."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The repository root (benchmarks/ lives at its top level).
REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Context:
    """Options and scratch space of one ``python -m benchmarks`` run.

    ``quick`` selects smaller sizes and fewer repetitions; ``scratch`` is a temporary directory
    removed at the end of the run; ``shared`` lets a section leave artifacts (e.g. a real cache
    directory) for a later one.
    """

    quick: bool
    scratch: Path
    verbose: bool = True
    #: "cpu" (torch 2.13 CPU, CI) or "cuda" (the GPU machine: §1's GPU workloads)
    device: str = "cpu"
    #: GPUs (ranks) of §13's DDP workload; 0: not run
    nproc: int = 0
    shared: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)
    #: A quick run's directory for what all its lanes share (the parent's scratch directory:
    #: the children's machine and the vector-ISA probes, each built once per run); ``None``:
    #: this context's own scratch directory.
    quick_root: Path | None = None

    def log(self, msg: str) -> None:
        if self.verbose:
            elapsed = time.perf_counter() - self.started
            print(f"[{elapsed:7.1f}s] {msg}", file=sys.stderr, flush=True)

    def tmpdir(self, prefix: str) -> Path:
        """A new empty directory under the scratch directory."""
        return Path(tempfile.mkdtemp(prefix=prefix, dir=self.scratch))

    def machine(self, prefix: str = "machine") -> Path:
        """A child process's ``TMPDIR``: the machine-wide state torch keeps outside the cache
        directory (``default_cache_dir()``: C++ precompiled headers, ~10 s to build on 2 cores).
        A full run gives a new empty one (a fresh machine); a quick run, which only checks that
        each section runs and writes its rows, gives every child the same one, so the headers
        are built once per run (torch's own lock, ``_HEADER_LOCK_DIR``, serializes lanes that
        need them at once)."""
        if not self.quick:
            return self.tmpdir(prefix)
        shared = (self.quick_root or self.scratch) / "quick-machine"
        shared.mkdir(exist_ok=True)
        return shared

    def cache_dir(self, prefix: str) -> Path:
        """A new Inductor cache directory (``<new tmpdir>/inductor``) for a child process. In a
        quick run it already holds torch's vector-ISA probes (:meth:`isa_probes`), which the
        first compile in an empty cache dir otherwise builds (a C++ test program per ISA, ~6 s
        of a ~10 s cold child on 2 cores); a full run gives it empty."""
        root = self.tmpdir(prefix) / "inductor"
        if self.quick and self.device == "cpu":
            import shutil

            shutil.copytree(self.isa_probes(), root)
        return root

    def isa_probes(self) -> Path:
        """A cache directory holding only torch's vector-ISA probes for this CPU, built once per
        run by ``cpu_vec_isa.pick_vec_isa()`` in a child process (torch/_inductor/cpu_vec_isa.py,
        ``VecISA.check_build``: ``<key[1:3]>/<key>.cpp`` and ``.so`` under the cache dir). The
        lanes of a quick run share one, under :attr:`quick_root`: the first lane that needs it
        builds it, holding a file lock another lane waits on. Raises
        ``subprocess.CalledProcessError`` when the child fails."""
        built = self.shared.get("isa_probes")
        if built is not None:
            return Path(built)
        from filelock import FileLock

        base = (self.quick_root or self.scratch) / "isa-probes"
        base.mkdir(exist_ok=True)
        root = base / "inductor"
        with FileLock(base / "build.lock"):
            if not (base / "built").exists():
                env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_")}
                env.update(TORCHINDUCTOR_CACHE_DIR=str(root), TMPDIR=str(self.machine()))
                subprocess.run([sys.executable, "-c",
                                "from torch._inductor import cpu_vec_isa; cpu_vec_isa.pick_vec_isa()"],
                               env=env, check=True, capture_output=True, timeout=600)
                root.mkdir(parents=True, exist_ok=True)
                (base / "built").touch()
        self.shared["isa_probes"] = root
        return root


@contextmanager
def fresh_torch_cache(ctx: Context, prefix: str = "inductor") -> Iterator[Path]:
    """Point torch's Inductor caches at a new empty directory, with torch's own machinery.

    ``torch._inductor.utils.fresh_cache`` clears every ``clear_on_fresh_cache`` memo
    (``CacheBase.get_local_cache_path``, ...), sets ``TORCHINDUCTOR_CACHE_DIR`` (and
    ``TRITON_CACHE_DIR``) to a new temporary directory and restores both afterwards. The
    directory is kept (the scratch directory is removed at the end of the run).
    """
    from torch._inductor.utils import clear_caches, fresh_cache

    parent = ctx.tmpdir(prefix)
    with fresh_cache(dir=str(parent), delete=False):
        yield Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    clear_caches()


class FakeChoice:
    """A ``ChoiceCaller`` as ``PersistentCache.lookup`` sees it: only ``hash_key()`` is used."""

    __slots__ = ("_hash",)

    def __init__(self, choice_hash: str) -> None:
        self._hash = choice_hash

    def hash_key(self) -> str:
        return self._hash

    def __repr__(self) -> str:
        return f"FakeChoice({self._hash!r})"


class DescribedChoice(FakeChoice):
    """A :class:`FakeChoice` that also says what torch's CPU choices say of themselves, which
    cachedb stores once per hash (:mod:`cachedb.live._choices`): the ``name``, ``description``
    and ``info_dict()`` of an ``ExternKernelCaller`` (a hash ``_linear_pointwise-...``,
    torch/_inductor/select_algorithm.py) or of a C++ GEMM template's choice (a hash
    ``CppMicroGemmFP32Vec-...``, codegen/cpp_template_kernel.py), as torch 2.13 gives them."""

    __slots__ = ()

    @property
    def name(self) -> str:
        kind = self._hash.split("-", 1)[0]
        return kind if kind.startswith("_") else f"cpp_{kind}_0"

    description = ""

    def info_dict(self) -> dict[str, str]:
        kind = self._hash.split("-", 1)[0]
        if kind.startswith("_"):
            return {"backend": "extern", "kernel_call_name": f"extern_kernels.{kind}"}
        return {"backend": "CPP", "op_type": "unknown"}


def built_real_cache(ctx: Context) -> Path:
    """A REAL Inductor cache directory built once per run by ``examples/build_cache.py`` in a
    child process (torch.compile of an MLP, dynamic shapes, forward+backward, a CPU
    max-autotune GEMM and a best config; ~35 s on 2 cores), kept in ``ctx.shared`` for the
    sections after the first that asks. Raises ``RuntimeError`` with the child's stderr when it
    fails, ``subprocess.TimeoutExpired`` when it runs past 900 s."""
    built = ctx.shared.get("built_real_cache")
    if built is not None:
        return Path(built)
    root = ctx.tmpdir("realcache") / "inductor"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_")}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(root)
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    ctx.log("building a real cache with examples/build_cache.py (torch.compile, ~35 s)")
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / "build_cache.py"), str(root), "--json"],
        env=env, capture_output=True, text=True, timeout=900, check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"build_cache.py failed: {proc.stderr[-2000:]}")
    ctx.shared["built_real_cache"] = root
    return root
