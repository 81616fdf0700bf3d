"""Names of torch/_inductor/codegen/cutedsl/cutedsl_scheduling.py: CuTe-DSL kernel names.
"""

from __future__ import annotations

import hashlib


def cutedsl_kernel_name(fused_name: str, src: str) -> str:
    """Name of a CuTe-DSL kernel in the generated wrapper.

    Mirrors torch/_inductor/codegen/cutedsl/cutedsl_scheduling.py:
    CuteDSLScheduling.define_kernel: ``h = hex(src)[:8]``; ``f"cutedsl_{h}"`` when
    ``fused_name == "fused"``, else ``f"cutedsl_{fused_name}_{h}"``. ``fused_name`` is
    ``get_fused_kernel_name(...)`` with ``config.triton.descriptive_names`` on, ``""``
    with it off (which gives ``"cutedsl__<h>"``).

    Args:
        fused_name: the descriptive fused name (``"fused"``, ``"fused_add_mul"``, ``""``).
        src: the kernel source *before* the ``KERNEL_NAME`` placeholder is replaced.

    Returns:
        The kernel name.

    Raises:
        TypeError: an argument is not a str.
    """
    if not isinstance(fused_name, str) or not isinstance(src, str):
        raise TypeError("cutedsl_kernel_name: fused_name and src must be str")
    kernel_hash = hashlib.sha256(src.encode("utf-8")).hexdigest()[:8]
    if fused_name == "fused":
        return f"cutedsl_{kernel_hash}"
    return f"cutedsl_{fused_name}_{kernel_hash}"
