"""One writer process of §6: records timings for its own op, reports per-record latency.

``python -m benchmarks._concurrency_child MODE PROC N [--db PATH]`` with ``MODE`` one of
``files`` (torch's ``PersistentCache`` on ``$TORCHINDUCTOR_CACHE_DIR``), ``cachedb``
(``repos.timings.record`` in one ``CacheDB.transaction()`` per record) or ``live`` (the same
``PersistentCache`` calls inside ``cachedb.install(db)``). Prints ``ready`` once set up, waits
for a line on stdin, records ``N`` (op, inputs) pairs of 10 choices each for op
``conc_op<PROC>``, then prints one JSON line: ``{"latencies_s": [...], "errors": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable


def pair_id(proc: int, i: int) -> int:
    return 1_000_000 + proc * 10_000 + i


def op_name(proc: int) -> str:
    return f"conc_op{proc}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["files", "cachedb", "live"])
    parser.add_argument("proc", type=int)
    parser.add_argument("n", type=int)
    parser.add_argument("--db", default=None)
    args = parser.parse_args(argv)

    from . import _payloads as P

    record: Callable[[int], None]
    if args.mode in ("files", "live"):
        from torch._inductor.codecache import PersistentCache

        from ._context import FakeChoice

        if args.mode == "live":
            import cachedb

            cachedb.install(args.db)

        def record(i: int) -> None:
            pair = pair_id(args.proc, i)
            table = P.timings_for(pair)
            choices = [FakeChoice(h) for h in table]
            PersistentCache().lookup(
                choices, op_name(args.proc), P.inputs_key(pair), lambda cs: {c: table[c.hash_key()] for c in cs}
            )

        if args.mode == "live":  # open the database and record the fingerprint before the start
            from cachedb.live import active_store

            store = active_store()
            assert store is not None
            with store.db.transaction() as repos:
                store._fingerprint_id(repos)
    else:
        from cachedb import CacheDB, Fingerprint

        db = CacheDB(args.db)
        with db.transaction() as repos:
            fp_id = repos.fingerprints.ensure(Fingerprint(system={"hash": P.CPU_SYSTEM_HASH}))

        def record(i: int) -> None:
            pair = pair_id(args.proc, i)
            with db.transaction() as repos:
                repos.timings.record(fp_id, op_name(args.proc), P.inputs_key(pair), P.PRECISION, P.timings_for(pair))

    print("ready", flush=True)
    sys.stdin.readline()
    latencies: list[float] = []
    errors: list[str] = []
    for i in range(args.n):
        t0 = time.perf_counter()
        try:
            record(i)
        except Exception as exc:  # counted: a failed record is a lost update
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
        latencies.append(time.perf_counter() - t0)
    print(json.dumps({"latencies_s": latencies, "errors": errors}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
