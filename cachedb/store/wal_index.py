"""Whether another connection may have committed to an SQLite WAL database, from its
WAL-index header, without running a statement.

Every commit to a database in WAL mode rewrites the header at the start of the wal-index, the
``-shm`` file next to the database (https://sqlite.org/walformat.html, "The WAL-Index
Header": two 48-byte copies; SQLite's wal.c, ``walIndexWriteHdr``). A connection's ``PRAGMA
data_version`` moves when, at the start of a read, that header differs from the one the
connection saw last (wal.c, ``walIndexReadHdr``). So while the 96 header bytes are what they
were before a ``PRAGMA data_version``, the PRAGMA would answer what it answered then: one
``pread`` of the header (~0.6 µs here) stands in for the PRAGMA (~3.3 µs, a read
transaction). When the bytes moved (a commit of this connection too, or a checkpoint that
restarted the log) the caller runs the PRAGMA again.

The bytes are read through the descriptor SQLite itself holds open on the ``-shm`` file of
the database the connection opened (the path from ``PRAGMA database_list``), found once per
connection in ``/proc/self/fd`` (:func:`find_for`), and never closed here: closing any descriptor
of a file drops every POSIX lock this process holds on it, SQLite's own included, so
cachedb never opens one of its own. ``pread`` rather than ``mmap``: a file that shrinks
gives a short read, not a ``SIGBUS``. A header that does not look like one (wrong version,
not initialized, the two copies differ: a write in progress) is treated as moved. The
caller's connection being open keeps SQLite's ``-shm`` descriptor open and the file in place
(SQLite removes it only when the last connection to the database closes);
:meth:`cachedb.store.engine.KeptConnection.version` says what a read racing a reopen sees.

Linux only (``/proc/self/fd``); elsewhere, or off WAL, :func:`find_for` returns ``None`` and
callers run the PRAGMA each time.
"""

from __future__ import annotations

import os
import sqlite3
import struct
import sys

#: Bytes of the wal-index header: two copies of the 48-byte ``WalIndexHdr``.
HEADER_BYTES = 96
#: ``WalIndexHdr.iVersion`` of every SQLite since 3.7.0 (``WALINDEX_MAX_VERSION``).
WALINDEX_VERSION = 3007000
_VERSION_AND_INIT = struct.Struct("=I8xB")  # iVersion (u32), unused, iChange, isInit (u8)


def header_ok(header: bytes) -> bool:
    """True when ``header`` (the first :data:`HEADER_BYTES` bytes of a ``-shm`` file) is an
    initialized wal-index header whose two copies agree."""
    if len(header) != HEADER_BYTES or header[:48] != header[48:]:
        return False
    version, is_init = _VERSION_AND_INIT.unpack_from(header)
    return version == WALINDEX_VERSION and is_init == 1


def read(descriptor: int) -> bytes | None:
    """The wal-index header read through ``descriptor``, or ``None`` when it cannot be read or
    is not a whole, initialized header (then the caller asks SQLite)."""
    try:
        header = os.pread(descriptor, HEADER_BYTES, 0)
    except OSError:
        return None
    return header if header_ok(header) else None


def find(database: str) -> int | None:
    """The descriptor this process's SQLite holds open on ``database + "-shm"``, or ``None``
    (not Linux, not in WAL mode, no connection has read the database yet, or the header is
    not initialized). Call it with a connection to ``database`` open that has read it.

    Cost: one ``stat`` per open descriptor of the process (once per connection).
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        shm = os.stat(database + "-shm")
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for name in names:
        try:
            st = os.stat(f"/proc/self/fd/{name}")
        except OSError:  # closed since the listing (the listing's own descriptor among them)
            continue
        if st.st_ino == shm.st_ino and st.st_dev == shm.st_dev:
            descriptor = int(name)
            if read(descriptor) is not None:
                return descriptor
    return None


def find_for(connection: sqlite3.Connection) -> int | None:
    """:func:`find` for the main database of ``connection``, a ``sqlite3`` connection: ``None``
    unless it is in WAL mode. The path is the one SQLite opened (``PRAGMA database_list``:
    absolute, symbolic links resolved), so a relative URL or a later ``chdir`` cannot point
    the check at another database's ``-shm`` file. Runs a read first, which opens the
    wal-index.

    Raises:
        sqlite3.Error: the driver failed.
    """
    mode = connection.execute("PRAGMA journal_mode").fetchone()
    if not mode or str(mode[0]).lower() != "wal":
        return None
    connection.execute("PRAGMA data_version").fetchone()  # a read: the -shm file is open after it
    main = next((row[2] for row in connection.execute("PRAGMA database_list") if row[1] == "main"), "")
    return find(main) if main else None
