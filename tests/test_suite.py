"""The suite's own set-up: what keeps one real compile per module fixture.

Modules whose module fixtures build real Inductor caches mark themselves
``pytest.mark.xdist_group`` so that ``--dist loadgroup`` (the README's test command) runs all
their tests on one worker, which builds the fixture once; if the grouping silently stopped
(pytest 9.2 with pytest-xdist 3.8: pytest-xdist issue #1386), every worker would build it again.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

MODULE = '''
import os
import pytest

pytestmark = pytest.mark.xdist_group("built_once")

@pytest.fixture(scope="module")
def built():
    with open(os.environ["BUILT_LOG"], "a") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")

@pytest.mark.parametrize("i", range(8))
def test_uses_it(built, i):
    pass
'''


def test_a_group_runs_on_one_worker_and_builds_its_fixture_once(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(MODULE)
    log = tmp_path / "built.log"
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
         "-p", "no:randomly", str(tmp_path / "test_grouped.py")],
        cwd=tmp_path, env={**os.environ, "BUILT_LOG": str(log)}, capture_output=True, text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout[-2000:]
    workers = set(re.findall(r"\[(gw\d+)\].*PASSED", out.stdout))
    assert len(re.findall(r"PASSED", out.stdout)) == 8
    assert len(workers) == 1, out.stdout[-2000:]
    assert log.read_text().split() == [workers.pop()]
