"""What each hit is worth: the view ``entry_value`` and docs/schema.md's queries over it, on
SQLite and PostgreSQL, with real rows written through the repositories."""

from __future__ import annotations

import datetime as dt
import random
import re
from pathlib import Path

import pytest
from sqlalchemy import text

from cachedb import CacheDB
from cachedb.tools.stats import collect

ROOT = Path(__file__).resolve().parent.parent
NOW = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.timezone.utc)


def put(db: CacheDB, kind: str, key: str, nbytes: int, compile_s: float | None, hits: int,
        used: dt.datetime = NOW) -> None:
    """One variant of ``nbytes`` incompressible bytes, compiled in ``compile_s`` seconds
    (``None``: torch recorded none), hit ``hits`` times, last used at ``used``."""
    payload = random.Random(key).randbytes(nbytes)
    with db.transaction() as repos:
        variant, _ = repos.guarded.put(kind, key, payload, guards_expr=None,
                                       time_taken_ns=None if compile_s is None else int(compile_s * 1e9))
        repos.guarded.record_hits({(kind, key, variant): (hits, used)})


def _documented_queries() -> list[str]:
    doc = (ROOT / "docs" / "schema.md").read_text()
    queries = re.findall(r"```sql\n(.*?)```", doc.split("## Queries", 1)[1], re.S)
    return [q for q in queries if "entry_value" in q]


def test_entry_value_and_its_documented_queries(db: CacheDB) -> None:
    """Per variant: compile seconds, hits, seconds saved = compile seconds × hits (0 where
    torch recorded no compile time), bytes; per kind the sum is ``cachedb stats``' figure."""
    put(db, "fxgraph", "fpointwise", 40_000, 0.5, 10)
    put(db, "fxgraph", "fautotuned", 200_000, 90.0, 2)
    put(db, "fxgraph", "fimported", 1_000, None, 7)
    put(db, "aotautograd", "aforward", 10_000, 3.0, 1)
    per_kind, top = _documented_queries()
    with db.engine.connect() as conn:
        kinds = [dict(r) for r in conn.execute(text(per_kind)).mappings()]
        best = [dict(r) for r in conn.execute(text(top)).mappings()]
    assert [(r["kind"], r["entries"], r["hits"], r["seconds_saved"]) for r in kinds] == [
        ("aotautograd", 1, 1, 3.0), ("fxgraph", 3, 19, 185.0)]
    assert all(r["stored_bytes"] > 0 for r in kinds)
    assert [(r["key"], r["compile_seconds"], r["hits"], r["seconds_saved"]) for r in best] == [
        ("fautotuned", 90.0, 2, 180.0), ("fpointwise", 0.5, 10, 5.0), ("aforward", 3.0, 1, 3.0),
        ("fimported", None, 7, 0.0)]
    assert best[0]["seconds_saved_per_mib"] == pytest.approx(180.0 * 1048576 / best[0]["stored_bytes"])
    with db.read() as repos:
        stats = {r["kind"]: r["seconds_saved"] for r in collect(repos.session)}
    assert (stats["fxgraph"], stats["aotautograd"]) == (185.0, 3.0)
