"""cachedb checks what it patches, and forks nothing of torch: each replaced function's
signature is checked at install, and each backport of a torch fix is installed only on the
releases that lack it, against the source pinned per release (tests/data/seam_sources.json,
made by tests/data/make_seam_sources.py from each release's wheel)."""

from __future__ import annotations

import importlib
import json
import pickle
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

DATA = Path(__file__).with_name("data")
sys.path.insert(0, str(DATA))
from make_seam_sources import TARGETS, digest  # noqa: E402

PINS = json.loads((DATA / "seam_sources.json").read_text())
TORCH_BACKPORTS = [name for name, (package, _, _) in TARGETS.items() if package == "torch"]


def _release(package: str) -> str:
    module = importlib.import_module(package)
    return f"{package} " + ".".join(module.__version__.split(".")[:2])


def _installed_digest(name: str) -> str | None:
    package, file, qualname = TARGETS[name]
    root = Path(importlib.import_module(package).__file__).parent.parent
    return digest(root / file, qualname)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_the_source_each_backport_replaces_is_pinned_for_this_release(name: str) -> None:
    """A release (or patch release) that changes what a backport replaces is seen here: pin it
    anew only after checking whether the backport still applies to it."""
    package = TARGETS[name][0]
    if package == "triton":
        pytest.importorskip("triton")
    release = _release(package)
    assert release in PINS[name], f"{release}: {name} not pinned (python tests/data/make_seam_sources.py)"
    assert _installed_digest(name) == PINS[name][release], f"{name} changed in {release}"


def test_backports_are_installed_only_where_torch_lacks_the_fix() -> None:
    pytest.importorskip("triton")
    from cachedb.live import _autotune

    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    installed = {name for _, name, _ in _autotune.patches()}
    backports = {"recheck_autotune_cache", "_dynamic_scale_rblock", "_load_cached_autotuning"}
    if (major, minor) < _autotune.FIXED_IN:
        assert backports <= installed
        # what torch 2.13 has: the pinned 2.13 sources differ from this release's
        for name in TORCH_BACKPORTS:
            assert PINS[name][f"torch {major}.{minor}"] != PINS[name]["torch 2.13"]
    else:
        assert not installed & backports
    assert "__setstate__" in installed  # Triton's Config drops the mark on every release pinned


def test_torchs_own_autotuner_runs_where_it_has_the_fixes(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    import cachedb
    from cachedb.live import _autotune
    from torch._inductor.runtime import autotune_cache, triton_heuristics

    own = (triton_heuristics.CachingAutotuner.recheck_autotune_cache, autotune_cache._load_cached_autotuning,
           triton_heuristics.CachingAutotuner._dynamic_scale_rblock)
    with cachedb.installed(tmp_path / "a.db"):
        now = (triton_heuristics.CachingAutotuner.recheck_autotune_cache, autotune_cache._load_cached_autotuning,
               triton_heuristics.CachingAutotuner._dynamic_scale_rblock)
    if not _autotune.backports_needed():
        assert now == own
    else:
        assert all(a is not b for a, b in zip(now, own))


def test_config_setstate_gives_back_the_mark_and_nothing_else(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    import cachedb
    from triton import Config

    marked = Config({"XBLOCK": 64}, num_warps=4, num_stages=1)
    marked.found_by_coordesc = True
    plain = Config({"XBLOCK": 64}, num_warps=4, num_stages=1)
    assert not hasattr(pickle.loads(pickle.dumps(marked)), "found_by_coordesc")  # Triton's own
    with cachedb.installed(tmp_path / "m.db"):
        back, other = pickle.loads(pickle.dumps(marked)), pickle.loads(pickle.dumps(plain))
    assert back.found_by_coordesc is True and not hasattr(other, "found_by_coordesc")
    assert vars(back) == {**vars(other), "found_by_coordesc": True}
    assert not hasattr(pickle.loads(pickle.dumps(marked)), "found_by_coordesc")  # restored after


def test_a_seam_with_another_signature_refuses_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A torch whose ``FxGraphCache._write_to_local_cache`` takes another parameter:
    ``SeamMissingError`` naming both signatures, nothing patched, torch's own behaviour."""
    import cachedb
    from torch._inductor import codecache

    def _write_to_local_cache(key: str, content: bytes, mode: str = "w") -> None:
        raise AssertionError("not called here")

    monkeypatch.setattr(codecache.FxGraphCache, "_write_to_local_cache", staticmethod(_write_to_local_cache))
    before = {name: vars(codecache.CacheBase)[name] for name in ("get_local_cache", "update_local_cache")}
    with pytest.raises(cachedb.live.SeamMissingError, match=r"_write_to_local_cache takes \(key, content, mode\)"):
        cachedb.install(tmp_path / "s.db")
    assert not cachedb.is_installed()
    assert {name: vars(codecache.CacheBase)[name] for name in before} == before
    assert vars(codecache.FxGraphCache)["_write_to_local_cache"].__func__ is _write_to_local_cache
