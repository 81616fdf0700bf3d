"""Repositories: one per table family. Each takes an ORM :class:`~sqlalchemy.orm.Session` or a
Core :class:`~sqlalchemy.Connection`, runs Core statements over :mod:`cachedb.store.tables` through
it, and never commits: the transaction belongs to the caller (:meth:`cachedb.CacheDB.transaction`,
:meth:`~cachedb.CacheDB.write`, :meth:`~cachedb.CacheDB.read`, :meth:`~cachedb.CacheDB.lookup`)."""

from .artifacts import KernelArtifactRepository, KernelFile
from .best_configs import BestConfigRepository
from .choices import ChoiceRepository
from .compile_claims import CompileClaimRepository, CompileWaitRepository
from .cutlass import CutlassOpListRepository
from .dynamo import DynamoRepository
from .factors import KeyFactorRepository, MissLogRepository
from .fingerprints import FingerprintRepository
from .guarded import GuardedEntryRepository, StoredVariant
from .local_values import LocalCacheValueRepository
from .timings import AutotuneTimingRepository

__all__ = [
    "AutotuneTimingRepository",
    "BestConfigRepository",
    "ChoiceRepository",
    "CompileClaimRepository",
    "CompileWaitRepository",
    "CutlassOpListRepository",
    "DynamoRepository",
    "FingerprintRepository",
    "GuardedEntryRepository",
    "KeyFactorRepository",
    "KernelArtifactRepository",
    "KernelFile",
    "LocalCacheValueRepository",
    "MissLogRepository",
    "StoredVariant",
]
