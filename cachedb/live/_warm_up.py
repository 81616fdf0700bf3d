"""What a process does while it waits for another process's compile (:mod:`._singleflight`):
the one-time set-up that serving the entry will need and that does not depend on it.

A process that compiles pays it inside its first compile; a waiter would pay it only after
the entry landed, in series with the holder's compile instead of beside it. One item today:
torch's vector-ISA probes (``torch/_inductor/cpu_vec_isa.py``, ``pick_vec_isa``), which loading
a CPU graph's kernels runs on first use: a C++ test program per ISA, each loaded in a fresh
``python -c "import torch ..."`` child. On the H200 host (16 cores, torch 2.11, no bytecode
written yet) that is ~35 s of a waiter's first hit; with bytecode, a few seconds.

The probes run on one daemon thread, started once per process at its first wait; a caller of
``pick_vec_isa`` that comes before they end runs them beside it (torch's file locks keep the
builds apart; both get the same answer). A failure is logged at debug level and changes
nothing: torch probes again where it needs to.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("cachedb.live")

_lock = threading.Lock()
_thread: threading.Thread | None = None


def start() -> None:
    """Start the warm-up on a daemon thread, once per process (later calls do nothing)."""
    global _thread
    with _lock:
        if _thread is not None:
            return
        _thread = threading.Thread(target=_probe_vector_isas, name="cachedb-warm-up", daemon=True)
    _thread.start()


def started() -> bool:
    """Whether this process started its warm-up."""
    return _thread is not None


def _probe_vector_isas() -> None:
    try:
        from torch._inductor import cpu_vec_isa

        cpu_vec_isa.pick_vec_isa()
    except Exception as exc:  # noqa: BLE001 - torch probes again where it needs to
        log.debug("cachedb: vector ISA probes ahead of a wait: %s", exc)
