"""Import with worker processes (cachedb/layout/pool.py): guarded entry files read, checked
and compressed in forked workers store exactly what an in-process import stores, on a real
Inductor cache; a hostile pickle that crashes or hangs the workers' C reader costs the import
its workers, never an entry."""

from __future__ import annotations

import logging
import multiprocessing
import shutil
from pathlib import Path

import pytest
from sqlalchemy import text

import cachedb
import cachedb.layout.pool as import_pool
import cachedb.layout.walk as import_walk
import cachedb.layout.importer as importer
from cachedb import CacheDB
from cachedb.layout.importer import ImportReport, Importer, scan
from cachedb.keys import sha256_hash

_COLUMNS = "kind, key, variant, guards_expr, guards_known, guards_note, time_taken_ns, size_bytes, checksum"


def _stored(db: CacheDB) -> list[tuple]:
    """Every guarded entry's columns and its decompressed, verified payload."""
    with db.read() as repos:
        rows = repos.session.execute(text(f"SELECT {_COLUMNS} FROM guarded_entries ORDER BY kind, key, variant")).all()
        payloads = [v.payload for v in repos.guarded.iter_all()]
    return [(*(bool(c) if i == 4 else c for i, c in enumerate(row)), p) for row, p in zip(rows, payloads, strict=True)]


def _import(db: CacheDB, cache_dir: Path, workers: int) -> tuple[ImportReport, int]:
    """The report, and the most worker processes alive at once (seen after each batch)."""
    seen = [0]

    def progress(done: int, total: int) -> None:
        seen[0] = max(seen[0], len(multiprocessing.active_children()))

    return Importer(db, workers=workers).run(cache_dir, progress=progress), seen[0]


def _same_import(cache_dir: Path, db: CacheDB, tmp_path: Path) -> tuple[ImportReport, int]:
    """Import ``cache_dir`` into ``db`` with two workers and into a new SQLite file with none;
    both must report and store the same."""
    with_workers, workers_seen = _import(db, cache_dir, workers=2)
    reference = CacheDB(tmp_path / "in_process.db")
    try:
        in_process, none_seen = _import(reference, cache_dir, workers=0)
        assert none_seen == 0
        assert with_workers.added == in_process.added
        assert with_workers.unchanged == in_process.unchanged
        assert with_workers.problems == in_process.problems
        assert with_workers.bytes_read == in_process.bytes_read
        assert _stored(db) == _stored(reference)
    finally:
        reference.close()
    return with_workers, workers_seen


def _with_entry(real: Path, tmp_path: Path, data: bytes) -> Path:
    """A copy of the real cache with one more FX graph entry file, named as Inductor names it."""
    cache_dir = tmp_path / "cache"
    shutil.copytree(real, cache_dir)
    key = "f" + "ab" * 25
    path = cache_dir / "fxgraph" / key[1:3] / key / sha256_hash(data)
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    return cache_dir


def _deep_tuple_key(depth: int) -> bytes:
    """A pickle of ``{(((),),...): None}`` nested ``depth`` deep: hashing the key recurses
    ``depth`` levels in C (the C unpickler overflows its stack); the opcode walk builds nothing."""
    return b"\x80\x04}" + b")" + b"\x85" * depth + b"Ns."


def _shared_tuple_key(depth: int) -> bytes:
    """A pickle of ``{t: None}`` where ``t = (u, u)``, ``u = (v, v)``, ... ``depth`` levels
    through the memo: hashing it takes 2**depth steps."""
    ops = b"\x80\x04}" + b")\x940"
    for i in range(depth):
        ops += b"h" + bytes([i]) + b"h" + bytes([i]) + b"\x86\x940"
    return ops + b"h" + bytes([depth]) + b"Ns."


@pytest.mark.slow
def test_workers_store_what_an_in_process_import_stores(
    real_cache: tuple[Path, dict], db: CacheDB, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache_dir, _ = real_cache
    with caplog.at_level(logging.WARNING, logger="cachedb"):
        report, workers_seen = _same_import(cache_dir, db, tmp_path)
    assert workers_seen == 2
    assert report.problems == [] and report.added["fxgraph"] > 0 and report.added["aotautograd"] > 0
    assert not [r for r in caplog.records if "worker process failed" in r.getMessage()]
    again, _ = _import(db, cache_dir, workers=2)  # re-import: nothing added, all unchanged
    assert sum(again.added.values()) == 0 and again.unchanged == report.added


@pytest.mark.slow
@pytest.mark.parametrize("hostile", ["crash", "stall"])
def test_a_pickle_that_breaks_a_worker_costs_no_entry(
    real_cache: tuple[Path, dict], sqlite_db: CacheDB, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch, hostile: str,
) -> None:
    data = _deep_tuple_key(1_000_000) if hostile == "crash" else _shared_tuple_key(64)
    if hostile == "stall":
        monkeypatch.setattr(import_pool, "STALL_LIMIT_S", 1.0)
    cache_dir = _with_entry(real_cache[0], tmp_path, data)
    with caplog.at_level(logging.WARNING, logger="cachedb"):
        report, _ = _same_import(cache_dir, sqlite_db, tmp_path)
    failures = [r for r in caplog.records if "worker process failed" in r.getMessage()]
    assert len(failures) == 1, failures  # the worker read it (one batch: no worker is left to see)
    assert report.problems == []
    stored = {row[2]: row for row in _stored(sqlite_db)}
    hostile_row = stored[sha256_hash(data)]
    assert hostile_row[4] is False and "not a cache entry object" in hostile_row[5]  # guards unknown, and why
    assert hostile_row[-1] == data
    assert report.added["fxgraph"] == len(list((cache_dir / "fxgraph").glob("*/*/*")))


def _batch_sum(batch: list[int]) -> int:
    return sum(batch)


@pytest.mark.parametrize(("weight", "taken_at_first_result"), [(100, 11), (2_000, 5)])
def test_batches_are_taken_ahead_by_their_weight(weight: int, taken_at_first_result: int) -> None:
    """Light batches are taken (and sent to the workers) past the default two per worker, up to
    ``ahead_bytes`` in flight; heavy ones only two per worker. The first result comes once the
    batch that takes its place went out (10 + 1, 4 + 1). Results stay in order."""
    taken: list[int] = []

    def batches():
        for i in range(20):
            taken.append(i)
            yield [i]

    results = import_pool.map_in_workers(_batch_sum, _batch_sum, batches(), workers=2, ahead_bytes=1_000,
                                         weigh=lambda batch: weight)
    assert next(results) == 0
    assert len(taken) == taken_at_first_result
    assert list(results) == list(range(1, 20))
    assert len(taken) == 20


def test_progress_knows_the_whole_walk_from_its_first_call(
    real_cache: tuple[Path, dict], db: CacheDB, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With workers, the walk goes on while they check the first batches; nothing is written
    (and ``progress`` is not called) before it ended: every call has the final total. Batches
    of 3 files, none ahead by weight: the walk is far from done when the first result is in."""
    monkeypatch.setattr(import_walk, "BATCH_FILES", 3)
    monkeypatch.setattr(importer, "_AHEAD_BYTES", 0)
    cache_dir, _ = real_cache
    items, _, _ = scan(cache_dir)
    calls: list[tuple[int, int]] = []
    report = Importer(db, workers=2).run(cache_dir, progress=lambda done, total: calls.append((done, total)))
    assert report.problems == []
    total = sum(item.size for item in items)
    assert calls and {t for _, t in calls} == {total}
    dones = [d for d, _ in calls]
    assert len(calls) > 5 and dones == sorted(dones) and dones[-1] == total


@pytest.mark.parametrize("enabled", [True, False])
def test_an_import_leaves_automatic_gc_as_it_found_it(real_cache: tuple[Path, dict], db: CacheDB,
                                                      tmp_path: Path, enabled: bool) -> None:
    """Automatic collection is off while an import runs and as it was after, also when the
    import fails (a directory that is not an Inductor cache)."""
    import gc

    not_a_cache = tmp_path / "notes"
    not_a_cache.mkdir()
    (not_a_cache / "readme.txt").write_text("hello")
    seen: list[bool] = []
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        Importer(db, workers=0).run(real_cache[0], progress=lambda done, total: seen.append(gc.isenabled()))
        assert gc.isenabled() is enabled
        with pytest.raises(cachedb.NotAnInductorCacheError):
            Importer(db).run(not_a_cache)
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
    assert seen and not any(seen)


class _StopImport(Exception):
    pass


@pytest.mark.parametrize("workers", [0, 2])
def test_a_transaction_spans_batches_up_to_its_bound_and_a_failure_keeps_what_committed(
    real_cache: tuple[Path, dict], db: CacheDB, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """Batches of 3 files are written into one transaction until it holds 7 files or more,
    then it commits. An error in a batch after a commit (from ``progress``) rolls back only the
    open transaction: the guarded entries of the committed batches stay, those of the batches
    after them are gone, and a re-import completes the cache."""
    monkeypatch.setattr(import_walk, "BATCH_FILES", 3)
    monkeypatch.setattr(importer, "_COMMIT_FILES", 7)
    cache_dir, _ = real_cache
    scanner = import_walk.Scanner(cache_dir)
    scanner.finish()
    batches = list(scanner.batches())
    commits, pending = [], 0  # after which batches (1-based) the import commits
    for n, batch in enumerate(batches, 1):
        pending += len(batch)
        if pending >= 7:
            commits.append(n)
            pending = 0

    def variants(bs: list[list[import_walk.Item]]) -> set[tuple[str, str, str]]:
        return {(i.kind, *i.rel.split("/")[-2:]) for b in bs for i in b if i.kind in import_walk.GUARDED_KINDS}

    # The first commit with guarded entries before it and after it, in the batches up to the
    # next commit: the import is stopped after the first such batch (the order of the files,
    # and so of the batches, follows their names, whose keys differ per build of the cache).
    stop = None
    for i, first in enumerate(commits):
        following = commits[i + 1] if i + 1 < len(commits) else len(batches) + 1
        committed = variants(batches[:first])
        for n in range(first + 1, following):
            rolled_back = variants(batches[first:n])
            if committed and rolled_back:
                stop = n
                break
        if stop is not None:
            break
    assert stop is not None  # the real cache gives both sides guarded entries

    def stop_after(n: int):
        calls = [0]

        def progress(done: int, total: int) -> None:
            calls[0] += 1
            if calls[0] == n:
                raise _StopImport

        return progress

    with pytest.raises(_StopImport):
        Importer(db, workers=workers).run(cache_dir, progress=stop_after(stop))
    with db.read() as repos:
        stored = {tuple(row) for row in repos.session.execute(text("SELECT kind, key, variant FROM guarded_entries"))}
    assert stored == committed
    report = Importer(db, workers=workers).run(cache_dir)
    assert report.problems == []
    assert sum(report.unchanged[k] for k in import_walk.GUARDED_KINDS) == len(committed)
    with db.read() as repos:
        stored = {tuple(row) for row in repos.session.execute(text("SELECT kind, key, variant FROM guarded_entries"))}
    assert stored == variants(batches)
