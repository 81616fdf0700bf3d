"""The live store's copies of Dynamo's caches: PGO profiles, precompiled packages and refusals."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..fleet import tier_sync as sync
from .._errors import CorruptPayloadError
from ..keys.factors import Factor
from ..store.payload import pack
from ..repositories import dynamo as dynamo_repo
from ._store_base import StoreBase, _Unavailable

log = logging.getLogger("cachedb.live")


class DynamoCaches(StoreBase):
    """Dynamo's caches of :class:`~cachedb.live._store.LiveStore`."""

    # -- Dynamo's caches: PGO profiles, ... --------------------------------------------------

    def dynamo_get(self, kind: str, key: str) -> bytes | None:
        """The pickle of one of Dynamo's caches (``kind``: ``pgo``, ...; ``key``: its
        :mod:`cachedb.repositories.dynamo` key), checked, or ``None``: a miss, a database that
        cannot be read, pickles refused (an untrusted database), or a corrupt row (warned
        about once per kind, quarantined). On a local miss the remote tier, if any, is asked
        (a local row found corrupt is served from the remote's copy). A hit is counted (written
        with the next write, or at exit). Never raises."""
        found = self._read_dynamo(kind, key)
        if found is None and self.remote is not None and self.pull(sync.dynamo(kind, key)):
            found = self._read_dynamo(kind, key)
        if found is not None:
            self.note_hit(kind, key, "")
        log.debug("%s lookup %s: %s", kind, key, "hit" if found is not None else "miss")
        return found

    def _read_dynamo(self, kind: str, key: str) -> bytes | None:
        try:
            db = self._db or self.db
            if self.pickles_refused is not None:
                return None
            rows = db.kept.fetch(dynamo_repo.statements(kind).get, {"key": key})
            if not rows:
                return None
            return dynamo_repo.checked(db.signer, kind, key, *rows[0])
        except _Unavailable:
            return None
        except CorruptPayloadError as exc:
            self.warn_once(f"{kind} payload check", exc)
            self._quarantine_dynamo(kind, key, exc.reason)
        except Exception as exc:  # the cache must never break a compile
            self.warn_once(f"{kind} lookup", exc)
        return None

    def _quarantine_dynamo(self, kind: str, key: str, reason: str) -> None:
        """Move a corrupt row of Dynamo's caches aside (kept for ``cachedb verify``) and count
        it in ``counters["inductor"]["cachedb_corrupt_payload"]``."""
        try:
            from torch._dynamo.utils import counters

            counters["inductor"]["cachedb_corrupt_payload"] += 1
        except ImportError:
            pass

        def write() -> None:
            with self.db.write() as repos:
                repos.dynamo(kind).quarantine(key, reason)

        self.safely(f"{kind} quarantine", None, write)

    def dynamo_put(self, kind: str, key: str, data: bytes, *,
                   factors: tuple[str, str, Sequence[Factor]] | None = None) -> bool:
        """Store ``data`` (a pickle torch just wrote) as the row of ``key``, replacing the one
        stored (the newer wins: this one, written now), then queue it for the remote tier.
        ``factors``: ``(kind, key, factors)`` of ``entry_factors`` to store in the same
        transaction unless that key has some (a package's system). Returns whether it was
        stored. Never raises."""
        def write() -> bool:
            db = self.db
            packed = pack(bytes(data))  # before BEGIN IMMEDIATE: the write lock is held for the rows alone
            if self._dynamo_written.get((kind, key)) == packed.checksum:
                return True  # torch puts the whole profile after every compile, most often unchanged
            # The fingerprint if this process recorded it already: computing it (triton_key and
            # torch_key hash their sources, ~0.3-0.5 s on 2 cores) would cost a warm start,
            # which writes its profile again and nothing else, that much.
            fp_id = self._known_fingerprint_id()
            with db.write() as repos:
                repos.dynamo(kind).put(key, data, fingerprint_id=fp_id, packed=packed)
                if factors is not None:
                    repos.key_factors.put(*factors)
                self._take_hits(repos)
            self._dynamo_written[(kind, key)] = packed.checksum
            log.debug("%s write %s", kind, key)
            return True

        stored = self.safely(f"{kind} write", False, write)
        if stored:
            self.push(sync.dynamo(kind, key))
        return stored

