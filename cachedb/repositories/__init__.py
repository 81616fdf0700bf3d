"""Repositories: one per table family. Each takes a :class:`~sqlalchemy.orm.Session`, reads
and writes through it, and never commits: the transaction belongs to the caller
(:meth:`cachedb.CacheDB.transaction`)."""

from .artifacts import KernelArtifactRepository, KernelFile
from .best_configs import BestConfigRepository
from .cutlass import CutlassOpListRepository
from .fingerprints import FingerprintRepository
from .guarded import GuardedEntryRepository, StoredVariant
from .local_values import LocalCacheValueRepository
from .timings import AutotuneTimingRepository

__all__ = [
    "AutotuneTimingRepository",
    "BestConfigRepository",
    "CutlassOpListRepository",
    "FingerprintRepository",
    "GuardedEntryRepository",
    "KernelArtifactRepository",
    "KernelFile",
    "LocalCacheValueRepository",
    "StoredVariant",
]
