"""§7's eviction replay: a bounded cache under a lookup trace, ``prune --order lru`` against
``--order value``.

The trace (seeded, :func:`make_trace`): many small pointwise-kernel FX graphs (compile 0.1–1 s,
20–200 KB, both log-uniform) and a few max-autotune graphs (30–120 s, 1–20 MB), their
popularity Zipf-like (weight ``1 / rank``, the ranks a seeded permutation, so popularity says
nothing of cost or size), lookups spread evenly over 14 simulated days.

The replay (:func:`replay`), once per order, into a fresh SQLite database: a lookup is a hit
when a variant of the key is stored (``variant_names``, the index alone), recorded by
``record_hits`` at the lookup's simulated time (gathered per key, written before each prune and
at the end of each transaction); a miss "compiles" (its seconds are counted, not
spent) and stores the graph's payload (incompressible bytes of its size) with its compile time
(``put``, ``time_taken_ns``), then, when the stored bytes may exceed the bound (an upper
bound of them is kept, exact after each plan), prunes to it through cachedb's own code path,
:func:`cachedb.tools.prune.plan` (``now`` = the simulated time) and
:func:`cachedb.tools.prune.apply`, as ``cachedb prune --max-bytes B --order ...`` does. The
bound is 25% of the stored bytes of every graph of the trace. Lookups run 200 to a transaction.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

#: Share of the trace's total stored bytes the cache is bounded at.
BOUND_SHARE = 0.25
#: A prune, once the stored bytes pass the bound, brings them down to this share of it.
LOW_WATER = 0.9
#: Simulated days the lookups are spread over.
DAYS = 14
#: Lookups per write transaction.
BATCH = 200


@dataclass(frozen=True)
class Graph:
    key: str
    compile_s: float
    nbytes: int
    autotuned: bool


@dataclass(frozen=True)
class Trace:
    graphs: list[Graph]
    #: indices into ``graphs``, in lookup order
    lookups: list[int]
    seed: int


@dataclass
class Replay:
    """What one order kept: hits, misses and compile seconds saved (hits × the graph's compile
    time) and spent (misses × it); the prune runs and the replay's wall time (s)."""

    order: str
    hits: int = 0
    misses: int = 0
    seconds_saved: float = 0.0
    seconds_compiled: float = 0.0
    prunes: int = 0
    evicted: int = 0
    wall_s: float = 0.0

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 0.0


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def make_trace(*, small: int, autotuned: int, lookups: int, seed: int = 7,
               autotuned_bytes: tuple[float, float] = (1e6, 20e6)) -> Trace:
    """The seeded trace of ``lookups`` lookups over ``small`` pointwise and ``autotuned``
    max-autotune graphs (module docstring); ``autotuned_bytes``: the range of the latter's
    sizes (bytes, log-uniform)."""
    rng = random.Random(seed)
    graphs = [Graph(f"fpw{i:05d}", _log_uniform(rng, 0.1, 1.0), int(_log_uniform(rng, 20e3, 200e3)), False)
              for i in range(small)]
    graphs += [Graph(f"fma{i:05d}", rng.uniform(30.0, 120.0), int(_log_uniform(rng, *autotuned_bytes)), True)
               for i in range(autotuned)]
    ranks = list(range(1, len(graphs) + 1))
    rng.shuffle(ranks)
    weights = [1.0 / r for r in ranks]
    return Trace(graphs, rng.choices(range(len(graphs)), weights=weights, k=lookups), seed)


def bound_bytes(trace: Trace) -> int:
    """The cache's bound: :data:`BOUND_SHARE` of the bytes of every graph the trace looks up."""
    return int(BOUND_SHARE * sum(trace.graphs[i].nbytes for i in set(trace.lookups)))


def replay(trace: Trace, order: str, db_path: Path) -> Replay:
    """Replay ``trace`` into a new database at ``db_path``, pruned to :func:`bound_bytes` with
    ``order`` after every miss (module docstring)."""
    from cachedb import CacheDB
    from cachedb.tools import prune as pruning

    bound = bound_bytes(trace)
    start = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=DAYS)
    step = dt.timedelta(days=DAYS) / max(len(trace.lookups), 1)
    payloads: dict[int, bytes] = {}
    out = Replay(order)
    #: an upper bound of the stored bytes (exact after each plan): a plan only when it may be over
    held = 0
    began = time.perf_counter()
    db = CacheDB(db_path)
    try:
        positions = iter(enumerate(trace.lookups))
        while batch := list(itertools.islice(positions, BATCH)):
            with db.transaction() as repos:
                pending: dict[tuple[str, str, str], tuple[int, dt.datetime]] = {}  # hits not yet recorded
                for position, index in batch:
                    graph, when = trace.graphs[index], start + step * position
                    stored = repos.guarded.variant_names("fxgraph", graph.key)
                    if stored:
                        hit = ("fxgraph", graph.key, stored[0])
                        pending[hit] = (pending.get(hit, (0, when))[0] + 1, when)
                        out.hits += 1
                        out.seconds_saved += graph.compile_s
                        continue
                    out.misses += 1
                    out.seconds_compiled += graph.compile_s
                    if index not in payloads:  # the same bytes each time the graph is compiled
                        payloads[index] = random.Random(f"{trace.seed}:{graph.key}").randbytes(graph.nbytes)
                    variant, _ = repos.guarded.put("fxgraph", graph.key, payloads[index], guards_expr=None,
                                                   time_taken_ns=int(graph.compile_s * 1e9))
                    repos.guarded.record_hits({("fxgraph", graph.key, variant): (0, when)})  # written now
                    held += graph.nbytes + graph.nbytes // 1000 + 256  # at least what the frame takes
                    if held <= bound:
                        continue
                    repos.guarded.record_hits(pending)  # the plan ranks by them
                    pending = {}
                    plan = pruning.plan(repos, max_bytes=int(bound * LOW_WATER), order=order, now=when)
                    held = plan.total_bytes - plan.bytes
                    if not plan.empty:
                        done = pruning.apply(repos, plan)
                        out.prunes += 1
                        out.evicted += done.entries
                repos.guarded.record_hits(pending)
                if len(payloads) > 64:  # keep the pointwise graphs' bytes, not every 20 MB one
                    for i in [i for i in payloads if trace.graphs[i].autotuned]:
                        del payloads[i]
    finally:
        db.close()
    out.wall_s = time.perf_counter() - began
    return out


__all__ = ["BOUND_SHARE", "DAYS", "Graph", "Replay", "Trace", "bound_bytes", "make_trace", "replay"]
