"""Which file system a path is on, to keep SQLite's write-ahead log off network file systems.

SQLite's WAL mode shares its index through a memory-mapped ``-shm`` file, which needs every
connection on one host with working shared memory: on NFS, SMB/CIFS or FUSE file systems it is
unsafe (sqlite.org/wal.html, "WAL does not work over a network filesystem"), and a database
there can be corrupted by two hosts, or be read stale by one. :func:`network_filesystem` tells
such a file system apart by ``statfs(2)``'s ``f_type`` (Linux), and names its mount from
``/proc/self/mountinfo``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from pathlib import Path

#: ``f_type`` of the network and user-space file systems (linux/magic.h and the file systems'
#: own headers), by name.
NETWORK_MAGIC: dict[int, str] = {
    0x6969: "nfs",
    0x517B: "smbfs",
    0xFF534D42: "cifs",
    0xFE534D42: "smb2",
    0x65735546: "fuse",
    0x00C36400: "ceph",
    0x73757245: "coda",
    0x5346414F: "afs",
    0x01021997: "9p",
    0x0BD00BD0: "lustre",
    0x47504653: "gpfs",
    0x01161970: "gfs2",
    0x7461636F: "ocfs2",
}

#: ``mountinfo`` file system types of the same kinds (a ``fuse.<name>`` type is FUSE).
NETWORK_TYPES = frozenset({
    "nfs", "nfs4", "smbfs", "cifs", "smb3", "fuse", "fuseblk", "ceph", "coda", "afs", "9p",
    "lustre", "gpfs", "gfs2", "ocfs2", "glusterfs",
})

_libc: ctypes.CDLL | None = None


def _statfs_type(path: str) -> int | None:
    """``statfs(path).f_type`` (Linux), ``None`` where it cannot be had."""
    global _libc
    if not sys.platform.startswith("linux"):
        return None
    try:
        if _libc is None:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        buf = ctypes.create_string_buffer(512)  # struct statfs is 120 bytes on x86-64 and arm64
        if _libc.statfs(os.fsencode(path), buf) != 0:
            return None
        return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF  # f_type, the first field
    except (OSError, AttributeError, ValueError):
        return None


def _mount_of(path: str) -> tuple[str, str] | None:
    """``(mount point, file system type)`` of the mount holding ``path``, from
    ``/proc/self/mountinfo``; ``None`` where it cannot be read."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    best: tuple[str, str] | None = None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5:
            continue
        point = fields[4].replace("\\040", " ")
        fstype = right.split(" ", 1)[0]
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > len(best[0])):
            best = (point, fstype)
    return best


def network_filesystem(path: str | os.PathLike[str]) -> str | None:
    """A description of the network or user-space file system ``path`` (a file or directory;
    the nearest existing parent is asked) is on, e.g. ``"fuse (fuse.sshfs at /mnt/shared)"``;
    ``None`` for a local file system, or where it cannot be told (not Linux)."""
    current = Path(path).expanduser().absolute()
    while not current.exists() and current != current.parent:
        current = current.parent
    real = os.path.realpath(current)
    magic = _statfs_type(real)
    mount = _mount_of(real)
    name = NETWORK_MAGIC.get(magic) if magic is not None else None
    if name is None and mount is not None:
        fstype = mount[1]
        if fstype in NETWORK_TYPES or fstype.startswith("fuse."):
            name = fstype
    if name is None:
        return None
    return f"{name} ({mount[1]} at {mount[0]})" if mount is not None else name


__all__ = ["NETWORK_MAGIC", "NETWORK_TYPES", "network_filesystem"]
