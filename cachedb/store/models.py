"""Typed SQLAlchemy 2.0 ORM models of Inductor's caches, one class per table of
:mod:`cachedb.store.tables` (declarative with imperative tables: each class maps its Core table
through ``__table__``; the ``Mapped`` annotations type the attributes). The classes document
what each column holds; the tables, the schema's constants and the views are in
:mod:`cachedb.store.tables`, which is what the hot paths import (no ORM in a compiling process).

The admin commands, the migrations' environment and the tests use these classes; the
repositories build their statements from the tables.
"""

from __future__ import annotations

import datetime as dt
from typing import Optional

from sqlalchemy.orm import DeclarativeBase, Mapped, relationship

from . import tables
from .tables import (  # the schema's names, importable from here as before
    ARTIFACT_KINDS,
    AUTOTUNE_TIMINGS,
    CHOICE_VIEW_COLUMNS,
    GUARDED_KINDS,
    NAMING_CONVENTION,
    NATURAL_KEY_COLUMNS,
    NEWEST_WINS_COMPARED,
    VIEW_NAMES,
    utcnow,
)

__all__ = [
    "ARTIFACT_KINDS", "AUTOTUNE_TIMINGS", "CHOICE_VIEW_COLUMNS", "GUARDED_KINDS", "NAMING_CONVENTION", "NATURAL_KEY_COLUMNS",
    "NEWEST_WINS_COMPARED", "VIEW_NAMES", "utcnow",
    "Base", "SystemFingerprint", "GuardedEntry", "AutotuneKey", "AutotuneRun", "AutotuneTiming", "AutotuneChoice",
    "LocalCacheValue", "BestConfig", "QuarantinedEntry", "CutlassOpList", "CutlassOp", "KernelBlob",
    "KernelArtifact", "PgoProfile", "DynamoPackage", "PrecompileRefusal", "RowOrigin", "KeyFactor", "EntryFactor", "CacheMiss",
]


class Base(DeclarativeBase):
    metadata = tables.metadata


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

    __table__ = tables.system_fingerprints

    id: Mapped[int]
    fingerprint_key: Mapped[str]
    system_hash: Mapped[str]
    system_json: Mapped[str]
    device_name: Mapped[Optional[str]]
    triton_key: Mapped[Optional[str]]
    cuda_version: Mapped[Optional[str]]
    hip_version: Mapped[Optional[str]]
    torch_version: Mapped[Optional[str]]
    torch_key: Mapped[Optional[str]]
    cpu_model: Mapped[Optional[str]]
    isa: Mapped[Optional[str]]
    created_at: Mapped[dt.datetime]


class GuardedEntry(Base):
    """One compiled variant of an FX graph or AOTAutograd cache key.

    ``variant`` is ``sha256_hash(payload)`` (torch/_inductor/codecache.py), the leaf file name
    Inductor gives it; ``guards_expr`` is the entry's guard expression read from the pickle
    without executing it (``None`` = unconditional hit, unless ``guards_known`` is false, in
    which case ``guards_note`` says why it could not be read). ``time_taken_ns`` is the
    compile time Inductor recorded (FX: ``_time_taken_ns``; AOT: forward + backward).
    ``last_used_at`` (indexed, revision 0002) is the time of the last hit, or of the write;
    eviction (``cachedb prune``) removes the least recently used first. ``signature`` is the
    HMAC-SHA256 of the entry under the team's key when signing is on (:mod:`cachedb.store.signing`).
    """

    __table__ = tables.guarded_entries

    id: Mapped[int]
    kind: Mapped[str]
    key: Mapped[str]
    variant: Mapped[str]
    guards_expr: Mapped[Optional[str]]
    guards_known: Mapped[bool]
    guards_note: Mapped[Optional[str]]
    payload: Mapped[bytes]
    size_bytes: Mapped[int]
    checksum: Mapped[str]
    time_taken_ns: Mapped[Optional[int]]
    created_at: Mapped[dt.datetime]
    last_used_at: Mapped[dt.datetime]
    hit_count: Mapped[int]
    fingerprint_id: Mapped[Optional[int]]
    signature: Mapped[Optional[str]]
    ed25519_signature: Mapped[Optional[str]]

    fingerprint: Mapped[Optional[SystemFingerprint]] = relationship()


class AutotuneKey(Base):
    """One ``cache[op][inputs][precision]`` of ``PersistentCache`` (torch/_inductor/codecache.py)
    on one fingerprint: the strings every benchmark of its choices shares, stored once
    (revision 0004). ``hint_override`` is the ``hint_override`` of the inputs key (``None``:
    none). Rows are found by the index on ``(fingerprint_id, op, inputs, precision)``; the
    writers look a key up before adding one, so a key normally has one row (two concurrent
    PostgreSQL writers may add a duplicate, which reads treat as the same key).
    """

    __table__ = tables.autotune_keys

    id: Mapped[int]
    fingerprint_id: Mapped[int]
    op: Mapped[str]
    inputs: Mapped[str]
    hint_override: Mapped[Optional[int]]
    precision: Mapped[str]

    fingerprint: Mapped[SystemFingerprint] = relationship()


class AutotuneRun(Base):
    """One benchmark of a key's choices, at ``recorded_at`` (revision 0004): what one
    ``PersistentCache.lookup`` miss measured, or one import of a document's values."""

    __table__ = tables.autotune_runs

    id: Mapped[int]
    key_id: Mapped[int]
    recorded_at: Mapped[dt.datetime]

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

    __table__ = tables.autotune_run_timings

    id: Mapped[int]
    run_id: Mapped[int]
    choice_hash: Mapped[str]
    timing_ms: Mapped[float]
    position: Mapped[int]
    ed25519_signature: Mapped[Optional[str]]

    run: Mapped[AutotuneRun] = relationship()


class AutotuneChoice(Base):
    """What torch says of one autotune choice, keyed by its choice hash (revision 0011).

    ``choice_hash`` is ``ChoiceCaller.hash_key()`` (torch/_inductor/ir.py; for a Triton
    template ``TritonTemplateCaller.hash_key``, torch/_inductor/select_algorithm.py: the
    template's name and the generated module's cache key), the key under which
    :class:`AutotuneTiming` rows hold its timings. ``name`` is ``ChoiceCaller.name`` as the
    process that described the choice saw it (``triton_mm_12``, ``_mkl_linear``,
    ``cpp_CppMicroGemmFP32Vec_0``: a template's trailing number counts the choices that process
    made), ``description`` is ``ChoiceCaller.description`` (a Triton template's kwargs, e.g.
    ``BLOCK_K=32, BLOCK_M=64, BLOCK_N=128, num_stages=3, num_warps=4``; ``""`` for extern and
    C++ choices, as torch gives it) and ``info_json`` is ``info_dict()`` as JSON (keys sorted;
    a value JSON cannot hold is written as its ``str``).

    From ``info_dict()``, as torch gives them (``None`` where it does not): ``backend``
    (``Triton``, ``extern``, ``CPP``, ``CUDA`` for CUTLASS, ``ROCm``, ``CuteDSL``,
    ``subgraph``), ``kernel_name`` (its ``kernel_name``, else ``kernel_call_name``:
    ``extern_kernels._mkl_linear``), ``tile_shape`` (the string torch writes: a Triton template's
    ``(BLOCK_M, BLOCK_K, BLOCK_N)``, ``-1`` for a block the template has none of; a CUTLASS op's
    tile description's ``[M, N, K]``), ``num_stages``, ``num_warps`` and ``group_m`` (Triton's
    ``GROUP_M``, ``-1`` for none). ``created_at`` is when it was first described; one row per
    hash, written once (the first description stays: a hash names one kernel).
    ``ed25519_signature`` signs the hash, name, description and ``info_json``
    (:mod:`cachedb.fleet.trust`), as the timings are signed.
    """

    __table__ = tables.autotune_choices

    id: Mapped[int]
    choice_hash: Mapped[str]
    name: Mapped[str]
    description: Mapped[Optional[str]]
    backend: Mapped[Optional[str]]
    kernel_name: Mapped[Optional[str]]
    tile_shape: Mapped[Optional[str]]
    num_stages: Mapped[Optional[int]]
    num_warps: Mapped[Optional[int]]
    group_m: Mapped[Optional[int]]
    info_json: Mapped[str]
    created_at: Mapped[dt.datetime]
    ed25519_signature: Mapped[Optional[str]]


class CompileClaim(Base):
    """A lease on one entry a process of the fleet is compiling (revision 0012): ``kind``
    (``fxgraph`` / ``aotautograd``) and ``key`` are torch's; ``holder`` names the process
    (``host:pid:random``), ``host`` and ``pid`` say where it runs, ``claimed_at`` when it took
    the lease and ``beat_at`` its last heartbeat: a lease whose ``beat_at`` is older than
    :data:`cachedb.live._singleflight.STALE_S` seconds is free to take. Used on a shared
    database (the remote tier); one row per entry.
    """

    __table__ = tables.compile_claims

    id: Mapped[int]
    kind: Mapped[str]
    key: Mapped[str]
    holder: Mapped[str]
    host: Mapped[str]
    pid: Mapped[int]
    claimed_at: Mapped[dt.datetime]
    beat_at: Mapped[dt.datetime]


class CompileWait(Base):
    """A compile a process did not run (revision 0012): it missed ``kind``/``key``, found
    another process compiling it (``waited_on``: ``pid N on HOST`` for a rank of the same
    machine, the remote holder's name for another machine), waited ``seconds`` (s) and was
    served the entry (``outcome`` ``landed``) at ``waited_at``. ``cachedb stats`` counts them
    per kind.
    """

    __table__ = tables.compile_waits

    id: Mapped[int]
    kind: Mapped[str]
    key: Mapped[str]
    seconds: Mapped[float]
    outcome: Mapped[str]
    waited_on: Mapped[str]
    waited_at: Mapped[dt.datetime]


class KeyFactor(Base):
    """One factor of a key torch computed (revision 0013), shared by every key that hashed it:
    for ``fxgraph`` one debug line of ``compiled_fx_graph_hash`` (torch/_inductor/codecache.py),
    one per attribute of ``FxGraphHashDetails`` (a list's items and a dict's values one each:
    ``example_inputs[0]``, ``inductor_config.max_autotune_pointwise``). ``hash``: the first 16
    characters of torch's hash of the factor; ``value``: a short readable form (at most 200
    characters: ``float32[64]``, ``False``; ``#<hash>`` where torch's text is not printable).
    """

    __table__ = tables.key_factors

    id: Mapped[int]
    factor: Mapped[str]
    hash: Mapped[str]
    value: Mapped[str]


class EntryFactor(Base):
    """What torch hashed into the key of the entries ``kind``/``key`` (revision 0013):
    ``factor_ids`` the JSON array of their :class:`KeyFactor` ids, in torch's order."""

    __table__ = tables.entry_factors

    id: Mapped[int]
    kind: Mapped[str]
    key: Mapped[str]
    factor_ids: Mapped[str]


class CacheMiss(Base):
    """A lookup that missed (revision 0013): ``outcome`` ``no_entry`` (no variant of the key),
    ``guards_failed`` (variants whose guards all failed) or ``bypass`` (torch did not look
    up: ``reason``, its bypass reason); ``factor_ids`` the JSON array of the :class:`KeyFactor`
    ids of the key wanted. Only the newest ``CACHEDB_MISS_LOG`` rows are kept.
    """

    __table__ = tables.cache_misses

    id: Mapped[int]
    kind: Mapped[str]
    key: Mapped[str]
    outcome: Mapped[str]
    reason: Mapped[str]
    factor_ids: Mapped[str]
    missed_at: Mapped[dt.datetime]


class LocalCacheValue(Base):
    """A ``LocalCache`` value (pad_mm decisions, runtime estimates, …) under its key path.

    ``key_path`` is the JSON array of keys from the top of the ``"cache"`` object down to the
    value (``LocalCache.set_value(*keys, value=...)``), ``namespace`` its first key, and
    ``value_json`` the JSON of the value (a leaf: never a non-empty object).
    """

    __table__ = tables.local_cache_values

    id: Mapped[int]
    fingerprint_id: Mapped[int]
    namespace: Mapped[str]
    key_path: Mapped[str]
    value_json: Mapped[str]
    position: Mapped[int]
    updated_at: Mapped[dt.datetime]
    ed25519_signature: Mapped[Optional[str]]

    fingerprint: Mapped[SystemFingerprint] = relationship()


class BestConfig(Base):
    """An autotune best config (``AutotuneCache``, torch/_inductor/runtime/autotune_cache.py).

    ``key`` is the file's path relative to ``cache_dir()``, ``"<k[1:3]>/<name>.best_config"``
    (the Mega-Cache artifact key), so one database serves any cache directory. ``content`` is
    the JSON exactly as written; the other columns are extracted from it.
    """

    __table__ = tables.best_configs

    id: Mapped[int]
    key: Mapped[str]
    content: Mapped[str]
    configs_hash: Mapped[Optional[str]]  # not indexed since 0005
    num_warps: Mapped[Optional[int]]
    num_stages: Mapped[Optional[int]]
    found_by_coordesc: Mapped[Optional[bool]]
    time_taken_ms: Mapped[Optional[int]]
    triton_cache_hash: Mapped[Optional[str]]
    kernel_kwargs: Mapped[Optional[str]]
    signature: Mapped[Optional[str]]
    ed25519_signature: Mapped[Optional[str]]
    fingerprint_id: Mapped[Optional[int]]
    created_at: Mapped[dt.datetime]
    updated_at: Mapped[dt.datetime]


class RowOrigin(Base):
    """Where a row of a machine's local file came from, when it crossed into it from another
    database (revision 0009; :data:`cachedb.store.tables.row_origins`): ``origin`` is
    ``key:<key id>`` (Ed25519 signature verified under that trusted key) or ``accepted``
    (unsigned, taken under ``CACHEDB_REMOTE_TRUST=1``); ``row_key`` the row's natural key.
    Every table that carries code holds ``ed25519_signature``, ``<key id>:<base64>`` of the
    writer's signature (:mod:`cachedb.fleet.trust`)."""

    __table__ = tables.row_origins

    id: Mapped[int]
    table_name: Mapped[str]
    row_key: Mapped[str]
    origin: Mapped[str]
    recorded_at: Mapped[dt.datetime]


class QuarantinedEntry(Base):
    """An entry whose payload failed its checksum (or signature): moved here, never served,
    kept for inspection (``cachedb verify`` lists them). Revision 0002. ``kind`` is the
    guarded kind (``fxgraph``, ``aotautograd``), or ``pgo`` / ``precompile`` for Dynamo's
    caches, whose ``variant`` is then the row's checksum."""

    __table__ = tables.quarantined_entries

    id: Mapped[int]
    kind: Mapped[str]
    key: Mapped[str]
    variant: Mapped[str]
    payload: Mapped[bytes]
    size_bytes: Mapped[int]
    checksum: Mapped[str]
    reason: Mapped[str]
    quarantined_at: Mapped[dt.datetime]


class CutlassOpList(Base):
    """A CUTLASS op list, ``configs_<request_key>.json`` (``maybe_fetch_ops``,
    torch/_inductor/codegen/cutlass/cache.py). ``payload`` is the zstd frame of the file's
    exact bytes; ``arch``, ``cuda_version`` and ``instantiation_level`` are the inputs of the
    request key where known (an imported file only reveals ``arch``)."""

    __table__ = tables.cutlass_op_lists

    id: Mapped[int]
    request_key: Mapped[str]
    arch: Mapped[Optional[int]]
    cuda_version: Mapped[Optional[str]]
    instantiation_level: Mapped[Optional[str]]
    op_count: Mapped[int]
    payload: Mapped[bytes]
    size_bytes: Mapped[int]
    checksum: Mapped[str]
    created_at: Mapped[dt.datetime]
    ed25519_signature: Mapped[Optional[str]]

    ops: Mapped[list[CutlassOp]] = relationship(
        back_populates="op_list", cascade="all, delete-orphan", passive_deletes=True
    )


class CutlassOp(Base):
    """One op of a CUTLASS op list, with the fields users filter by (parsed without CUTLASS
    installed, :func:`cachedb.formats.cutlass_ops.parse_op_list`)."""

    __table__ = tables.cutlass_ops

    id: Mapped[int]
    op_list_id: Mapped[int]
    position: Mapped[int]
    gemm_kind: Mapped[Optional[str]]
    arch: Mapped[Optional[int]]
    element_a: Mapped[Optional[str]]
    element_b: Mapped[Optional[str]]
    element_c: Mapped[Optional[str]]
    element_d: Mapped[Optional[str]]
    element_accumulator: Mapped[Optional[str]]
    element_epilogue: Mapped[Optional[str]]
    layout_a: Mapped[Optional[str]]
    layout_b: Mapped[Optional[str]]
    layout_c: Mapped[Optional[str]]
    layout_d: Mapped[Optional[str]]
    alignment_a: Mapped[Optional[int]]
    alignment_b: Mapped[Optional[int]]
    alignment_c: Mapped[Optional[int]]
    alignment_d: Mapped[Optional[int]]
    tile_shape: Mapped[Optional[str]]
    cluster_shape: Mapped[Optional[str]]
    stages: Mapped[Optional[int]]
    kernel_schedule: Mapped[Optional[str]]
    epilogue_schedule: Mapped[Optional[str]]
    tile_scheduler: Mapped[Optional[str]]
    epilogue_functor: Mapped[Optional[str]]
    swizzling_functor: Mapped[Optional[str]]

    op_list: Mapped[CutlassOpList] = relationship(back_populates="ops")


class KernelBlob(Base):
    """The bytes of one kernel file, stored once however many keys or machines share them
    (revision 0003).

    ``sha256`` is the hex digest of the uncompressed bytes (the content address and the
    checksum); ``payload`` their zstd frame; ``size_bytes`` the uncompressed size and
    ``stored_bytes`` the frame's size, both in bytes.
    """

    __table__ = tables.kernel_blobs

    id: Mapped[int]
    sha256: Mapped[str]
    payload: Mapped[bytes]
    size_bytes: Mapped[int]
    stored_bytes: Mapped[int]
    created_at: Mapped[dt.datetime]


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

    __table__ = tables.kernel_artifacts

    id: Mapped[int]
    kind: Mapped[str]
    host_key: Mapped[str]
    key: Mapped[str]
    name: Mapped[str]
    blob_id: Mapped[int]
    size_bytes: Mapped[int]
    fingerprint_id: Mapped[Optional[int]]
    created_at: Mapped[dt.datetime]
    last_used_at: Mapped[dt.datetime]
    hit_count: Mapped[int]
    ed25519_signature: Mapped[Optional[str]]

    blob: Mapped[KernelBlob] = relationship()


class _DynamoPayload:
    """The columns Dynamo's two caches share (one pickle per key, the newer wins):
    ``payload`` as torch wrote it, checksummed and signed like every payload, ``last_used_at``
    and ``hit_count`` for eviction."""

    id: Mapped[int]
    key: Mapped[str]
    payload: Mapped[bytes]
    size_bytes: Mapped[int]
    checksum: Mapped[str]
    signature: Mapped[Optional[str]]
    ed25519_signature: Mapped[Optional[str]]
    fingerprint_id: Mapped[Optional[int]]
    created_at: Mapped[dt.datetime]
    updated_at: Mapped[dt.datetime]
    last_used_at: Mapped[dt.datetime]
    hit_count: Mapped[int]


class PgoProfile(_DynamoPayload, Base):
    """A Dynamo PGO profile (automatic-dynamic code state, torch/_dynamo/pgo.py), revision 0006.

    ``key`` is the name torch gives the file, ``dynamo/code_state_<key>.pkl`` (``code_state_path``:
    the PGO cache key ``f"{job_id}:{rank}:{cache_key_tag}"`` with ``<>:"/\\|?*`` made ``_``), so
    two cache keys that share a file in torch share a row here. ``payload`` is the pickle
    torch wrote (a ``defaultdict[CodeId, CodeState]``), stored as a checksummed payload and
    handed back to torch as it is: cachedb never unpickles it. A profile is rewritten whole by
    each process that learns something (the one it loaded plus what it learned), so one row
    per key and the newer ``updated_at`` wins (as torch's own file: the last write stays).
    ``last_used_at`` (indexed) and ``hit_count`` count serves (eviction).
    """

    __table__ = tables.pgo_profiles


class DynamoPackage(_DynamoPayload, Base):
    """A precompiled Dynamo package (torch's caching precompile, torch/_dynamo/package.py),
    revision 0007.

    ``key`` is the compiled function's source id (``CompilePackage.source_id_from_fn``: the
    SHA-256 of its qualified name and first line), the directory ``DiskDynamoCache`` keeps
    ``dynamo/<key>/entry`` in. ``payload`` is that file's pickle (a ``PrecompileCacheEntry``:
    Dynamo's bytecode and guards for every frame of the function, and the backends they need),
    stored as a checksummed payload and handed back to torch as it is: cachedb never unpickles
    it. One row per key, the newer ``updated_at`` wins (a process saves the package it loaded
    plus what it compiled). torch checks the package's Python, torch and GPU toolkit versions
    when it installs it (``SystemInfo.check_compatibility``). ``last_used_at`` (indexed) and
    ``hit_count`` count serves (eviction).
    """

    __table__ = tables.dynamo_packages


class PrecompileRefusal(_DynamoPayload, Base):
    """A function torch could not package for caching precompile on one system, revision 0010.

    ``key`` is the key its package would have (:func:`cachedb.keys.package_key`: the source id
    and the system tag). ``payload`` is cachedb's JSON, ``{"function", "error", "code"}``: the
    qualified name, the one-line error torch raised, and the function's code identity
    (:func:`cachedb.live._precompile_fallback.code_identity`); a refusal whose code identity
    differs from the function's is ignored, and the package is tried again. One row per key,
    the newer ``updated_at`` wins. ``last_used_at`` (indexed) and ``hit_count`` count serves
    (eviction).
    """

    __table__ = tables.precompile_refusals
