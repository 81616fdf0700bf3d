"""Fixtures of the reliability suite and the hook that writes its figures.

The database fixtures (``pg_url``, ``sqlite_db``, ...) come from ``tests/conftest.py``.
"""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing
import os
import platform
import sqlite3
import time
from collections import Counter

import pytest

from . import _work, figures

_started = time.monotonic()
_outcomes: Counter[str] = Counter()
_durations: dict[str, float] = {}


@pytest.fixture(scope="session")
def mp() -> multiprocessing.context.BaseContext:
    """A multiprocessing context whose children are forked from a server that has already
    imported cachedb (``_work``): real, separate processes that start in milliseconds instead
    of the ~1.5 s an interpreter takes to import SQLAlchemy and Alembic."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["__main__", _work.__name__])
    warm = ctx.Process(target=_work.noop)  # start the server now, not inside a timed trial
    warm.start()
    warm.join()
    return ctx


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "tests/reliability/" not in report.nodeid.replace(os.sep, "/"):
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        outcome = "xfailed" if hasattr(report, "wasxfail") and report.skipped else report.outcome
        if hasattr(report, "wasxfail") and report.passed:
            outcome = "xpassed"
        _outcomes[outcome] += 1
    module = report.nodeid.split("::")[0]
    _durations[module] = _durations.get(module, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Write the figures where ``$CACHEDB_RELIABILITY_FIGURES`` says (``python
    tests/reliability/figures.py`` sets it); a plain test run writes nothing (the suite's
    workers each see only part of the figures)."""
    if not figures.FIGURES or not os.environ.get(figures.ENV_PATH):
        return
    data = {
        "figures": figures.FIGURES,
        "totals": figures.totals(figures.FIGURES),
        "run": {
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "wall_s": round(time.monotonic() - _started, 1),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
            "outcomes": dict(sorted(_outcomes.items())),
            "exit_status": int(exitstatus),
        },
        "seconds_per_module": {k: round(v, 1) for k, v in sorted(_durations.items())},
    }
    path = figures.output_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    except OSError as exc:  # a read-only checkout must not fail the run
        print(f"reliability figures not written to {path}: {exc}")
