"""cachedb: one SQLite (or PostgreSQL) database for PyTorch Inductor's caches.

>>> from cachedb import CacheDB
>>> db = CacheDB("inductor.db")            # created and migrated on first open
>>> with db.read() as repos:
...     repos.guarded.count("fxgraph")

>>> import cachedb
>>> cachedb.install("inductor.db")         # torch.compile now reads and writes the database
"""

from ._errors import (
    BadInputError,
    CacheDBError,
    CorruptBlobError,
    CorruptPayloadError,
    CutlassOpListError,
    DatabaseOpenError,
    ExportError,
    KeyConfigError,
    MigrationError,
    NotADatabaseError,
    NotAnInductorCacheError,
    PickleScanError,
    QueryError,
    SchemaTooNewError,
    SchemaTooOldError,
    TorchUnavailableError,
)
from ._version import __version__
from .db import CacheDB, Repos
from .fingerprint import Fingerprint
from .live import install, installed, is_installed, uninstall


__all__ = [
    "BadInputError",
    "CacheDB",
    "CacheDBError",
    "CorruptBlobError",
    "CorruptPayloadError",
    "CutlassOpListError",
    "DatabaseOpenError",
    "ExportError",
    "KeyConfigError",
    "Fingerprint",
    "MigrationError",
    "NotADatabaseError",
    "NotAnInductorCacheError",
    "PickleScanError",
    "QueryError",
    "Repos",
    "SchemaTooNewError",
    "SchemaTooOldError",
    "TorchUnavailableError",
    "__version__",
    "install",
    "installed",
    "is_installed",
    "uninstall",
]
