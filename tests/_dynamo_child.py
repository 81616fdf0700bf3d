"""One process of the Dynamo-cache tests (tests/test_dynamo_caches.py): compile the workloads,
print one JSON line of what Dynamo did.

``python tests/_dynamo_child.py files|cachedb [--db PATH] [--precompile] [--save]
[--list-dir] [--python-version V] [--unpackageable] [--late-class] [--guard-assert]`` with
``TORCHINDUCTOR_CACHE_DIR`` set by the caller. The workloads: an MLP, then a function called
with 7, 33 and 1,024 rows (static at first: a recompile makes it dynamic, unless a PGO profile
says so already). ``cachedb``: ``cachedb.install(db, precompile=True)`` (with
``--precompile``) first; ``--save``: ``torch.compiler.save_cache_artifacts()`` at the end (how
torch alone writes precompiled Dynamo packages); ``--list-dir``: the files under the cache
directory after the workloads (relative paths); ``--python-version``: the process reports
``V`` as its Python version in ``SystemInfo.current()`` (torch/_dynamo/package.py), for torch
recording it in the packages it builds and checking it in those it loads, as another machine of
a mixed fleet would.

``--unpackageable``: then a model torch cannot package for precompile (:class:`_Model`, whose
``forward`` calls a property with a graph break inside, as transformers' models call
``self.loss_function``); ``--late-class``: then a function called with an instance of a class
defined only after ``torch.compile`` wrapped the function (:func:`_scaled`: torch loads the
function's package when it wraps it, and unpickling the package's guards needs the class);
``--guard-assert``: then a function whose guards fail an assertion while ``caching_precompile``
is on, as torch 2.11's do for GPT-2 (:func:`_inject_guard_assertion`).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch


def _rows(x):  # noqa: ANN001, ANN202 - compiled by Dynamo
    return (x.sin() * 2).sum(0)


class _Model(torch.nn.Module):
    """As transformers' models: ``forward`` calls ``self.loss_function``, a property that logs
    once (``logger.warning_once``: a graph break). Dynamo compiles the property's frame apart,
    and torch cannot name its code from the module (``_get_code_source``, torch/_dynamo/package.py)."""

    @property
    def loss_function(self):  # noqa: ANN201 - PreTrainedModel.loss_function
        torch._dynamo.graph_break()
        return torch.nn.functional.mse_loss

    def forward(self, x, y):  # noqa: ANN001, ANN201 - compiled by Dynamo
        return self.loss_function(x.sin(), y) * 2


class _Scale:
    factor = 2.0


def _scaled(x, scale):  # noqa: ANN001, ANN202 - compiled by Dynamo: its guards name _Scale
    return x.cos() * scale.factor


def _asserting(x):  # noqa: ANN001, ANN202 - compiled by Dynamo under --guard-assert
    return x.tan() + 1


#: How many times guards were built for :func:`_asserting`'s frame (once per compile of it).
_ASSERTING_GUARD_BUILDS = [0]


def _inject_guard_assertion() -> None:
    """torch 2.11's failure under precompile, where torch 2.13 does not fail: with
    ``caching_precompile`` on it filters every frame's guards, package or not, which builds
    them twice (``CheckFunctionManager.__init__``, torch/_dynamo/guards.py), and
    ``Guard.set_export_info`` (torch/_guards.py) asserts a guarded object is the same both
    times, which an object made anew on each access is not (transformers'
    ``_PerLayerConfigView``, GPT-2). Raised here, for :func:`_asserting`'s frame only, where
    the guards are built while ``caching_precompile`` is on: with it off the frame compiles."""
    import torch._dynamo.config as dynamo_config
    from torch._dynamo.guards import CheckFunctionManager

    original = CheckFunctionManager.__init__

    def __init__(self, f_code, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202, N807
        if f_code.co_name == "_asserting":
            _ASSERTING_GUARD_BUILDS[0] += 1
        if dynamo_config.caching_precompile and f_code.co_name == "_asserting":
            raise AssertionError("Guarded object must be identical, None or ephemeral (dead weakref), "
                                 "got <weakref to '_View' at 0x1>\nvs <weakref to '_View' at 0x2>\n")
        original(self, f_code, *args, **kwargs)

    CheckFunctionManager.__init__ = __init__


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["files", "cachedb"])
    parser.add_argument("--db")
    parser.add_argument("--precompile", action="store_true")
    parser.add_argument("--save", action="store_true")
    parser.add_argument("--list-dir", action="store_true")
    parser.add_argument("--python-version")
    parser.add_argument("--unpackageable", action="store_true")
    parser.add_argument("--late-class", action="store_true")
    parser.add_argument("--guard-assert", action="store_true")
    args = parser.parse_args()

    from torch._dynamo.utils import counters

    if args.python_version:
        import types

        from torch._dynamo import package

        # SystemInfo.current() reads platform.python_version(), both where torch checks a
        # package it loads and where a package records its system (_DynamoCacheEntry's
        # default_factory, bound when torch imported the module)
        package.platform = types.SimpleNamespace(python_version=lambda: args.python_version)

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
    if args.unpackageable:
        loss_model = _Model()
        loss = torch.compile(loss_model)
        x, y = torch.randn(4, 8), torch.randn(4, 8)
        ok &= bool(torch.allclose(loss(x, y), loss_model(x, y), atol=1e-5, rtol=1e-4))
    if args.late_class:
        scale_class = globals().pop("_Scale")  # not defined yet when torch.compile wraps _scaled
        scaled = torch.compile(_scaled)
        globals()["_Scale"] = scale_class
        x = torch.randn(4, 8)
        ok &= bool(torch.allclose(scaled(x, _Scale()), _scaled(x, _Scale()), atol=1e-5, rtol=1e-4))
    if args.guard_assert:
        _inject_guard_assertion()
        asserting = torch.compile(_asserting)
        x = torch.randn(4, 8)
        ok &= bool(torch.allclose(asserting(x), _asserting(x), atol=1e-5, rtol=1e-4))
    if args.save:
        torch.compiler.save_cache_artifacts()
    out = {
        "ok": ok,
        "seconds": seconds,
        "frames": dict(counters["frames"]),
        "unique_graphs": counters["stats"]["unique_graphs"],
        "dynamo_cache": dict(counters["dynamo_cache"]),
        "corrupt": counters["inductor"]["cachedb_corrupt_payload"],
        "asserting_guard_builds": _ASSERTING_GUARD_BUILDS[0],
    }
    if args.list_dir:
        root = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        out["files"] = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
