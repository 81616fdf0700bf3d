"""SQLite write-ahead-log checkpoints off the writer's thread.

SQLite checkpoints its WAL inside the ``COMMIT`` that takes the log past ``wal_autocheckpoint``
pages (1,000 by default): that commit copies the log's pages into the database file and fsyncs
both before it returns. A live put of a 20 MB FX graph entry (5.5 MB stored) crosses the
threshold on its own, so the compile thread waited for the copy and the fsyncs on every such
put: measured here, 49 ms per 5.5 MB commit with the default against 10 ms without the
checkpoint.

The connection each process keeps for the hot paths (:class:`cachedb.store.engine.KeptConnection`)
therefore runs with ``wal_autocheckpoint = 0`` and tells a :class:`BackgroundCheckpointer`
how many bytes each write bound; once its writes since the last checkpoint add up to
:data:`CHECKPOINT_WAL_BYTES` (each counted as its bytes plus :data:`WRITE_OVERHEAD_PAGES`
of the database's pages for the table and index pages it touches), the checkpointer's thread
runs ``PRAGMA wal_checkpoint(PASSIVE)`` on a connection of its own (it waits for no reader or
writer, like SQLite's own automatic checkpoint). The WAL file's size cannot tell: SQLite
reuses the file from its start after a checkpoint without shrinking it. Nothing committed
depends on it: a checkpoint cut short by a crash leaves the WAL as the authority, as SQLite's
own would. Every other connection keeps SQLite's automatic checkpoint.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from pathlib import Path

from .fork import fork_waits_for

log = logging.getLogger("cachedb")

#: Bytes written since the last checkpoint from which a write wakes the checkpointer: SQLite's
#: own threshold at its default page size (``wal_autocheckpoint``: 1,000 pages of 4 KiB). At
#: larger pages too: the WAL file keeps its largest size, and the copy runs off the hot path.
CHECKPOINT_WAL_BYTES = 1000 * 4096
#: What a write is counted for beyond the bytes it binds: four pages (a table leaf, index
#: leaves; every changed page goes to the WAL whole), so that a run of small writes is
#: checkpointed about as often as its WAL bytes call for.
WRITE_OVERHEAD_PAGES = 4
#: :data:`WRITE_OVERHEAD_PAGES` in bytes at SQLite's default page size (4 KiB);
#: :meth:`BackgroundCheckpointer.set_page_size` scales it to a database's.
WRITE_OVERHEAD_BYTES = WRITE_OVERHEAD_PAGES * 4096


class BackgroundCheckpointer:
    """Checkpoints the WAL of the SQLite database at ``path`` on a daemon thread.

    ``busy_timeout_s``: the thread's connection's busy timeout (seconds). Fork-safe: a fork
    waits (at most :data:`cachedb.store.fork.FORK_WAIT_S`) for a checkpoint under way, so the child
    does not inherit SQLite's mutexes held by this thread; the child starts a thread of its own
    on its first :meth:`after_write` and never uses the parent's connection. ``checkpoints``
    counts the checkpoints this process's thread ran.
    """

    def __init__(self, path: Path, busy_timeout_s: float, *, wal_bytes: int = CHECKPOINT_WAL_BYTES) -> None:
        self.path = path
        self._pending = 0  # bytes counted since the last wake-up
        self._busy_timeout_s = busy_timeout_s
        self._wal_bytes = wal_bytes
        self._overhead = WRITE_OVERHEAD_BYTES
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self.checkpoints = 0
        self.closed = False
        #: held while a checkpoint (its connection's open and close included) runs
        self._busy = threading.Lock()
        fork_waits_for(self, lambda checkpointer: checkpointer._busy, BackgroundCheckpointer._forked)

    def _forked(self) -> None:
        """In a forked child: a lock of its own (the copy was held for the fork); the parent's
        thread and its connection are not here (:meth:`_running` starts another)."""
        self._busy = threading.Lock()
        self._lock = threading.Lock()

    def set_page_size(self, page_size: int) -> None:
        """Count a write's overhead as :data:`WRITE_OVERHEAD_PAGES` pages of ``page_size``
        bytes (the database's ``PRAGMA page_size``)."""
        if page_size > 0:
            self._overhead = WRITE_OVERHEAD_PAGES * page_size

    def after_write(self, nbytes: int) -> None:
        """After a commit of ``nbytes`` bound bytes on a connection without automatic
        checkpoints: wake the thread once the writes since the last wake-up add up to
        :data:`CHECKPOINT_WAL_BYTES`. Never raises; where no thread can be started, checkpoints
        on the caller's thread instead."""
        self._pending += nbytes + self._overhead
        if self.closed or self._pending < self._wal_bytes:
            return
        self._pending = 0
        if self._running():
            self._wake.set()
            return
        try:
            self._checkpoint_once()
        except sqlite3.Error as exc:
            log.debug("cachedb: WAL checkpoint of %s failed: %s", self.path, exc)

    def _running(self) -> bool:
        """The thread of this process, started if need be (False: it could not be started)."""
        thread = self._thread
        if thread is not None and self._pid == os.getpid() and thread.is_alive():
            return True
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's thread is not here
                self._pid = os.getpid()
                self._wake = threading.Event()
                self.checkpoints = 0
            if self._thread is None or not self._thread.is_alive():
                thread = threading.Thread(target=self._run, name="cachedb-wal-checkpoint", daemon=True)
                try:
                    thread.start()
                except RuntimeError as exc:  # no new threads (interpreter shutdown, limits)
                    log.debug("cachedb: no WAL checkpoint thread: %s", exc)
                    return False
                self._thread = thread
        return True

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=self._busy_timeout_s, isolation_level=None, check_same_thread=False)

    def _checkpoint_once(self) -> None:
        with self._busy:
            conn = self._connect()
            try:
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            finally:
                conn.close()

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        wake = self._wake
        while True:
            wake.wait()
            wake.clear()
            if self.closed:
                break
            with self._busy:
                try:
                    if conn is None:
                        conn = self._connect()
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self.checkpoints += 1
                except sqlite3.Error as exc:  # the next write wakes it again; nothing depends on it
                    log.debug("cachedb: WAL checkpoint of %s failed: %s", self.path, exc)
                    if conn is not None:
                        conn.close()
                    conn = None
        if conn is not None:
            with self._busy:
                conn.close()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop this process's thread (a checkpoint under way finishes first, up to
        ``timeout_s`` seconds)."""
        self.closed = True
        thread = self._thread
        if thread is not None and self._pid == os.getpid() and thread.is_alive():
            self._wake.set()
            thread.join(timeout_s)
