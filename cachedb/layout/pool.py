"""Batches of an import checked in forked worker processes, in order, with a fallback.

``cachedb import`` spends most of its time outside the database: reading each entry file,
hashing it, reading ``guards_expr`` out of its pickle and compressing it. Those steps touch
nothing shared, so :func:`map_in_workers` runs them for batch after batch in worker processes
(``concurrent.futures.ProcessPoolExecutor`` over ``fork``: nothing is imported again) while the
calling process writes the batches before them.

A worker is disposable, which lets it read pickles with the C unpickler over inert stand-ins
(:mod:`cachedb.formats.own_pickle`) instead of the opcode walk: a hostile file that would make that
reader run for ever or overflow the C stack (a hash of a deeply nested tuple) takes down a
worker, never the import. A worker that dies, raises, or holds a batch longer than the stall
limit (its ``SIGALRM`` kills it) ends the pool: that batch and every one after it are
computed in the calling process by the fallback (the opcode walk), and the fact is logged once.
"""

from __future__ import annotations

import faulthandler
import logging
import math
import multiprocessing
import os
import signal
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from typing import TypeVar

from .. import settings

__all__ = ["STALL_LIMIT_S", "default_workers", "map_in_workers"]

log = logging.getLogger("cachedb")

_B = TypeVar("_B")
_END = object()
_R = TypeVar("_R")

#: Seconds a worker may spend on one batch before its alarm kills it (a batch holds at most
#: 256 files or 256 MiB: seconds of work at most).
STALL_LIMIT_S = 60.0


def default_workers() -> int:
    """Worker processes an import uses by default: one fewer than the CPUs this process may
    run on (the calling process walks the directory and writes every batch: it is busy the
    whole import), at most 4, or 0 (everything in-process) where there is one CPU or no
    ``fork`` (not Linux). ``CACHEDB_IMPORT_WORKERS`` (an integer, 0 = none) overrides it.

    On 2 CPUs one worker imports the 10,000 small files of ``benchmarks`` §5 in ~0.67 s and
    its 1,499 ~100 KB entries in ~0.7 s, against ~0.76 s and ~0.85 s with two: three busy
    processes on two CPUs take turns, and the writer, which bounds the import, waits."""
    try:
        workers = settings.read("CACHEDB_IMPORT_WORKERS")
    except settings.SettingError as exc:
        log.warning("%s: ignored", exc)
        workers = None
    if workers is not None:
        return int(workers)
    if not sys.platform.startswith("linux"):
        return 0
    cpus = len(os.sched_getaffinity(0))
    return 0 if cpus < 2 else min(cpus - 1, 4)


def _init_worker() -> None:
    """Worker initializer: ``SIGALRM`` kills the worker (the parent's handler, if any, does
    not run in C code, where a stalled read sits); Ctrl-C (``SIGINT``, sent to the whole
    process group) is left to the parent, which stops the pool; and a worker that a hostile
    file crashes dies quietly (no ``faulthandler`` dump inherited from the parent): the parent
    says so."""
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    faulthandler.disable()


def _watched(work: Callable[[_B], _R], stall_s: float, batch: _B) -> _R:
    signal.alarm(max(1, math.ceil(stall_s)))
    try:
        return work(batch)
    finally:
        signal.alarm(0)


def map_in_workers(
    work: Callable[[_B], _R],
    fallback: Callable[[_B], _R],
    batches: Iterable[_B],
    *,
    workers: int,
    ahead: int | None = None,
    ahead_bytes: int = 0,
    weigh: Callable[[_B], int] | None = None,
    most_ahead: int = 64,
    stall_s: float | None = None,
) -> Iterator[_R]:
    """``work(batch)`` for every batch, yielded in order, computed in ``workers`` forked
    processes ahead of the consumer: always up to ``ahead`` batches (default ``2 * workers``),
    and more while the batches in flight weigh less than ``ahead_bytes`` in all (``weigh``:
    a batch's input bytes) and number fewer than ``most_ahead``. Batches are taken from
    ``batches`` only as they are submitted, so a lazy iterable (a directory walk) is consumed
    while the workers already run; the first result is awaited only once that many are in
    flight.

    ``work`` and its results cross a process boundary (pickled). When a worker dies, raises,
    or stalls past ``stall_s`` seconds (default :data:`STALL_LIMIT_S`), that batch and the rest
    are ``fallback(batch)`` in this process instead (logged once); with ``workers`` 0, every
    batch is. Closing the iterator early cancels what was not started and waits for what was.
    """
    it = iter(batches)
    if workers <= 0:
        yield from map(fallback, it)
        return
    ahead = max(1, ahead or 2 * workers)
    stall_s = STALL_LIMIT_S if stall_s is None else stall_s
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork"),
                               initializer=_init_worker)
    pending: deque[tuple[_B, Future[_R], int]] = deque()
    in_flight = 0  # the weight of the pending batches

    def submit() -> None:
        nonlocal in_flight
        while len(pending) < ahead or (len(pending) < most_ahead and in_flight < ahead_bytes):
            batch = next(it, _END)
            if batch is _END:
                return
            weight = weigh(batch) if weigh is not None else 0
            pending.append((batch, pool.submit(_watched, work, stall_s, batch), weight))  # type: ignore[arg-type]
            in_flight += weight

    failed: list[_B] = []
    try:
        submit()
        while pending:
            batch, future, weight = pending.popleft()
            in_flight -= weight
            try:
                result = future.result(timeout=2 * stall_s)
            except Exception as exc:  # noqa: BLE001 - dead, stalled or failing worker: fall back
                log.warning("cachedb import: a worker process failed (%s: %s); checking the rest in this process",
                            type(exc).__name__, exc)
                failed = [batch, *(b for b, _, _ in pending)]
                pending.clear()
                break
            submit()
            yield result
    finally:
        # A failed pool is not waited for: a stalled worker ends at its alarm.
        pool.shutdown(wait=not failed, cancel_futures=True)
    for batch in failed:
        yield fallback(batch)
    yield from map(fallback, it)
