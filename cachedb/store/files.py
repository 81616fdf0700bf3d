"""Atomic file writes: a temporary in the same directory, then ``os.replace``."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path


def refuse_special(path: Path) -> None:
    """Raise ``OSError`` when ``path`` exists and is neither a regular file nor a symbolic link
    (``os.replace`` would put a regular file in place of a device node or a FIFO)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except NotADirectoryError:
        return  # a parent is a file: the write fails with its own error
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise OSError(errno.EINVAL, "not a regular file (a device, FIFO or socket is never replaced)", str(path))


def write_atomic(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Write ``data`` (bytes) to ``path`` through a dot-prefixed temporary beside it and
    ``os.replace``, so a reader sees the old file or the whole new one, never a part.
    ``mode``: permission bits of the new file (default: ``mkstemp``'s 0600). Creates the parent
    directory. Raises ``OSError``; the temporary is removed on any failure. An existing
    ``path`` that is not a regular file (a device such as ``/dev/null``, a FIFO, a directory)
    is refused, never replaced."""
    refuse_special(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
