"""§5 Import of a generated ~10k-file Inductor cache directory: entries per second.

The directory (:func:`benchmarks._payloads.synthetic_cache_dir`): 70 % FX entries, 20 %
AOTAutograd entries (real pickles of ~2 KB, named ``sha256_hash(bytes)`` as Inductor names
them; some keys with two guarded variants), 10 % ``.best_config`` files and one
``cache/<system hash>`` JSON document with 5,000 timings.

cachedb: ``Importer(CacheDB(fresh db)).run(dir)``, wall time (s), as ``cachedb import`` runs it
(guarded entry files read, checked and compressed by worker processes, ``cachedb/layout/pool.py``), and
the same import with ``workers=0`` (everything in one process), in
alternation, each in a fresh interpreter that imports cachedb and not torch
(:mod:`benchmarks._import_child`), as the ``cachedb import`` command runs. One more import per
repetition runs in the benchmark's own process, for comparison: it holds torch and what §1–§4
left on its heap, and the import forks its workers from it (§4's at-scale case runs in a
process of its own, so that its ~1 GB of heap does not slow this one). Reference ("baseline"): the I/O floor — ``os.walk`` plus reading every file's
bytes — so the ratio is the importer's cost over just reading the directory. All run on a warm
page cache. A cProfile of one more in-process import says where the time goes (grouped by
module). Units: s per import; entries/s.
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path

from . import _payloads as P
from ._context import Context
from ._report import Row, SectionResult
from ._stats import seconds_to, summarize

NAME = "import"
TITLE = "Import of a generated cache dir (entries/s)"

#: Profile groups: (label, substrings of the function's file name or name).
_GROUPS = [
    ("pickle scan (cachedb/formats/pickle_scan.py + pickletools)", ("formats/pickle_scan", "pickletools")),
    ("SQLAlchemy (Core/ORM: statement building, execution, result handling)", ("sqlalchemy",)),
    ("sqlite3 driver (executing SQL)", ("sqlite3", "method 'execute'", "method 'executemany'",
                                         "method 'fetch", "method 'commit'")),
    ("zstd compression", ("zstandard", "compress")),
    ("hashing (sha256_hash / checksum)", ("hashlib", "openssl", "sha256", "b32encode", "_b32", "keys.py")),
    ("file system (walk, stat, read)", ("posixpath", "pathlib", "os.py", "genericpath", "method 'read'",
                                         "posix.stat", "posix.scandir", "open", "<built-in method posix")),
    ("JSON (best configs, timings document)", ("json",)),
]


#: Cumulative time of these (label, file-name suffix, function name) is reported as a share of
#: the whole profiled import: the steps of ``Importer.run``.
_STEPS = [
    ("walk (scandir + stat every file, classify; cachedb/layout/walk.py)", "cachedb/layout/walk.py", "_classify"),
    ("Importer._import_batch (per batch: read, check, write)", "cachedb/layout/importer.py", "_import_batch"),
    ("_check_guarded (name check + pickle scan)", "cachedb/layout/importer.py", "_check_guarded"),
    ("read_entry_fields (pickle opcode scan)", "cachedb/formats/pickle_scan.py", "read_entry_fields"),
    ("GuardedEntryRepository.put_many_pickled (bulk insert)", "repositories/guarded.py", "put_many_pickled"),
    ("GuardedEntryRepository.put (one by one)", "repositories/guarded.py", "put"),
    ("Importer._store (bulk store per kind, savepoint)", "cachedb/layout/importer.py", "_store"),
    ("BestConfigRepository.put_many (bulk insert)", "repositories/best_configs.py", "put_many"),
    ("Importer._import_one (timings document, CUTLASS lists: one by one)", "cachedb/layout/importer.py", "_import_one"),
    ("timings document (_import_local_cache)", "cachedb/layout/importer.py", "_import_local_cache"),
    ("SAVEPOINT (Connection.begin_nested)", "engine/base.py", "begin_nested"),
    ("RELEASE SAVEPOINT (SessionTransaction.commit)", "orm/session.py", "commit"),
    ("_payload.pack (zstd)", "cachedb/store/payload.py", "pack"),
    ("keys.sha256_hash", "cachedb/keys.py", "sha256_hash"),
]


def _read_all(root: Path) -> int:
    n = 0
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            with open(os.path.join(dirpath, name), "rb") as f:
                f.read()
            n += 1
    return n


def profile_summary(stats: pstats.Stats, total_s: float, top: int = 12) -> dict[str, object]:
    """Self time grouped by module (``_GROUPS``) and the ``top`` functions by self time."""
    grouped: dict[str, float] = {label: 0.0 for label, _ in _GROUPS}
    grouped["other (cachedb importer/repositories, Python)"] = 0.0
    rows = []
    for (filename, line, func), (_cc, ncalls, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{filename}:{line}({func})"
        rows.append((tottime, cumtime, ncalls, where))
        for label, needles in _GROUPS:
            if any(n in filename or n in func for n in needles):
                grouped[label] += tottime
                break
        else:
            grouped["other (cachedb importer/repositories, Python)"] += tottime
    rows.sort(reverse=True)
    prof_total = sum(grouped.values()) or 1.0
    steps: dict[str, float] = {}
    for label, suffix, name in _STEPS:
        cum = [
            ct for (filename, _line, func), (_cc, _nc, _tt, ct, _callers) in stats.stats.items()  # type: ignore[attr-defined]
            if func == name and filename.replace("\\", "/").endswith(suffix.split("/")[-1])
            and suffix.split("/")[0] in filename
        ]
        if cum:
            steps[label] = round(100 * max(cum) / prof_total, 1)
    return {
        "profiled_seconds": round(prof_total, 3),
        "unprofiled_seconds": round(total_s, 3),
        "steps_cumulative_percent": steps,
        "by_group_percent": {k: round(100 * v / prof_total, 1) for k, v in sorted(grouped.items(), key=lambda kv: -kv[1])},
        "top_self_time": [
            {"self_s": round(t, 3), "cum_s": round(c, 3), "calls": n, "function": w.replace(str(Path.cwd()) + "/", "")}
            for t, c, n, w in rows[:top]
        ],
    }


REPO_ROOT = Path(__file__).resolve().parents[1]


def _import_in_child(root: Path, db_path: Path, workers: int | None) -> float:
    """Seconds of one import of ``root`` into the new database ``db_path`` in a fresh interpreter
    (:mod:`benchmarks._import_child`, no torch), as the ``cachedb import`` command runs it."""
    path = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_")}
    env["PYTHONPATH"] = os.pathsep.join(path)
    cmd = [sys.executable, "-m", "benchmarks._import_child", str(root), str(db_path),
           "default" if workers is None else str(workers)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"import child failed: {done.stderr.strip()[-2000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["problems"] == 0, out
    return float(out["s"])


def run(ctx: Context) -> SectionResult:
    from cachedb import CacheDB
    from cachedb.layout.importer import Importer

    res = SectionResult(NAME, TITLE)
    n_files = 500 if ctx.quick else 10_000
    reps = 1 if ctx.quick else 3
    root = ctx.tmpdir("synthcache") / "inductor"
    ctx.log(f"import: generating a {n_files}-file cache dir")
    t0 = time.perf_counter()
    counts = P.synthetic_cache_dir(root, n_files)
    gen_s = time.perf_counter() - t0
    ctx.shared["synthetic_dir"] = root
    small_entries = counts["fxgraph"] + counts["aotautograd"] + counts["best_config"]
    _read_all(root)  # warm the page cache for both contenders

    import_s: list[float] = []
    in_process_s: list[float] = []
    here_s: list[float] = []  # in the benchmark's own process
    read_s: list[float] = []
    last_db: Path | None = None
    for r in range(reps):
        t0 = time.perf_counter()
        _read_all(root)
        read_s.append(time.perf_counter() - t0)
        for workers, times in ((None, import_s), (0, in_process_s)):
            db_path = ctx.tmpdir("importdb") / "import.db"
            ctx.log(f"import: run {r + 1}/{reps}, workers={'default' if workers is None else workers}")
            times.append(_import_in_child(root, db_path, workers))
            if workers is None:
                last_db = db_path
        db = CacheDB(ctx.tmpdir("importdb_here") / "import.db")  # opened (and migrated) outside the timed import
        t0 = time.perf_counter()
        report = Importer(db).run(root)
        here_s.append(time.perf_counter() - t0)
        db.close()
        assert not report.problems, report.problems[:3]
    ctx.shared["synthetic_db"] = last_db

    # Entries of a real size (~100 KB, as CPU entries are; GPU ones are larger): here reading the
    # pickles and compressing them outweigh the database, which is what the workers take over.
    big_root = ctx.tmpdir("synthcache_100k") / "inductor"
    n_big = 50 if ctx.quick else 1_500
    ctx.log(f"import: generating {n_big} files of ~100 KB")
    big_counts = P.synthetic_cache_dir(big_root, n_big, entry_bytes=100_000, timings=100)
    big_entries = big_counts["fxgraph"] + big_counts["aotautograd"] + big_counts["best_config"]
    _read_all(big_root)
    big_s: list[float] = []
    big_in_process_s: list[float] = []
    for r in range(reps):
        for workers, times in ((None, big_s), (0, big_in_process_s)):
            times.append(_import_in_child(big_root, ctx.tmpdir("importdb_100k") / "import.db", workers))

    ctx.log("import: one more import under cProfile")
    db = CacheDB(ctx.tmpdir("importprof") / "import.db")
    prof = cProfile.Profile()
    prof.enable()
    Importer(db, workers=0).run(root)
    prof.disable()
    db.close()
    summary = profile_summary(pstats.Stats(prof), sum(import_s) / len(import_s))
    res.extra["profile"] = summary
    res.extra["dir"] = {"files": counts, "generated_in_s": round(gen_s, 2)}

    rate = summarize([small_entries / s for s in import_s], "entries/s")
    target = 20_000
    from cachedb.layout.pool import default_workers

    n_workers = default_workers()
    pool = f"{n_workers} worker process{'' if n_workers == 1 else 'es'}"
    res.rows += [
        Row(f"import {sum(counts.values())} files ({small_entries} small entries), {pool}, fresh process",
            seconds_to("s", import_s), seconds_to("s", read_s), "walk + read every file (I/O floor)"),
        Row(f"import {sum(counts.values())} files, in-process (workers=0)", seconds_to("s", in_process_s),
            seconds_to("s", read_s), "walk + read every file (I/O floor)"),
        Row("import rate (fresh process, as `cachedb import` runs)", rate, None, "", target=f"≥ {target:,} entries/s", met=rate.median >= target),
        Row("import rate, in-process (workers=0)", summarize([small_entries / s for s in in_process_s], "entries/s"),
            None, ""),
        Row(f"import rate, {pool}, run in the benchmark's own process (torch, §1–§4's heap)",
            summarize([small_entries / s for s in here_s], "entries/s"), None, ""),
        Row(f"import {big_entries} entries of ~100 KB, {pool}", seconds_to("s", big_s),
            seconds_to("s", big_in_process_s), "the same import in-process (workers=0)"),
    ]
    groups = summary["by_group_percent"]
    assert isinstance(groups, dict)
    res.notes.append(
        f"{small_entries} small entries (~2 KB pickles and best-config JSONs) + 1 timings document "
        f"(5,000 timings); import median {rate.median:,.0f} entries/s, each import in a fresh interpreter "
        f"without torch as `cachedb import` runs (in the benchmark's own process: "
        f"{summarize([small_entries / s for s in here_s], 'entries/s').median:,.0f} entries/s). Profile of the in-process import "
        "(self time, cProfile inflates Python-heavy code): " + "; ".join(f"{k} {v}%" for k, v in groups.items() if v >= 1.0) + "."
    )
    steps = summary["steps_cumulative_percent"]
    assert isinstance(steps, dict)
    res.notes.append(
        "Importer steps (cumulative share of the profiled import; nested steps overlap): "
        + "; ".join(f"{k} {v}%" for k, v in steps.items()) + "."
    )
    top = summary["top_self_time"]
    assert isinstance(top, list)
    res.notes.append("Top self time: " + "; ".join(f"{t['function']} {t['self_s']}s" for t in top[:6]) + ".")
    res.rows += _cutlass_and_progress_rows(ctx)
    return res


#: The CUTLASS op list of the test corpus (torch 2.13's generator, 21,268 ops, gzip).
_CORPUS = Path(__file__).resolve().parents[1] / "tests" / "data" / "configs_b15d29dd.json.gz"


def _cutlass_and_progress_rows(ctx: Context) -> list[Row]:
    """Parsing a real CUTLASS op list into its rows (``cachedb import`` of a ``configs_*.json``)
    against ``json.loads`` of the same bytes, the floor; and one progress-bar update of an
    import (``ProgressBar.update``, once per file) against a clock read."""
    import gzip

    from rich.console import Console

    from cachedb.cli._common import ProgressBar
    from cachedb.formats.cutlass_ops import parse_op_list

    rows: list[Row] = []
    if _CORPUS.is_file():
        data = gzip.decompress(_CORPUS.read_bytes())
        reps = 1 if ctx.quick else 3
        parse_s, floor_s = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            json.loads(data)
            floor_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            parse_op_list(data, where=_CORPUS.name)
            parse_s.append(time.perf_counter() - t0)
        rows.append(Row("parse a CUTLASS op list (21,268 ops, 84 MB)", seconds_to("s", parse_s),
                        seconds_to("s", floor_s), "json.loads of the same bytes", target="≤ 10 s",
                        met=max(parse_s) <= 10.0))
    n = 2_000 if ctx.quick else 300_000
    console = Console(file=io.StringIO(), force_terminal=True, width=160)
    t0 = time.perf_counter()
    with ProgressBar("importing", console=console) as bar:
        for i in range(1, n + 1):
            bar.update(count=i, total_count=n, done_bytes=i * 1000, total_bytes=n * 1000)
    update_s = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n):
        time.monotonic()
    clock_s = (time.perf_counter() - t0) / n
    rows.append(Row(f"progress bar update of an import ({n:,} updates)", seconds_to("us", [update_s]),
                    seconds_to("us", [clock_s]), "a clock read", target="≤ 10 us", met=update_s <= 10e-6))
    return rows
