"""Datasette metadata for a cachedb database (``cachedb datasette-metadata``).

``datasette cache.db -m meta.json`` then shows every table and view with a description,
column descriptions and units (``ms``, ``ns``, ``bytes``), and canned queries:

- ``winners_per_op``: the winning choice per op, input shape, precision, GPU and torch version
  (``:op`` filters, empty for all);
- ``torch_regressions``: op/shape/precision/device whose winner got slower from torch ``:old``
  to torch ``:new`` (ratio new/old);
- ``largest_entries``: the largest stored entries of every kind (bytes and stored bytes);
- ``stale_fingerprints``: system fingerprints nothing has used for ``:days`` days.

The queries are SQLite (Datasette serves SQLite files only). Nothing here imports Datasette.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .._errors import CacheDBError

#: Units Datasette shows next to values (Pint unit names).
_MS, _NS, _BYTES = "ms", "ns", "bytes"


class MetadataError(CacheDBError):
    """The metadata could not be written or formatted."""


def database_name(location: str | None) -> str:
    """The name Datasette gives the database of ``location``: the file's name without its
    extension (``cache.db`` → ``cache``)."""
    if location is None:
        from ..store.engine import default_location

        location = default_location()
    tail = location.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0]
    return Path(tail).stem or "cachedb"


#: The choice's columns of the tuning-history views (revision 0011).
_CHOICE_COLUMNS = {
    "choice_name": "the choice's name (NULL: no description stored, e.g. imported from Inductor's files)",
    "backend": "Triton, extern, CPP, CUDA (CUTLASS), ...",
    "description": "the choice's description (a Triton template's block sizes, stages, warps)",
    "tile_shape": "Triton (BLOCK_M, BLOCK_K, BLOCK_N); CUTLASS [M, N, K]",
    "num_stages": "pipeline stages", "num_warps": "warps", "group_m": "GROUP_M (-1: none)",
    "kernel_name": "the kernel torch calls",
}

TABLES: dict[str, dict[str, Any]] = {
    "system_fingerprints": {
        "description": "Where entries were produced: Inductor's system hash (GPU, CUDA/HIP, Triton), "
                       "torch version and torch_key, CPU model and ISA. One row per distinct machine/torch build.",
        "columns": {
            "system_hash": "Inductor's CacheBase.get_system() hash (identical on every CPU-only machine)",
            "device_name": "GPU name (empty on CPU-only machines)",
            "torch_version": "torch.__version__ of the process that wrote the entries",
            "cpu_model": "CPU model name (tells CPU machines apart)",
            "isa": "torch.backends.cpu.get_cpu_capability()",
            "fingerprint_key": "SHA-256 of the identifying fields (natural key)",
        },
    },
    "guarded_entries": {
        "description": "FX graph and AOTAutograd cache entries: one compiled variant per row (payload zstd).",
        "columns": {
            "kind": "fxgraph or aotautograd",
            "key": "the cache key torch computes",
            "variant": "leaf file name: sha256 of the payload",
            "guards_expr": "guard expression read from the pickle without executing it (empty: always hits)",
            "size_bytes": "uncompressed payload size",
            "time_taken_ns": "compile time Inductor recorded",
            "hit_count": "hits served by the live backend",
            "last_used_at": "last hit (or write), UTC; eviction removes the least recently used first",
        },
        "units": {"size_bytes": _BYTES, "time_taken_ns": _NS},
    },
    "autotune_keys": {
        "description": "One cache[op][inputs][precision] of one fingerprint: the strings its benchmarks share.",
        "columns": {
            "op": "autotuned op (mm, addmm, linear_unary, ...)",
            "inputs": "input key: per input (device, dtype, *sizes, *strides, offset)",
            "precision": "torch.get_float32_matmul_precision() at tuning time",
        },
    },
    "autotune_runs": {
        "description": "One benchmark of a key's choices.",
        "columns": {"recorded_at": "when it was benchmarked (UTC)"},
    },
    "autotune_run_timings": {
        "description": "The timing of each choice in a run (view autotune_timings shows them flat).",
        "columns": {"choice_hash": "the benchmarked choice (template config or extern kernel)",
                    "timing_ms": "benchmarked time"},
        "units": {"timing_ms": _MS},
    },
    "autotune_choices": {
        "description": "What torch said of each autotune choice at tuning time, once per choice hash: its name, "
                       "description and info_dict(). Timings imported from Inductor's files have none.",
        "columns": {
            "choice_hash": "ChoiceCaller.hash_key(): what the timings name",
            "name": "ChoiceCaller.name (triton_mm_12, _mkl_linear, cpp_CppMicroGemmFP32Vec_0)",
            "description": "ChoiceCaller.description: a Triton template's kwargs (BLOCK_M=64, ..., num_warps=4)",
            "backend": "info_dict()['backend']: Triton, extern, CPP, CUDA (CUTLASS), ROCm, CuteDSL, subgraph",
            "kernel_name": "info_dict()'s kernel_name or kernel_call_name (extern_kernels._mkl_linear)",
            "tile_shape": "info_dict()['tile_shape']: Triton (BLOCK_M, BLOCK_K, BLOCK_N); CUTLASS [M, N, K]",
            "num_stages": "info_dict()['num_stages']",
            "num_warps": "info_dict()['num_warps']",
            "group_m": "info_dict()['GROUP_M'] (-1: none)",
            "info_json": "the whole info_dict() as JSON",
        },
    },
    "autotune_timings": {
        "description": "View: every autotune benchmark flat, cache[op][inputs][precision][choice] = ms. "
                       "A re-benchmark adds a row; the latest row of a choice is its current value.",
        "columns": {
            "op": "autotuned op (mm, addmm, linear_unary, ...)",
            "inputs": "input key: per input (device, dtype, *sizes, *strides, offset)",
            "precision": "torch.get_float32_matmul_precision() at tuning time",
            "choice_hash": "the benchmarked choice (template config or extern kernel)",
            "timing_ms": "benchmarked time",
            "recorded_at": "when it was benchmarked (UTC)",
        },
        "units": {"timing_ms": _MS},
    },
    "local_cache_values": {
        "description": "Other LocalCache values (pad_mm decisions, runtime estimates, ...) under their key path.",
    },
    "best_configs": {
        "description": "Autotune best configs (<k[1:3]>/<name>.best_config), one per Triton kernel.",
        "columns": {
            "key": "<k[1:3]>/<name>.best_config, relative to the cache dir",
            "kernel_kwargs": "block sizes of the chosen config (JSON)",
            "found_by_coordesc": "found by coordinate descent (else by autotuning)",
            "time_taken_ms": "tuning time Inductor recorded",
        },
        "units": {"time_taken_ms": _MS},
    },
    "cutlass_op_lists": {
        "description": "CUTLASS op lists (configs_<request key>.json), payload zstd.",
        "units": {"size_bytes": _BYTES},
    },
    "cutlass_ops": {"description": "One row per op of a CUTLASS op list, with the fields users filter by."},
    "kernel_blobs": {
        "description": "Content-addressed bytes of kernel files (one copy per SHA-256).",
        "columns": {"size_bytes": "uncompressed size", "stored_bytes": "size of the zstd frame"},
        "units": {"size_bytes": _BYTES, "stored_bytes": _BYTES},
    },
    "kernel_artifacts": {
        "description": "Files of compiled kernels: Triton cache directories and C++ kernel libraries, by key.",
        "columns": {"hit_count": "directories served by the live backend", "host_key": "C++: hosts that can load it"},
        "units": {"size_bytes": _BYTES},
    },
    "quarantined_entries": {
        "description": "Entries whose payload failed its checksum or signature: never served, kept for inspection.",
        "units": {"size_bytes": _BYTES},
    },
    "pgo_profiles": {
        "description": "Dynamo's PGO profiles (dynamo/code_state_<key>.pkl): which dimensions turned out "
                       "dynamic, per PGO cache key; the pickle as torch wrote it (never unpickled by cachedb).",
        "columns": {"key": "the PGO cache key as torch's file name holds it (job id, rank, tag)",
                    "hit_count": "processes served", "updated_at": "the newer of two profiles of a key wins"},
        "units": {"size_bytes": _BYTES},
    },
    "dynamo_packages": {
        "description": "Precompiled Dynamo packages (dynamo/<source id>/entry, torch's caching precompile): "
                       "Dynamo's output and the backends it needs, per compiled function; never unpickled by cachedb.",
        "columns": {"key": "the compiled function's source id (SHA-256 of its qualified name and first line)",
                    "hit_count": "processes served", "updated_at": "the newer of two packages of a key wins"},
        "units": {"size_bytes": _BYTES},
    },
    "precompile_refusals": {
        "description": "Functions torch could not package for caching precompile on a system: a warm start "
                       "compiles them without a package at once. The payload is JSON: the function, the error, "
                       "its code identity.",
        "columns": {"key": "the function's source id and system tag, as its package would be keyed",
                    "hit_count": "processes served", "updated_at": "the newer of two refusals of a key wins"},
        "units": {"size_bytes": _BYTES},
    },
    "compile_claims": {
        "description": "Leases on entries one process of the fleet is compiling (a shared database's): the "
                       "others wait for the entry instead of compiling it too; a lease not renewed for 5 s is "
                       "free to take.",
        "columns": {"holder": "host:pid:random of the process compiling", "beat_at": "its last heartbeat"},
    },
    "compile_waits": {
        "description": "Compiles a process did not run: it waited for the entry another process compiled "
                       "(cachedb stats: compiles_avoided).",
        "columns": {"seconds": "seconds it waited", "waited_on": "the process it waited for",
                    "outcome": "landed: served the entry"},
        "units": {"seconds": "s"},
    },
    "key_factors": {
        "description": "One factor of the keys torch computed (what compiled_fx_graph_hash or autograd_cache_key "
                       "hashed: the graph's code, each input, each fx kwarg, each Inductor or functorch config, "
                       "torch's key, the system), shared by every key that hashed it.",
        "columns": {"factor": "example_inputs[0], inductor_config.max_autotune_pointwise, gm, ...",
                    "hash": "the first 16 characters of torch's hash of the factor",
                    "value": "a short readable form: float32[64], False"},
    },
    "entry_factors": {
        "description": "What torch hashed into each stored entry's key: the JSON array of its key_factors ids "
                       "(json_each(factor_ids) joins them). Deleted with the entry.",
        "columns": {"factor_ids": "JSON array of key_factors.id, in torch's order"},
    },
    "cache_misses": {
        "description": "The newest lookups that missed (CACHEDB_MISS_LOG, 1000), with the factors of the key "
                       "wanted: what cachedb misses explains.",
        "columns": {"outcome": "no_entry, guards_failed, bypass or (timings) new_choices",
                    "reason": "torch's bypass reason",
                    "factor_ids": "JSON array of key_factors.id of the key wanted"},
    },
    "row_origins": {
        "description": "In a machine's file: the rows that crossed in from another database (a remote tier's "
                       "pull, copy/merge --require-signed) and who vouched for them.",
        "columns": {"row_key": "the row's natural key (JSON array)",
                    "origin": "key:<key id> of the trusted Ed25519 key that verified it, or accepted (unsigned, "
                              "taken under CACHEDB_REMOTE_TRUST=1)"},
    },
    "alembic_version": {"description": "Schema revision (Alembic).", "hidden": True},
    # views
    "autotune_current": {
        "description": "View: the current timing of each choice (its latest benchmark), with the choice's name, "
                       "backend, description and config (NULL where none is stored).",
        "columns": _CHOICE_COLUMNS,
        "units": {"timing_ms": _MS},
    },
    "autotune_winners": {
        "description": "View: the fastest current choice per op, inputs, precision and fingerprint, "
                       "with the number of candidates benchmarked, the choice's name and config, and the runner-up.",
        "columns": {"candidates": "choices benchmarked for this op/inputs/precision on this fingerprint",
                    "runner_up_choice_hash": "the second fastest choice", "runner_up_name": "its name",
                    "runner_up_ms": "its current timing", **_CHOICE_COLUMNS},
        "units": {"timing_ms": _MS, "runner_up_ms": _MS},
    },
    "autotune_history": {
        "description": "View: every benchmark with its fingerprint (device, CUDA/HIP, Triton, torch version, host) "
                       "and its choice's name and config: timings over time, GPUs and torch versions.",
        "columns": _CHOICE_COLUMNS,
        "units": {"timing_ms": _MS},
    },
    "kernels": {
        "description": "View: one row per kernel key: files, bytes (uncompressed) and stored bytes, "
                       "files sharing a blob with another key, hits and last use.",
        "units": {"size_bytes": _BYTES, "stored_bytes": _BYTES},
    },
    "entry_value": {
        "description": "View: one row per FX graph / AOTAutograd variant: the compile time torch recorded, "
                       "its hits, the compile seconds they saved and its bytes.",
        "columns": {"compile_seconds": "the compile time torch recorded (_time_taken_ns), NULL where none",
                    "hits": "serves of this variant",
                    "seconds_saved": "compile_seconds x hits (0 where the compile time is unknown)",
                    "stored_bytes": "the compressed payload the database holds (what prune --max-bytes counts)"},
        "units": {"compile_seconds": "s", "seconds_saved": "s", "size_bytes": _BYTES, "stored_bytes": _BYTES},
    },
}

QUERIES: dict[str, dict[str, Any]] = {
    "winners_per_op": {
        "title": "Winners per op",
        "description": "The winning choice per op, input shape, precision, GPU and torch version, with its name, "
                       "backend and config, its time (ms), the runner-up and the number of candidates. op: one op "
                       "(e.g. mm), empty for all.",
        "sql": """SELECT op, inputs, precision, device_name, torch_version, choice_name AS winner, backend,
       description, tile_shape, num_stages, num_warps, timing_ms, runner_up_name, runner_up_ms, candidates,
       choice_hash, recorded_at
FROM autotune_winners
WHERE (:op = '' OR op = :op)
ORDER BY op, inputs, precision, device_name, torch_version""",
    },
    "torch_regressions": {
        "title": "Regressions between two torch versions",
        "description": "Op, input shape, precision and device whose winning time (ms) is slower under torch "
                       ":new than under torch :old (e.g. old=2.11.0, new=2.13.0); ratio = new / old.",
        "sql": """SELECT o.op, o.inputs, o.precision, o.device_name,
       o.choice_hash AS old_winner, o.choice_name AS old_winner_name, o.timing_ms AS old_ms,
       n.choice_hash AS new_winner, n.choice_name AS new_winner_name, n.timing_ms AS new_ms,
       ROUND(n.timing_ms / o.timing_ms, 3) AS ratio
FROM autotune_winners o
JOIN autotune_winners n
  ON n.op = o.op AND n.inputs = o.inputs AND n.precision = o.precision
 AND n.hint_override IS o.hint_override AND n.device_name IS o.device_name
WHERE o.torch_version = :old AND n.torch_version = :new AND n.timing_ms > o.timing_ms
ORDER BY ratio DESC, o.op, o.inputs""",
    },
    "largest_entries": {
        "title": "Largest entries",
        "description": "The 100 largest stored entries of every kind: FX graph and AOTAutograd entries, "
                       "kernels (whole key directories), CUTLASS op lists; bytes uncompressed and stored.",
        "sql": """SELECT kind, key, detail, size_bytes, stored_bytes FROM (
  SELECT kind, key, variant AS detail, size_bytes, LENGTH(payload) AS stored_bytes FROM guarded_entries
  UNION ALL
  SELECT kind || '_kernel', key, files || ' files', size_bytes, stored_bytes FROM kernels
  UNION ALL
  SELECT 'cutlass_op_list', request_key, op_count || ' ops', size_bytes, LENGTH(payload) FROM cutlass_op_lists
)
ORDER BY stored_bytes DESC, size_bytes DESC
LIMIT 100""",
        "units": {"size_bytes": _BYTES, "stored_bytes": _BYTES},
    },
    "stale_fingerprints": {
        "title": "Stale fingerprints",
        "description": "System fingerprints whose entries (guarded entries, kernels, timings, best configs, "
                       "LocalCache values) nobody used or wrote for more than :days days, or that hold nothing.",
        "sql": """SELECT f.id, f.system_hash, f.device_name, f.torch_version, f.cpu_model,
       u.entries, u.last_used_at,
       ROUND(julianday('now') - julianday(u.last_used_at), 1) AS days_unused
FROM system_fingerprints f
LEFT JOIN (
  SELECT fingerprint_id, COUNT(*) AS entries, MAX(t) AS last_used_at FROM (
    SELECT fingerprint_id, last_used_at AS t FROM guarded_entries
    UNION ALL SELECT fingerprint_id, last_used_at FROM kernel_artifacts
    UNION ALL SELECT fingerprint_id, recorded_at FROM autotune_timings
    UNION ALL SELECT fingerprint_id, updated_at FROM best_configs
    UNION ALL SELECT fingerprint_id, updated_at FROM local_cache_values
    UNION ALL SELECT fingerprint_id, last_used_at FROM pgo_profiles
    UNION ALL SELECT fingerprint_id, last_used_at FROM dynamo_packages
  ) WHERE fingerprint_id IS NOT NULL GROUP BY fingerprint_id
) u ON u.fingerprint_id = f.id
WHERE u.last_used_at IS NULL OR julianday('now') - julianday(u.last_used_at) > CAST(:days AS REAL)
ORDER BY u.last_used_at""",
    },
}


def metadata(database: str = "cache") -> dict[str, Any]:
    """Datasette's metadata document for a cachedb database Datasette names ``database``."""
    from .._version import __version__

    return {
        "title": "cachedb: PyTorch Inductor's caches",
        "description": "Inductor's caches in one SQLite database: FX graph and AOTAutograd entries, autotune "
                       "timings and their history, best configs, CUTLASS op lists, kernels. Times in ms "
                       "(ns where named), sizes in bytes; timestamps UTC.",
        "source": f"cachedb {__version__}",
        "databases": {
            database: {
                "description": "A cachedb database. Start with the views autotune_winners, autotune_history "
                               "and kernels, or the canned queries.",
                "tables": {name: dict(spec) for name, spec in TABLES.items()},
                "queries": {name: dict(spec) for name, spec in QUERIES.items()},
            }
        },
    }


def dump(document: dict[str, Any], fmt: str = "json") -> str:
    """``document`` as JSON (default) or YAML (needs PyYAML, which Datasette installs)."""
    if fmt == "json":
        return json.dumps(document, indent=2) + "\n"
    if fmt == "yaml":
        try:
            import yaml
        except ImportError as exc:
            raise MetadataError("YAML output needs PyYAML (pip install pyyaml), or use --format json") from exc
        return str(yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=100))
    raise MetadataError(f"unknown format {fmt!r}: json or yaml")


def write(document: str, out: str | os.PathLike[str]) -> Path:
    """Write ``document`` to ``out`` and return its absolute path."""
    path = Path(out).expanduser().resolve()
    try:
        path.write_text(document, encoding="utf-8")
    except OSError as exc:
        raise MetadataError(f"{out}: cannot write: {exc.strerror or exc}") from exc
    return path
