"""Compile claims (leases on entries being compiled, on a shared database) and the compile
waits a database records (:mod:`cachedb.live._singleflight`)."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from sqlalchemy import and_, delete, func, insert, or_, select, update

from ..store.tables import compile_claims as _C
from ..store.tables import compile_waits as _W
from ..store.tables import utcnow

if TYPE_CHECKING:
    from sqlalchemy import Connection
    from sqlalchemy.orm import Session


class CompileClaimRepository:
    """Leases on entries being compiled (``compile_claims``): one row per ``(kind, key)``."""

    def __init__(self, session: Session | Connection) -> None:
        self.session = session

    def claim(self, kind: str, key: str, holder: str, host: str, pid: int, *, stale_s: float) -> str:
        """Take the lease of ``kind``/``key`` for ``holder`` if it is free (no row, or a row
        whose heartbeat is older than ``stale_s`` seconds); returns the holder it has now
        (``holder`` itself when taken). Run it in its own transaction."""
        now = utcnow()
        stale = now - dt.timedelta(seconds=stale_s)
        found = self.session.execute(
            select(_C.c.id, _C.c.holder, _C.c.beat_at).where(_C.c.kind == kind, _C.c.key == key)
            .with_for_update()).first()
        if found is None:
            self.session.execute(insert(_C).values(kind=kind, key=key, holder=holder, host=host, pid=pid,
                                                   claimed_at=now, beat_at=now))
            return holder
        row_id, current, beat_at = found
        if beat_at.tzinfo is None:
            beat_at = beat_at.replace(tzinfo=dt.timezone.utc)
        if current == holder or beat_at < stale:
            self.session.execute(update(_C).where(_C.c.id == row_id).values(
                holder=holder, host=host, pid=pid, claimed_at=now, beat_at=now))
            return holder
        return str(current)

    def holder(self, kind: str, key: str, *, stale_s: float) -> str | None:
        """The holder of a live lease on ``kind``/``key`` (heartbeat within ``stale_s``
        seconds), else ``None``."""
        stale = utcnow() - dt.timedelta(seconds=stale_s)
        found = self.session.execute(select(_C.c.holder, _C.c.beat_at).where(
            _C.c.kind == kind, _C.c.key == key)).first()
        if found is None:
            return None
        beat_at = found[1] if found[1].tzinfo is not None else found[1].replace(tzinfo=dt.timezone.utc)
        return str(found[0]) if beat_at >= stale else None

    def beat(self, holder: str, claims: list[tuple[str, str]]) -> int:
        """Renew ``holder``'s leases on ``claims`` (``(kind, key)``); returns how many it held."""
        if not claims:
            return 0
        which = or_(*(and_(_C.c.kind == k, _C.c.key == key) for k, key in claims))
        return int(self.session.execute(update(_C).where(_C.c.holder == holder, which)
                                        .values(beat_at=utcnow())).rowcount or 0)

    def release(self, holder: str, kind: str, key: str) -> None:
        """Give up ``holder``'s lease on ``kind``/``key`` (none taken over by another is touched)."""
        self.session.execute(delete(_C).where(_C.c.kind == kind, _C.c.key == key, _C.c.holder == holder))


class CompileWaitRepository:
    """The compiles this database's processes did not run (``compile_waits``)."""

    def __init__(self, session: Session | Connection) -> None:
        self.session = session

    def add(self, kind: str, key: str, *, seconds: float, outcome: str, waited_on: str) -> None:
        """Record one wait: ``seconds`` (s) spent waiting for ``kind``/``key`` compiled by
        ``waited_on``, and its ``outcome``."""
        self.session.execute(insert(_W).values(kind=kind, key=key[:128], seconds=float(seconds),
                                               outcome=outcome[:16], waited_on=waited_on[:300],
                                               waited_at=utcnow()))

    def avoided(self) -> dict[str, tuple[int, float]]:
        """Per kind: ``(compiles avoided, seconds waited for them)`` (waits that ``landed``)."""
        rows = self.session.execute(select(_W.c.kind, func.count(), func.coalesce(func.sum(_W.c.seconds), 0.0))
                                    .where(_W.c.outcome == "landed").group_by(_W.c.kind))
        return {str(kind): (int(n), float(s)) for kind, n, s in rows}
