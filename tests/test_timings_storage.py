"""The compact timings storage (revision 0004): rows written in the view's shape through
``insert_flat`` (import, copy/merge, the fleet tiers) read back through the view
``autotune_timings`` exactly, once per benchmark, with one key and one run per distinct
``(fingerprint, op, inputs, hint_override, precision)`` and ``recorded_at``. Property tests
on SQLite and PostgreSQL; every example runs in a transaction that is rolled back."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, func, select

from cachedb import CacheDB
from cachedb.store.bulk import utc
from cachedb.fingerprint import Fingerprint
from cachedb.store.models import AUTOTUNE_TIMINGS, AutotuneKey, AutotuneRun
from cachedb.repositories import timings as timings_repo

UTC = dt.timezone.utc
STAMPS = [dt.datetime(2026, 11, 23, 12, 0, s, 250 * s, tzinfo=UTC) for s in range(3)]
NATURAL = ("fingerprint_id", "op", "inputs", "hint_override", "precision", "recorded_at", "choice_hash")


@pytest.fixture
def fps(db: CacheDB) -> tuple[int, int]:
    with db.transaction() as repos:
        return (repos.fingerprints.ensure(Fingerprint(system={"hash": "a" * 64})),
                repos.fingerprints.ensure(Fingerprint(system={"hash": "b" * 64})))


def _rows(fps: tuple[int, int]) -> st.SearchStrategy[list[dict[str, Any]]]:
    row = st.fixed_dictionaries({
        "fingerprint_id": st.sampled_from(fps),
        "op": st.sampled_from(["mm", "addmm"]),
        "inputs": st.sampled_from(["[('cuda', 'torch.float16', 64, 64)]", "[('cpu', 'torch.float32', 8, 8)]"]),
        "hint_override": st.sampled_from([None, 4096]),
        "precision": st.sampled_from(["high", "highest"]),
        "choice_hash": st.sampled_from(["extern_mm", "triton_mm_1", "triton_mm_2"]),
        "timing_ms": st.floats(min_value=0.001, max_value=100.0, allow_nan=False),
        "position": st.integers(min_value=0, max_value=10_000),
        "recorded_at": st.sampled_from(STAMPS),
    })
    return st.lists(row, max_size=25)


def _natural(row: Any) -> tuple:
    return tuple(row[c] for c in NATURAL)


def _stored(conn: Connection) -> dict[tuple, tuple]:
    view = AUTOTUNE_TIMINGS
    out = {}
    for row in conn.execute(select(view)).mappings():
        values = dict(row)
        values["recorded_at"] = utc(values["recorded_at"])
        assert _natural(values) not in out, "a benchmark stored twice"
        out[_natural(values)] = (values["timing_ms"], values["position"])
    return out


def _first(rows: list[dict[str, Any]]) -> dict[tuple, tuple]:
    out: dict[tuple, tuple] = {}
    for r in rows:
        out.setdefault(_natural(r), (r["timing_ms"], r["position"]))
    return out


@pytest.fixture
def rolled_back(db: CacheDB) -> Iterator[Any]:
    def run(body: Any) -> None:
        with db.engine.connect() as conn:
            txn = conn.begin()
            try:
                body(conn)
            finally:
                txn.rollback()
    yield run


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_insert_flat_stores_each_benchmark_once(db: CacheDB, fps: tuple[int, int], rolled_back: Any,
                                                data: st.DataObject) -> None:
    first = data.draw(_rows(fps), label="first")
    second = data.draw(_rows(fps), label="second")

    def body(conn: Connection) -> None:
        stored = [first[i] for i in timings_repo.insert_flat(conn, first, skip_stored=True)]
        assert _first(stored) == _first(first) and len(stored) == len(_first(first))
        assert _stored(conn) == _first(first)
        assert timings_repo.insert_flat(conn, first, skip_stored=True) == []  # idempotent

        expected = {**_first(second), **_first(first)}  # what is stored stays
        added = [second[i] for i in timings_repo.insert_flat(conn, second, skip_stored=True)]
        assert {_natural(r) for r in added} == set(_first(second)) - set(_first(first))
        assert _stored(conn) == expected

        # tier sync: what is added goes after everything stored, in the rows' own order
        third = data.draw(_rows(fps), label="third")
        top = timings_repo.next_position(conn)
        placed = timings_repo.insert_flat(conn, third, skip_stored=True, place_after_stored=True)
        now = _stored(conn)
        by_own_position = sorted(placed, key=lambda i: third[i]["position"])
        assert [now[_natural(third[i])][1] for i in by_own_position] == list(range(top, top + len(placed)))
        expected.update((_natural(third[i]), (third[i]["timing_ms"], now[_natural(third[i])][1])) for i in placed)
        assert now == expected

        keys = {k[:5] for k in expected}
        runs = {k[:6] for k in expected}
        assert conn.execute(select(func.count()).select_from(AutotuneKey.__table__)).scalar_one() == len(keys)
        assert conn.execute(select(func.count()).select_from(AutotuneRun.__table__)).scalar_one() == len(runs)

    rolled_back(body)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_record_then_lookup_is_the_latest_benchmark(db: CacheDB, fps: tuple[int, int], data: st.DataObject) -> None:
    """``record`` (one run per call) after rows written flat: a lookup answers each choice's
    latest timing, and a record's new choices take positions after everything stored."""
    rows = data.draw(_rows(fps), label="rows")
    timings = data.draw(st.dictionaries(st.sampled_from(["extern_mm", "triton_mm_1", "triton_mm_9"]),
                                        st.floats(min_value=0.001, max_value=100.0, allow_nan=False),
                                        min_size=1), label="timings")
    fp, op, inputs, precision = fps[0], "mm", "[('cuda', 'torch.float16', 64, 64)]", "high"
    with db.engine.connect() as conn:
        txn = conn.begin()
        try:
            timings_repo.insert_flat(conn, rows, skip_stored=True)
            top = timings_repo.next_position(conn)
            repo = timings_repo.AutotuneTimingRepository(conn)  # type: ignore[arg-type]
            assert repo.record(fp, op, inputs, precision, timings) == len(timings)
            got = repo.lookup([fp], op, inputs, precision)
            before: dict[str, float] = {}  # each choice's latest stored benchmark
            for natural, (ms, _pos) in sorted(_first(rows).items(), key=lambda item: item[0][5]):
                if natural[:5] == (fp, op, inputs, None, precision):
                    before[natural[6]] = ms
            assert got == {**before, **timings}
            positions = dict(conn.execute(
                select(AUTOTUNE_TIMINGS.c.choice_hash, func.min(AUTOTUNE_TIMINGS.c.position))
                .where(AUTOTUNE_TIMINGS.c.fingerprint_id == fp, AUTOTUNE_TIMINGS.c.op == op,
                       AUTOTUNE_TIMINGS.c.inputs == inputs, AUTOTUNE_TIMINGS.c.precision == precision,
                       AUTOTUNE_TIMINGS.c.hint_override.is_(None))
                .group_by(AUTOTUNE_TIMINGS.c.choice_hash)).all())
            new = [c for c in timings if c not in before]
            assert sorted(positions[c] for c in new) == list(range(top, top + len(new)))
        finally:
            txn.rollback()
