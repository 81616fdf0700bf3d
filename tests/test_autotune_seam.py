"""The re-tuning seam: installed by default, left out with retune=True or
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
from torch._inductor.runtime.triton_heuristics import CachingAutotuner
torch_own = CachingAutotuner.recheck_autotune_cache
kwargs = {} if sys.argv[2] == "default" else {"retune": sys.argv[2] == "retune"}
cachedb.install(sys.argv[1], **kwargs)
patched = CachingAutotuner.recheck_autotune_cache is _autotune.recheck_autotune_cache
cachedb.uninstall()
restored = CachingAutotuner.recheck_autotune_cache is torch_own
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
