"""One compile per graph: processes that start the same cold workload together compile each
graph once in all, on one local file (the ranks of a machine) and through a shared PostgreSQL
(the machines of a fleet, directly and through PgBouncer); a holder killed, hung or too slow
frees its waiters. Real ``torch.compile`` (CPU) in every process (tests/_flight_child.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cachedb import CacheDB

from ._realcache import seeded

torch = pytest.importorskip("torch")

CHILD = Path(__file__).resolve().parents[1] / "benchmarks" / "_flight_child.py"
GRAPHS = 2  # the graphs every child shares (and one of its own each): two of the child's four


def _start(tmp_path: Path, db: Path, tag: str, *args: str, graphs: int = GRAPHS,
           **env_extra: str) -> tuple[subprocess.Popen[str], Path]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_")}
    env["TORCHINDUCTOR_CACHE_DIR"] = seeded(tmp_path / f"ind-{tag}")  # a machine's own directory
    env.update(env_extra)
    err = tmp_path / f"{tag}.err"
    proc = subprocess.Popen([sys.executable, str(CHILD), str(db), tag, "--graphs", str(graphs), *args],
                            stdout=subprocess.PIPE,
                            stderr=err.open("w"), text=True, env=env)
    return proc, err


def _report(proc: subprocess.Popen[str], err: Path) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.read_text()[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _until(predicate: Any, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _correct(report: dict[str, Any]) -> bool:
    return report["own_ok"] and all(torch.allclose(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-5)
                                    for a, b in zip(report["results"], report["eager"]))


def _compiled_once(reports: list[dict[str, Any]]) -> None:
    """Each shared graph compiled once in all, each process's own graph by itself, every
    result right, and no process waited on another's own graph (another key)."""
    assert sum(r["miss"] for r in reports) == GRAPHS + len(reports), [(r["miss"], r["hit"]) for r in reports]
    assert all(_correct(r) for r in reports)
    assert all(len(r["waits"]) <= GRAPHS for r in reports)


@pytest.mark.slow
def test_ranks_sharing_a_local_file_compile_each_graph_once(tmp_path: Path) -> None:
    db = tmp_path / "machine.db"
    CacheDB(db).close()
    runs = [_start(tmp_path, db, f"rank{i}") for i in range(3)]
    reports = [_report(*run) for run in runs]
    _compiled_once(reports)
    waited = [w for r in reports for w in r["waits"]]
    assert waited and all(w["why"] == "landed" for w in waited)
    # a process that waited probed the vector ISAs meanwhile; one that never waited did not
    assert [r["warmed"] for r in reports] == [bool(r["waits"]) for r in reports]
    assert all("waiting for" in line and "which pid" in line
               for run in runs for line in run[1].read_text().splitlines() if "cachedb.live WARNING" in line)
    stats = subprocess.run([sys.executable, "-m", "cachedb", "--db", str(db), "stats", "--format", "json"],
                           capture_output=True, text=True, check=True, timeout=120)
    avoided = {r["kind"]: r["entries"] for r in json.loads(stats.stdout) if r["kind"].startswith("compiles_avoided:")}
    assert sum(avoided.values()) == len(waited), avoided


@pytest.mark.slow
@pytest.mark.parametrize("through", ["postgresql", "pgbouncer"])
def test_machines_sharing_a_remote_compile_each_graph_once(tmp_path: Path, through: str,
                                                           request: pytest.FixtureRequest) -> None:
    if through == "postgresql":
        remote = request.getfixturevalue("pg_url")
    else:
        remote = request.getfixturevalue("pgbouncer").url(request.getfixturevalue("database"))
    CacheDB(remote).close()
    runs = [_start(tmp_path, tmp_path / f"m{i}.db", f"machine{i}", "--remote", remote) for i in range(2)]
    reports = [_report(*run) for run in runs]
    _compiled_once(reports)
    assert any("through the remote tier" in line for run in runs for line in run[1].read_text().splitlines())
    database = CacheDB(remote)
    with database.read() as repos:
        left = repos.session.execute(__import__("sqlalchemy").text("SELECT count(*) FROM compile_claims")).scalar()
    database.close()
    assert left == 0  # every lease given up once its entry was sent


@pytest.mark.slow
def test_a_killed_hung_or_slow_holder_frees_its_waiters(tmp_path: Path) -> None:
    """Three machines, each a holder stuck in its first compile and a waiter: the holder is
    killed (SIGKILL: the kernel drops its claim, the waiter compiles at once), stopped (SIGSTOP:
    its heartbeat stops, the waiter compiles within 5 s), or just slow past the waiter's
    ``CACHEDB_COMPILE_WAIT`` (1 s). Every waiter finishes with right results."""
    cases = {"killed": {}, "hung": {}, "slow": {"CACHEDB_COMPILE_WAIT": "1"}}
    holders = {}
    for case in cases:
        db = tmp_path / f"{case}.db"
        CacheDB(db).close()
        holders[case] = _start(tmp_path, db, f"{case}-holder", "--hold-for", "120", graphs=1)
    for proc, _ in holders.values():
        assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
    waiters = {case: _start(tmp_path, tmp_path / f"{case}.db", f"{case}-waiter", graphs=1, **env)
               for case, env in cases.items()}
    for _, err in waiters.values():
        _until(lambda err=err: "waiting for" in err.read_text())
    acted = time.time()
    holders["killed"][0].send_signal(signal.SIGKILL)
    holders["hung"][0].send_signal(signal.SIGSTOP)
    try:
        reports = {case: _report(*run) for case, run in waiters.items()}
    finally:
        for proc, _ in holders.values():
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
    for case, report in reports.items():
        assert _correct(report), case
        first = report["waits"][0]
        assert first["why"] != "landed", (case, first)
    assert reports["killed"]["waits"][0]["ended_at"] - acted < 5, reports["killed"]["waits"][0]
    assert "released it without the entry" in reports["killed"]["waits"][0]["why"]
    assert reports["hung"]["waits"][0]["ended_at"] - acted < 5 + 2, reports["hung"]["waits"][0]
    assert "stopped beating" in reports["hung"]["waits"][0]["why"]
    assert reports["slow"]["waits"][0]["why"] == "the wait bound passed"
    assert 1 <= reports["slow"]["waits"][0]["seconds"] < 3
