"""What a ``fork`` must not copy: at-fork hooks for cachedb's objects that hold connections,
threads or locks.

A forked child (a DataLoader worker, a ``multiprocessing`` pool's process) gets a copy of the
parent's memory and only the thread that called ``fork``. Whatever another thread held at that
instant stays held in the child, where no thread will release it: SQLite's mutexes while a
statement runs, a module's import lock while a first write imports a dialect. The hooks here
take weak references, so registering one keeps nothing alive.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import TypeVar

__all__ = ["FORK_WAIT_S", "fork_waits_for", "in_forked_children"]

T = TypeVar("T")

#: Seconds a fork waits for a background thread's running job (a queued write, a WAL
#: checkpoint) to end before it goes ahead anyway.
FORK_WAIT_S = 10.0


def in_forked_children(obj: T, call: Callable[[T], object]) -> None:
    """Run ``call(obj)`` in every child this process forks from now on, for as long as ``obj``
    lives (held by a weak reference: the hook keeps nothing alive; ``call`` must not capture
    ``obj``). A no-op where ``os.register_at_fork`` is missing (Windows)."""
    if not hasattr(os, "register_at_fork"):
        return
    ref = weakref.ref(obj)

    def _after_fork() -> None:
        alive = ref()
        if alive is not None:
            call(alive)

    os.register_at_fork(after_in_child=_after_fork)


def fork_waits_for(
    obj: T, lock_of: Callable[[T], threading.Lock], after_in_child: Callable[[T], object],
    *, timeout_s: float = FORK_WAIT_S,
) -> None:
    """Make every ``fork`` of this process wait for ``lock_of(obj)``, the lock ``obj``'s
    background thread holds while it runs a job whose locks a child must not inherit, for at
    most ``timeout_s`` seconds; the parent releases it once the child exists, and the child runs
    ``after_in_child(obj)``, which must replace the lock (the child's copy is held) and forget
    the parent's thread. Held by a weak reference, as :func:`in_forked_children`; a no-op where
    ``os.register_at_fork`` is missing.

    Mirrors what CPython does for its own locks around ``fork`` (``PyOS_BeforeFork``: the
    import lock is taken before and released after, in both processes)."""
    if not hasattr(os, "register_at_fork"):
        return
    ref = weakref.ref(obj)
    held: dict[int, threading.Lock] = {}  # per forking thread: the lock it took for its fork

    def _before() -> None:
        alive = ref()
        if alive is not None:
            lock = lock_of(alive)
            if lock.acquire(timeout=timeout_s):
                held[threading.get_ident()] = lock

    def _after_in_parent() -> None:
        lock = held.pop(threading.get_ident(), None)
        if lock is not None:
            lock.release()

    def _after_in_child() -> None:
        held.clear()
        alive = ref()
        if alive is not None:
            after_in_child(alive)

    os.register_at_fork(before=_before, after_in_parent=_after_in_parent, after_in_child=_after_in_child)
