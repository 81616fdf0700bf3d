"""The exception hierarchy: every error cachedb raises derives from :class:`CacheDBError`."""

from __future__ import annotations

from pathlib import Path


class CacheDBError(Exception):
    """Root of every error raised by cachedb."""


def input_error_reason(exc: BaseException) -> str | None:
    """The reason to report when storing one input item failed, or ``None`` when ``exc`` is
    not about the item's content (and must propagate).

    Bad input can fail below cachedb's own checks: JSON nested past the recursion limit,
    integers outside int64, strings that are not valid UTF-8, values PostgreSQL refuses
    (text longer than its column, NUL bytes). Importers catch those per item, report the item
    and go on; nothing else is stored differently.
    """
    from sqlalchemy.exc import DataError, IntegrityError, ProgrammingError

    if isinstance(exc, BadInputError):
        return exc.reason
    if isinstance(exc, CacheDBError):
        return str(exc)
    if isinstance(exc, (ValueError, TypeError, OverflowError, RecursionError, UnicodeError, AttributeError)):
        return f"{type(exc).__name__}: {exc}"[:500]
    if isinstance(exc, (DataError, IntegrityError, ProgrammingError)):
        return f"rejected by the database: {type(exc.orig).__name__}: {exc.orig}"[:500]
    return None


class DatabaseOpenError(CacheDBError):
    """The database could not be opened; nothing in it was changed."""


class NotADatabaseError(DatabaseOpenError):
    """The path exists but is not an SQLite database; the file is left untouched."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: not an SQLite database ({reason}); the file was left untouched")


class SchemaTooNewError(DatabaseOpenError):
    """The database carries a schema revision this version of cachedb does not know."""

    def __init__(self, where: str, db_revision: str, code_head: str) -> None:
        self.db_revision = db_revision
        self.code_head = code_head
        super().__init__(
            f"{where}: database schema revision {db_revision!r} is newer than this cachedb "
            f"(latest known revision {code_head!r}); upgrade cachedb to open it"
        )


class SchemaTooOldError(DatabaseOpenError):
    """A shared (remote) database is at an older schema revision than this code; it is not
    upgraded behind its other users' backs (``cachedb --db URL upgrade`` does it)."""

    def __init__(self, where: str, db_revision: str, code_head: str) -> None:
        self.db_revision = db_revision
        self.code_head = code_head
        super().__init__(
            f"{where}: database schema revision {db_revision!r} is older than this cachedb's "
            f"{code_head!r}; run `cachedb --db URL upgrade` once for every host sharing it"
        )


class MigrationError(CacheDBError):
    """A schema migration failed; the transaction was rolled back."""


class BadInputError(CacheDBError):
    """An input file could not be read: names the file (or key) and the reason."""

    def __init__(self, where: str | Path, reason: str) -> None:
        self.where = str(where)
        self.reason = reason
        super().__init__(f"{where}: {reason}")


class PickleScanError(BadInputError):
    """A pickle payload is truncated or malformed (found without executing it)."""


class CutlassOpListError(BadInputError):
    """A CUTLASS op list is not the JSON list of serialized ops torch writes."""


class NotAnInductorCacheError(CacheDBError):
    """An import directory holds none of the files an Inductor cache directory holds."""


class ExportError(CacheDBError):
    """The export target cannot be written; nothing was left half-written."""


class QueryError(CacheDBError):
    """A read-only query failed (bad SQL, or an attempt to write)."""


class KeyConfigError(CacheDBError):
    """A signing or trusted key (``CACHEDB_SIGNING_KEY``, ``CACHEDB_TRUSTED_KEYS``) is not an
    Ed25519 key, or its file cannot be read; the message names the file or entry."""


class TorchUnavailableError(CacheDBError):
    """The operation needs torch, which is not importable in this environment."""


class CorruptPayloadError(CacheDBError):
    """A stored payload does not decompress or does not match its checksum; it is never returned."""

    def __init__(self, where: str, reason: str) -> None:
        self.where = where
        self.reason = reason
        super().__init__(f"{where}: corrupt payload ({reason})")


class CorruptBlobError(CorruptPayloadError):
    """A kernel blob (:class:`~cachedb.store.models.KernelBlob`) fails its SHA-256 or does not
    decompress; ``sha256`` names it. Its files are never written out."""

    def __init__(self, where: str, reason: str, sha256: str) -> None:
        self.sha256 = sha256
        super().__init__(where, reason)


class CopyError(CacheDBError):
    """A database-to-database copy or merge was refused or failed (``cachedb copy``,
    ``cachedb merge``, :mod:`cachedb.fleet.copy`); the message names the database and the reason."""
