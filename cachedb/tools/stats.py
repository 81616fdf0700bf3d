"""Counts and bytes per cache kind and fingerprint (``cachedb stats``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..repositories.artifacts import KernelArtifactRepository
from ..repositories.compile_claims import CompileWaitRepository
from ..repositories.dynamo import LABELS as DYNAMO_LABELS
from ..repositories.dynamo import table_of
from ..store.tables import DYNAMO_TABLES
from ..store.models import (
    AUTOTUNE_TIMINGS,
    AutotuneChoice,
    BestConfig,
    CutlassOp,
    CutlassOpList,
    GuardedEntry,
    LocalCacheValue,
    SystemFingerprint,
)

COLUMNS = ("kind", "fingerprint", "entries", "bytes", "stored_bytes", "seconds_saved")


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
    ``bytes`` and ``stored_bytes`` 0). ``seconds_saved`` (s): for FX graph and AOTAutograd
    rows, the sum over their entries of the compile time torch recorded (``_time_taken_ns``)
    times the entry's hits; 0 for the other kinds. A last row ``total`` (when there are rows)
    counts the FX graph and AOTAutograd entries and sums their seconds saved."""
    labels = _label(session)
    rows: list[dict[str, Any]] = []

    def add(kind: str, fp: int | None, n: int, raw: int | None, stored: int | None, saved: float = 0.0) -> None:
        rows.append(
            {"kind": kind, "fingerprint": labels.get(fp, f"#{fp}"), "entries": int(n),
             "bytes": int(raw or 0), "stored_bytes": int(stored or 0), "seconds_saved": round(saved, 3)}
        )

    g = GuardedEntry
    saved_ns = func.coalesce(func.sum(func.coalesce(g.time_taken_ns, 0) * g.hit_count), 0)
    total_saved = 0.0
    for kind, fp, n, raw, stored, ns in session.execute(
        select(g.kind, g.fingerprint_id, func.count(), func.sum(g.size_bytes), func.sum(func.length(g.payload)),
               saved_ns)
        .group_by(g.kind, g.fingerprint_id)
        .order_by(g.kind, g.fingerprint_id)
    ):
        add(kind, fp, n, raw, stored, int(ns) / 1e9)
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
    for row in KernelArtifactRepository(session).totals():
        add(f"{row['kind']}_kernel", None, row["keys"], row["size_bytes"], row["stored_bytes"])
    # Dynamo's caches: one row per key (a pickle each)
    for kind in DYNAMO_TABLES:
        d = table_of(kind)
        for fp, n, raw, stored in session.execute(
            select(d.c.fingerprint_id, func.count(), func.sum(d.c.size_bytes), func.sum(func.length(d.c.payload)))
            .group_by(d.c.fingerprint_id)
            .order_by(d.c.fingerprint_id)
        ):
            add(DYNAMO_LABELS[kind], fp, n, raw, stored)
    for kind, (n, _seconds) in sorted(CompileWaitRepository(session).avoided().items()):
        add(f"compiles_avoided:{kind}", None, n, 0, 0)
    if rows:
        add("total", None, sum(r["entries"] for r in rows if r["kind"] in ("fxgraph", "aotautograd")), 0, 0,
            total_saved)
    return rows
