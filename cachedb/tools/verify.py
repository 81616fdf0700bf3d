"""``cachedb verify``: database integrity, payload checksums and signatures, quarantine."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import DatabaseError

from .._errors import CorruptPayloadError
from ..db import CacheDB
from ..repositories.dynamo import KINDS as DYNAMO_KINDS
from ..store.models import CutlassOpList, GuardedEntry, KernelBlob, QuarantinedEntry


def verify(db: CacheDB, *, quarantine: bool = True) -> tuple[list[dict[str, Any]], int]:
    """See :func:`_verify`; damage that stops SQLite from reading at all is reported as a
    problem of the database rather than raised."""
    try:
        return _verify(db, quarantine=quarantine)
    except (DatabaseError, UnicodeDecodeError) as exc:
        reason = str(getattr(exc, "orig", None) or exc)
        return [{"what": "database", "where": db.where, "problem": f"unreadable: {reason}"}], 0


def _verify(db: CacheDB, *, quarantine: bool = True) -> tuple[list[dict[str, Any]], int]:
    """``(problems, payloads checked)``.

    Problems are rows ``{what, where, problem}``: the SQLite integrity check's complaints,
    every guarded payload that fails decompression, its SHA-256 checksum or (with
    ``CACHEDB_HMAC_KEY`` set) its signature — moved to ``quarantined_entries`` when
    ``quarantine`` is true — every kernel blob whose bytes fail their SHA-256 (quarantined with
    every key directory that uses it), every row of Dynamo's caches (PGO profiles, ...) that
    fails its checks (quarantined), every corrupt CUTLASS op list, and every entry already in
    quarantine (``what`` = ``quarantined <kind>``).
    """
    problems: list[dict[str, Any]] = []
    checked = 0
    with db.engine.connect() as conn:
        if conn.dialect.name == "sqlite":
            for (line,) in conn.exec_driver_sql("PRAGMA integrity_check"):
                if line != "ok":
                    problems.append({"what": "database", "where": db.where, "problem": line})
        conn.rollback()
    g, c = GuardedEntry.__table__, CutlassOpList.__table__
    corrupt: list[tuple[str, str, str, str]] = []
    with db.read() as repos:
        ids = repos.session.execute(select(g.c.kind, g.c.key).distinct()).all()
        for kind, key in ids:
            for variant, load in repos.guarded.raw_candidates(kind, key, full=True):
                checked += 1
                try:
                    load()
                except CorruptPayloadError as exc:
                    corrupt.append((kind, key, variant, exc.reason))
        for key, blob, size, digest in repos.session.execute(
            select(c.c.request_key, c.c.payload, c.c.size_bytes, c.c.checksum)
        ):
            checked += 1
            try:
                repos.cutlass.get(key, full=True)
            except CorruptPayloadError as exc:
                problems.append({"what": "cutlass_op_list", "where": f"configs_{key}.json", "problem": exc.reason})
        bad_blobs = list(repos.artifacts.check_blobs())
        checked += repos.session.execute(select(func.count()).select_from(KernelBlob)).scalar_one()
        bad_dynamo = []  # Dynamo's caches: (kind, key, reason)
        for kind in DYNAMO_KINDS:
            dynamo = repos.dynamo(kind)
            checked += dynamo.count()
            bad_dynamo += [(kind, key, reason) for key, reason in dynamo.check_all()]
    for kind, key, variant, reason in corrupt:
        problems.append({"what": kind, "where": f"{kind}/{key}/{variant}", "problem": reason})
    for digest, reason in bad_blobs:
        problems.append({"what": "kernel_blob", "where": f"kernel blob {digest}", "problem": reason})
    for kind, key, reason in bad_dynamo:
        problems.append({"what": kind, "where": f"{kind}/{key}", "problem": reason})
    if quarantine and (corrupt or bad_blobs or bad_dynamo):
        with db.transaction() as repos:
            for kind, key, variant, reason in corrupt:
                repos.guarded.quarantine(kind, key, variant, reason)
            for digest, reason in bad_blobs:
                repos.artifacts.quarantine_blob(digest, reason)
            quarantined_dynamo = [(kind, key, repos.dynamo(kind).quarantine(key, reason), reason)
                                  for kind, key, reason in bad_dynamo]
        corrupt += [("kernel_blob", digest, "", reason) for digest, reason in bad_blobs]
        corrupt += [(kind, key, variant, reason) for kind, key, variant, reason in quarantined_dynamo if variant is not None]
    q = QuarantinedEntry.__table__
    with db.read() as repos:
        for kind, key, variant, reason, when in repos.session.execute(
            select(q.c.kind, q.c.key, q.c.variant, q.c.reason, q.c.quarantined_at).order_by(q.c.id)
        ):
            if (kind, key, variant, reason) in corrupt:
                continue  # just reported above
            problems.append({"what": f"quarantined {kind}", "where": f"{kind}/{key}/{variant}",
                             "problem": f"{reason} (quarantined {when:%Y-%m-%d %H:%M})"})
    return problems, checked
