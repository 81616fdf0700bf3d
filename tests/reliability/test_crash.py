"""Crash safety: SIGKILL a real child process at seeded random moments while it imports a cache
directory or commits a stream of puts, then check the SQLite file.

After every kill: ``PRAGMA integrity_check`` is ``ok``; ``CacheDB(path)`` opens at the head
revision; :func:`cachedb.tools.verify.verify` finds no problem; every payload decompresses and matches
its checksum and the source bytes exactly; nothing committed before the kill is missing; only
whole transactions exist (an import leaves a prefix of its files, a put all of its rows or none).
"""

from __future__ import annotations

import random
import signal
import sqlite3
import time
from pathlib import Path

from click.testing import CliRunner
from sqlalchemy import select, text

from cachedb import CacheDB

from cachedb.store import migrate as _migrate
from cachedb.store.payload import unpack
from cachedb.cli import main as cli
from cachedb.layout.importer import Importer
from cachedb.store.models import GuardedEntry
from cachedb.tools.verify import verify

from . import _synth, _work, figures

SEED = 20261121
IMPORT_TRIALS, MAX_KILLS_PER_ROUND = 40, 12  # 40 kills during imports
PUT_ROUNDS, KILLS_PER_PUT_ROUND = 9, 8  # 72 kills during puts


def _kill_after(mp, target, args: tuple, delay_s: float, after: Path | None = None) -> int:
    """Start ``target(*args)`` in a child, SIGKILL it ``delay_s`` later (counted from the moment
    the file ``after`` is not empty, if given); its exit code."""
    proc = mp.Process(target=target, args=args, daemon=True)
    proc.start()
    if after is not None:
        deadline = time.monotonic() + 60
        while proc.exitcode is None and not (after.exists() and after.stat().st_size):
            assert time.monotonic() < deadline, "child never got going"
            time.sleep(0.002)
    proc.join(delay_s)
    if proc.exitcode is None:
        proc.kill()  # os.kill(pid, SIGKILL)
    proc.join(30)
    assert proc.exitcode is not None, "child did not die"
    return proc.exitcode


def _integrity_ok(path: Path) -> None:
    if not path.exists():
        return
    con = sqlite3.connect(path)
    try:
        rows = con.execute("PRAGMA integrity_check").fetchall()
    finally:
        con.close()
    assert rows == [("ok",)], rows


def _open_and_verify(path: Path) -> CacheDB:
    _integrity_ok(path)
    db = CacheDB(path)
    assert db.revision() == _migrate.head_revision()
    problems, _checked = verify(db)
    assert problems == [], problems
    return db


# --------------------------------------------------------------------------- (a) import


def _imported_items(db: CacheDB, synth: _synth.SynthCache) -> list[str]:
    """The items of ``synth`` found in ``db`` (relative paths), each checked to be whole and
    byte-identical to its source file."""
    found: set[tuple] = set()
    with db.read() as repos:
        for entry in repos.guarded.iter_all():  # decompresses and checks every checksum
            ident = (entry.kind, entry.key, entry.variant)
            assert ident in synth.guarded, f"unexpected entry {ident}"
            assert entry.payload == synth.guarded[ident], f"{ident}: bytes differ from the source file"
            found.add(("guarded", *ident))
        for key, content in repos.best_configs.iter_all():
            assert content == synth.best_configs[key], key
            found.add(("best_config", key))
        for system_hash, leaves in synth.docs.items():
            n = repos.session.execute(
                text(
                    "SELECT (SELECT count(*) FROM autotune_timings t JOIN system_fingerprints f"
                    " ON f.id = t.fingerprint_id WHERE f.system_hash = :h)"
                    " + (SELECT count(*) FROM local_cache_values v JOIN system_fingerprints f"
                    " ON f.id = v.fingerprint_id WHERE f.system_hash = :h)"
                ),
                {"h": system_hash},
            ).scalar_one()
            assert n in (0, leaves), f"cache/{system_hash}: {n} of {leaves} leaves (a partial document)"
            if n:
                found.add(("doc", system_hash))
    return [rel for rel in synth.order if synth.item_id(rel) in found]


def test_sigkill_during_import(mp, tmp_path: Path) -> None:
    synth = _synth.build(tmp_path / "inductor", seed=SEED, fx_keys=130, aot_keys=40, best_configs=50,
                         max_payload=8000)
    assert len(synth.order) > 2 * _work.IMPORT_COMMIT_FILES, "the import must span several transactions"
    rng = random.Random(SEED)

    # Calibrate: how long a child takes to import into a fresh database, and to re-import
    # (everything unchanged); kills are spread over the time the next import should take.
    calibrate = (str(tmp_path / "calibrate.db"), str(synth.root))
    t0 = time.monotonic()
    assert _kill_after(mp, _work.run_import, calibrate, 60.0) == 0
    full_s = time.monotonic() - t0
    t0 = time.monotonic()
    assert _kill_after(mp, _work.run_import, calibrate, 60.0) == 0
    redo_s = time.monotonic() - t0
    calibrated = CacheDB(tmp_path / "calibrate.db")
    assert _imported_items(calibrated, synth) == synth.order
    calibrated.close()

    trials = kills = finished = checked = lost = rounds = 0
    scale = 1.0  # adapts the delays when the machine gets faster or slower than at calibration
    while trials < IMPORT_TRIALS:
        # A round: a fresh file, imports killed one after the other until one completes.
        path = tmp_path / f"import{rounds}.db"
        prefix = 0
        for k in range(MAX_KILLS_PER_ROUND):
            # The first kill of every other round lands while the file is created and migrated.
            done = prefix / len(synth.order)
            expected_s = done * redo_s + (1 - done) * full_s
            early = k == 0 and rounds % 2 == 0
            delay = rng.uniform(0.0, 0.3) if early else rng.uniform(0.0, scale * expected_s)
            code = _kill_after(mp, _work.run_import, (str(path), str(synth.root)), delay)
            trials += 1
            if code == -signal.SIGKILL:
                kills += 1
                scale = min(1.0, scale * 1.05)
            else:
                assert code == 0, f"import child failed with exit code {code}"
                finished += 1
                scale *= 0.8
            db = _open_and_verify(path)
            items = _imported_items(db, synth)
            db.close()
            # Transactions commit in file order: what survives is a prefix of the files ...
            assert items == synth.order[: len(items)], "imported files are not a prefix: a partial batch"
            # ... which never shrinks: nothing committed by an earlier import is lost.
            lost += max(0, prefix - len(items))
            assert len(items) >= prefix
            prefix = len(items)
            checked += len(items)
            if code == 0 or trials >= IMPORT_TRIALS:
                break
        # Re-importing afterwards completes the import.
        db = _open_and_verify(path)
        report = Importer(db).run(synth.root)
        assert report.problems == []
        assert _imported_items(db, synth) == synth.order
        assert sum(Importer(db).run(synth.root).added.values()) == 0  # and is idempotent
        db.close()
        result = CliRunner().invoke(cli, ["--db", str(path), "verify"])
        assert result.exit_code == 0 and result.output.startswith("ok:"), result.output
        rounds += 1

    figures.add("crash_import", trials=trials, kills=kills, finished_before_kill=finished,
                committed_checked=checked, entries_lost=lost, reimports_completed=rounds)
    figures.note("crash_import", seed=SEED, files_per_import=len(synth.order),
                 full_import_s=round(full_s, 2), reimport_s=round(redo_s, 2))
    assert lost == 0
    assert kills >= trials / 2, f"only {kills} of {trials} children were killed before finishing"


# --------------------------------------------------------------------------- (b) puts


def _stream_state(db: CacheDB, first: int, last: int) -> dict[int, bytes]:
    """``{put number: payload bytes}`` of the stream puts numbered ``first..last`` in ``db``."""
    g = GuardedEntry.__table__
    out: dict[int, bytes] = {}
    with db.read() as repos:
        rows = repos.session.execute(
            select(g.c.time_taken_ns, g.c.key, g.c.variant, g.c.payload, g.c.size_bytes, g.c.checksum).where(
                g.c.time_taken_ns >= first, g.c.time_taken_ns <= last
            )
        )
        for i, key, variant, blob, size, digest in rows:
            assert key == _work.stream_key(i)
            out[int(i)] = unpack(blob, size, digest, where=f"put {i}")
    return out


def test_sigkill_during_puts(mp, tmp_path: Path) -> None:
    rng = random.Random(SEED + 1)
    trials = kills = checked = lost = unlogged_commits = 0
    for round_ in range(PUT_ROUNDS):
        path = tmp_path / f"puts{round_}.db"
        CacheDB(path).close()
        committed: set[int] = set()
        for k in range(KILLS_PER_PUT_ROUND):
            first = (round_ * KILLS_PER_PUT_ROUND + k) * 1_000_000
            log = tmp_path / f"puts{round_}_{k}.log"
            # Most kills land in the stream of commits (timed from the first commit); every
            # fourth one anywhere from the start, opening the database included.
            after = None if k % 4 == 0 else log
            code = _kill_after(mp, _work.put_stream, (str(path), str(log), first), rng.uniform(0.0, 0.3), after)
            assert code == -signal.SIGKILL, f"put stream exited on its own ({code})"
            trials += 1
            kills += 1
            logged = _work.read_lines(log)
            assert logged == list(range(first, first + len(logged))), "log is not the sequence of puts"

            db = _open_and_verify(path)
            present = _stream_state(db, first, first + 999_999)
            # Every put the child saw commit is there; at most the one in flight is there too
            # (committed, killed before it was logged).
            expected = set(logged)
            extra = set(present) - expected
            assert extra <= {first + len(logged)}, f"entries that were never put: {sorted(extra)[:5]}"
            unlogged_commits += len(extra)
            missing = expected - set(present)
            lost += len(missing)
            assert not missing, f"committed puts lost: {sorted(missing)[:10]}"
            for i, payload in present.items():
                assert payload == _work.stream_payload(i), f"put {i}: bytes differ"
            committed |= set(present)
            with db.read() as repos:
                # Earlier trials' puts are all still there.
                n_all = repos.session.execute(text("SELECT count(*) FROM guarded_entries")).scalar_one()
                assert n_all == len(committed)
                # Whole transactions only: a timing row exactly for the puts with i % 4 == 0 ...
                choices = set(repos.session.execute(text("SELECT choice_hash FROM autotune_timings")).scalars())
                assert choices == {f"choice{i}" for i in committed if i % 4 == 0}
                # ... and each best config holds the last committed put for its key.
                for key_index in range(_work.STREAM_BEST_CONFIG_KEYS):
                    writers = [i for i in committed if i % 3 == 0 and i % _work.STREAM_BEST_CONFIG_KEYS == key_index]
                    stored = repos.best_configs.get(f"bc/stream{key_index}.best_config")
                    assert stored == (_work.stream_best_config(max(writers)) if writers else None)
            db.close()
            checked += len(present)
        result = CliRunner().invoke(cli, ["--db", str(path), "verify"])
        assert result.exit_code == 0 and result.output.startswith("ok:"), result.output

    figures.add("crash_puts", trials=trials, kills=kills, committed_checked=checked, entries_lost=lost,
                committed_but_unlogged=unlogged_commits)
    figures.note("crash_puts", seed=SEED + 1)
    assert lost == 0
