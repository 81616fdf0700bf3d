"""Child process for the kernel-artifact tests: real Triton compiles of SM90 kernels (no GPU
needed: ``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))``).

Usage: ``python _triton_child.py TRITON_CACHE_DIR N [DB]`` compiles ``N`` distinct kernels
(``BLOCK`` = 32, 64, ...) with the cache manager that ``TRITON_CACHE_MANAGER`` names; with
``DB`` it first runs ``cachedb.install(DB)`` (which sets that variable). Prints one JSON line:
``{"hits": [bool per kernel], "hashes": [...], "cubin_sha256": [...], "dirs": [...]}``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys


def main() -> None:
    cache_dir, n = sys.argv[1], int(sys.argv[2])
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    if len(sys.argv) > 3:
        import cachedb

        cachedb.install(sys.argv[3])
    import triton
    import triton.language as tl
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    hits: list[bool] = []
    knobs.compilation.listener = lambda **kw: hits.append(bool(kw["cache_hit"]))

    @triton.jit
    def scale_add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        y = tl.load(y_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, x * 2.0 + y, mask=mask)

    out: dict[str, list] = {"hits": hits, "hashes": [], "cubin_sha256": [], "dirs": []}
    for i in range(n):
        src = ASTSource(
            fn=scale_add,
            signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
            constexprs={"BLOCK": 32 << i},
        )
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32))
        out["hashes"].append(kernel.hash)
        out["cubin_sha256"].append(hashlib.sha256(kernel.asm["cubin"]).hexdigest())
    out["dirs"] = sorted(d for d in os.listdir(cache_dir) if not d.startswith("."))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
