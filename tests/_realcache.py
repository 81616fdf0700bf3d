"""Build a real Inductor cache directory with torch (examples/build_cache.py in a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BUILDER = Path(__file__).resolve().parents[1] / "examples" / "build_cache.py"

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
