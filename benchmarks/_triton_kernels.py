"""Child of §1's Triton key-fill measurement where no GPU compile ran: real Triton compiles
for sm80 and sm90 on a machine without a GPU (``triton.compile(ASTSource(...),
target=GPUTarget("cuda", arch, 32))``).

``python -m benchmarks._triton_kernels TRITON_CACHE_DIR N`` compiles ``N`` distinct kernels into
``TRITON_CACHE_DIR`` with Triton's own ``FileCacheManager``.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ["TRITON_CACHE_DIR"] = sys.argv[1]
    os.environ.pop("TRITON_CACHE_MANAGER", None)
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m)
        tl.store(out_ptr + offs, tl.exp(x) * tl.load(y_ptr + offs, mask=m) + x, mask=m)

    sig = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    for i in range(int(sys.argv[2])):
        triton.compile(ASTSource(fn=kernel, signature=sig, constexprs={"BLOCK": 64 << (i % 5)}),
                       target=GPUTarget("cuda", 80 + 10 * (i // 5), 32))


if __name__ == "__main__":
    main()
