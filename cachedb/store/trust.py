"""Whose database is it? Pickled entries are only loaded from databases the user controls."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..settings import value_or_default

#: ``CACHEDB_TRUST=1`` trusts every database (for shared read-only team caches you vetted).
ENV_TRUST = "CACHEDB_TRUST"


def untrusted_reason(path: Path) -> str | None:
    """Why unpickling entries from the SQLite file ``path`` is unsafe, or ``None``.

    Unsafe: the file is owned by another user or writable by group/others, or its directory is
    writable by others without the sticky bit, or owned by another user and group-writable
    (anyone who can write there can swap the file). ``CACHEDB_TRUST=1`` overrides.
    """
    if value_or_default(ENV_TRUST) or not hasattr(os, "getuid"):
        return None
    uid = os.getuid()
    try:
        st = path.stat()
        parent = path.parent.stat()
    except OSError:
        return None  # not created yet: we create it, owner-only
    if st.st_uid != uid:
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & 0o022:
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    if parent.st_mode & 0o002 and not parent.st_mode & stat.S_ISVTX:
        return f"{path.parent} is writable by others"
    if parent.st_uid != uid and parent.st_mode & 0o020:
        return f"{path.parent} is owned by uid {parent.st_uid} and group-writable"
    return None
