"""Schema v1: typed SQLAlchemy 2.0 models of Inductor's caches.

One table family per cache kind Inductor writes under ``cache_dir()``:

===========================  ==================================================================
table                        Inductor artifact
===========================  ==================================================================
``system_fingerprints``      ``CacheBase.get_system()`` (+ torch version, ``torch_key``, host)
``guarded_entries``          ``fxgraph/<k[1:3]>/<key>/<variant>``, ``aotautograd/<key>/<variant>``
``autotune_keys``            ``cache/<system hash>`` → ``cache[op][inputs][precision]``
``autotune_runs``            one benchmark of a key's choices (``recorded_at``)
``autotune_run_timings``     ``cache[op][inputs][precision][choice]`` = ms, per run
``local_cache_values``       ``cache/<system hash>`` → any other ``LocalCache`` value
``best_configs``             ``<k[1:3]>/<name>.best_config``
``cutlass_op_lists``         ``configs_<request key>.json``
``cutlass_ops``              one row per op of a CUTLASS op list
``kernel_artifacts``         ``triton/<device>/<key>/<file>`` (Triton's cache), ``<k[1:3]>/<k>*.so``
                             (C++ kernel libraries): (kind, host, key, file name) → a blob
``kernel_blobs``             content-addressed bytes of kernel files (one copy per SHA-256)
===========================  ==================================================================

Views (created by the migrations, see :data:`VIEW_NAMES`): ``autotune_current``,
``autotune_winners``, ``autotune_history`` (revision 0001), ``kernels`` (revision 0003),
``autotune_timings`` (revision 0004: the timings flat, as the table of that name held them).

Timestamps are timezone-aware UTC. Payload columns hold zstd frames; sizes are bytes of the
uncompressed payload; ``checksum`` is the SHA-256 hex digest of the uncompressed payload.
"""

from __future__ import annotations

import datetime as dt
from typing import Optional

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: Kinds of guarded entries, named after their directory under ``cache_dir()``.
GUARDED_KINDS = ("fxgraph", "aotautograd")

#: Natural-key columns of the tables that ``cachedb copy`` / merge and the remote tier match by
#: key rather than by a newest-wins row (:mod:`cachedb.copy`, :mod:`cachedb.tier_sync`).
NATURAL_KEY_COLUMNS = {
    "kernel_artifacts": ("kind", "host_key", "key", "name"),
    "guarded_entries": ("kind", "key", "variant"),
    "quarantined_entries": ("kind", "key", "variant", "checksum", "quarantined_at"),
}
#: Columns compared to tell whether a newest-wins row (the same key on both sides) changed.
NEWEST_WINS_COMPARED = {"local_cache_values": ("value_json",), "best_configs": ("content",)}


def utcnow() -> dt.datetime:
    """The current time, timezone-aware UTC (the value every timestamp column gets)."""
    return dt.datetime.now(dt.timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class SystemFingerprint(Base):
    """Where an entry was produced.

    ``system_hash`` is Inductor's own ``CacheBase.get_system()["hash"]``
    (torch/_inductor/codecache.py); it is identical on every CPU-only machine, so the host
    fields (``cpu_model``, ``isa``) and the torch build (``torch_version``, ``torch_key``)
    complete it. ``fingerprint_key`` is the natural key: the SHA-256 hex digest of the
    canonical JSON of every identifying field (:func:`cachedb.fingerprint.fingerprint_key`).
    ``system_json`` is the ``"system"`` object exactly as Inductor wrote it, so a
    ``cache/<system hash>`` file is exported byte for byte.
    """

    __tablename__ = "system_fingerprints"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    fingerprint_key: Mapped[str] = mapped_column(String(64), unique=True)
    system_hash: Mapped[str] = mapped_column(String(64), index=True)
    system_json: Mapped[str] = mapped_column(Text)
    device_name: Mapped[Optional[str]] = mapped_column(String(256))
    triton_key: Mapped[Optional[str]] = mapped_column(String(256))
    cuda_version: Mapped[Optional[str]] = mapped_column(String(32))
    hip_version: Mapped[Optional[str]] = mapped_column(String(64))
    torch_version: Mapped[Optional[str]] = mapped_column(String(64))
    torch_key: Mapped[Optional[str]] = mapped_column(String(64))
    cpu_model: Mapped[Optional[str]] = mapped_column(String(256))
    isa: Mapped[Optional[str]] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class GuardedEntry(Base):
    """One compiled variant of an FX graph or AOTAutograd cache key.

    ``variant`` is ``sha256_hash(payload)`` (torch/_inductor/codecache.py), the leaf file name
    Inductor gives it; ``guards_expr`` is the entry's guard expression read from the pickle
    without executing it (``None`` = unconditional hit, unless ``guards_known`` is false, in
    which case ``guards_note`` says why it could not be read). ``time_taken_ns`` is the
    compile time Inductor recorded (FX: ``_time_taken_ns``; AOT: forward + backward).
    ``last_used_at`` (indexed, revision 0002) is the time of the last hit, or of the write;
    eviction (``cachedb prune``) removes the least recently used first. ``signature`` is the
    HMAC-SHA256 of the entry under the team's key when signing is on (:mod:`cachedb._signing`).
    """

    __tablename__ = "guarded_entries"
    __table_args__ = (
        UniqueConstraint("kind", "key", "variant", name="uq_guarded_entries_kind_key_variant"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    key: Mapped[str] = mapped_column(String(128))
    variant: Mapped[str] = mapped_column(String(64))
    guards_expr: Mapped[Optional[str]] = mapped_column(Text)
    guards_known: Mapped[bool] = mapped_column(Boolean, default=True)
    guards_note: Mapped[Optional[str]] = mapped_column(Text)
    payload: Mapped[bytes] = mapped_column(LargeBinary)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    checksum: Mapped[str] = mapped_column(String(64))
    time_taken_ns: Mapped[Optional[int]] = mapped_column(BigInteger)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_used_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    hit_count: Mapped[int] = mapped_column(Integer, default=0)
    fingerprint_id: Mapped[Optional[int]] = mapped_column(
        ForeignKey("system_fingerprints.id", ondelete="SET NULL"), index=True
    )
    signature: Mapped[Optional[str]] = mapped_column(String(64))

    fingerprint: Mapped[Optional[SystemFingerprint]] = relationship()


class AutotuneKey(Base):
    """One ``cache[op][inputs][precision]`` of ``PersistentCache`` (torch/_inductor/codecache.py)
    on one fingerprint: the strings every benchmark of its choices shares, stored once
    (revision 0004). ``hint_override`` is the ``hint_override`` of the inputs key (``None``:
    none). Rows are found by the index on ``(fingerprint_id, op, inputs, precision)``; the
    writers look a key up before adding one, so a key normally has one row (two concurrent
    PostgreSQL writers may add a duplicate, which reads treat as the same key).
    """

    __tablename__ = "autotune_keys"
    __table_args__ = (Index("ix_autotune_keys_lookup", "fingerprint_id", "op", "inputs", "precision"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    fingerprint_id: Mapped[int] = mapped_column(
        ForeignKey("system_fingerprints.id", ondelete="CASCADE")
    )
    op: Mapped[str] = mapped_column(String(256))
    inputs: Mapped[str] = mapped_column(Text)
    hint_override: Mapped[Optional[int]] = mapped_column(BigInteger)
    precision: Mapped[str] = mapped_column(String(16))

    fingerprint: Mapped[SystemFingerprint] = relationship()


class AutotuneRun(Base):
    """One benchmark of a key's choices, at ``recorded_at`` (revision 0004): what one
    ``PersistentCache.lookup`` miss measured, or one import of a document's values."""

    __tablename__ = "autotune_runs"
    __table_args__ = (Index("ix_autotune_runs_key_id", "key_id", "recorded_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key_id: Mapped[int] = mapped_column(ForeignKey("autotune_keys.id", ondelete="CASCADE"))
    recorded_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    key: Mapped[AutotuneKey] = relationship()


class AutotuneTiming(Base):
    """One timing of one choice in one run: ``cache[op][inputs_key][precision][choice_hash] =
    timing_ms`` (milliseconds).

    Mirrors ``PersistentCache.lookup`` (torch/_inductor/codecache.py). A re-benchmark adds a
    run; the current value of a choice is its latest run's. ``position`` orders entries as they
    first appeared in Inductor's JSON document (shared with :class:`LocalCacheValue`), so an
    export writes the document back byte for byte.

    Since revision 0004 the strings of ``(fingerprint, op, inputs, precision)`` live once per
    key (:class:`AutotuneKey`) and the timestamp once per run (:class:`AutotuneRun`); the view
    ``autotune_timings`` (:data:`AUTOTUNE_TIMINGS`) shows the rows flat, as revisions 0001-0003
    stored them.
    """

    __tablename__ = "autotune_run_timings"
    __table_args__ = (Index("ix_autotune_run_timings_run_id", "run_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("autotune_runs.id", ondelete="CASCADE"))
    choice_hash: Mapped[str] = mapped_column(Text)
    timing_ms: Mapped[float] = mapped_column(Float)
    position: Mapped[int] = mapped_column(BigInteger, index=True)

    run: Mapped[AutotuneRun] = relationship()


class LocalCacheValue(Base):
    """A ``LocalCache`` value (pad_mm decisions, runtime estimates, …) under its key path.

    ``key_path`` is the JSON array of keys from the top of the ``"cache"`` object down to the
    value (``LocalCache.set_value(*keys, value=...)``), ``namespace`` its first key, and
    ``value_json`` the JSON of the value (a leaf: never a non-empty object).
    """

    __tablename__ = "local_cache_values"
    __table_args__ = (
        UniqueConstraint("fingerprint_id", "key_path", name="uq_local_cache_values_fp_key_path"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    fingerprint_id: Mapped[int] = mapped_column(
        ForeignKey("system_fingerprints.id", ondelete="CASCADE")
    )
    namespace: Mapped[str] = mapped_column(String(256), index=True)
    key_path: Mapped[str] = mapped_column(Text)
    value_json: Mapped[str] = mapped_column(Text)
    position: Mapped[int] = mapped_column(BigInteger, index=True)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    fingerprint: Mapped[SystemFingerprint] = relationship()


class BestConfig(Base):
    """An autotune best config (``AutotuneCache``, torch/_inductor/runtime/autotune_cache.py).

    ``key`` is the file's path relative to ``cache_dir()``, ``"<k[1:3]>/<name>.best_config"``
    (the Mega-Cache artifact key), so one database serves any cache directory. ``content`` is
    the JSON exactly as written; the other columns are extracted from it.
    """

    __tablename__ = "best_configs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(256), unique=True)
    content: Mapped[str] = mapped_column(Text)
    configs_hash: Mapped[Optional[str]] = mapped_column(String(64))  # not indexed since 0005
    num_warps: Mapped[Optional[int]] = mapped_column(Integer)
    num_stages: Mapped[Optional[int]] = mapped_column(Integer)
    found_by_coordesc: Mapped[Optional[bool]] = mapped_column(Boolean)
    time_taken_ms: Mapped[Optional[int]] = mapped_column(BigInteger)
    triton_cache_hash: Mapped[Optional[str]] = mapped_column(String(128))
    kernel_kwargs: Mapped[Optional[str]] = mapped_column(Text)
    signature: Mapped[Optional[str]] = mapped_column(String(64))
    fingerprint_id: Mapped[Optional[int]] = mapped_column(
        ForeignKey("system_fingerprints.id", ondelete="SET NULL")
    )
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class QuarantinedEntry(Base):
    """A guarded entry whose payload failed its checksum (or signature): moved here, never
    served, kept for inspection (``cachedb verify`` lists them). Revision 0002."""

    __tablename__ = "quarantined_entries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    key: Mapped[str] = mapped_column(String(128))
    variant: Mapped[str] = mapped_column(String(64))
    payload: Mapped[bytes] = mapped_column(LargeBinary)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    checksum: Mapped[str] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(Text)
    quarantined_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class CutlassOpList(Base):
    """A CUTLASS op list, ``configs_<request_key>.json`` (``maybe_fetch_ops``,
    torch/_inductor/codegen/cutlass/cache.py). ``payload`` is the zstd frame of the file's
    exact bytes; ``arch``, ``cuda_version`` and ``instantiation_level`` are the inputs of the
    request key where known (an imported file only reveals ``arch``)."""

    __tablename__ = "cutlass_op_lists"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    request_key: Mapped[str] = mapped_column(String(64), unique=True)
    arch: Mapped[Optional[int]] = mapped_column(Integer)
    cuda_version: Mapped[Optional[str]] = mapped_column(String(32))
    instantiation_level: Mapped[Optional[str]] = mapped_column(String(32))
    op_count: Mapped[int] = mapped_column(Integer)
    payload: Mapped[bytes] = mapped_column(LargeBinary)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    checksum: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    ops: Mapped[list[CutlassOp]] = relationship(
        back_populates="op_list", cascade="all, delete-orphan", passive_deletes=True
    )


class CutlassOp(Base):
    """One op of a CUTLASS op list, with the fields users filter by (parsed without CUTLASS
    installed, :func:`cachedb.cutlass_ops.parse_op_list`)."""

    __tablename__ = "cutlass_ops"
    __table_args__ = (
        Index("ix_cutlass_ops_types", "element_a", "element_b", "layout_a", "layout_b"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    op_list_id: Mapped[int] = mapped_column(
        ForeignKey("cutlass_op_lists.id", ondelete="CASCADE"), index=True
    )
    position: Mapped[int] = mapped_column(Integer)
    gemm_kind: Mapped[Optional[str]] = mapped_column(String(64))
    arch: Mapped[Optional[int]] = mapped_column(Integer)
    element_a: Mapped[Optional[str]] = mapped_column(String(32))
    element_b: Mapped[Optional[str]] = mapped_column(String(32))
    element_c: Mapped[Optional[str]] = mapped_column(String(32))
    element_d: Mapped[Optional[str]] = mapped_column(String(32))
    element_accumulator: Mapped[Optional[str]] = mapped_column(String(32))
    element_epilogue: Mapped[Optional[str]] = mapped_column(String(32))
    layout_a: Mapped[Optional[str]] = mapped_column(String(32))
    layout_b: Mapped[Optional[str]] = mapped_column(String(32))
    layout_c: Mapped[Optional[str]] = mapped_column(String(32))
    layout_d: Mapped[Optional[str]] = mapped_column(String(32))
    alignment_a: Mapped[Optional[int]] = mapped_column(Integer)
    alignment_b: Mapped[Optional[int]] = mapped_column(Integer)
    alignment_c: Mapped[Optional[int]] = mapped_column(Integer)
    alignment_d: Mapped[Optional[int]] = mapped_column(Integer)
    tile_shape: Mapped[Optional[str]] = mapped_column(String(32))
    cluster_shape: Mapped[Optional[str]] = mapped_column(String(32))
    stages: Mapped[Optional[int]] = mapped_column(Integer)
    kernel_schedule: Mapped[Optional[str]] = mapped_column(String(64))
    epilogue_schedule: Mapped[Optional[str]] = mapped_column(String(64))
    tile_scheduler: Mapped[Optional[str]] = mapped_column(String(64))
    epilogue_functor: Mapped[Optional[str]] = mapped_column(String(64))
    swizzling_functor: Mapped[Optional[str]] = mapped_column(String(64))

    op_list: Mapped[CutlassOpList] = relationship(back_populates="ops")


#: Kinds of kernel artifacts: Triton's cache directories and C++ kernel libraries.
ARTIFACT_KINDS = ("triton", "cpp")


class KernelBlob(Base):
    """The bytes of one kernel file, stored once however many keys or machines share them
    (revision 0003).

    ``sha256`` is the hex digest of the uncompressed bytes (the content address and the
    checksum); ``payload`` their zstd frame; ``size_bytes`` the uncompressed size and
    ``stored_bytes`` the frame's size, both in bytes.
    """

    __tablename__ = "kernel_blobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    payload: Mapped[bytes] = mapped_column(LargeBinary)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    stored_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class KernelArtifact(Base):
    """One file of a compiled kernel, found by the key its compiler gives it (revision 0003).

    - ``kind="triton"``: a file of Triton's cache directory ``<triton cache>/<key>/<name>``
      (``key`` = ``_base32(sha256(get_cache_key(...)))``, triton/runtime/cache.py; it covers
      the source, Triton's build, the GPU arch, ptxas and the options). ``host_key`` is ``""``:
      the key alone decides.
    - ``kind="cpp"``: a C++ kernel library built by ``CppCodeCache.load_async``
      (torch/_inductor/codecache.py), ``<cache dir>/<key[1:3]>/<name>`` with ``key`` the
      ``code_hash`` of its source and command line. The command line says ``-march=native``
      and not the compiler's version, so ``host_key`` (:func:`cachedb.live._cpp_cache.host_key`:
      compiler version, CPU flags, machine, torch and Python versions) scopes the binary to the
      hosts that can load it; ``""`` = built on an unknown host (exported, never served).

    A whole key directory is fetched in one query (the unique index leads with kind, host key,
    key). ``last_used_at`` (indexed) drives eviction; ``hit_count`` counts serves.
    """

    __tablename__ = "kernel_artifacts"
    __table_args__ = (
        UniqueConstraint("kind", "host_key", "key", "name", name="uq_kernel_artifacts_kind_host_key_key_name"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    host_key: Mapped[str] = mapped_column(String(64), default="")
    key: Mapped[str] = mapped_column(String(128))
    name: Mapped[str] = mapped_column(String(255))
    blob_id: Mapped[int] = mapped_column(ForeignKey("kernel_blobs.id", ondelete="RESTRICT"), index=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    fingerprint_id: Mapped[Optional[int]] = mapped_column(
        ForeignKey("system_fingerprints.id", ondelete="SET NULL"), index=True
    )
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_used_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    hit_count: Mapped[int] = mapped_column(Integer, default=0)

    blob: Mapped[KernelBlob] = relationship()


#: Views created by the migrations. Every timing flat (0004_compact_timings.py):
#: ``autotune_timings`` (:data:`AUTOTUNE_TIMINGS`). Tuning history (SQL in 0001_schema_v1.py,
#: recreated unchanged by 0004):
#: ``autotune_current`` (latest timing of each choice), ``autotune_winners`` (fastest current
#: choice per op, inputs, precision and fingerprint, with the number of candidates) and
#: ``autotune_history`` (every benchmark with its fingerprint: device, torch version, host).
#: Kernels (0003_kernel_artifacts.py): ``kernels``, one row per kernel key with its files,
#: bytes (uncompressed and stored), blobs shared with other keys, hits and last use.
VIEW_NAMES = ("autotune_timings", "autotune_current", "autotune_winners", "autotune_history", "kernels")

#: The view ``autotune_timings`` (revision 0004, migrations/versions/0004_compact_timings.py):
#: every timing flat, one row per :class:`AutotuneTiming` with its key's and run's columns, as
#: the table of that name held them before. Reads (SQLite and PostgreSQL inline the join) and
#: ``cachedb copy`` from any revision go through it; writes go to the three tables
#: (:mod:`cachedb.repositories.timings`). Not part of :attr:`Base.metadata`: it is no table.
AUTOTUNE_TIMINGS = Table(
    "autotune_timings",
    MetaData(),
    Column("id", Integer, primary_key=True),
    Column("fingerprint_id", Integer, nullable=False),
    Column("op", String(256), nullable=False),
    Column("inputs", Text, nullable=False),
    Column("hint_override", BigInteger),
    Column("precision", String(16), nullable=False),
    Column("choice_hash", Text, nullable=False),
    Column("timing_ms", Float, nullable=False),
    Column("position", BigInteger, nullable=False),
    Column("recorded_at", DateTime(timezone=True), nullable=False),
)
