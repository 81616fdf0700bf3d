"""Atomic file writes: a temporary in the same directory, then ``os.replace``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Write ``data`` (bytes) to ``path`` through a dot-prefixed temporary beside it and
    ``os.replace``, so a reader sees the old file or the whole new one, never a part.
    ``mode``: permission bits of the new file (default: ``mkstemp``'s 0600). Creates the parent
    directory. Raises ``OSError``; the temporary is removed on any failure."""
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
