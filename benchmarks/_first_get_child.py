"""One first FX-graph get in a fresh interpreter, as torch makes it once per process (§4).

``python -m benchmarks._first_get_child MODE CACHE_DIR KEY NONCE [DB [KIND WARM_KEY]]``: ``MODE`` ``files``
reads the entry from Inductor's own cache dir ``CACHE_DIR`` (``TORCHINDUCTOR_CACHE_DIR``);
``live`` from the database ``DB`` inside ``cachedb.installed``. After one lookup of an absent
key (torch's first lookup imports and sets up, on both sides alike) and the import of the
entry's classes, times the one ``FxGraphCache.iterate_over_candidates(True, None, KEY)`` call
(list, read or fetch, decompress, ``pickle.loads``) with no warm memory on either side, and
counts the minor page faults it took. With ``KIND`` (``fxgraph`` or ``aotautograd``: a real
entry, whose unpickle builds torch objects) the class is that kind's cache, another stored
entry of the kind, ``WARM_KEY``, is read first, untimed (the first unpickle of a real entry
imports the modules its objects need, on both sides alike), and ``NONCE`` is not checked
(pass -1). The call runs with Python's collector off, on both
sides: else whether a collection lands in it depends on how many objects the code before it
allocated (a change elsewhere in cachedb moved the live side's first 100 KB get from 0.3 to
1.1 ms, all of it one collection). Prints one JSON line: ``{"s": seconds, "faults": count}``.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time


def main() -> None:
    mode, cache_dir, key, nonce = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    import resource
    from contextlib import nullcontext

    from torch._inductor.codecache import FxGraphCache

    kind = sys.argv[6] if len(sys.argv) > 6 else None
    cls = FxGraphCache
    if kind == "aotautograd":
        from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache

        cls = AOTAutogradCache
    if mode == "live":
        import cachedb

        scope = cachedb.installed(sys.argv[5])
    else:
        scope = nullcontext()
    with scope:
        # What both sides pay once, before any graph: the entry's classes, and the code of the
        # lookup itself (a lookup of an absent key: torch's first call imports and sets up).
        import benchmarks._payloads  # noqa: F401

        assert not list(cls.iterate_over_candidates(True, None, "f" + "0" * 51))
        if kind is not None:  # a real entry: its classes' modules imported by another entry's unpickle
            assert len(list(cls.iterate_over_candidates(True, None, sys.argv[7]))) == 1
        # Python's collector runs when enough objects have been allocated since its last run:
        # one timed call either pays a pass over older generations (torch's objects included,
        # ~0.8 ms) or not, by where the count stood, which shifts with any code that ran
        # before. Both sides time the call with the collector off. (A gc.collect() first would
        # leave the CPU caches cold: both sides' calls took 0.4-0.7 ms then.)
        gc.disable()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t = time.perf_counter()
        got = list(cls.iterate_over_candidates(True, None, key))
        took = time.perf_counter() - t
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        gc.enable()
    assert len(got) == 1 and (nonce < 0 or got[0][0].nonce == nonce), (mode, key, len(got))
    print(json.dumps({"s": took, "faults": faults}))


if __name__ == "__main__":
    main()
