"""README.md's commands run as written.

Every fenced block preceded by a ``<!-- runnable -->`` line is run, in README order, in one
fresh directory (``examples/`` linked into it, as in a clone): ``bash`` blocks with ``bash -e``,
``python`` blocks by the test's interpreter. The blocks build a real Inductor cache with
``torch.compile`` (``examples/build_cache.py``), serve a program from the database, and run the
CLI, the Python API and the SQL queries against that real database. The other ``bash`` blocks
(installs, CI, benchmarks, a PostgreSQL remote) are checked for syntax and for the scripts they
name; ``examples/quickstart.sh`` and ``.ci/test`` run the installs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
README = REPO_ROOT / "README.md"
MARK = "<!-- runnable -->"

_FENCE = re.compile(r"^```(\w+)\n(.*?)^```\n", re.S | re.M)


def blocks(text: str) -> list[tuple[str, str, bool]]:
    """Every fenced block of ``text``: (language, body, marked runnable)."""
    found = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").splitlines()
        runnable = bool(before) and before[-1].strip() == MARK
        found.append((match.group(1), match.group(2), runnable))
    return found


def test_the_readme_has_runnable_blocks_and_every_mark_precedes_a_block() -> None:
    text = README.read_text()
    found = blocks(text)
    assert sum(r for _, _, r in found) >= 4
    assert text.count(MARK) == sum(r for _, _, r in found)  # no mark left dangling
    assert len(text.splitlines()) <= 315


def test_every_bash_block_parses_and_names_scripts_that_exist() -> None:
    for lang, body, _ in blocks(README.read_text()):
        if lang != "bash":
            continue
        check = subprocess.run(["bash", "-n"], input=body, text=True, capture_output=True)
        assert check.returncode == 0, (body, check.stderr)
        for line in body.splitlines():
            words = line.split()
            if len(words) >= 2 and words[0] in ("bash", "python") and words[1].endswith((".sh", ".py", "/test")):
                assert (REPO_ROOT / words[1]).is_file(), line


@pytest.mark.slow
@pytest.mark.torch
def test_the_runnable_blocks_run_as_written(tmp_path: Path, real_cache: tuple[Path, dict],
                                            live_cache: tuple[Path, dict, dict]) -> None:
    """The blocks run on the session's compiles: ``inductor/`` starts as a copy of the cache
    dir examples/build_cache.py made with torch alone, and ``cache.db`` as a copy of the
    database it filled under ``cachedb run``, so the README's compiles run warm (what they
    print and store is checked below, as after cold ones)."""
    import shutil
    import sqlite3

    pytest.importorskip("torch")
    work = tmp_path / "clone"
    work.mkdir()
    shutil.copytree(real_cache[0], work / "inductor")
    source, target = sqlite3.connect(live_cache[0]), sqlite3.connect(work / "cache.db")
    try:
        source.backup(target)
    finally:
        target.close()
        source.close()
    (work / "examples").symlink_to(REPO_ROOT / "examples", target_is_directory=True)
    (tmp_path / "tmp").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CACHEDB_", "TORCHINDUCTOR_", "TRITON_CACHE"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["TMPDIR"] = str(tmp_path / "tmp")
    env["HOME"] = str(tmp_path)  # nothing lands in the user's ~/.cache
    outputs = []
    for lang, body, runnable in blocks(README.read_text()):
        if not runnable:
            continue
        cmd = ["bash", "-e", "-o", "pipefail", "-c", body] if lang == "bash" else [sys.executable, "-c", body]
        proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f"{lang} block failed:\n{body}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
        outputs.append(proc.stdout)
    joined = "\n".join(outputs)
    assert "True" in joined.split()  # the environment activates cachedb at Inductor's cache modules
    assert (work / "cache.db").is_file() and (work / "saved.db").is_file()
    assert any((work / "exported").iterdir()) and any((work / "exported-api").iterdir())
    assert "linear" in joined  # the tuning history's queries returned the GEMM's rows
    # ... naming its choices as torch does, with their backends
    assert "cpp_CppMicroGemmFP32Vec" in joined and "_linear_pointwise" in joined and "extern" in joined
