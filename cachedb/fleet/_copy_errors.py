"""The errors of a copy or merge that say more than :class:`cachedb._errors.CopyError`
(re-exported by :mod:`cachedb.fleet.copy`)."""

from __future__ import annotations

from .._errors import CopyError


class DamagedSourceError(CopyError):
    """An SQLite source fails SQLite's own checks (damaged pages, not a database)."""


class UnsignedInputError(CopyError):
    """``require_signed``: a source holds unsigned or foreign-signed entries."""


class TargetNotEmptyError(CopyError):
    """``copy`` was pointed at a DST that holds rows (and no unfinished copy of this SRC)."""
