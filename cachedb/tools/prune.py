"""``cachedb prune``: the plan of an eviction, and the run that applies it.

:func:`plan` decides, without deleting anything, which FX graph/AOTAutograd entries and which
kernel key directories (with the blobs only they use) go: those not used since ``older_than``,
then the least recently used until what is stored fits ``max_bytes`` (entries and kernels
together, each giving up its share of the excess). With ``order="value"`` the FX graph and
AOTAutograd entries go worth least per stored byte first instead: an entry's value is

    compile_s × (hits + 1) × 2 ** (-age / half_life) / stored_bytes

(seconds of compile per byte: ``compile_s`` the compile time torch recorded, 0 where none;
``hits + 1`` its hits and its write; ``age`` the time since its last use; ``half_life`` 7 days
by default; :func:`cachedb.repositories.guarded.eviction_value`), the least recently used first
among equals. Kernels and Dynamo's caches keep no compile time: they go least recently used
first in either order. ``cachedb prune --dry-run`` prints the plan;
``cachedb prune`` shows it (and asks, when it is big) and :func:`apply` deletes exactly what
it names. One code path decides what goes, whether or not it is then deleted. Dynamo's caches
(PGO profiles, precompiled packages) are entries too, evicted by their last use the same way,
each kind giving up its share of the excess.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..repositories.artifacts import KernelEviction
from ..repositories.dynamo import KINDS as DYNAMO_KINDS
from ..repositories.dynamo import LABELS as DYNAMO_LABELS
from ..repositories.dynamo import DynamoEviction
from ..repositories.guarded import DEFAULT_HALF_LIFE, EVICTION_ORDERS, GuardedEviction

if TYPE_CHECKING:
    from ..db import Repos

#: Eviction orders: ``lru`` (least recently used first), ``value`` (worth least per byte first).
ORDERS = EVICTION_ORDERS

#: Columns of :meth:`PrunePlan.rows`.
COLUMNS = ("kind", "entries", "of_entries", "files", "stored_bytes")


@dataclass
class PrunePlan:
    """What a prune removes: :class:`~cachedb.repositories.guarded.GuardedEviction` and
    :class:`~cachedb.repositories.artifacts.KernelEviction`, and the stored bytes before it."""

    max_bytes: int | None
    older_than: dt.datetime | None
    guarded: GuardedEviction
    kernels: KernelEviction
    #: Dynamo's caches, one :class:`~cachedb.repositories.dynamo.DynamoEviction` per kind
    dynamo: list[DynamoEviction] = field(default_factory=list)

    @property
    def entries(self) -> int:
        return sum(self.guarded.entries.values()) + sum(d.entries for d in self.dynamo)

    @property
    def entry_bytes(self) -> int:
        return sum(self.guarded.stored_bytes.values()) + sum(d.stored_bytes for d in self.dynamo)

    @property
    def files(self) -> int:
        return sum(self.kernels.files.values())

    @property
    def kernel_bytes(self) -> int:
        return sum(self.kernels.stored_bytes.values()) + self.kernels.unreferenced

    @property
    def bytes(self) -> int:
        """Stored bytes removed (entries' payloads and kernel blobs)."""
        return self.entry_bytes + self.kernel_bytes

    @property
    def total_entries(self) -> int:
        return sum(self.guarded.total_entries.values()) + sum(d.total_entries for d in self.dynamo)

    @property
    def total_files(self) -> int:
        return sum(self.kernels.total_files.values())

    @property
    def total_bytes(self) -> int:
        """Stored bytes before the prune (entries' payloads and kernel blobs)."""
        return (sum(self.guarded.total_bytes.values()) + self.kernels.total_bytes
                + sum(d.total_bytes for d in self.dynamo))

    @property
    def empty(self) -> bool:
        return not (self.guarded.ids or self.kernels.groups or self.kernels.blob_ids
                    or any(d.ids for d in self.dynamo))

    def share(self) -> float:
        """The part of the stored bytes removed (0 to 1; 0 for an empty database)."""
        return self.bytes / self.total_bytes if self.total_bytes else 0.0

    def rows(self) -> list[dict[str, Any]]:
        """Per kind: entries (kernels: key directories) removed and held, files, stored bytes."""
        out: list[dict[str, Any]] = []
        g = self.guarded
        for kind in sorted(set(g.total_entries) | set(g.entries)):
            out.append({"kind": kind, "entries": g.entries.get(kind, 0), "of_entries": g.total_entries.get(kind, 0),
                        "files": None, "stored_bytes": g.stored_bytes.get(kind, 0)})
        k = self.kernels
        for kind in sorted(set(k.total_keys) | set(k.keys)):
            out.append({"kind": f"{kind}_kernel", "entries": k.keys.get(kind, 0), "of_entries": k.total_keys.get(kind, 0),
                        "files": k.files.get(kind, 0), "stored_bytes": k.stored_bytes.get(kind, 0)})
        if k.unreferenced:
            out.append({"kind": "unused_kernel_blobs", "entries": None, "of_entries": None, "files": None,
                        "stored_bytes": k.unreferenced})
        for d in self.dynamo:
            if d.total_entries:
                out.append({"kind": DYNAMO_LABELS[d.kind], "entries": d.entries, "of_entries": d.total_entries,
                            "files": None, "stored_bytes": d.stored_bytes})
        return out


@dataclass(frozen=True)
class PruneResult:
    """What :func:`apply` deleted."""

    entries: int
    entry_bytes: int
    files: int
    kernel_bytes: int


def plan(repos: Repos, *, max_bytes: int | None = None, older_than: dt.datetime | None = None,
         order: str = "lru", half_life: dt.timedelta = DEFAULT_HALF_LIFE, now: dt.datetime | None = None) -> PrunePlan:
    """The plan of a prune, in ``repos``' transaction (a read one will do): entries and kernels
    not used since ``older_than``, then until the stored bytes total at most ``max_bytes``
    (entries and kernels each giving up their share of the excess) the least recently used, or
    with ``order="value"`` the FX graph and AOTAutograd entries worth least per stored byte
    (the module's formula, ``half_life``, ages counted to ``now``, default the current time;
    kernels and Dynamo's caches least recently used). Raises ``ValueError`` for a negative
    ``max_bytes``, an ``order`` not in :data:`ORDERS` or a ``half_life`` that is not positive."""
    if max_bytes is not None and max_bytes < 0:
        raise ValueError("max_bytes must not be negative")
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, not {order!r}")
    g_limit = k_limit = None
    d_limits: dict[str, int | None] = dict.fromkeys(DYNAMO_KINDS)
    if max_bytes is not None:
        g, k = repos.guarded.stored_total(), repos.artifacts.stored_total()
        d = {kind: repos.dynamo(kind).stored_bytes() for kind in DYNAMO_KINDS}
        total = g + k + sum(d.values())
        over = max(0, total - max_bytes)
        d_over = {kind: over * n // total if total else 0 for kind, n in d.items()}  # Dynamo's share
        d_limits = {kind: n - d_over[kind] for kind, n in d.items()}
        over -= sum(d_over.values())
        g_over = over * g // (g + k) if g + k else 0
        g_limit, k_limit = g - g_over, k - (over - g_over)
    return PrunePlan(max_bytes, older_than,
                     repos.guarded.plan_evict(max_bytes=g_limit, older_than=older_than, order=order,
                                              half_life=half_life, now=now),
                     repos.artifacts.plan_evict(max_bytes=k_limit, older_than=older_than),
                     [repos.dynamo(kind).plan_evict(max_bytes=d_limits[kind], older_than=older_than)
                      for kind in DYNAMO_KINDS])


def apply(repos: Repos, prune: PrunePlan) -> PruneResult:
    """Delete what ``prune`` names, in ``repos``' (write) transaction: its entries and kernel key
    directories, and the blobs of those no file points at any more. Rows the plan names that
    another process deleted meanwhile are not counted; rows added since are kept."""
    entries, entry_bytes = repos.guarded.apply_evict(prune.guarded)
    files, kernel_bytes = repos.artifacts.apply_evict(prune.kernels)
    for eviction in prune.dynamo:
        n, freed = repos.dynamo(eviction.kind).apply_evict(eviction)
        entries, entry_bytes = entries + n, entry_bytes + freed
    return PruneResult(entries, entry_bytes, files, kernel_bytes)


__all__ = ["COLUMNS", "DEFAULT_HALF_LIFE", "ORDERS", "PrunePlan", "PruneResult", "apply", "plan"]
