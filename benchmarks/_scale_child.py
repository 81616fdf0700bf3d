"""§4's 100 KB get at scale, in a process of its own (:func:`benchmarks.s4_guarded._scale_case`).

``python -m benchmarks._scale_child CACHE_DIR DB ENTRIES GETS ROUNDS``: torch's own put writes
``ENTRIES`` FX graph entries of 100 KB (one variant each) into the empty Inductor cache dir
``CACHE_DIR`` (``TORCHINDUCTOR_CACHE_DIR``), ``Importer`` copies that directory into the new
database ``DB``, and ``FxGraphCache.iterate_over_candidates`` reads ``GETS`` keys drawn at random
per round from both, files and live (inside ``cachedb.installed``) alternating, ``ROUNDS``
rounds after a warm-up round. Prints one JSON line: ``{"files": [s, ...], "live": [s, ...],
"db_bytes": n}`` (seconds per get).

A process of its own, because writing and importing a gigabyte leaves the benchmark process's
heap larger and more fragmented, and §5's import (which forks its workers from that process)
measured 40% slower after it.
"""

from __future__ import annotations

import gc
import json
import os
import random
import sys
from pathlib import Path


def main() -> None:
    cache_dir, db_path = Path(sys.argv[1]), Path(sys.argv[2])
    n, n_gets, rounds = (int(a) for a in sys.argv[3:6])
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    from torch._inductor.codecache import FxGraphCache

    import cachedb
    from cachedb import CacheDB
    from cachedb.layout.importer import Importer

    from . import _payloads as P
    from ._stats import time_ops

    size = 100_000
    binary = P.binary_blob(size, 0)
    keys = [P.fx_key(70_000_000 + i) for i in range(n)]
    for i, key in enumerate(keys):
        FxGraphCache._write_to_local_cache(key, P.fx_entry(size, 70_000_000 + i, binary=binary))
    db = CacheDB(db_path)
    try:
        report = Importer(db).run(cache_dir)
    finally:
        db.close()
    assert report.added["fxgraph"] == n and not report.problems, report

    def get(key: str) -> None:
        assert len(list(FxGraphCache.iterate_over_candidates(True, None, key))) == 1

    rng = random.Random(11)
    times: dict[str, list[float]] = {"files": [], "live": []}
    for r in range(-1, rounds):
        for mode in (("files", "live") if r % 2 == 0 else ("live", "files")):
            sample = rng.sample(keys, n_gets)
            gc.collect()
            if mode == "files":
                got = time_ops(lambda j: get(sample[j]), range(n_gets))
            else:
                with cachedb.installed(db_path):
                    # the store opened (an absent key), as in the other live blocks
                    assert not list(FxGraphCache.iterate_over_candidates(True, None, "f" + "0" * 51))
                    got = time_ops(lambda j: get(sample[j]), range(n_gets))
            if r >= 0:  # round -1: warm-up
                times[mode] += got
    print(json.dumps({**times, "db_bytes": db_path.stat().st_size}))


if __name__ == "__main__":
    main()
