"""``cachedb datasette-metadata`` and a real Datasette serving a real database with it: the
views and canned queries answer through Datasette's JSON API (127.0.0.1, a free port, stopped
at the end)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cachedb.cli import main
from cachedb.tools.datasette import QUERIES, TABLES, database_name, metadata
from cachedb.store.models import VIEW_NAMES, Base

from .test_report import fill_report_db


def test_metadata_covers_every_table_and_view() -> None:
    doc = metadata("cache")
    tables = doc["databases"]["cache"]["tables"]
    assert set(Base.metadata.tables) | set(VIEW_NAMES) <= set(tables)
    assert all(spec.get("description") for spec in tables.values())
    assert tables["autotune_timings"]["units"]["timing_ms"] == "ms"
    assert tables["kernels"]["units"]["stored_bytes"] == "bytes"
    assert set(doc["databases"]["cache"]["queries"]) == {"winners_per_op", "torch_regressions", "largest_entries",
                                                          "stale_fingerprints"}
    assert ":old" in QUERIES["torch_regressions"]["sql"] and ":new" in QUERIES["torch_regressions"]["sql"]
    assert ":days" in QUERIES["stale_fingerprints"]["sql"]
    assert database_name("/data/inductor.db") == "inductor" and database_name("x/cache.sqlite3") == "cache"
    assert "alembic_version" in TABLES


def test_cli_prints_json_or_yaml_and_writes_a_file(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["datasette-metadata", "--db", str(tmp_path / "team.db")])
    assert result.exit_code == 0, result.output
    assert "team" in json.loads(result.output)["databases"]
    assert not (tmp_path / "team.db").exists()  # the database is never opened, let alone created
    out = tmp_path / "meta.json"
    result = runner.invoke(main, ["--db", str(tmp_path / "team.db"), "datasette-metadata", "--out", str(out)])
    assert result.exit_code == 0 and result.output.strip() == str(out.resolve())
    assert json.loads(out.read_text()) == metadata("team")
    yaml = pytest.importorskip("yaml")
    result = runner.invoke(main, ["datasette-metadata", "--format", "yaml", "--name", "cache"])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.output) == metadata("cache")


# --------------------------------------------------------------------------- a real Datasette


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1 only, never a proxy


def _get(url: str, timeout: float = 10.0) -> Any:
    with _NO_PROXY.open(url, timeout=timeout) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def served(real_cache: tuple[Path, dict], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Datasette serving a real database (imported cache + two torch versions' timings) with
    cachedb's metadata; yields the database's base URL."""
    pytest.importorskip("datasette", reason="Datasette is in the dev extra: pip install -e '.[dev]'")
    work = tmp_path_factory.mktemp("datasette")
    db_path = work / "cache.db"
    fill_report_db(real_cache[0], db_path)
    meta = work / "meta.json"
    result = CliRunner().invoke(main, ["--db", str(db_path), "datasette-metadata", "--out", str(meta)])
    assert result.exit_code == 0, result.output
    port = _free_port()
    log = (work / "datasette.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "datasette", "serve", str(db_path), "-m", result.output.strip(),
         "--host", "127.0.0.1", "--port", str(port), "--setting", "sql_time_limit_ms", "5000"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                _get(f"{base}/-/versions.json", timeout=2)
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    pytest.fail(f"datasette did not start: {(work / 'datasette.log').read_text()[-2000:]}")
                time.sleep(0.3)
        yield f"{base}/cache"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
        log.close()


def _rows(url: str, **params: str) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({**params, "_shape": "array"})
    return _get(f"{url}.json?{query}")


def test_datasette_serves_metadata_views_and_canned_queries(served: str) -> None:
    base = served.rsplit("/", 1)[0]
    meta = _get(f"{base}/-/metadata.json")
    assert meta["databases"]["cache"]["tables"]["autotune_winners"]["description"].startswith("View:")

    winners = _rows(f"{served}/autotune_winners")
    mm = {w["torch_version"]: w for w in winners if w["op"] == "mm"}
    assert mm["2.11.0"]["choice_hash"] == "triton_mm_128x128x64_w8_s3" and mm["2.11.0"]["candidates"] == 4
    assert mm["2.13.0"]["choice_hash"] == "triton_mm_256x128x64_w8_s3"
    assert len(_rows(f"{served}/kernels")) > 0

    per_op = _rows(f"{served}/winners_per_op", op="mm")
    assert {r["torch_version"] for r in per_op} == {"2.11.0", "2.13.0"} and all(r["op"] == "mm" for r in per_op)
    named = {r["torch_version"]: r for r in per_op}
    assert (named["2.11.0"]["winner"], named["2.11.0"]["backend"], named["2.11.0"]["num_warps"]) == ("triton_mm_3",
                                                                                                    "Triton", 8)
    assert named["2.11.0"]["runner_up_name"] is None  # the runner-up is a bare hash: no description stored
    assert len(_rows(f"{served}/winners_per_op", op="")) == len(winners)

    regressions = _rows(f"{served}/torch_regressions", old="2.11.0", new="2.13.0")
    assert len(regressions) == 1
    r = regressions[0]
    assert (r["old_winner"], r["new_winner"]) == ("triton_mm_128x128x64_w8_s3", "triton_mm_256x128x64_w8_s3")
    assert (r["old_winner_name"], r["new_winner_name"]) == ("triton_mm_3", None)
    assert r["ratio"] == pytest.approx(0.55 * 0.97 / (0.52 * 1.01), abs=1e-3) and r["ratio"] > 1
    assert _rows(f"{served}/torch_regressions", old="2.13.0", new="2.11.0") == []

    largest = _rows(f"{served}/largest_entries")
    assert largest and largest == sorted(largest, key=lambda x: -x["stored_bytes"])
    assert {x["kind"] for x in largest} >= {"fxgraph", "aotautograd"}

    stale_now = _rows(f"{served}/stale_fingerprints", days="-1")  # anything used before now
    recent = _rows(f"{served}/stale_fingerprints", days="3650")
    assert {f["torch_version"] for f in stale_now} >= {"2.11.0", "2.13.0"}
    assert all(f["last_used_at"] is None for f in recent)  # only fingerprints holding nothing
