"""Remote lookups and writes coalesced between the processes that share one local file.

The ranks of a machine (and Inductor's compile workers) share one local SQLite file. Without
coordination, each of 8 ranks missing the same FX graph entry asks the shared database for it
at once, and each of them sends the same entry after compiling it. Here the first asks (or
sends) and the others wait for it (bounded by the remote timeout), then read what it brought
into the local file: one remote query per entry per machine.

The coordination lives in a sidecar file beside the local database, ``<database>.remote``
(owner-only, sparse: :data:`SLOTS` slots of :data:`SLOT_BYTES` bytes, 3 MiB of address space
and a few pages on disk). An entry hashes to one slot, which holds

- the entry's digest (16 bytes: a slot shared by two entries is read as empty by both),
- ``asked_at``: when a process last finished asking the remote for it (its rows, if any, were
  in the local file by then; seconds since the epoch, float64, this machine's clock),
- ``found``: whether that ask found the entry on the remote,
- ``sent``: the :func:`~cachedb.fleet.tier_sync.content_digest` of the entry's rows a process
  last claimed sending: a process whose local rows have that digest sends nothing.

The slot doubles as a lock: an open-file-description record lock (Linux ``F_OFD_SETLKW`` on
its bytes) held while a process asks, so the others wait on it in the kernel and wake when it
is released. Such a lock belongs to one open of the file, so threads of one process exclude
each other as processes do, and the kernel releases it when its holder's descriptor closes, a
process killed mid-lookup included: nobody waits past their timeout for a dead rank. A wait
runs on a helper thread so that it can give up at its deadline; a lock granted after that is
released at once.

Where the sidecar cannot be used (no ``F_OFD_SETLKW``: not Linux; an in-memory or server
database as the local one; a read-only directory), :func:`for_database` gives ``None`` and each
process asks alone.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

try:
    import fcntl

    _SETLK = fcntl.F_OFD_SETLK
    _SETLKW = fcntl.F_OFD_SETLKW
except (ImportError, AttributeError):  # pragma: no cover - not Linux
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("cachedb.live")

#: Slots in the sidecar file (a power of two).
SLOTS = 1 << 16
#: Bytes per slot: a 16-byte entry digest, ``asked_at`` (little-endian float64), ``found``
#: (one byte, then padding), the 16-byte ``sent`` content digest.
SLOT_BYTES = 48
_LAYOUT = struct.Struct("<16sd?7x16s")
#: ``struct flock`` of Linux (x86-64, AArch64): type, whence, start, length, pid (0 for OFD).
_FLOCK = struct.Struct("hhqqi4x")
#: Seconds for which another process's ask answers this one's: an ask that finished this
#: recently (or after this process began waiting) is not repeated. Ranks of one job reach the
#: same lookup within a few seconds of each other; an entry that appears on the remote later
#: than this after a machine found it missing is asked for again.
ASKED_FRESH_S = 10.0
#: Suffix of the sidecar file.
SUFFIX = ".remote"


def digest(parts: tuple[object, ...]) -> bytes:
    """A 16-byte BLAKE2b digest of an entry's kind and filter values."""
    return hashlib.blake2b("\x00".join(map(str, parts)).encode("utf-8", "surrogatepass"), digest_size=16).digest()


@dataclass
class Slot:
    """The record of one entry in the sidecar, read while its lock is held."""

    coalescer: Coalescer
    fd: int  #: the descriptor holding the slot's lock (-1: no lock could be taken)
    index: int
    key: bytes
    asked_at: float
    found: bool
    sent: bytes

    def mark_asked(self, found: bool) -> None:
        """Record that this process asked the remote now, and whether it had the entry."""
        self.asked_at = time.time()
        self.found = found
        self.coalescer._write(self)

    def mark_sent(self, content: bytes) -> None:
        """Record that this process sends the rows whose content digest is ``content``."""
        self.sent = content
        self.coalescer._write(self)


class Coalescer:
    """The sidecar of one local database file (see the module's docstring); fork-safe: it
    holds no descriptor between calls."""

    def __init__(self, path: Path, database: Path) -> None:
        self.path = path
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))  # fails here if it cannot
        #: The database file's identity, part of every slot's digest: a database deleted and
        #: made anew beside an old sidecar never reads what was recorded for the old one.
        st = os.stat(database)
        self._identity = (st.st_dev, st.st_ino)

    def _flock(self, fd: int, cmd: int, kind: int, index: int) -> None:
        fcntl.fcntl(fd, cmd, _FLOCK.pack(kind, os.SEEK_SET, index * SLOT_BYTES, SLOT_BYTES, 0))

    def _acquire(self, index: int, deadline: float) -> int | None:
        """A descriptor holding the slot's lock; ``None`` when the wait reached ``deadline``.
        The lock is released by closing the descriptor."""
        fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        try:
            self._flock(fd, _SETLK, fcntl.F_WRLCK, index)
            return fd
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EAGAIN):
                os.close(fd)
                raise
        done = threading.Condition()
        state: dict[str, object] = {}

        def wait() -> None:  # blocks in the kernel until the holder releases the slot
            try:
                self._flock(fd, _SETLKW, fcntl.F_WRLCK, index)
                ok = True
            except OSError:  # EDEADLK, EINTR: ask without the lock
                ok = False
            with done:
                state["ok"] = ok
                if state.get("abandoned") or not ok:
                    os.close(fd)  # too late for the caller: release at once
                done.notify()

        threading.Thread(target=wait, name="cachedb-remote-wait", daemon=True).start()
        with done:
            done.wait_for(lambda: "ok" in state, timeout=max(0.0, deadline - time.monotonic()))
            if "ok" not in state:
                state["abandoned"] = True
                return None
            return fd if state["ok"] else None

    def _write(self, slot: Slot) -> None:
        if slot.fd < 0:  # not locked: nothing recorded
            return
        os.pwrite(slot.fd, _LAYOUT.pack(slot.key, slot.asked_at, slot.found, slot.sent), slot.index * SLOT_BYTES)

    @contextmanager
    def hold(self, parts: tuple[object, ...], deadline: float) -> Iterator[Slot | None]:
        """The slot of the entry named by ``parts``, locked for the ``with`` block; ``None``
        when another process or thread held it until ``deadline`` (``time.monotonic()``
        seconds)."""
        key = digest((*self._identity, *parts))
        index = int.from_bytes(key[:4], "little") & (SLOTS - 1)
        try:
            fd = self._acquire(index, deadline)
        except OSError as exc:  # a file system without these locks (ENOLCK, EINVAL): ask alone
            log.debug("cachedb: no remote coalescing through %s: %s", self.path, exc)
            yield Slot(self, -1, index, key, 0.0, False, b"")
            return
        if fd is None:
            yield None
            return
        try:
            raw = os.pread(fd, SLOT_BYTES, index * SLOT_BYTES)
            stored, asked_at, found, sent = _LAYOUT.unpack(raw) if len(raw) == SLOT_BYTES else (b"", 0.0, False, b"")
            if stored != key:
                asked_at, found, sent = 0.0, False, b""
            yield Slot(self, fd, index, key, asked_at, found, sent)
        finally:
            os.close(fd)  # releases the lock


def for_database(path: Path | None) -> Coalescer | None:
    """The :class:`Coalescer` of the local database file ``path``; ``None`` where there is no
    file, no ``fcntl``, or the sidecar cannot be created (logged at debug level)."""
    if path is None or fcntl is None:
        return None
    try:
        return Coalescer(Path(str(path) + SUFFIX), Path(path))
    except OSError as exc:
        log.debug("cachedb: no remote coalescing beside %s: %s", path, exc)
        return None
