"""Counts and bytes per cache kind and fingerprint (``cachedb stats``), as rows or in
Prometheus' text exposition format (``cachedb stats --format prometheus``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..repositories.artifacts import KernelArtifactRepository
from ..repositories.compile_claims import CompileWaitRepository
from ..repositories.dynamo import LABELS as DYNAMO_LABELS
from ..repositories.dynamo import table_of
from ..repositories.factors import OUTCOMES, OUTCOMES_OF
from ..store.tables import DYNAMO_TABLES
from ..store.models import (
    AUTOTUNE_TIMINGS,
    AutotuneChoice,
    BestConfig,
    CacheMiss,
    CutlassOp,
    CutlassOpList,
    GuardedEntry,
    KernelArtifact,
    LocalCacheValue,
    SystemFingerprint,
)

COLUMNS = ("kind", "fingerprint", "entries", "bytes", "stored_bytes", "hits", "seconds_saved")


def _label(session: Session) -> dict[int | None, str]:
    labels: dict[int | None, str] = {None: "-"}
    for fp in session.execute(select(SystemFingerprint)).scalars():
        parts = [f"#{fp.id} {fp.system_hash[:8]}"]
        parts += [p for p in (fp.device_name, fp.torch_version, fp.cpu_model) if p]
        labels[fp.id] = " ".join(parts)
    return labels


def collect(session: Session) -> list[dict[str, Any]]:
    """Rows of ``kind, fingerprint, entries, bytes, stored_bytes``: ``bytes`` is the
    uncompressed size of payloads (or of the JSON for timings, values and configs) and
    ``stored_bytes`` what the database holds for them (compressed payloads). Kernel rows
    (``triton_kernel``, ``cpp_kernel``) count key directories; their ``bytes`` are the files'
    sizes and ``stored_bytes`` the compressed distinct blobs they use. Dynamo's caches
    (``pgo_profile``, ...) count one row per key, ``bytes`` their pickles. ``autotune_choice``
    counts the described choices (``bytes``: their ``info_dict()`` JSON and descriptions).
    ``compiles_avoided:<kind>`` counts the compiles of FX graph and AOTAutograd entries a
    process did not run, having waited for another process's (:mod:`cachedb.live._singleflight`;
    ``bytes`` and ``stored_bytes`` 0). ``hits``: the serves counted on the stored entries of
    the kinds that count them (FX graph and AOTAutograd variants, kernel key directories,
    Dynamo's caches), 0 for the others. ``seconds_saved`` (s): for FX graph and AOTAutograd
    rows, the sum over their entries of the compile time torch recorded (``_time_taken_ns``)
    times the entry's hits; 0 for the other kinds. A last row ``total`` (when there are rows)
    sums the rows of what is stored (entries, bytes, stored bytes, hits and seconds saved; not
    the ``compiles_avoided`` rows, nor ``cutlass_op``, whose ops are in the op lists' bytes)."""
    labels = _label(session)
    rows: list[dict[str, Any]] = []

    def add(kind: str, fp: int | None, n: int, raw: int | None, stored: int | None, saved: float = 0.0,
            hits: int | None = 0) -> None:
        rows.append(
            {"kind": kind, "fingerprint": labels.get(fp, f"#{fp}"), "entries": int(n),
             "bytes": int(raw or 0), "stored_bytes": int(stored or 0), "hits": int(hits or 0),
             "seconds_saved": round(saved, 3)}
        )

    g = GuardedEntry
    saved_ns = func.coalesce(func.sum(func.coalesce(g.time_taken_ns, 0) * g.hit_count), 0)
    total_saved = 0.0
    for kind, fp, n, raw, stored, ns, hits in session.execute(
        select(g.kind, g.fingerprint_id, func.count(), func.sum(g.size_bytes), func.sum(func.length(g.payload)),
               saved_ns, func.sum(g.hit_count))
        .group_by(g.kind, g.fingerprint_id)
        .order_by(g.kind, g.fingerprint_id)
    ):
        add(kind, fp, n, raw, stored, int(ns) / 1e9, hits)
        total_saved += int(ns) / 1e9
    t = AUTOTUNE_TIMINGS.c  # the flat view
    for fp, n in session.execute(
        select(t.fingerprint_id, func.count()).group_by(t.fingerprint_id).order_by(t.fingerprint_id)
    ):
        add("autotune_timings", fp, n, None, None)
    c = AutotuneChoice
    for n, raw in session.execute(
        select(func.count(), func.sum(func.length(c.info_json) + func.coalesce(func.length(c.description), 0)))
        .having(func.count() > 0)
    ):
        add("autotune_choice", None, n, raw, raw)
    v = LocalCacheValue
    for fp, n, raw in session.execute(
        select(v.fingerprint_id, func.count(), func.sum(func.length(v.value_json)))
        .group_by(v.fingerprint_id)
        .order_by(v.fingerprint_id)
    ):
        add("local_cache_values", fp, n, raw, raw)
    b = BestConfig
    for fp, n, raw in session.execute(
        select(b.fingerprint_id, func.count(), func.sum(func.length(b.content))).group_by(b.fingerprint_id)
    ):
        add("best_config", fp, n, raw, raw)
    c = CutlassOpList
    for n, raw, stored in session.execute(
        select(func.count(), func.sum(c.size_bytes), func.sum(func.length(c.payload))).having(func.count() > 0)
    ):
        add("cutlass_op_list", None, n, raw, stored)
    n_ops = session.execute(select(func.count()).select_from(CutlassOp)).scalar_one()
    if n_ops:
        add("cutlass_op", None, n_ops, None, None)
    # Kernel artifacts: entries = key directories; stored_bytes = their distinct blobs (a blob
    # shared by both kinds counts in each).
    kernel_hits = _kernel_hits(session)
    for row in KernelArtifactRepository(session).totals():
        add(f"{row['kind']}_kernel", None, row["keys"], row["size_bytes"], row["stored_bytes"],
            hits=kernel_hits.get(row["kind"], 0))
    # Dynamo's caches: one row per key (a pickle each)
    for kind in DYNAMO_TABLES:
        d = table_of(kind)
        for fp, n, raw, stored, hits in session.execute(
            select(d.c.fingerprint_id, func.count(), func.sum(d.c.size_bytes), func.sum(func.length(d.c.payload)),
                   func.sum(d.c.hit_count))
            .group_by(d.c.fingerprint_id)
            .order_by(d.c.fingerprint_id)
        ):
            add(DYNAMO_LABELS[kind], fp, n, raw, stored, hits=hits)
    for kind, (n, _seconds) in sorted(CompileWaitRepository(session).avoided().items()):
        add(f"compiles_avoided:{kind}", None, n, 0, 0)
    if rows:
        stored = [r for r in rows if r["kind"] not in TOTAL_SKIPS and not r["kind"].startswith("compiles_avoided:")]
        add("total", None, sum(r["entries"] for r in stored), sum(r["bytes"] for r in stored),
            sum(r["stored_bytes"] for r in stored), total_saved, sum(r["hits"] for r in stored))
    return rows


#: Rows the ``total`` row leaves out: they count what other rows hold (the ops of the CUTLASS
#: op lists).
TOTAL_SKIPS = ("cutlass_op",)


def _kernel_hits(session: Session) -> dict[str, int]:
    """Per kernel kind, the serves of its key directories (each file of a directory carries the
    directory's count: the largest is taken per directory)."""
    a = KernelArtifact
    per_key = (select(a.kind, func.max(a.hit_count).label("hits"))
               .group_by(a.kind, a.host_key, a.key).subquery())
    return {str(kind): int(n or 0) for kind, n in session.execute(
        select(per_key.c.kind, func.sum(per_key.c.hits)).group_by(per_key.c.kind))}


def misses(session: Session) -> dict[tuple[str, str], int]:
    """``{(kind, outcome): lookups}`` of the miss log (``cache_misses``: the newest
    ``CACHEDB_MISS_LOG`` lookups that missed, so these fall as older misses leave it), every
    outcome of :data:`~cachedb.repositories.factors.OUTCOMES` for ``fxgraph`` (the kind
    logged) and for each kind logged (a kind of ``OUTCOMES_OF``: its own outcomes), 0 where
    none missed so."""
    m = CacheMiss
    counted = {(str(kind), str(outcome)): int(n) for kind, outcome, n in session.execute(
        select(m.kind, m.outcome, func.count()).group_by(m.kind, m.outcome))}
    kinds = sorted({"fxgraph"} | {kind for kind, _ in counted})
    out = {}
    for kind in kinds:
        known = OUTCOMES_OF.get(kind, OUTCOMES)
        for outcome in list(known) + sorted({o for k, o in counted if k == kind} - set(known)):
            out[(kind, outcome)] = counted.get((kind, outcome), 0)
    return out


#: The metrics of :func:`prometheus`: ``(name, row column, help)``, one sample per stats row.
METRICS = (
    ("cachedb_entries", "entries", "Entries stored (kernels: key directories; compiles_avoided: waits that were "
                                   "served another process's compile)."),
    ("cachedb_bytes", "bytes", "Uncompressed bytes of the stored payloads (timings, values, configs: their JSON)."),
    ("cachedb_stored_bytes", "stored_bytes", "Bytes the database holds for them (compressed payloads)."),
    ("cachedb_hits", "hits", "Serves counted on the entries stored (falls when entries are evicted)."),
    ("cachedb_seconds_saved", "seconds_saved", "Compile seconds saved: the compile time torch recorded times "
                                               "the hits, summed over the stored FX graph and AOTAutograd entries."),
)


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def prometheus(session: Session) -> str:
    """The counters of :func:`collect` and :func:`misses` in Prometheus' text exposition format
    (version 0.0.4: ``# HELP`` and ``# TYPE`` lines, label values escaped), for node_exporter's
    textfile collector. One sample per kind and fingerprint of :data:`METRICS` (the
    ``fingerprint`` label is ``collect``'s, ``""`` for kinds without one); the kinds
    ``compiles_avoided:<kind>`` become ``cachedb_compiles_avoided{kind}``, the ``total`` row is
    left out (``sum()`` over the FX graph and AOTAutograd series gives it);
    ``cachedb_misses{kind, outcome}`` counts the miss log. Every metric is a gauge: eviction
    lowers hits and seconds saved, and the miss log keeps only the newest lookups."""
    rows = [r for r in collect(session) if r["kind"] != "total"]
    stored = [r for r in rows if not r["kind"].startswith("compiles_avoided:")]
    avoided = [r for r in rows if r["kind"].startswith("compiles_avoided:")]
    lines: list[str] = []

    def family(name: str, help_text: str, samples: list[tuple[dict[str, str], float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} gauge")
        for labels, value in samples:
            text = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{text}}} {_number(value)}")

    def fingerprint(row: dict[str, Any]) -> str:
        return "" if row["fingerprint"] == "-" else str(row["fingerprint"])

    for name, column, help_text in METRICS:
        family(name, help_text, [({"kind": r["kind"], "fingerprint": fingerprint(r)}, r[column]) for r in stored])
    family("cachedb_compiles_avoided", "Compiles of FX graph and AOTAutograd entries a process did not run, having "
           "waited for another process's.", [({"kind": r["kind"].split(":", 1)[1]}, r["entries"]) for r in avoided])
    family("cachedb_misses", "Lookups that missed in the miss log (the newest CACHEDB_MISS_LOG), by outcome: "
           "no_entry, guards_failed, bypass, new_choices (timings).",
           [({"kind": kind, "outcome": outcome}, n) for (kind, outcome), n in misses(session).items()])
    return "\n".join(lines) + "\n"
