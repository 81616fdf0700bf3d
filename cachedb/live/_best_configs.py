"""Best configs read from a process-local copy that other processes' writes invalidate.

torch reads a best config per Triton kernel (``AutotuneCache.read_best`` →
``LocalAutotuneCache.get``, torch/_inductor/runtime/autotune_cache.py, through
``CacheDBBestConfigBackend._get``). On SQLite, :class:`BestConfigCopy` answers those reads from
a dict of every stored best config, loaded in one query, for as long as no other connection
has committed to the database: each get first asks the kept connection for its ``PRAGMA
data_version`` token (:meth:`~cachedb.store.engine.KeptConnection.version`), which changes with
every commit of another process, or of another connection of this one (a remote-tier pull, a
:meth:`~cachedb.CacheDB.write` transaction on a pooled connection). While the database's
wal-index header has not moved since the last PRAGMA, the token is known without a statement
(one ``pread``, ~0.7 µs against ~3.7 µs: :mod:`cachedb.store.wal_index`). A changed token sends
gets back to one indexed SELECT per key, so a get never returns what another process replaced
or deleted before it.

Loading costs about 1 µs per stored config. It is done only after the token has held still
for ``max(LOAD_AFTER_GETS, rows / 16)`` gets (rows: the size of the last load), so processes
that keep committing cost each other at most about the per-key reads they would have done
anyway; a database with more than :data:`MAX_ROWS` best configs is never copied (per-key
reads only). This process's own best-config upserts through the kept connection do not
change the token; :meth:`BestConfigCopy.wrote` puts them into the copy.

Off SQLite (PostgreSQL) the token is ``None`` and every get reads the database.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Union

from .._errors import CorruptPayloadError
from ..repositories import best_configs as best_configs_repo

if TYPE_CHECKING:
    from ..db import CacheDB

log = logging.getLogger("cachedb.live")

#: A database holding more best configs than this is read per key, never copied.
MAX_ROWS = 16_384
#: Gets at an unchanged token before the first load (later: also ``rows / 16``).
LOAD_AFTER_GETS = 4

Token = tuple[int, int]


class Refused:
    """A stored best config whose signature did not verify: a get of it is a miss (warned)."""

    __slots__ = ("error",)

    def __init__(self, error: CorruptPayloadError) -> None:
        self.error = error


#: What a copy holds per key: the JSON bytes torch gets, or why it is refused.
Held = Union[bytes, Refused]


class BestConfigCopy:
    """Every best config of one database, as of a ``data_version`` token (see the module
    docstring). Thread-safe: the copy is replaced whole; the counters are under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: tuple[Token, dict[str, Held]] | None = None
        self._writes = 0  # own upserts; a load that overlaps one is not installed
        self._still_token: Token | None = None
        self._still_gets = 0
        self._rows = 0
        self.too_large = False
        #: how many loads were installed (read by the tests)
        self.loads = 0

    def lookup(self, token: Token, key: str) -> Held | None | bool:
        """The copy's entry for ``key`` when the copy is as of ``token`` (``None``: not
        stored), else ``False`` (the caller reads the database)."""
        state = self._state
        if state is None or state[0] != token:
            return False
        return state[1].get(key)

    def due(self, token: Token) -> bool:
        """Count one get that missed the copy at ``token``; True when it is time to load."""
        if self.too_large:
            return False
        with self._lock:
            if token != self._still_token:
                self._still_token, self._still_gets = token, 0
            self._still_gets += 1
            return self._still_gets >= max(LOAD_AFTER_GETS, self._rows // 16)

    def load(self, db: CacheDB) -> None:
        """Read every best config of ``db`` (one query on the kept connection) and make it the
        copy, unless the database holds more than :data:`MAX_ROWS` or this process wrote a
        best config meanwhile. Signatures are checked here, once per row.

        Raises:
            HotReadError: the driver failed.
        """
        writes = self._writes
        token, rows = db.kept.fetch_versioned(best_configs_repo.ALL_CONTENT, {"limit": MAX_ROWS + 1})
        if token is None:
            return
        if len(rows) > MAX_ROWS:
            self.too_large = True
            log.debug("best configs: more than %d stored; read per key", MAX_ROWS)
            return
        held: dict[str, Held] = {}
        for key, content, signature in rows:
            try:
                held[key] = best_configs_repo.checked_content(db.signer, key, content, signature).encode("utf-8")
            except CorruptPayloadError as exc:
                held[key] = Refused(exc)
        with self._lock:
            self._rows = len(rows)
            if self._writes != writes:
                return
            self._state = (token, held)
            self.loads += 1
        log.debug("best configs: %d copied into the process", len(rows))

    def wrote(self, key: str, data: bytes) -> None:
        """This process stored ``data`` at ``key`` (committed; through the kept connection, or
        another one, whose commit changes the token anyway)."""
        with self._lock:
            self._writes += 1
            state = self._state
            if state is not None:
                state[1][key] = data

    def clear(self) -> None:
        with self._lock:
            self._state = None
            self._still_token, self._still_gets = None, 0
