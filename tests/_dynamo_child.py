"""One process of the Dynamo-cache tests (tests/test_dynamo_caches.py): compile the workloads,
print one JSON line of what Dynamo did.

``python tests/_dynamo_child.py files|cachedb [--db PATH] [--precompile] [--save]
[--list-dir] [--python-version V]`` with ``TORCHINDUCTOR_CACHE_DIR`` set by the caller. The workloads: an MLP, then
a function called with 7, 33 and 1,024 rows (static at first: a recompile makes it dynamic,
unless a PGO profile says so already). ``cachedb``: ``cachedb.install(db, precompile=True)``
(with ``--precompile``) first; ``--save``: ``torch.compiler.save_cache_artifacts()`` at the end
(how torch alone writes precompiled Dynamo packages); ``--list-dir``: the files under the cache
directory after the workloads (relative paths); ``--python-version``: the process reports
``V`` as its Python version in ``SystemInfo.current()`` (torch/_dynamo/package.py), for torch
recording it in the packages it builds and checking it in those it loads, as another machine of
a mixed fleet would.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def _rows(x):  # noqa: ANN001, ANN202 - compiled by Dynamo
    return (x.sin() * 2).sum(0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["files", "cachedb"])
    parser.add_argument("--db")
    parser.add_argument("--precompile", action="store_true")
    parser.add_argument("--save", action="store_true")
    parser.add_argument("--list-dir", action="store_true")
    parser.add_argument("--python-version")
    args = parser.parse_args()

    import torch
    from torch._dynamo.utils import counters

    if args.python_version:
        import dataclasses

        from torch._dynamo import package

        current = package.SystemInfo.current
        package.SystemInfo.current = classmethod(  # type: ignore[method-assign]
            lambda cls: dataclasses.replace(current(), python_version=args.python_version))

    if args.mode == "cachedb":
        import cachedb

        cachedb.install(args.db, **({"precompile": True} if args.precompile else {}))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).eval()
    seconds = {}
    t = time.perf_counter()
    compiled = torch.compile(model)
    with torch.no_grad():
        x = torch.randn(4, 16)
        ok = bool(torch.allclose(compiled(x), model(x), atol=1e-5, rtol=1e-4))
    seconds["mlp"] = time.perf_counter() - t
    t = time.perf_counter()
    rows = torch.compile(_rows)
    for n in (7, 33, 1024):
        x = torch.randn(n, 8)
        ok &= bool(torch.allclose(rows(x), _rows(x), atol=1e-4, rtol=1e-4))
    seconds["dynamic"] = time.perf_counter() - t
    if args.save:
        torch.compiler.save_cache_artifacts()
    out = {
        "ok": ok,
        "seconds": seconds,
        "frames": dict(counters["frames"]),
        "unique_graphs": counters["stats"]["unique_graphs"],
        "dynamo_cache": dict(counters["dynamo_cache"]),
        "corrupt": counters["inductor"]["cachedb_corrupt_payload"],
    }
    if args.list_dir:
        root = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        out["files"] = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
