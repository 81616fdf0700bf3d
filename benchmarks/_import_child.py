"""One timed import in a fresh interpreter, as ``cachedb import`` runs it (§5).

``python -m benchmarks._import_child CACHE_DIR DB WORKERS``: opens (creates and migrates) the
database ``DB`` untimed, then times ``Importer(db, workers=WORKERS).run(CACHE_DIR)``
(``WORKERS``: ``default`` or an integer). Prints one JSON line: ``{"s": seconds, "problems":
count, "added": {kind: rows}}``.

The process imports cachedb and not torch, as ``cachedb import`` without ``--this-machine``
does: the benchmark's own process holds torch and what §1–§4 left on its heap, and an
import's worker processes are forked from whichever process runs it.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    cache_dir, db_path, workers_arg = sys.argv[1], sys.argv[2], sys.argv[3]
    from cachedb import CacheDB
    from cachedb.layout.importer import Importer

    workers = None if workers_arg == "default" else int(workers_arg)
    db = CacheDB(db_path)
    try:
        t0 = time.perf_counter()
        report = Importer(db, workers=workers).run(cache_dir)
        took = time.perf_counter() - t0
    finally:
        db.close()
    assert "torch" not in sys.modules
    print(json.dumps({"s": took, "problems": len(report.problems), "added": dict(report.added)}))


if __name__ == "__main__":
    main()
