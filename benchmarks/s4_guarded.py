"""§4 Guarded entries (FX graph cache): put and get of 100 KB and 20 MB pickles.

Baseline: torch's own ``FxGraphCache._write_to_local_cache(key, content)`` (``write_atomic``
to ``fxgraph/<k[1:3]>/<key>/<sha256_hash(content)>``) and
``FxGraphCache.iterate_over_candidates(True, None, key)`` (list the key's directory, read and
``pickle.loads`` every variant) on a fresh cache dir.

cachedb (repositories), as a caller must do it: put = ``read_entry_fields`` (the guards
expression and compile time, read from the pickle's opcodes) + one
``CacheDB.transaction()`` around ``repos.guarded.put(...)`` (SHA-256 name; under 1 MiB stored as
it is in a zstd frame, from 1 MiB zstd at level 1 by zstd workers, or all at
``CACHEDB_COMPRESSION_LEVEL``; checksum, insert); get = one
``CacheDB.read()`` around ``repos.guarded.candidates(...)`` (decompress, verify) +
``pickle.loads`` of each variant, as Inductor unpickles candidates.

cachedb (live): the same two ``FxGraphCache`` calls inside ``cachedb.installed(db)``, in
blocks that alternate with the others' (each live block installs cachedb, opens its database
and writes one small entry, untimed, before its calls: the seams replace the file methods, so
the two cannot run in one block); their targets: put ≤ 2.0x, get ≤ 1.0x of the files.
A live put queues the entry for the write-behind thread (cachedb/live/_writer.py) and returns:
its row is what the compiling thread waits for. The "written" row beside it adds the drain of
the queue after each block's last put (the writer thread's work: hash, guards read, frame,
INSERT, COMMIT), per put, against the file puts' mean of the same block. Live gets run after
the queue is written (a lookup of a queued key would wait for it).

Payloads: :func:`benchmarks._payloads.fx_entry` (source text, metadata tuples, machine code;
zstd-3 ratio printed in the notes); each put stores a new key with one variant. Units: ms.

Several variants of a key (:func:`_variants_case`): four 100 KB variants under each key, the
first in Inductor's order holding, looked up with torch's own ``find_guarded_entry`` over files
and live in alternating rounds (Inductor reads and unpickles the first and stops).

Real entries (:func:`_real_case`): every FX graph and AOTAutograd variant that a real
``torch.compile`` wrote (§1's cold compile directory when §1 ran, else
``examples/build_cache.py``'s), each put under a new key and read back through the same
``FxGraphCache`` / ``AOTAutogradCache`` calls, files against live in alternating rounds (the
live rounds inside ``cachedb.installed``). Their ``pickle.loads`` builds a real
``CompiledFxGraph`` / AOTAutograd entry, which the synthetic payloads (bytes and tuples) do
not. Those gets follow their puts in the same process; a last row times the first get of a
real entry in a fresh process (:func:`_real_first_gets`), the get of a warm start.
"""

from __future__ import annotations

import gc
import hashlib
import itertools
import json
import os
import pickle
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import zstandard

from . import _payloads as P
from ._context import Context, built_real_cache, fresh_torch_cache
from ._report import Row, SectionResult
from ._stats import interleaved, seconds_to, time_ops

REPO_ROOT = Path(__file__).resolve().parents[1]

NAME = "guarded"
TITLE = "Guarded entries: put / get vs FxGraphCache files"

#: (label, payload bytes, repetitions full, repetitions quick)
CASES = [("100 KB", 100_000, 60, 10), ("20 MB", 20_000_000, 7, 2)]
#: A key no case stores: a live block's untimed first lookup (it opens the database).
ABSENT_KEY = "f" + "0" * 51


def _targeted(case: str, live: list[float], files: list[float], baseline_name: str, limit: float) -> Row:
    """A row of live against files in ms with its target ``ratio ≤ limit``, met or not."""
    row = Row(case, seconds_to("ms", live), seconds_to("ms", files), baseline_name, target=f"ratio ≤ {limit}")
    row.met = row.ratio is not None and row.ratio <= limit
    return row


def _flush() -> float:
    """Seconds :meth:`cachedb.live._store.LiveStore.flush` took to write the active live store's
    queue of FX graph / AOTAutograd puts (the write-behind thread's backlog, cachedb/live/_writer.py);
    0.0 with no store active (the files side: a file put is written when it returns)."""
    import time

    from cachedb.live import active_store

    store = active_store()
    if store is None:
        return 0.0
    t0 = time.perf_counter()
    assert store.flush(600), "the write-behind queue was not written"
    return time.perf_counter() - t0


def _median_s(fn: Callable[[], object], reps: int = 5) -> float:
    """Median wall time of ``fn()`` over ``reps`` calls, in seconds."""
    return statistics.median(time_ops(lambda _i: fn(), range(reps)))


def _minor_faults(get: Callable[[int], object], reps: int) -> float:
    """Minor page faults of this process per ``get(i)`` call over ``i`` in ``range(reps)``
    (``getrusage``; 0 where the platform has no ``resource`` module)."""
    try:
        import resource
    except ImportError:
        return 0.0
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in range(reps):
        get(i)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / reps


#: Fresh-process pairs of the first-get measurement (full run; quick: 1).
FIRST_GET_PAIRS = 5


def _first_gets(
    ctx: Context, cache_dir: Path, db_path: Path, file_key: str, file_nonce: int, live_key: str, live_nonce: int
) -> dict[str, float] | None:
    """Median seconds and minor page faults of the first get in a fresh process, files vs live
    (:mod:`benchmarks._first_get_child`), in alternating pairs: what torch pays once per process,
    where neither side has warm memory. Each side's call runs with Python's collector off, so a
    collection of older generations does not land in one side's single call by chance.
    ``None`` off Linux/macOS (no ``resource``)."""
    try:
        import resource  # noqa: F401 - the child needs it
    except ImportError:
        return None
    path = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    env = {k: v for k, v in env.items() if not k.startswith("CACHEDB_")}
    out: dict[str, list[dict[str, float]]] = {"files": [], "live": []}
    for _ in range(1 if ctx.quick else FIRST_GET_PAIRS):
        for mode, key, nonce in (("files", file_key, file_nonce), ("live", live_key, live_nonce)):
            cmd = [sys.executable, "-m", "benchmarks._first_get_child", mode, str(cache_dir), key, str(nonce), str(db_path)]
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=300, check=True)
            out[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {
        f"{mode}_{what}": statistics.median(sample[what] for sample in samples)
        for mode, samples in out.items() for what in ("s", "faults")
    }


#: Alternating files / live rounds of the real-entries case (full run; quick: 1).
REAL_ROUNDS = 6


def _real_variants(root: Path) -> list[tuple[str, str, bytes]]:
    """``(kind, key, content)`` of every variant file under ``root/fxgraph/<k[1:3]>/<key>/``
    and ``root/aotautograd/<key>/`` (torch's layouts: ``FxGraphCache._get_tmp_dir_for_key``,
    ``AOTAutogradCache._get_tmp_dir``), sorted by path."""
    out: list[tuple[str, str, bytes]] = []
    for kind, pattern in (("fxgraph", "fxgraph/*/*/*"), ("aotautograd", "aotautograd/*/*")):
        for path in sorted(root.glob(pattern)):
            if path.is_file() and not path.name.startswith("."):
                out.append((kind, path.parent.name, path.read_bytes()))
    return out


def _alternating_rounds(
    ctx: Context, name: str, rounds: int, block: Callable[[str, int], None]
) -> tuple[Path, Path]:
    """``block(mode, r)`` for ``mode`` "files" and "live" (inside ``cachedb.installed`` on a
    database of its own), round -1 (the warm-up) then ``rounds`` rounds, alternating which mode
    goes first; on a fresh torch cache dir named ``name``. Returns ``(cache dir, database)``."""
    import cachedb

    with fresh_torch_cache(ctx, name) as cache_dir:
        db_path = ctx.tmpdir(f"{name}-db") / "live.db"
        for r in range(-1, rounds):
            for mode in (("files", "live") if r % 2 == 0 else ("live", "files")):
                gc.collect()
                if mode == "files":
                    block(mode, r)
                else:
                    with cachedb.installed(db_path):
                        block(mode, r)
    return cache_dir, db_path


def _real_first_gets(
    ctx: Context, cache_dir: Path, db_path: Path, keyed: Callable[[str, int], list[tuple[type, str, bytes]]],
    rounds: int, entries: list[tuple[str, str, bytes]],
) -> dict[str, list[float]] | None:
    """Seconds of the first get of a real entry in a fresh process, files and live, in
    alternating pairs (:mod:`benchmarks._first_get_child` with the entry's kind): per kind,
    its largest entry of the last round, after one other entry of the kind is read untimed.
    ``None`` off Linux/macOS, or with fewer than two entries of every kind."""
    try:
        import resource  # noqa: F401 - the child needs it
    except ImportError:
        return None
    path = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_")}
    env["PYTHONPATH"] = os.pathsep.join(path)
    picks: list[tuple[str, int, int]] = []  # (kind, timed index, warm-up index)
    for kind in ("fxgraph", "aotautograd"):
        idx = sorted((i for i, e in enumerate(entries) if e[0] == kind), key=lambda i: -len(entries[i][2]))
        if len(idx) < 2:
            return None
        picks.append((kind, idx[0], idx[1]))
    out: dict[str, list[float]] = {"files": [], "live": []}
    for _ in range(1 if ctx.quick else FIRST_GET_PAIRS):
        for kind, timed, warm in picks:
            for mode in ("files", "live"):
                batch = keyed(mode, rounds - 1)
                cmd = [sys.executable, "-m", "benchmarks._first_get_child", mode, str(cache_dir),
                       batch[timed][1], "-1", str(db_path), kind, batch[warm][1]]
                done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=300,
                                      check=True)
                out[mode].append(json.loads(done.stdout.strip().splitlines()[-1])["s"])
    return out


def _real_case(ctx: Context, res: SectionResult) -> None:
    """Put and get of real FX graph / AOTAutograd variants, files against live (see the module
    docstring). Rows in ms per entry; the notes give the entries' sizes and the per-entry
    decompression and ``pickle.loads`` (the floor both sides share)."""
    from cachedb.store import payload as _payload
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache
    from torch._inductor.codecache import FxGraphCache

    shared = ctx.shared.get("real_cache_dir")
    origin = "§1's cold compile directory" if shared else "examples/build_cache.py"
    try:
        root = Path(shared) if shared else built_real_cache(ctx)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:  # the synthetic rows still stand
        res.notes.append(f"real entries: no real cache directory ({exc}); case skipped.")
        return
    entries = _real_variants(root)
    if not entries:
        res.notes.append(f"real entries: none under {origin}; case skipped.")
        return
    classes = {"fxgraph": FxGraphCache, "aotautograd": AOTAutogradCache}
    rounds = 1 if ctx.quick else REAL_ROUNDS

    def keyed(mode: str, r: int) -> list[tuple[type, str, bytes]]:
        # a new key per (side, round, entry): each put stores a new key with one variant; the
        # key keeps its kind's first letter and length (the directory is key[1:3])
        return [(classes[kind], f"{key[:-9]}{mode[:2]}{r + 1:03d}{i:04d}", content)
                for i, (kind, key, content) in enumerate(entries)]

    times: dict[str, dict[str, list[float]]] = {m: {"put": [], "get": []} for m in ("files", "live")}
    drains: dict[str, list[float]] = {"files": [], "live": []}

    def block(mode: str, r: int) -> None:
        # untimed: one put and get on entering the block (a live store's first write of the
        # process records its fingerprint, as torch's first write does once per process)
        batch = keyed(mode, r)
        cls, key, content = batch[0]
        key = f"{key[:-9]}w{mode[0]}{key[-7:]}"  # a key of its own, same length
        cls._write_to_local_cache(key, content)
        list(cls.iterate_over_candidates(True, None, key))
        _flush()  # untimed: the warm-up write
        puts = time_ops(lambda j: batch[j][0]._write_to_local_cache(batch[j][1], batch[j][2]), range(len(batch)))
        drain = _flush()  # live: the writer's queue written (0 for files) before the gets

        def get(j: int) -> None:
            cls, key, _content = batch[j]
            assert len(list(cls.iterate_over_candidates(True, None, key))) == 1

        gets = time_ops(get, range(len(batch)))
        if r >= 0:  # round -1: warm-up (imports, first connection, first unpickle of each class)
            times[mode]["put"] += puts
            times[mode]["get"] += gets
            drains[mode].append(drain)

    cache_dir, db_path = _alternating_rounds(ctx, "guardedreal", rounds, block)
    first = _real_first_gets(ctx, cache_dir, db_path, keyed, rounds, entries)
    # as the live put stores them (under 1 MiB: as they are, in a zstd frame)
    frames = [
        _payload.pack(content, level=_payload.guarded_level(len(content))).blob for _k, _key, content in entries
    ]
    digests = [hashlib.sha256(content).hexdigest() for _k, _key, content in entries]  # the rows' checksums
    unpack_s = sum(  # what a get does with the stored payload: _payload.unpack
        _median_s(lambda f=f, n=len(content), d=d: _payload.unpack(f, n, d, where="bench"))
        for f, (_k, _key, content), d in zip(frames, entries, digests)
    )
    unpickle_s = sum(_median_s(lambda c=content: pickle.loads(c)) for _k, _key, content in entries)
    n_fx = sum(1 for kind, _key, _c in entries if kind == "fxgraph")
    sizes = sorted(len(content) for _k, _key, content in entries)
    label = f"real entries ({n_fx} FX graph + {len(entries) - n_fx} AOTAutograd variants)"
    ms = "ms"
    for op, limit in (("put", 2.0), ("get", 1.0)):  # the targets of the synthetic rows
        res.rows.append(_targeted(f"{op} {label} (live)", times["live"][op], times["files"][op],
                                  "FxGraphCache / AOTAutogradCache files", limit))
    if first is not None:
        res.rows.append(_targeted(f"get {label}, first get of an entry in a fresh process (live)",
                                  first["live"], first["files"], "FxGraphCache / AOTAutogradCache files", 1.0))
        res.notes.append(
            f"{label}, first get in a fresh process: for each kind, its largest entry read by a "
            f"process that has read one other entry of the kind (untimed: the first unpickle "
            f"imports the modules its torch objects need), files and live in "
            f"{1 if ctx.quick else FIRST_GET_PAIRS} alternating pairs, each call with Python's "
            "collector off (`_first_get_child.py`): the get of a warm start, which reads what "
            "another process wrote, where the row above reads each entry right after its put."
        )
    n = len(entries)
    # per round, the live puts once written: (the round's put calls + the queue's drain after
    # its last put) / entries, against the file puts' mean in the same round
    written = [(sum(times["live"]["put"][k * n:(k + 1) * n]) + d) / n for k, d in enumerate(drains["live"])]
    files_means = [sum(times["files"]["put"][k * n:(k + 1) * n]) / n for k in range(len(drains["files"]))]
    put_at = next(i for i, r in enumerate(res.rows) if r.case == f"put {label} (live)")
    res.rows.insert(put_at + 1, Row(
        f"put {label}, written (live: the calls plus the write-behind queue's drain, per entry)",
        seconds_to(ms, written), seconds_to(ms, files_means), "FxGraphCache / AOTAutogradCache files (round means)",
        note="the compiling thread waits only for the put row; this is the work the writer thread does for it",
    ))
    # per pass over all entries (one round): the sums, less sensitive to the mix of sizes
    passes = {mode: [sum(t[k:k + n]) for k in range(0, len(t), n)] for mode, t in
              ((m, times[m]["get"]) for m in ("files", "live"))}
    pass_ratio = statistics.median(passes["live"]) / statistics.median(passes["files"])
    res.extra["real_entries"] = {
        "origin": origin, "variants": n, "fxgraph": n_fx, "bytes_median": sizes[n // 2],
        "bytes_min": sizes[0], "bytes_max": sizes[-1], "rounds": rounds,
        "unpack_ms_per_entry": round(unpack_s / n * 1e3, 4), "unpickle_ms_per_entry": round(unpickle_s / n * 1e3, 4),
        "get_pass_ms": {mode: [round(x * 1e3, 4) for x in v] for mode, v in passes.items()},
        "get_pass_ratio": round(pass_ratio, 4),
    }
    res.notes.append(
        f"{label}, from {origin}: {n} pickles of {sizes[0] / 1e3:.0f}–{sizes[-1] / 1e3:.0f} KB (median "
        f"{sizes[n // 2] / 1e3:.0f} KB, stored at zstd level {_payload.guarded_level(sizes[-1])}), each put "
        f"under a new key and read back, {rounds} alternating "
        f"rounds of files and live after one warm-up round. A get pass over all {n} (the sum, median "
        f"of the rounds): live {statistics.median(passes['live']) * 1e3:.2f} ms against files "
        f"{statistics.median(passes['files']) * 1e3:.2f} ms, {pass_ratio:.2f}x. Per entry, reading the stored frame takes "
        f"{unpack_s / n * 1e3:.3f} ms and the `pickle.loads` both sides pay {unpickle_s / n * 1e3:.3f} ms "
        "(means of per-entry medians of 5). Unlike the synthetic payloads, a real entry's unpickle "
        "builds torch objects, and its share of the get is larger."
    )


def run(ctx: Context) -> SectionResult:
    import cachedb
    from cachedb import CacheDB
    from cachedb.formats.own_pickle import read_own_entry_fields
    from cachedb.formats.pickle_scan import read_entry_fields
    from torch._inductor.codecache import FxGraphCache

    res = SectionResult(NAME, TITLE)
    res.extra["payloads"] = {}
    for label, size, reps_full, reps_quick in CASES:
        reps = reps_quick if ctx.quick else reps_full
        warm = 1
        total = 3 * (reps + warm)  # files, cachedb, live: disjoint keys and payloads
        binary = P.binary_blob(size, 0)
        ctx.log(f"guarded {label}: building {total} payloads")
        payloads = [P.fx_entry(size, i, guards_expr=P.GUARDS[i % 4], binary=binary) for i in range(total)]
        keys = [P.fx_key(10_000 * size + i) for i in range(total)]
        ratio = len(payloads[0]) / len(zstandard.ZstdCompressor(level=3).compress(payloads[0]))
        res.extra["payloads"][label] = {"bytes": len(payloads[0]), "zstd3_ratio": round(ratio, 2)}

        def slot(kind: int, i: int) -> int:
            return kind * (reps + warm) + i

        with fresh_torch_cache(ctx, "guarded") as _cache_dir:
            db_path = ctx.tmpdir("gdb") / "guarded.db"
            db = CacheDB(db_path)

            def put_files(i: int) -> None:
                j = slot(0, i)
                FxGraphCache._write_to_local_cache(keys[j], payloads[j])

            def put_cachedb(i: int) -> None:
                j = slot(1, i)
                fields = read_entry_fields(payloads[j])
                with db.transaction() as repos:
                    repos.guarded.put(
                        "fxgraph", keys[j], payloads[j], guards_expr=fields.guards_expr,
                        guards_known=fields.guards_known, guards_note=fields.reason,
                        time_taken_ns=fields.time_taken_ns,
                    )

            def get_files(i: int) -> None:
                j = slot(0, i)
                got = list(FxGraphCache.iterate_over_candidates(True, None, keys[j]))
                assert len(got) == 1 and got[0][0].nonce == j

            def get_cachedb(i: int) -> None:
                j = slot(1, i)
                with db.read() as repos:
                    found = repos.guarded.candidates("fxgraph", keys[j])
                entries = [pickle.loads(content) for _variant, content in found]
                assert len(entries) == 1 and entries[0].nonce == j

            live_puts_done = [0]  # live puts made (timed and warm-up)
            live_drains: list[float] = []  # seconds each live put block's queue took to write after it

            def put_live(i: int) -> None:  # inside live_scope
                j = slot(2, i)
                FxGraphCache._write_to_local_cache(keys[j], payloads[j])
                live_puts_done[0] += 1

            def get_live(i: int) -> None:  # inside live_scope
                j = slot(2, i)
                got = list(FxGraphCache.iterate_over_candidates(True, None, keys[j]))
                assert len(got) == 1 and got[0][0].nonce == j

            scope_numbers = itertools.count(1)

            @contextmanager
            def live_scope() -> Iterator[None]:
                """The same FxGraphCache calls, served by cachedb: ``cachedb.installed`` for one
                block. What a process pays once per store is paid before the block's timed
                calls, as a long-running process has paid it: the database opened (a lookup of
                an absent key) and a first write (a small entry under a key of its own: the
                fingerprint recorded, the write statements prepared)."""
                number = next(scope_numbers)
                with cachedb.installed(db_path):
                    assert not list(FxGraphCache.iterate_over_candidates(True, None, ABSENT_KEY))
                    FxGraphCache._write_to_local_cache(P.fx_key(90_000_000 + size + number), P.fx_entry(1_000, -number))
                    _flush()
                    before = live_puts_done[0]
                    yield
                    drain = _flush()  # the block's puts still queued when its last put returned
                    if live_puts_done[0] > before:
                        live_drains.append(drain)

            ctx.log(f"guarded {label}: {reps} puts and gets per contender, live in alternating blocks")
            scopes = {"live": live_scope}
            puts = interleaved({"files": put_files, "cachedb": put_cachedb, "live": put_live}, reps, warmup=warm,
                               rounds=min(reps, 5), scopes=scopes)
            gets = interleaved({"files": get_files, "cachedb": get_cachedb, "live": get_live}, reps, warmup=warm,
                               rounds=min(reps, 5), scopes=scopes)
            live_put, live_get = puts["live"], gets["live"]
            # the put blocks' per-put cost once written: (the block's put calls + the drain of the
            # queue after its last put) / its puts, against the file puts' mean in the same block
            n_rounds = max(1, min(reps, 5))  # interleaved's blocks, as the calls below pass them
            bounds = [reps * r // n_rounds for r in range(n_rounds + 1)]
            timed_drains = live_drains[1:]  # [0]: the warm-up block's
            written = [(sum(live_put[a:b]) + d) / (b - a) for a, b, d in zip(bounds, bounds[1:], timed_drains)]
            files_blocks = [sum(puts["files"][a:b]) / (b - a) for a, b in zip(bounds, bounds[1:])]
            files_faults = _minor_faults(get_files, reps)
            with live_scope():
                live_faults = _minor_faults(get_live, reps)
            first = _first_gets(ctx, _cache_dir, db_path, keys[slot(0, 0)], slot(0, 0), keys[slot(2, 0)], slot(2, 0))
            if first is not None:
                res.extra["payloads"][label]["first_get"] = first
            # Where a cachedb put's time goes, for the notes: the scan, hashing and zstd alone
            # (medians of 5, seconds).
            from cachedb.store import payload as _payload

            scan_s = _median_s(lambda: read_entry_fields(payloads[0]))
            own_s = _median_s(lambda: read_own_entry_fields(payloads[0]))
            level = _payload.guarded_level(len(payloads[0]))  # stored under 1 MiB, else ZSTD_LEVEL
            zstd_s = _median_s(lambda: _payload.pack(payloads[0], digest=b"\0" * 32, level=level))
            sha_s = _median_s(lambda: hashlib.sha256(payloads[0]).digest())
            stored = _payload.pack(payloads[0], level=level)
            unpack_s = _median_s(  # what a get does with the stored payload
                lambda: _payload.unpack(stored.blob, stored.size_bytes, stored.checksum, where="bench")
            )
            unpickle_s = _median_s(lambda: pickle.loads(payloads[0]))
            # A shared tier's boundary (cachedb.fleet.trust): the writer signs a row once when it
            # sends it, a consumer verifies it (and hashes the whole content) once when it
            # pulls it; a local get or put does neither.
            from cachedb.fleet.trust import row_message
            from cachedb.store.signing import SigningKey, TrustedKeys

            signing = SigningKey.generate()
            trusted = TrustedKeys([signing.public_raw])
            row = {"kind": "fxgraph", "key": keys[0], "variant": "v" * 52, "checksum": stored.checksum,
                   "guards_expr": P.GUARDS[0]}
            signature = signing.sign(row_message("guarded_entries", row))
            sign_s = _median_s(lambda: signing.sign(row_message("guarded_entries", row)), reps=50)
            verify_s = _median_s(lambda: trusted.verify(signature, row_message("guarded_entries", row)), reps=50)
            db.close()
        del payloads

        ms = "ms"
        base_put, base_get = seconds_to(ms, puts["files"]), seconds_to(ms, gets["files"])
        res.rows += [
            Row(f"put {label}", seconds_to(ms, puts["cachedb"]), base_put, "FxGraphCache files"),
            Row(f"get {label}", seconds_to(ms, gets["cachedb"]), base_get, "FxGraphCache files"),
            _targeted(f"put {label} (live: FxGraphCache via cachedb.installed)", live_put, puts["files"],
                      "FxGraphCache files", 2.0),
            _targeted(f"get {label} (live: FxGraphCache via cachedb.installed)", live_get, gets["files"],
                      "FxGraphCache files", 1.0),
        ]
        if len(written) == len(files_blocks):
            res.rows.insert(len(res.rows) - 1, Row(
                f"put {label}, written (live: the calls plus the write-behind queue's drain, per put)",
                seconds_to(ms, written), seconds_to(ms, files_blocks), "FxGraphCache files (block means)",
                note="the compiling thread waits only for the row above; this is the work the writer "
                     "thread does for it, after the put returned",
            ))
        res.rows.append(Row(
            f"Ed25519 sign + verify + whole-content SHA-256 of one {label} entry (once per entry per machine, "
            f"where it crosses a shared tier) vs a live get", seconds_to(ms, [sign_s + verify_s + sha_s]),
            seconds_to(ms, live_get), "live get",
            note="local gets and puts do no public-key operation: a pulled row's signer is recorded in the file"))
        res.extra["payloads"][label].update(
            {"scan_ms": round(scan_s * 1e3, 2), "own_fields_ms": round(own_s * 1e3, 2), "zstd_level": level, "zstd_ms": round(zstd_s * 1e3, 2),
             "sha256_ms": round(sha_s * 1e3, 2), "unpack_ms": round(unpack_s * 1e3, 2),
             "unpickle_ms": round(unpickle_s * 1e3, 2), "ed25519_sign_ms": round(sign_s * 1e3, 3),
             "ed25519_verify_ms": round(verify_s * 1e3, 3), "get_page_faults_files": files_faults,
             "get_page_faults_live": live_faults}
        )
    for label, info in res.extra["payloads"].items():
        first = info.get("first_get")
        if first:
            res.notes.append(
                f"{label}, the first get in a fresh process (what torch pays: once per process, no warm "
                f"memory on either side; medians of {1 if ctx.quick else FIRST_GET_PAIRS} alternating pairs): "
                f"live {first['live_s'] * 1e3:.2f} ms ({first['live_faults']:,.0f} minor page faults) against "
                f"files {first['files_s'] * 1e3:.2f} ms ({first['files_faults']:,.0f}), "
                f"{first['live_s'] / first['files_s']:.2f}x."
            )
        res.notes.append(
            f"{label}: payload compresses {info['zstd3_ratio']}x with zstd-3 (cachedb stores it at level "
            f"{info['zstd_level']}); one pickle scan {info['scan_ms']} ms (C unpickler over stand-ins: "
            f"{info['own_fields_ms']} ms), one compression {info['zstd_ms']} ms, "
            f"one SHA-256 {info['sha256_ms']} ms: the building blocks of a cachedb put, which a file put does "
            f"not pay except one SHA-256 for the file name (a live put reads the fields with the C "
            f"unpickler over inert stand-ins instead of the scan). A get reads the payload back "
            f"({info['unpack_ms']} ms: stored as it is, sliced from its raw blocks and checked by its "
            f"XXH3-64; compressed, zstd checks the content checksum as it decompresses; no SHA-256 pass) before "
            f"the `pickle.loads` ({info['unpickle_ms']} ms) both pay: the floor of a cachedb get over a file "
            "get's read (medians of 5). Minor page faults per get (the memory each call takes from the "
            f"kernel): live {info['get_page_faults_live']:,.0f}, files {info['get_page_faults_files']:,.0f}."
        )
    _variants_case(ctx, res)
    _real_case(ctx, res)
    _scale_case(ctx, res)
    return res


#: Guarded variants per key in :func:`_variants_case`, keys per round (full, quick), rounds.
VARIANTS_PER_KEY, VARIANT_KEYS, VARIANT_ROUNDS = 4, (20, 5), 5


def _variants_case(ctx: Context, res: SectionResult) -> None:
    """Several guarded variants under one key (as dynamic shapes leave them): torch's own
    ``FxGraphCache.find_guarded_entry`` over files and live, where the first variant in
    Inductor's order (sorted names) holds, so Inductor reads, unpickles and checks one and
    stops. Files and live in alternating rounds (live inside ``cachedb.installed``), each round
    on keys of its own, put untimed before. Units: ms per lookup."""
    from torch._inductor.codecache import FxGraphCache

    size, n_keys = 100_000, VARIANT_KEYS[1 if ctx.quick else 0]
    rounds = 1 if ctx.quick else VARIANT_ROUNDS
    binary = P.binary_blob(size, 0)
    times: dict[str, list[float]] = {"files": [], "live": []}

    def block(mode: str, r: int) -> None:
        base = 50_000_000 + (r + 1) * 10_000 + (5_000 if mode == "live" else 0)
        keys = [P.fx_key(base + i) for i in range(n_keys)]
        for i, key in enumerate(keys):
            for v in range(VARIANTS_PER_KEY):
                FxGraphCache._write_to_local_cache(key, P.fx_entry(size, base * 8 + i * 8 + v, binary=binary))
        _flush()  # untimed: live puts are written before the timed gets read them

        def get(i: int) -> None:
            graph, _content, info = FxGraphCache.find_guarded_entry(keys[i], True, None, lambda e, h: True, [])
            assert graph is not None and info["cache_status_detailed"] == "hit"

        got = time_ops(get, range(n_keys))
        if r >= 0:  # round -1: warm-up
            times[mode] += got

    _alternating_rounds(ctx, "guardedvariants", rounds, block)
    res.rows.append(_targeted(
        f"get 100 KB, {VARIANTS_PER_KEY} guarded variants of a key, the first holds (live: find_guarded_entry)",
        times["live"], times["files"], "FxGraphCache files", 1.0,
    ))
    res.notes.append(
        f"{VARIANTS_PER_KEY} guarded variants of 100 KB under each key, the first in Inductor's order "
        f"holding: torch's `find_guarded_entry` reads and unpickles that one and stops, on files and "
        f"live alike ({n_keys} keys a round, {rounds} alternating rounds after a warm-up). The live store "
        "reads the key's first variant in one query (the others are listed only if Inductor asks for "
        "more) and decompresses a variant only when Inductor reaches it."
    )


#: Entries of 100 KB in the stored case (:func:`_scale_case`: full, quick), keys read per round
#: (full, quick), rounds.
SCALE_ENTRIES, SCALE_GETS, SCALE_ROUNDS = (10_000, 200), (500, 50), 5


def _scale_case(ctx: Context, res: SectionResult) -> None:
    """The 100 KB get from a cache that holds many entries (:mod:`benchmarks._scale_child`, in a
    process of its own): torch's own put writes :data:`SCALE_ENTRIES` entries of 100 KB (one
    variant each) into a fresh cache directory, ``cachedb import`` copies that directory into a
    database (~1 GB at 10,000), and ``FxGraphCache.iterate_over_candidates`` reads keys drawn at
    random from both, in alternating rounds (live inside ``cachedb.installed``). The §4 rows
    above read a database of a few hundred entries, whose pages SQLite and the page cache hold;
    here each get's index and table pages are mostly not in SQLite's own cache. Units: ms per get."""
    n, n_gets = SCALE_ENTRIES[1 if ctx.quick else 0], SCALE_GETS[1 if ctx.quick else 0]
    rounds = 1 if ctx.quick else SCALE_ROUNDS
    ctx.log(f"guarded at scale: {n} entries of 100 KB")
    path = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_")}
    env["PYTHONPATH"] = os.pathsep.join(path)
    cache_dir = ctx.tmpdir("guardedscale")
    db_path = ctx.tmpdir("guardedscale-db") / "live.db"
    cmd = [sys.executable, "-m", "benchmarks._scale_child", str(cache_dir), str(db_path), str(n), str(n_gets), str(rounds)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=900, check=False)
    if done.returncode != 0:
        res.notes.append(f"at scale: the child failed ({done.stderr.strip().splitlines()[-1:]}); case skipped.")
        return
    out = json.loads(done.stdout.strip().splitlines()[-1])
    times, db_bytes = {"files": out["files"], "live": out["live"]}, out["db_bytes"]
    res.rows.append(_targeted(f"get 100 KB from {n:,} stored entries ({db_bytes / 1e9:.2f} GB; live, random keys)",
                              times["live"], times["files"], "FxGraphCache files", 1.0))
    res.extra["scale"] = {"entries": n, "db_bytes": db_bytes, "gets_per_round": n_gets, "rounds": rounds}
    res.notes.append(
        f"at scale: {n:,} FX graph entries of 100 KB written by torch's own put, imported into a "
        f"{db_bytes / 1e9:.2f} GB database; {n_gets} keys drawn at random per round, {rounds} alternating "
        "rounds of files and live after a warm-up. Both sides read from the OS page cache; a database "
        "this much larger than SQLite's own page cache (2 MB by default) reads a random key's index "
        "and table pages from it, a `pread` each, where the rows above read a few hundred entries."
    )
