"""Schema v1 as SQLAlchemy Core tables: what every statement of cachedb is built from.

One table family per cache kind Inductor writes under ``cache_dir()``:

===========================  ==================================================================
table                        Inductor artifact
===========================  ==================================================================
``system_fingerprints``      ``CacheBase.get_system()`` (+ torch version, ``torch_key``, host)
``guarded_entries``          ``fxgraph/<k[1:3]>/<key>/<variant>``, ``aotautograd/<key>/<variant>``
``autotune_keys``            ``cache/<system hash>`` → ``cache[op][inputs][precision]``
``autotune_runs``            one benchmark of a key's choices (``recorded_at``)
``autotune_run_timings``     ``cache[op][inputs][precision][choice]`` = ms, per run
``autotune_choices``         none: what torch says of each choice hash at tuning time (name,
                             description, ``info_dict()``), revision 0011
``local_cache_values``       ``cache/<system hash>`` → any other ``LocalCache`` value
``best_configs``             ``<k[1:3]>/<name>.best_config``
``cutlass_op_lists``         ``configs_<request key>.json``
``cutlass_ops``              one row per op of a CUTLASS op list
``kernel_artifacts``         ``triton/<device>/<key>/<file>`` (Triton's cache), ``<k[1:3]>/<k>*.so``
                             (C++ kernel libraries): (kind, host, key, file name) → a blob
``kernel_blobs``             content-addressed bytes of kernel files (one copy per SHA-256)
``quarantined_entries``      entries that failed their checksum or signature (guarded entries,
                             PGO profiles, Dynamo packages)
``pgo_profiles``             ``dynamo/code_state_<key>.pkl`` (Dynamo's PGO profiles, revision 0006)
``dynamo_packages``          ``dynamo/<source id>/entry`` (precompiled Dynamo packages, revision 0007)
``precompile_refusals``      none: a function torch could not package on a system, so that
                             precompile leaves it out at once (revision 0010)
``compile_claims``           none: a lease on an entry one process of the fleet is compiling,
                             on a shared database (revision 0012)
``compile_waits``            none: a compile a process did not run, having waited for another
                             process's entry (revision 0012)
``key_factors``              none: one factor of a key torch computed (name, hash, readable
                             value), shared by the keys that hashed it (revision 0013)
``entry_factors``            none: what torch hashed into an FX graph entry's key, factor by
                             factor (``compiled_fx_graph_hash``'s debug lines), revision 0013
``cache_misses``             none: the last ``CACHEDB_MISS_LOG`` lookups that missed, with their
                             factors (revision 0013)
===========================  ==================================================================

What each column holds is documented on its typed ORM class in :mod:`cachedb.store.models`, which
maps these tables (``__table__``). They are Core tables so that a compiling process, whose
hot paths run prebuilt Core statements (the repositories' lookups, puts and records), loads
neither ``sqlalchemy.orm`` nor the mappers: ``import cachedb`` and the live seams import this
module, not :mod:`cachedb.store.models` (~0.1 s less per compiling process on a 2-core VM).

Views (created by the migrations, see :data:`VIEW_NAMES`): ``autotune_current``,
``autotune_winners``, ``autotune_history`` (revision 0001; each choice's name, backend,
description and config beside its hash since revision 0011), ``kernels`` (revision 0003),
``autotune_timings`` (revision 0004: the timings flat, as the table of that name held them),
``entry_value`` (revision 0014: each FX graph and AOTAutograd variant's compile seconds, hits,
seconds saved and bytes).

Timestamps are timezone-aware UTC. Payload columns hold zstd frames; sizes are bytes of the
uncompressed payload; ``checksum`` is the SHA-256 hex digest of the uncompressed payload.
"""

from __future__ import annotations

import datetime as dt

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

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: Kinds of guarded entries, named after their directory under ``cache_dir()``.
GUARDED_KINDS = ("fxgraph", "aotautograd")

#: Kinds of kernel artifacts: Triton's cache directories and C++ kernel libraries.
ARTIFACT_KINDS = ("triton", "cpp")

#: Natural-key columns of the tables that ``cachedb copy`` / merge and the remote tier match by
#: key rather than by a newest-wins row (:mod:`cachedb.fleet.copy`, :mod:`cachedb.fleet.tier_sync`).
NATURAL_KEY_COLUMNS = {
    "autotune_choices": ("choice_hash",),
    "kernel_artifacts": ("kind", "host_key", "key", "name"),
    "guarded_entries": ("kind", "key", "variant"),
    "quarantined_entries": ("kind", "key", "variant", "checksum", "quarantined_at"),
}
#: Columns compared to tell whether a newest-wins row (the same key on both sides) changed.
NEWEST_WINS_COMPARED = {
    "local_cache_values": ("value_json",), "best_configs": ("content",), "pgo_profiles": ("checksum",),
    "dynamo_packages": ("checksum",), "precompile_refusals": ("checksum",),
}

#: Dynamo's own caches, by their Mega-Cache artifact type (torch/compiler/_cache.py), and
#: cachedb's record of the functions torch could not package (``precompile_refusal``, no file
#: or artifact of torch's): the table of each (:mod:`cachedb.repositories.dynamo`). One row per
#: key, the newer ``updated_at`` wins.
DYNAMO_TABLES = {"pgo": "pgo_profiles", "precompile": "dynamo_packages", "precompile_refusal": "precompile_refusals"}


def utcnow() -> dt.datetime:
    """The current time, timezone-aware UTC (the value every timestamp column gets)."""
    return dt.datetime.now(dt.timezone.utc)


#: Every table of the schema (the views are not in it); :class:`cachedb.store.models.Base` maps it.
metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _utc_timestamp(name: str, *, index: bool | None = None) -> Column[dt.datetime]:
    return Column(name, DateTime(timezone=True), nullable=False, default=utcnow, index=index)


system_fingerprints = Table(
    "system_fingerprints",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("fingerprint_key", String(64), nullable=False, unique=True),
    Column("system_hash", String(64), nullable=False, index=True),
    Column("system_json", Text, nullable=False),
    Column("device_name", String(256)),
    Column("triton_key", String(256)),
    Column("cuda_version", String(32)),
    Column("hip_version", String(64)),
    Column("torch_version", String(64)),
    Column("torch_key", String(64)),
    Column("cpu_model", String(256)),
    Column("isa", String(64)),
    _utc_timestamp("created_at"),
)

guarded_entries = Table(
    "guarded_entries",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("kind", String(16), nullable=False),
    Column("key", String(128), nullable=False),
    Column("variant", String(64), nullable=False),
    Column("guards_expr", Text),
    Column("guards_known", Boolean, nullable=False, default=True),
    Column("guards_note", Text),
    Column("payload", LargeBinary, nullable=False),
    Column("size_bytes", BigInteger, nullable=False),
    Column("checksum", String(64), nullable=False),
    Column("time_taken_ns", BigInteger),
    _utc_timestamp("created_at"),
    _utc_timestamp("last_used_at", index=True),
    Column("hit_count", Integer, nullable=False, default=0),
    Column("fingerprint_id", Integer, ForeignKey("system_fingerprints.id", ondelete="SET NULL"), index=True),
    Column("signature", String(64)),
    Column("ed25519_signature", Text),
    UniqueConstraint("kind", "key", "variant", name="uq_guarded_entries_kind_key_variant"),
)

autotune_keys = Table(
    "autotune_keys",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("fingerprint_id", Integer, ForeignKey("system_fingerprints.id", ondelete="CASCADE"), nullable=False),
    Column("op", String(256), nullable=False),
    Column("inputs", Text, nullable=False),
    Column("hint_override", BigInteger),
    Column("precision", String(64), nullable=False),
    Index("ix_autotune_keys_lookup", "fingerprint_id", "op", "inputs", "precision"),
)

autotune_runs = Table(
    "autotune_runs",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("key_id", Integer, ForeignKey("autotune_keys.id", ondelete="CASCADE"), nullable=False),
    _utc_timestamp("recorded_at"),
    Index("ix_autotune_runs_key_id", "key_id", "recorded_at"),
)

autotune_run_timings = Table(
    "autotune_run_timings",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("run_id", Integer, ForeignKey("autotune_runs.id", ondelete="CASCADE"), nullable=False),
    Column("choice_hash", Text, nullable=False),
    Column("timing_ms", Float, nullable=False),
    Column("position", BigInteger, nullable=False, index=True),
    Column("ed25519_signature", Text),
    Index("ix_autotune_run_timings_run_id", "run_id"),
)

#: What torch says of each autotune choice (revision 0011), keyed by the choice hash the timings
#: name (``ChoiceCaller.hash_key()``): its ``name``, ``description`` and ``info_dict()``
#: (torch/_inductor/ir.py ``ChoiceCaller``; torch/_inductor/select_algorithm.py
#: ``TritonTemplateCaller.info_dict``, ``ExternKernelCaller.info_dict``), the whole
#: ``info_dict()`` as JSON and its fields people filter by as columns. Written once per choice
#: by the live path (:mod:`cachedb.live._choices`); a choice whose timings came from Inductor's
#: files has no row (the views then show ``NULL``) until a live tuning describes it.
autotune_choices = Table(
    "autotune_choices",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("choice_hash", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("description", Text),
    Column("backend", Text),
    Column("kernel_name", Text),
    Column("tile_shape", Text),
    Column("num_stages", Integer),
    Column("num_warps", Integer),
    Column("group_m", Integer),
    Column("info_json", Text, nullable=False),
    _utc_timestamp("created_at"),
    Column("ed25519_signature", Text),
    UniqueConstraint("choice_hash", name="uq_autotune_choices_choice_hash"),
)

#: A lease on one entry (``kind``, ``key``: torch's key) a process of the fleet is compiling,
#: held by ``holder`` (host, pid and a random part) and renewed by its heartbeat ``beat_at``
#: (:mod:`cachedb.live._singleflight`; the remote tier's claims). One row per entry.
compile_claims = Table(
    "compile_claims",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("kind", String(32), nullable=False),
    Column("key", String(128), nullable=False),
    Column("holder", String(128), nullable=False),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    _utc_timestamp("claimed_at"),
    _utc_timestamp("beat_at"),
    UniqueConstraint("kind", "key", name="uq_compile_claims_kind"),
)

#: A compile a process did not run: it waited ``seconds`` for the entry another process
#: (``waited_on``: pid and host, or the remote holder) compiled; ``outcome`` ``landed``.
compile_waits = Table(
    "compile_waits",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("kind", String(32), nullable=False, index=True),
    Column("key", String(128), nullable=False),
    Column("seconds", Float, nullable=False),
    Column("outcome", String(16), nullable=False),
    Column("waited_on", String(300), nullable=False),
    _utc_timestamp("waited_at"),
)

#: One factor of a key, shared by every key torch hashed it into: ``factor`` its name
#: (``example_inputs[0]``, ``inductor_config.max_autotune_pointwise``, ...), ``hash`` the
#: first 16 characters of torch's hash of it, ``value`` a short readable form (``float32[64]``,
#: ``False``). One row per distinct (factor, hash).
key_factors = Table(
    "key_factors",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("factor", String(200), nullable=False),
    Column("hash", String(16), nullable=False),
    Column("value", String(200), nullable=False),
    UniqueConstraint("factor", "hash", name="uq_key_factors_factor"),
)

#: What torch hashed into the key of an entry (``kind``, ``key``): ``factor_ids`` the JSON
#: array of its :data:`key_factors` ids, in torch's order. Deleted with the last variant of
#: its key.
entry_factors = Table(
    "entry_factors",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("kind", String(32), nullable=False),
    Column("key", String(128), nullable=False),
    Column("factor_ids", Text, nullable=False),
    UniqueConstraint("kind", "key", name="uq_entry_factors_kind"),
)

#: One lookup that missed: ``outcome`` ``no_entry``, ``guards_failed`` or ``bypass``
#: (``reason``: torch's bypass reason), ``factor_ids`` the JSON array of the
#: :data:`key_factors` ids of the key wanted. A ring: the newest ``CACHEDB_MISS_LOG`` rows.
cache_misses = Table(
    "cache_misses",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("kind", String(32), nullable=False),
    Column("key", String(128), nullable=False),
    Column("outcome", String(16), nullable=False),
    Column("reason", String(300), nullable=False),
    Column("factor_ids", Text, nullable=False),
    _utc_timestamp("missed_at"),
)

local_cache_values = Table(
    "local_cache_values",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("fingerprint_id", Integer, ForeignKey("system_fingerprints.id", ondelete="CASCADE"), nullable=False),
    Column("namespace", String(256), nullable=False, index=True),
    Column("key_path", Text, nullable=False),
    Column("value_json", Text, nullable=False),
    Column("position", BigInteger, nullable=False, index=True),
    _utc_timestamp("updated_at"),
    Column("ed25519_signature", Text),
    UniqueConstraint("fingerprint_id", "key_path", name="uq_local_cache_values_fp_key_path"),
)

best_configs = Table(
    "best_configs",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("key", String(256), nullable=False, unique=True),
    Column("content", Text, nullable=False),
    Column("configs_hash", String(64)),  # not indexed since 0005
    Column("num_warps", Integer),
    Column("num_stages", Integer),
    Column("found_by_coordesc", Boolean),
    Column("time_taken_ms", BigInteger),
    Column("triton_cache_hash", String(128)),
    Column("kernel_kwargs", Text),
    Column("signature", String(64)),
    Column("fingerprint_id", Integer, ForeignKey("system_fingerprints.id", ondelete="SET NULL")),
    _utc_timestamp("created_at"),
    _utc_timestamp("updated_at"),
    Column("ed25519_signature", Text),
)

quarantined_entries = Table(
    "quarantined_entries",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("kind", String(16), nullable=False),
    Column("key", String(128), nullable=False),
    Column("variant", String(64), nullable=False),
    Column("payload", LargeBinary, nullable=False),
    Column("size_bytes", BigInteger, nullable=False),
    Column("checksum", String(64), nullable=False),
    Column("reason", Text, nullable=False),
    _utc_timestamp("quarantined_at"),
)

cutlass_op_lists = Table(
    "cutlass_op_lists",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("request_key", String(64), nullable=False, unique=True),
    Column("arch", Integer),
    Column("cuda_version", String(32)),
    Column("instantiation_level", String(32)),
    Column("op_count", Integer, nullable=False),
    Column("payload", LargeBinary, nullable=False),
    Column("size_bytes", BigInteger, nullable=False),
    Column("checksum", String(64), nullable=False),
    _utc_timestamp("created_at"),
    Column("ed25519_signature", Text),
)

cutlass_ops = Table(
    "cutlass_ops",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("op_list_id", Integer, ForeignKey("cutlass_op_lists.id", ondelete="CASCADE"), nullable=False, index=True),
    Column("position", Integer, nullable=False),
    Column("gemm_kind", String(64)),
    Column("arch", Integer),
    Column("element_a", String(32)),
    Column("element_b", String(32)),
    Column("element_c", String(32)),
    Column("element_d", String(32)),
    Column("element_accumulator", String(32)),
    Column("element_epilogue", String(32)),
    Column("layout_a", String(32)),
    Column("layout_b", String(32)),
    Column("layout_c", String(32)),
    Column("layout_d", String(32)),
    Column("alignment_a", Integer),
    Column("alignment_b", Integer),
    Column("alignment_c", Integer),
    Column("alignment_d", Integer),
    Column("tile_shape", String(32)),
    Column("cluster_shape", String(32)),
    Column("stages", Integer),
    Column("kernel_schedule", String(64)),
    Column("epilogue_schedule", String(64)),
    Column("tile_scheduler", String(64)),
    Column("epilogue_functor", String(64)),
    Column("swizzling_functor", String(64)),
    Index("ix_cutlass_ops_types", "element_a", "element_b", "layout_a", "layout_b"),
)

kernel_blobs = Table(
    "kernel_blobs",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("sha256", String(64), nullable=False, unique=True),
    Column("payload", LargeBinary, nullable=False),
    Column("size_bytes", BigInteger, nullable=False),
    Column("stored_bytes", BigInteger, nullable=False),
    _utc_timestamp("created_at"),
)

kernel_artifacts = Table(
    "kernel_artifacts",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("kind", String(16), nullable=False),
    Column("host_key", String(64), nullable=False, default=""),
    Column("key", String(128), nullable=False),
    Column("name", String(255), nullable=False),
    Column("blob_id", Integer, ForeignKey("kernel_blobs.id", ondelete="RESTRICT"), nullable=False, index=True),
    Column("size_bytes", BigInteger, nullable=False),
    Column("fingerprint_id", Integer, ForeignKey("system_fingerprints.id", ondelete="SET NULL"), index=True),
    _utc_timestamp("created_at"),
    _utc_timestamp("last_used_at", index=True),
    Column("hit_count", Integer, nullable=False, default=0),
    Column("ed25519_signature", Text),
    UniqueConstraint("kind", "host_key", "key", "name", name="uq_kernel_artifacts_kind_host_key_key_name"),
)


def _dynamo_table(name: str, key_length: int) -> Table:
    """A table of one of Dynamo's caches (revision 0006 on): one opaque pickle per key, stored
    as a checksummed payload (:mod:`cachedb.store.payload`) that cachedb never unpickles."""
    return Table(
        name,
        metadata,
        Column("id", Integer, primary_key=True),
        Column("key", String(key_length), nullable=False, unique=True),
        Column("payload", LargeBinary, nullable=False),
        Column("size_bytes", BigInteger, nullable=False),
        Column("checksum", String(64), nullable=False),
        Column("signature", String(64)),
        Column("fingerprint_id", Integer, ForeignKey("system_fingerprints.id", ondelete="SET NULL"), index=True),
        _utc_timestamp("created_at"),
        _utc_timestamp("updated_at"),
        _utc_timestamp("last_used_at", index=True),
        Column("hit_count", Integer, nullable=False, default=0),
        Column("ed25519_signature", Text),
    )


#: Dynamo's PGO profiles (revision 0006): ``dynamo/code_state_<key>.pkl``, keyed by the name
#: torch gives the file (``code_state_path``, torch/_dynamo/pgo.py: the PGO cache key with
#: ``<>:"/\|?*`` made ``_``).
pgo_profiles = _dynamo_table("pgo_profiles", 512)

#: Precompiled Dynamo packages (revision 0007): ``dynamo/<source id>/entry`` of torch's
#: ``DiskDynamoCache``, keyed by the compiled function's source id
#: (``CompilePackage.source_id_from_fn``, torch/_dynamo/package.py).
dynamo_packages = _dynamo_table("dynamo_packages", 128)

#: Functions torch could not package for caching precompile (revision 0010), keyed as their
#: packages would be (the source id and the system tag, :func:`cachedb.keys.package_key`): the
#: payload is cachedb's JSON, what failed and the function's code identity
#: (:mod:`cachedb.live._precompile_fallback`). A warm start with precompile on compiles such a
#: function without a package at once instead of failing to build one again.
precompile_refusals = _dynamo_table("precompile_refusals", 128)


#: Where a row of the local file came from, when it crossed into it from another database (a
#: remote tier's pull, ``cachedb copy``/``merge --require-signed``), revision 0009: ``origin``
#: is ``key:<key id>`` (its Ed25519 signature verified under that trusted key) or ``accepted``
#: (taken unsigned under ``CACHEDB_REMOTE_TRUST=1``). Rows written here have none. A row whose
#: origin the process's trust no longer allows is deleted when a live store opens
#: (:func:`cachedb.fleet.trust.sweep`): a miss, then replaced. ``row_key`` is the row's natural
#: key, a JSON array (:data:`cachedb.fleet.trust.ROW_KEYS`).
row_origins = Table(
    "row_origins",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("table_name", String(32), nullable=False),
    Column("row_key", Text, nullable=False),
    Column("origin", String(64), nullable=False, index=True),
    _utc_timestamp("recorded_at"),
    UniqueConstraint("table_name", "row_key", name="uq_row_origins_table_name_row_key"),
)


#: Views created by the migrations. Every timing flat (0004_compact_timings.py):
#: ``autotune_timings`` (:data:`AUTOTUNE_TIMINGS`). Tuning history (SQL in
#: 0011_choice_descriptions.py; 0001's columns first, as they were):
#: ``autotune_current`` (latest timing of each choice), ``autotune_winners`` (fastest current
#: choice per op, inputs, precision and fingerprint, with the number of candidates and the
#: runner-up) and ``autotune_history`` (every benchmark with its fingerprint: device, torch
#: version, host); each row with its choice's name, backend, description and config
#: (:data:`CHOICE_VIEW_COLUMNS`, ``NULL`` where :data:`autotune_choices` has no row).
#: Kernels (0003_kernel_artifacts.py): ``kernels``, one row per kernel key with its files,
#: bytes (uncompressed and stored), blobs shared with other keys, hits and last use. Entry
#: value (0014_entry_value.py): ``entry_value``, one row per guarded variant with its compile
#: seconds (``time_taken_ns`` / 10^9), hits, seconds saved (compile seconds × hits) and bytes.
VIEW_NAMES = ("autotune_timings", "autotune_current", "autotune_winners", "autotune_history", "kernels",
              "entry_value")

#: The columns of :data:`autotune_choices` the tuning-history views show beside each choice hash
#: (revision 0011), as ``(view column, table column)``.
CHOICE_VIEW_COLUMNS = (
    ("choice_name", "name"), ("backend", "backend"), ("description", "description"),
    ("kernel_name", "kernel_name"), ("tile_shape", "tile_shape"), ("num_stages", "num_stages"),
    ("num_warps", "num_warps"), ("group_m", "group_m"),
)

#: The view ``autotune_timings`` (revision 0004, migrations/versions/0004_compact_timings.py):
#: every timing flat, one row per ``autotune_run_timings`` row with its key's and run's
#: columns, as the table of that name held them before. Reads (SQLite and PostgreSQL inline the
#: join) and ``cachedb copy`` from any revision go through it; writes go to the three tables
#: (:mod:`cachedb.repositories.timings`). Not part of :data:`metadata`: it is no table.
AUTOTUNE_TIMINGS = Table(
    "autotune_timings",
    MetaData(),
    Column("id", Integer, primary_key=True),
    Column("fingerprint_id", Integer, nullable=False),
    Column("op", String(256), nullable=False),
    Column("inputs", Text, nullable=False),
    Column("hint_override", BigInteger),
    Column("precision", String(64), nullable=False),
    Column("choice_hash", Text, nullable=False),
    Column("timing_ms", Float, nullable=False),
    Column("position", BigInteger, nullable=False),
    Column("recorded_at", DateTime(timezone=True), nullable=False),
    Column("ed25519_signature", Text),  # revision 0009
)
