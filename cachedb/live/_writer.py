"""Write-behind for the live store's FX graph and AOTAutograd puts.

``FxGraphCache._write_to_local_cache`` (torch/_inductor/codecache.py) runs on the compiling
thread, and the put it stands for costs cachedb a SHA-256 of the pickle, its opcode scan
(``guards_expr``), the zstd frame and an SQLite ``INSERT`` with its commit: 0.4 ms for a 100 KB
entry against 0.2 ms for torch's ``write_atomic``. :class:`WriteBehind` takes that work off
the compiling thread: the put queues the entry and returns; one daemon thread per process
writes the queue in order, each entry in its own transaction, as the synchronous put did.

What it keeps:

- **Read-your-writes in the process**: a lookup of a key with queued entries waits until they
  are written, then reads the database (:meth:`WriteBehind.wait_for`); other keys never wait.
- **No partial row**: each entry is one transaction; a crash (``kill -9``, power loss) loses at
  most the entries still queued (acknowledged to torch, not yet written), never part of one.
  Inductor treats a lost entry as a miss and compiles again.
- **Bounded memory**: at most ``max_pending_bytes`` (:data:`DEFAULT_MAX_PENDING_BYTES`) of
  queued payloads; a put that would pass it waits for the writer (one entry is always taken).
- **Exit**: :meth:`WriteBehind.flush` runs before the live store closes (``cachedb``'s
  ``atexit`` hook, ``uninstall``, ``LiveStore.close``), so a process that exits normally loses
  nothing.
- **The first put of a process** is written before it returns (``LiveStore.guarded_put``):
  it records the process's fingerprint, which imports torch modules; the thread's jobs after
  it import nothing.
- **Processes**: in a :mod:`multiprocessing` child (a compile worker, terminated by its pool
  without exit handlers) puts are written before they return; a ``fork`` waits for the write
  the thread is running (its locks would be copied held into the child), and the child starts
  with an empty queue (the parent writes its own).

Other processes see an entry once the writer has committed it (milliseconds after the put
returned, a compile later at most); a process that must see it at once calls
``LiveStore.flush()``. ``CACHEDB_WRITE_BEHIND=0`` (or ``install(write_behind=False)``) writes
every put before it returns, as before.
"""

from __future__ import annotations

import atexit
import collections
import logging
import multiprocessing
import os
import threading
import time
import weakref
from collections.abc import Callable, Hashable

from ..store.fork import FORK_WAIT_S, fork_waits_for

log = logging.getLogger("cachedb.live")

#: ``0`` turns write-behind off: every FX graph / AOTAutograd put is written before it returns.
ENV_WRITE_BEHIND = "CACHEDB_WRITE_BEHIND"
#: Bytes of queued payloads a process may hold before a put waits for the writer (64 MiB).
DEFAULT_MAX_PENDING_BYTES = 64 << 20
#: Seconds the writer thread waits for work before it ends (the next put starts another), so
#: an idle process (one that forks DataLoader workers, say) holds no extra thread.
IDLE_EXIT_S = 2.0
#: Seconds the exit flush waits for the queue before it gives up on the rest (warned about).
DEFAULT_FLUSH_TIMEOUT_S = 60.0


def enabled_by_environment() -> bool:
    """``$CACHEDB_WRITE_BEHIND`` is unset or anything but ``0`` / ``false`` / ``no`` / ``off``."""
    from .. import settings

    return bool(settings.value_or_default(ENV_WRITE_BEHIND))


def _in_multiprocessing_child() -> bool:
    """True in a :mod:`multiprocessing` child, which its pool may terminate without exit
    handlers (Inductor's compile workers): a queue there could lose what it holds."""
    return multiprocessing.parent_process() is not None


class WriteBehind:
    """A queue of writes and the daemon thread that runs them, in order, one at a time.

    ``submit(key, nbytes, job)`` queues ``job`` (a callable that writes one entry and never
    raises: the live store's writes catch their own failures) under ``key`` (e.g.
    ``("fxgraph", cache_key)``), counting ``nbytes`` (bytes) against ``max_pending_bytes``.
    ``wait_for(key)`` returns once no job of ``key`` is queued or running; ``flush()`` once no
    job is. ``counts`` (a :class:`collections.Counter`): ``queued``, ``written``,
    ``waited`` (puts that waited for room), ``read_waits`` (lookups that waited for a key).
    """

    def __init__(
        self,
        *,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        flush_timeout_s: float = DEFAULT_FLUSH_TIMEOUT_S,
    ) -> None:
        self.max_pending_bytes = max_pending_bytes
        self.flush_timeout_s = flush_timeout_s
        self.counts: collections.Counter[str] = collections.Counter()
        self.closed = False
        self._reset()
        ref = weakref.ref(self)

        def _at_exit() -> None:  # a store used without install(): its queue is written too
            writer = ref()
            if writer is not None and not writer.closed:
                writer.close()

        atexit.register(_at_exit)
        # A fork in the middle of a job would copy the locks the writer thread holds (a module's
        # import lock while its first write imports SQLAlchemy's dialect, SQLite's mutexes) into
        # a child where no thread will release them: a fork waits for the running job to end (at
        # most FORK_WAIT_S), and the child starts with a new queue.
        fork_waits_for(self, lambda writer: writer._job_lock, WriteBehind._reset, timeout_s=FORK_WAIT_S)

    def _reset(self) -> None:
        """A fresh queue, lock and no thread (at start, and in a forked child: the parent's
        queued jobs are the parent's to write; its lock may have been held at the fork)."""
        self._cond = threading.Condition(threading.Lock())
        self._job_lock = threading.Lock()  # held while a job runs (a fork waits for it)
        self._jobs: collections.deque[tuple[Hashable, int, Callable[[], object]]] = collections.deque()
        #: queued or running jobs per key (read without the lock by :meth:`has_pending`)
        self._pending: dict[Hashable, int] = {}
        self._bytes = 0
        self._running = False
        self._current: Hashable = None  # the key of the running job
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    # -- the caller's side --------------------------------------------------------------------

    def submit(self, key: Hashable, nbytes: int, job: Callable[[], object]) -> bool:
        """Queue ``job`` under ``key``; False when it was not queued (closed, or in a
        multiprocessing child): the caller then runs it itself. Waits while queued payloads
        would pass ``max_pending_bytes`` (never for an empty queue)."""
        if self.closed or _in_multiprocessing_child():
            return False
        if os.getpid() != self._pid:  # forked without the at-fork hook (not on this platform)
            self._reset()
        with self._cond:
            if self._bytes and self._bytes + nbytes > self.max_pending_bytes:
                self.counts["waited"] += 1
                while self._bytes and self._bytes + nbytes > self.max_pending_bytes and not self.closed:
                    self._cond.wait()
                if self.closed:
                    return False
            self._jobs.append((key, nbytes, job))
            self._pending[key] = self._pending.get(key, 0) + 1
            self._bytes += nbytes
            self.counts["queued"] += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="cachedb-write-behind", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return True

    def has_pending(self, key: Hashable) -> bool:
        """Whether a job of ``key`` is queued or running (no lock: a dict lookup)."""
        return key in self._pending

    def wait_for(self, key: Hashable, timeout_s: float) -> bool:
        """Wait until no job of ``key`` is queued or running; False if ``timeout_s`` seconds
        passed first."""
        if os.getpid() != self._pid:
            return True
        deadline = time.monotonic() + timeout_s
        with self._cond:
            if key in self._pending:
                self.counts["read_waits"] += 1
            while key in self._pending:
                left = deadline - time.monotonic()
                if left <= 0 or not self._alive():
                    return key not in self._pending
                self._cond.wait(left)
        return True

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every queued job has run; False if ``timeout_s`` (default
        ``flush_timeout_s``) seconds passed first, or the writer thread is gone."""
        if os.getpid() != self._pid:
            return True
        deadline = time.monotonic() + (self.flush_timeout_s if timeout_s is None else timeout_s)
        with self._cond:
            while self._jobs or self._running:
                left = deadline - time.monotonic()
                if left <= 0 or not self._alive():
                    return not (self._jobs or self._running)
                self._cond.wait(left)
        return True

    def pending(self) -> int:
        """Jobs queued or running."""
        with self._cond:
            return len(self._jobs) + self._running

    def close(self, timeout_s: float | None = None) -> bool:
        """Flush (at most ``timeout_s`` seconds, default ``flush_timeout_s``), then take no
        more jobs (later submits return False: their callers write them). False, with one
        warning, when jobs were left unwritten."""
        done = self.flush(timeout_s)
        with self._cond:
            self.closed = True
            left = len(self._jobs)
            self._jobs.clear()
            running = self._current
            self._pending = {running: 1} if self._running else {}
            self._bytes = 0
            self._cond.notify_all()
        if not done and left:
            log.warning("cachedb: %d FX graph/AOTAutograd write(s) were still queued after %.0f s and "
                        "are not stored (Inductor compiles them again)", left,
                        self.flush_timeout_s if timeout_s is None else timeout_s)
        return done

    # -- the writer thread --------------------------------------------------------------------

    def _alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._jobs:
                    if self.closed or os.getpid() != self._pid:
                        return
                    if not cond.wait(IDLE_EXIT_S) and not self._jobs:  # idle: the next put starts one
                        if self._thread is threading.current_thread():
                            self._thread = None
                        return
                key, nbytes, job = self._jobs.popleft()
                self._running, self._current = True, key
            try:
                with self._job_lock:
                    job()
            except BaseException as exc:  # jobs catch their own failures: this is a bug
                log.warning("cachedb: a queued write failed: %s: %s", type(exc).__name__, exc)
            finally:
                with cond:
                    self._running = False
                    count = self._pending.get(key, 0) - 1
                    if count > 0:
                        self._pending[key] = count
                    else:
                        self._pending.pop(key, None)
                    self._bytes = max(0, self._bytes - nbytes)
                    self.counts["written"] += 1
                    cond.notify_all()
