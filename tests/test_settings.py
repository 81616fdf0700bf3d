"""Every CACHEDB_* variable is parsed in one place: a bad value is one line naming the
variable, its value and the form expected, and cachedb stays off (torch unaffected)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cachedb import CacheDBError
from cachedb.settings import VARIABLES, SettingError, check_environment, read

from ._realcache import seeded


def test_a_bad_value_names_the_variable_its_value_and_the_form() -> None:
    with pytest.raises(SettingError) as info:
        read("CACHEDB_TIMEOUT", {"CACHEDB_TIMEOUT": "10s"})
    assert str(info.value) == "CACHEDB_TIMEOUT='10s': expected seconds, a number >= 0 (e.g. 10 or 0.5)"
    assert isinstance(info.value, CacheDBError)
    for name, bad in (("CACHEDB_TIMEOUT", "-1"), ("CACHEDB_TIMEOUT", "nan"), ("CACHEDB_REMOTE_TIMEOUT", "0"),
                      ("CACHEDB_WRITE_BEHIND", "maybe"), ("CACHEDB_COMPRESSION_LEVEL", "23"),
                      ("CACHEDB_IMPORT_WORKERS", "2.5"), ("CACHEDB_REMOTE_URL", "db-host/inductor"),
                      ("CACHEDB_EXIT_FLUSH", "inf")):
        with pytest.raises(SettingError, match=f"^{name}="):
            read(name, {name: bad})


def test_unset_and_empty_are_the_default_and_good_values_parse() -> None:
    assert read("CACHEDB_TIMEOUT", {}) == 10.0 == read("CACHEDB_TIMEOUT", {"CACHEDB_TIMEOUT": " "})
    assert read("CACHEDB_WRITE_BEHIND", {}) is True
    assert read("CACHEDB_WRITE_BEHIND", {"CACHEDB_WRITE_BEHIND": "off"}) is False
    assert read("CACHEDB_RETUNE", {"CACHEDB_RETUNE": "1"}) is True
    assert read("CACHEDB_REMOTE_TIMEOUT", {"CACHEDB_REMOTE_TIMEOUT": "0.5"}) == 0.5
    assert read("CACHEDB_COMPRESSION_LEVEL", {"CACHEDB_COMPRESSION_LEVEL": "-5"}) == -5
    values = check_environment({})
    assert set(values) == set(VARIABLES) and values["CACHEDB_EXIT_FLUSH"] == 5.0


@given(st.floats(min_value=0, max_value=1e6, allow_nan=False))
def test_any_number_of_seconds_reads_back(seconds: float) -> None:
    assert read("CACHEDB_TIMEOUT", {"CACHEDB_TIMEOUT": repr(seconds)}) == seconds


def test_every_variable_the_code_reads_is_known() -> None:
    """No CACHEDB_ variable is read anywhere that this module does not parse."""
    import re

    package = Path(__file__).resolve().parents[1] / "cachedb"
    used = set()
    for path in package.rglob("*.py"):
        used |= set(re.findall(r'"(CACHEDB_[A-Z_]+)"', path.read_text()))
    assert used <= set(VARIABLES), sorted(used - set(VARIABLES))


def _child(code: str, env_extra: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_")}
    env["TORCHINDUCTOR_CACHE_DIR"] = seeded(tmp_path / "ind")
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=300)


def test_install_refuses_a_bad_value_and_patches_nothing(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = _child(f"""
        import cachedb
        from torch._inductor.codecache import FxGraphCache
        before = FxGraphCache.__dict__["_write_to_local_cache"]
        try:
            cachedb.install({str(tmp_path / 'x.db')!r})
        except cachedb.settings.SettingError as exc:
            print("refused:", exc)
        print(cachedb.is_installed(), FxGraphCache.__dict__["_write_to_local_cache"] is before)
    """, {"CACHEDB_TIMEOUT": "10s"}, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == [
        "refused: CACHEDB_TIMEOUT='10s': expected seconds, a number >= 0 (e.g. 10 or 0.5)", "False True"]
    assert not (tmp_path / "x.db").exists()


def test_a_process_activated_by_the_environment_says_it_once_and_torch_compiles(tmp_path: Path) -> None:
    """Under ``cachedb run``'s environment, a bad value: one warning line, cachedb off, the
    compile runs on torch's own files."""
    pytest.importorskip("torch")
    from cachedb.live import child_environment

    env = child_environment(str(tmp_path / "env.db"), base={})
    env["CACHEDB_REMOTE_TIMEOUT"] = "two"
    out = _child("""
        import torch
        f = torch.compile(lambda x: x.sin() + 1)
        print(f(torch.zeros(3)).tolist())
        import cachedb
        print(cachedb.is_installed())
    """, env, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == ["[1.0, 1.0, 1.0]", "False"]
    lines = [line for line in out.stderr.splitlines() if "cachedb" in line]
    assert len(lines) == 1, out.stderr
    assert "CACHEDB_REMOTE_TIMEOUT='two': expected seconds, a number > 0" in lines[0]
    assert not (tmp_path / "env.db").exists() and (tmp_path / "ind" / "fxgraph").is_dir()


def test_cachedb_run_refuses_a_bad_value_before_starting_the_program(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_")}
    env["CACHEDB_EXIT_FLUSH"] = "soon"
    proc = subprocess.run([sys.executable, "-m", "cachedb", "--db", str(tmp_path / "r.db"), "run", "--",
                           sys.executable, "-c", "print('ran')"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and "ran" not in proc.stdout
    assert "CACHEDB_EXIT_FLUSH='soon': expected seconds" in proc.stderr
