"""The factors of FX graph keys and the miss log: torch's debug lines parsed into factors, and
the log bounded."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachedb import CacheDB
from cachedb.keys.factors import Factor, differences, equal_count, parse_debug_lines, readable
from cachedb.settings import SettingError, read

torch = pytest.importorskip("torch")

def test_miss_log_is_a_ring(tmp_path: Path) -> None:
    db = CacheDB(str(tmp_path / "ring.db"))
    try:
        for i in range(7):
            with db.transaction() as repos:
                repos.misses.add("fxgraph", f"k{i}", "no_entry", [Factor("gm", f"h{i}", f"v{i}")], keep=3)
        with db.read() as repos:
            recent = repos.misses.recent(10)
            assert [m["key"] for m in recent] == ["k6", "k5", "k4"]
            assert recent[0]["factors"] == {"gm": ("h6", "v6")}
    finally:
        db.close()


def test_miss_log_setting() -> None:
    assert read("CACHEDB_MISS_LOG", {}) == 1000
    assert read("CACHEDB_MISS_LOG", {"CACHEDB_MISS_LOG": "0"}) == 0
    with pytest.raises(SettingError):
        read("CACHEDB_MISS_LOG", {"CACHEDB_MISS_LOG": "-1"})


def test_factors_of_torchs_own_hash() -> None:
    """``compiled_fx_graph_hash`` (torch/_inductor/codecache.py) on a traced graph: one factor
    per debug line, and another input dtype changes that input's factor alone."""
    from torch._inductor.codecache import compiled_fx_graph_hash

    gm = torch.fx.symbolic_trace(lambda x: torch.sin(x) + 1)
    _, lines = compiled_fx_graph_hash(gm, [torch.randn(4)], {}, [])
    _, other = compiled_fx_graph_hash(gm, [torch.randn(4, dtype=torch.float64)], {}, [])
    a = {f.factor: (f.hash, f.value) for f in parse_debug_lines(lines)}
    b = {f.factor: (f.hash, f.value) for f in parse_debug_lines(other)}
    assert len(a) == sum(1 for line in lines if line.startswith("["))
    assert a["example_inputs[0]"][1] == "float32[4]"
    assert "inductor_config.max_autotune_pointwise" in a
    assert [(d.factor, d.stored, d.wanted) for d in differences(a, b)] == [
        ("example_inputs[0]", "float32[4]", "float64[4]")]


_names = st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True)
_values = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=300)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_names, st.none() | st.integers(0, 9) | _names,
                          st.from_regex(r"[a-z2-7]{52}", fullmatch=True), _values), max_size=30))
def test_parse_debug_lines_property(items) -> None:
    """Lines in ``FxGraphCachePickler.debug_lines``' form parse back to their names, hash
    prefixes and (folded, cut) values; a name met twice keeps its first value."""
    lines, expected = [], {}
    for name, item, h, value in items:
        shown = name if item is None else f"{name}[{item}]"
        lines.append(f"[{h}] {shown}: {value}")
        factor = name if item is None else f"{name}[{item}]" if isinstance(item, int) else f"{name}.{item}"
        expected.setdefault(factor, (h[:16], readable(value, h[:16])))
    got = {f.factor: (f.hash, f.value) for f in parse_debug_lines(lines)}
    assert got == expected
    assert all(len(v) <= 200 for _h, v in got.values())
    assert equal_count(got, got) == len(got) and differences(got, got) == []
