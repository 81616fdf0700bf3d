"""``cachedb verify``: database integrity and payload checksums."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from ._errors import CorruptPayloadError
from ._payload import unpack
from .db import CacheDB
from .models import CutlassOpList, GuardedEntry


def verify(db: CacheDB) -> tuple[list[dict[str, Any]], int]:
    """``(problems, payloads checked)``. Problems are rows ``{what, where, problem}``: the
    SQLite integrity check's complaints and every payload that fails decompression or its
    SHA-256 checksum."""
    problems: list[dict[str, Any]] = []
    checked = 0
    with db.engine.connect() as conn:
        if conn.dialect.name == "sqlite":
            for (line,) in conn.exec_driver_sql("PRAGMA integrity_check"):
                if line != "ok":
                    problems.append({"what": "database", "where": db.where, "problem": line})
        conn.rollback()
    g, c = GuardedEntry.__table__, CutlassOpList.__table__
    with db.read() as repos:
        for kind, key, variant, blob, size, digest in repos.session.execute(
            select(g.c.kind, g.c.key, g.c.variant, g.c.payload, g.c.size_bytes, g.c.checksum).execution_options(
                yield_per=32
            )
        ):
            checked += 1
            where = f"{kind}/{key}/{variant}"
            try:
                unpack(blob, size, digest, where=where)
            except CorruptPayloadError as exc:
                problems.append({"what": kind, "where": where, "problem": exc.reason})
        for key, blob, size, digest in repos.session.execute(
            select(c.c.request_key, c.c.payload, c.c.size_bytes, c.c.checksum)
        ):
            checked += 1
            where = f"configs_{key}.json"
            try:
                unpack(blob, size, digest, where=where)
            except CorruptPayloadError as exc:
                problems.append({"what": "cutlass_op_list", "where": where, "problem": exc.reason})
    return problems, checked
