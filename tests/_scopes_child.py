"""torch's cache scopes and clear() exercised in one process, printed as JSON: run by
tests/test_scopes.py once with torch alone and once under cachedb, which must agree.

    python tests/_scopes_child.py OUT.json [DB]     (DB: cachedb.install(DB) first)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import torch

if len(sys.argv) > 2:
    import cachedb

    cachedb.install(sys.argv[2])

from torch._dynamo.utils import counters
from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache
from torch._inductor.codecache import FxGraphCache
from torch._inductor.utils import fresh_cache, fresh_inductor_cache

KEYS = ("fxgraph_cache_hit", "fxgraph_cache_miss")
CHILD = """
import sys, torch
from torch._dynamo.utils import counters
def h(x):
    return x.cos() * 3 - 1
torch.compile(h)(torch.ones(6))
print(counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"])
"""


def h(x):  # the children's function (the same graph, the same key)
    return x.cos() * 3 - 1


def compiled(fn, *args):
    """Counts of one fresh compile of ``fn`` (Dynamo reset first), and its result."""
    torch._dynamo.reset()
    counters.clear()
    out = torch.compile(fn)(*args)
    return [counters["inductor"][k] for k in KEYS], out


def child(cache_dir: str | None = None) -> list[int]:
    """A Python process started here (with ``cache_dir`` as its cache dir, if given) compiles a
    function: its (hits, misses)."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir) if cache_dir else None
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, env=env)
    return [int(n) for n in proc.stdout.split()]


def f(x):
    return torch.sin(x) * 2 + 1


def k(x):
    return torch.tanh(x) + x


x = torch.ones(8)
report: dict[str, object] = {}

# A fresh block serves nothing stored before it, and what it compiles inside it.
report["outside"] = compiled(f, x)[0]
report["h outside"] = compiled(h, torch.ones(6))[0]  # what a child given another dir must not see
with fresh_inductor_cache():
    report["fresh: first"] = compiled(f, x)[0]
    report["fresh: again"] = compiled(f, x)[0]
    report["fresh: child"] = child()
    report["fresh: second child"] = child()
    elsewhere = tempfile.mkdtemp()  # a child given another, empty cache dir: empty there too
    report["fresh: child elsewhere"] = child(elsewhere)
    report["fresh: child elsewhere again"] = child(elsewhere)
report["after fresh"] = compiled(f, x)[0]

# A kept directory serves what its block compiled, wherever it is the cache dir.
kept_parent = tempfile.mkdtemp()
with fresh_cache(dir=kept_parent, delete=False):
    kept = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    report["kept: first"] = compiled(h, torch.ones(6))[0]
report["kept dir exists"] = os.path.isdir(kept)
outer = os.environ["TORCHINDUCTOR_CACHE_DIR"]
os.environ["TORCHINDUCTOR_CACHE_DIR"] = kept
report["kept: child there"] = child()
os.environ["TORCHINDUCTOR_CACHE_DIR"] = outer

# clear() removes what the cache serves.
report["k: first"] = compiled(k, x)[0]
report["k: again"] = compiled(k, x)[0]
FxGraphCache.clear()
AOTAutogradCache.clear()
report["k: after clear"] = compiled(k, x)[0]

# standalone_compile's artifacts, both formats, saved and loaded in fresh blocks.
mod = torch.nn.Linear(1, 3)


def g(y):
    with torch.no_grad():
        return mod(y), y.sin()


y = torch.randn(4, 1)


def capture(fn):
    got = {}

    def backend(gm, args, **kwargs):
        got["gm"], got["args"] = gm, args
        return gm

    torch._dynamo.reset()
    torch.compile(fn, fullgraph=True, backend=backend)(y)
    return got["gm"], got["args"]


root = tempfile.mkdtemp()
paths = {"binary": os.path.join(root, "artifact.bin"), "unpacked": os.path.join(root, "unpacked")}
with fresh_cache():
    gm, args = capture(g)
    artifact = torch._inductor.standalone_compile(gm, args)
    for fmt, path in paths.items():
        artifact.save(path=path, format=fmt)
for fmt, path in paths.items():
    counters.clear()
    saved = sorted(os.listdir(path)) if fmt == "unpacked" else os.path.getsize(path) > 0
    with fresh_cache():
        loaded = torch._inductor.CompiledArtifact.load(path=path, format=fmt)
        same = all(torch.allclose(a, b) for a, b in zip(loaded(*args), g(y)))
    report[f"standalone {fmt}"] = [saved, same, counters["inductor"]["fxgraph_cache_hit"]]

with open(sys.argv[1], "w") as out:
    json.dump(report, out)
