"""One compiling process of the singleflight benchmark and tests/test_singleflight.py: four
graphs every process shares and one of its own, compiled cold under cachedb; prints JSON with
its counters, results, the waits it made (seconds, why it ended, when) and how long its
compiles took (s).

    python benchmarks/_flight_child.py DB TAG [--remote URL] [--hold-for SECONDS] [--shared-only] [--graphs K]

``--graphs K``: only the first K of the four shared graphs (a quick run's smallest workload).

``--hold-for``: once this process has claimed its first graph, it says ``holding`` on stdout and
sleeps inside the compile that many seconds (the test then kills or stops it).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("db")
parser.add_argument("tag")
parser.add_argument("--remote")
parser.add_argument("--hold-for", type=float, default=0.0)
parser.add_argument("--shared-only", action="store_true", help="compile no graph of this process's own")
parser.add_argument("--graphs", type=int, default=4, choices=range(1, 5), help="shared graphs compiled (1-4)")
args = parser.parse_args()

waits: list[dict[str, object]] = []


class Waits(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text.startswith("cachedb: waited "):
            waits.append({"seconds": float(text.split()[2]), "why": text.rsplit(": ", 1)[1], "ended_at": time.time()})


logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
logging.getLogger().handlers[0].setLevel(logging.WARNING)
live_log = logging.getLogger("cachedb.live")
live_log.setLevel(logging.DEBUG)
handler = Waits()
handler.setLevel(logging.DEBUG)
live_log.addHandler(handler)

import cachedb  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

from cachedb.live import _warm_up  # noqa: E402

if args.db != "-":  # "-": torch alone, its own files
    cachedb.install(args.db, **({"remote": args.remote, "remote_trust": True} if args.remote else {}))

if args.hold_for:
    import torch._inductor.compile_fx as compile_fx

    compile_graph = compile_fx.fx_codegen_and_compile

    def held(*a: object, **k: object) -> object:  # the first graph's compile, after its claim
        compile_fx.fx_codegen_and_compile = compile_graph
        print("holding", flush=True)
        time.sleep(args.hold_for)
        return compile_graph(*a, **k)

    compile_fx.fx_codegen_and_compile = held

shared = [lambda x: (x.sin() * 2).cumsum(0), lambda x: x.cos().relu() + 1, lambda x: torch.tanh(x) * x,
          lambda x: x.exp().sum()][: args.graphs]
scale = float(sum(map(ord, args.tag)))  # a graph of this process's own (another key)
own = lambda x: x * scale - 1.0  # noqa: E731
x = torch.linspace(-1, 1, 32)
started = time.perf_counter()
results = [torch.compile(fn)(x).tolist() for fn in shared]
own_result = (x * scale - 1.0).tolist() if args.shared_only else torch.compile(own)(x).tolist()
seconds = time.perf_counter() - started
print(json.dumps({
    "miss": counters["inductor"]["fxgraph_cache_miss"], "hit": counters["inductor"]["fxgraph_cache_hit"],
    "results": results, "own_ok": torch.allclose(torch.tensor(own_result), x * scale - 1.0),
    "eager": [fn(x).tolist() for fn in shared], "waits": waits, "seconds": seconds,
    "warmed": _warm_up.started(),
}), flush=True)
