"""``cachedb report`` on a real database: a real Inductor cache imported, plus autotune
timings of two GPU fingerprints (torch 2.11 and 2.13) recorded through the repository, so the
history has several series and re-benchmarks. The HTML is rendered in headless Chromium with
the network blocked: the charts must draw from the file alone."""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from cachedb import CacheDB
from cachedb.cli import main
from cachedb.fingerprint import Fingerprint
from cachedb.layout.importer import Importer
from cachedb.repositories.choices import describe

pytestmark = [pytest.mark.torch, pytest.mark.slow]

#: A GEMM as Inductor keys it: per input (device, dtype, *sizes, *strides, offset).
MM_INPUTS = ("[('cuda', 'torch.bfloat16', 4096, 4096, 4096, 1, 0), "
             "('cuda', 'torch.bfloat16', 4096, 4096, 4096, 1, 0)]")
MM_CHOICES = {"mm": 0.61, "triton_mm_128x128x64_w8_s3": 0.52, "triton_mm_64x128x32_w4_s4": 0.58,
              "triton_mm_256x128x64_w8_s3": 0.55}
H100 = {"name": "NVIDIA H100 80GB HBM3"}


def _triton(block_m: int, block_n: int, block_k: int, stages: int, warps: int) -> tuple[str, dict]:
    """A Triton mm template's description and ``info_dict()`` as torch 2.13 writes them
    (``TritonTemplate.generate``, torch/_inductor/select_algorithm.py)."""
    description = (f"ACC_TYPE='tl.float32', ALLOW_TF32=False, BLOCK_K={block_k}, BLOCK_M={block_m}, "
                   f"BLOCK_N={block_n}, EVEN_K=True, GROUP_M=8, USE_FAST_ACCUM=False, num_stages={stages}, "
                   f"num_warps={warps}")
    info = {"backend": "Triton", "tile_shape": str((block_m, block_k, block_n)), "num_stages": stages,
            "num_warps": warps, "GROUP_M": 8, "allow_tf32": "False", "acc_type": "tl.float32"}
    return description, info


#: What torch said of three of the four choices (the fourth stays a bare hash, as an
#: imported timing is).
MM_DESCRIBED = {
    "mm": ("mm", "", {"backend": "extern", "kernel_call_name": "extern_kernels.mm"}),
    "triton_mm_128x128x64_w8_s3": ("triton_mm_3", *_triton(128, 128, 64, 3, 8)),
    "triton_mm_64x128x32_w4_s4": ("triton_mm_7", *_triton(64, 128, 32, 4, 4)),
}
#: The label the report gives the 2.11 winner.
WINNER_LABEL = "triton_mm_3 · BLOCK_M=128 BLOCK_N=128 BLOCK_K=64 GROUP_M=8 stages=3 warps=8"


def fill_report_db(cache_dir: Path, path: Path) -> dict[str, int]:
    """Import ``cache_dir`` (a real Inductor cache) into a new database at ``path``, then record
    GEMM timings for two GPU fingerprints (torch 2.11.0 and 2.13.0; the 2.11 one benchmarked
    twice) and some hits. Returns the fingerprint ids."""
    db = CacheDB(path)
    try:
        report = Importer(db).run(cache_dir)
        assert not report.problems, report.problems
        with db.transaction() as repos:
            old = repos.fingerprints.ensure(Fingerprint(
                system={"device": H100, "version": {"triton": "triton-3.6", "cuda": "13.0"}, "hash": "a" * 64},
                torch_version="2.11.0"))
            new = repos.fingerprints.ensure(Fingerprint(
                system={"device": H100, "version": {"triton": "triton-3.7", "cuda": "13.0"}, "hash": "b" * 64},
                torch_version="2.13.0"))
            repos.timings.record(old, "mm", MM_INPUTS, "high", MM_CHOICES)
            repos.choices.put_new([describe(h, name, description, info)
                                   for h, (name, description, info) in MM_DESCRIBED.items()])
            # under 2.13 the old winner got slower (a regression), the others a bit faster
            repos.timings.record(new, "mm", MM_INPUTS, "high",
                                 {c: ms * (1.2 if c == "triton_mm_128x128x64_w8_s3" else 0.97)
                                  for c, ms in MM_CHOICES.items()})
        with db.transaction() as repos:  # a re-benchmark: history beyond the current timings
            repos.timings.record(old, "mm", MM_INPUTS, "high", {c: ms * 1.01 for c, ms in MM_CHOICES.items()})
            now = dt.datetime.now(dt.timezone.utc)
            entries = repos.session.execute(text("SELECT kind, key, variant FROM guarded_entries ORDER BY id")).all()
            repos.guarded.record_hits({(k, key, v): (3 * i + 1, now - dt.timedelta(hours=5 * i))
                                       for i, (k, key, v) in enumerate(entries)})
            kernels = repos.session.execute(text("SELECT kind, host_key, key FROM kernels ORDER BY key")).all()
            repos.artifacts.record_hits({(k, h, key): (i + 2, now - dt.timedelta(hours=3 * i))
                                         for i, (k, h, key) in enumerate(kernels)})
        return {"old": old, "new": new}
    finally:
        db.close()


@pytest.fixture(scope="module")
def report_db(real_cache: tuple[Path, dict], tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache_dir, _ = real_cache
    path = tmp_path_factory.mktemp("report") / "cache.db"
    fill_report_db(cache_dir, path)
    return path


def test_collect_reads_every_section(report_db: Path) -> None:
    from cachedb.tools.report import collect

    db = CacheDB(report_db)
    try:
        data = collect(db)
        with db.read() as repos:
            n_current = repos.session.execute(text("SELECT COUNT(*) FROM autotune_current")).scalar_one()
            n_history = repos.session.execute(text("SELECT COUNT(*) FROM autotune_history")).scalar_one()
            n_kernels = repos.session.execute(text("SELECT COUNT(*) FROM kernels")).scalar_one()
            n_best = repos.session.execute(text("SELECT COUNT(*) FROM best_configs")).scalar_one()
    finally:
        db.close()
    assert len(data.timings) == n_current and len(data.history) == n_history > n_current
    assert len(data.kernels) == n_kernels > 0 and len(data.best_configs) == n_best > 0
    mm = [w for w in data.winners if w["op"] == "mm"]
    assert {w["series"].split(" · ")[1] for w in mm} == {"torch 2.11.0", "torch 2.13.0"}
    by_torch = {w["series"].split(" · ")[1]: w for w in mm}
    assert by_torch["torch 2.11.0"]["winner"] == "triton_mm_128x128x64_w8_s3"
    assert by_torch["torch 2.13.0"]["winner"] == "triton_mm_256x128x64_w8_s3"
    assert by_torch["torch 2.11.0"]["candidates"] == 4
    # named by name and config; the undescribed choice by its hash
    assert by_torch["torch 2.11.0"]["winner_label"] == WINNER_LABEL
    assert by_torch["torch 2.11.0"]["backend"] == "Triton"
    assert by_torch["torch 2.11.0"]["runner_up_label"] == "triton_mm_256x128x64_w8_s3"
    assert by_torch["torch 2.13.0"]["winner_label"] == "triton_mm_256x128x64_w8_s3"
    assert by_torch["torch 2.13.0"]["runner_up_label"].startswith("triton_mm_7 · BLOCK_M=64 BLOCK_N=128 BLOCK_K=32")
    # every series with its torch version: the two GPU ones and the imported CPU cache's
    versions = {r["torch_version"] for r in data.series}
    assert {"2.11.0", "2.13.0"} <= versions and len(data.series) == 3
    # one op and shape on both GPU series side by side, one row per choice
    (group,) = {w["group"] for w in mm}
    series, rows = data.side_by_side(group)
    assert len(series) == 2 and len(rows) == 4
    winner_row = next(r for r in rows if r["label"] == WINNER_LABEL)
    assert set(winner_row["ms"]) == set(series) and len(winner_row["won"]) == 1
    assert "torch 2.11.0" in next(iter(winner_row["won"]))
    extern = next(r for r in rows if r["label"] == "mm")
    assert extern["backend"] == "extern" and not extern["won"]
    assert mm[0]["shape"] == "bf16[4096,4096] × bf16[4096,4096]"
    # the real cache's own CPU autotuning is there too, winner = the fastest current choice
    real = [w for w in data.winners if w["op"] != "mm"]
    assert real, "the real cache holds CPU autotune timings"
    for w in real:
        mine = [t["timing_ms"] for t in data.timings if t["group"] == w["group"] and t["series"] == w["series"]]
        assert w["winner_ms"] == min(mine)
    assert sum(h["hits"] for h in data.hits) > 0
    assert {r["kind"] for r in data.contents} >= {"fxgraph", "aotautograd", "autotune_timings"}


def test_text_report(report_db: Path) -> None:
    result = CliRunner().invoke(main, ["report", "--db", str(report_db), "--format", "text"],
                                env={"COLUMNS": "220"})  # a terminal wide enough for a choice's hash
    assert result.exit_code == 0, result.output
    out = result.output
    for needle in ("Autotune winners", "triton_mm_128x128x64_w8_s3", "torch 2.13.0", "Best configs",
                   "Cache contents", "Kernels", "Hits", "fxgraph", "Series", "2.11.0", "side by side",
                   "triton_mm_3 · BLOCK_M=128", "extern", "Compile seconds saved"):
        assert needle in out, needle


def test_seconds_saved_by_day_of_last_hit(db: CacheDB) -> None:
    """On SQLite and PostgreSQL: each entry's seconds saved (compile time × hits) fall on the
    UTC day of its last hit, summed per kind; entries never hit are left out; the HTML draws
    them as one stacked bar per day and the text form lists them."""
    from cachedb.tools.report import collect, render_html, saved_chart

    monday = dt.datetime(2026, 11, 30, 23, 30, tzinfo=dt.timezone.utc)
    with db.transaction() as repos:
        for kind, key, seconds, hits, used in (
                ("fxgraph", "fa", 2.0, 3, monday), ("fxgraph", "fb", 0.5, 4, monday - dt.timedelta(hours=1)),
                ("aotautograd", "aa", 10.0, 1, monday), ("fxgraph", "fc", 1.0, 2, monday + dt.timedelta(hours=1)),
                ("fxgraph", "fnever", 50.0, 0, monday)):
            variant, _ = repos.guarded.put(kind, key, key.encode() * 100, guards_expr=None,
                                           time_taken_ns=int(seconds * 1e9))
            repos.guarded.record_hits({(kind, key, variant): (hits, used)})
    data = collect(db)
    assert data.saved == [
        {"day": "2026-11-30", "kind": "aotautograd", "entries": 1, "hits": 1, "seconds_saved": 10.0},
        {"day": "2026-11-30", "kind": "fxgraph", "entries": 2, "hits": 7, "seconds_saved": 8.0},
        {"day": "2026-12-01", "kind": "fxgraph", "entries": 1, "hits": 2, "seconds_saved": 2.0},
    ]
    figure = saved_chart(data)
    assert [(t["name"], t["x"], t["y"]) for t in figure["data"]] == [
        ("aotautograd", ["2026-11-30", "2026-12-01"], [10.0, 0]), ("fxgraph", ["2026-11-30", "2026-12-01"], [8.0, 2.0])]
    page = render_html(data, plotly_js="")
    assert '<section id="saved"><h2>Seconds saved over time</h2>' in page and "day of last hit (UTC)" in page
    text_out = CliRunner().invoke(main, ["report", "--db", db.where, "--format", "text"], env={"COLUMNS": "200"})
    assert text_out.exit_code == 0 and "Compile seconds saved, by the day of each entry's last hit" in text_out.output


def test_report_never_creates_a_database(tmp_path: Path) -> None:
    missing = tmp_path / "nothing" / "x.db"
    for fmt in ("html", "text"):
        result = CliRunner().invoke(main, ["report", "--db", str(missing), "--format", fmt,
                                           "--out", str(tmp_path / "r.html")])
        assert result.exit_code == 1
        assert "no database at" in result.output
    assert not missing.parent.exists() and not (tmp_path / "r.html").exists()


# --------------------------------------------------------------------------- HTML in Chromium


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    if shutil.which("apt-get") is None:
        pytest.skip("no Chromium and no apt-get to install it (Debian's chromium package)")
    pytest.fail("Chromium is missing: apt-get install chromium (bash .ci/test installs it)")


def _chromium_run(html: Path, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium with every network request refused (no DNS, a dead proxy)."""
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}",
           "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost", "--proxy-server=127.0.0.1:9",
           "--virtual-time-budget=15000", *args, html.as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)


def png_pixels(path: Path) -> tuple[int, int, int, list[bytes]]:
    """``(width, height, bytes per pixel, rows)`` of an 8-bit, non-interlaced RGB/RGBA PNG
    (what Chromium writes), filters undone."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert header is not None
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, header
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        ftype = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if ftype == 1:
                line[i] = (line[i] + a) & 0xFF
            elif ftype == 2:
                line[i] = (line[i] + b) & 0xFF
            elif ftype == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


def test_html_report_draws_its_charts_offline(report_db: Path, tmp_path: Path) -> None:
    pytest.importorskip("plotly", reason="the HTML report needs the report extra (Plotly)")
    out = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["report", "--db", str(report_db), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "report written to" in result.output and out.stat().st_size > 1_000_000  # Plotly inlined
    page = out.read_text(encoding="utf-8")

    # Nothing to fetch: no script, stylesheet, image or frame with a URL; one document.
    tags = re.findall(r"<(script|link|img|iframe)\b[^>]*>", page, flags=re.I)
    for tag in re.findall(r"<(?:script|link|img|iframe)\b[^>]*>", page, flags=re.I):
        assert not re.search(r"\b(src|href)\s*=", tag, flags=re.I), tag
    assert tags.count("script") >= 3
    n_charts = len(re.findall(r'<div id="chart-\d+" class="chart">', page))
    assert n_charts >= 7  # two op/shape groups, a history, best configs, contents, kernels, seconds saved, hits

    dom_run = _chromium_run(out, tmp_path / "profile", "--dump-dom")
    assert dom_run.returncode == 0, dom_run.stderr[-2000:]
    dom = dom_run.stdout
    assert f'data-charts-drawn="{n_charts}"' in dom, re.findall(r"data-charts-\w+=\"[^\"]*\"", dom)
    assert len(re.findall(r'<svg class="main-svg"', dom)) >= n_charts
    # the marks themselves: bar paths and scatter points inside the plots
    assert len(re.findall(r'<g class="point">\s*<path d="M[^"]+"', dom)) >= 8
    assert "triton_mm_128x128x64_w8_s3" in dom and "★" in dom
    assert WINNER_LABEL in dom  # the choice by name and config, its hash on hover
    assert f'title="triton_mm_128x128x64_w8_s3">{WINNER_LABEL}<' in dom
    assert "Side by side" in dom and ">2.11.0<" in dom and ">2.13.0<" in dom

    shot = tmp_path / "report.png"
    shot_run = _chromium_run(out, tmp_path / "profile2", "--window-size=1400,2400", f"--screenshot={shot}")
    assert shot_run.returncode == 0 and shot.exists(), shot_run.stderr[-2000:]
    width, height, bpp, rows = png_pixels(shot)
    assert (width, height) == (1400, 2400)
    colours: set[bytes] = set()
    coloured = 0  # saturated pixels: chart bars and markers (the page itself is grey on white)
    for row in rows[::4]:
        for x in range(0, width * bpp, 4 * bpp):
            r, g, b = row[x], row[x + 1], row[x + 2]
            colours.add(bytes((r, g, b)))
            if max(r, g, b) - min(r, g, b) > 60:
                coloured += 1
    assert len(colours) > 50
    assert coloured > 2000, coloured  # Plotly's blue/orange bars and points, not a blank page


def test_report_open_calls_the_browser(report_db: Path, tmp_path: Path) -> None:
    pytest.importorskip("plotly", reason="the HTML report needs the report extra (Plotly)")
    seen = tmp_path / "opened.txt"
    browser = tmp_path / "browser.sh"
    browser.write_text(f'#!/bin/sh\necho "$1" > {seen}\n')
    browser.chmod(0o755)
    out = tmp_path / "r.html"
    env = dict(os.environ, BROWSER=str(browser))
    env.pop("DISPLAY", None)
    proc = subprocess.run([sys.executable, "-m", "cachedb", "--db", str(report_db), "report", "--out", str(out),
                           "--open"], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    for _ in range(50):  # webbrowser may start the command in the background
        if seen.exists() and seen.read_text().strip():
            break
        import time

        time.sleep(0.1)
    assert seen.read_text().strip() == out.resolve().as_uri()
