"""The live store's best configs (``.best_config`` files of Triton's coordinate-descent tuner)."""

from __future__ import annotations

import logging

from ..fleet import tier_sync as sync
from ..repositories import best_configs as best_configs_repo
from ._best_configs import Refused
from ._store_base import StoreBase, _Unavailable

log = logging.getLogger("cachedb.live")


class BestConfigs(StoreBase):
    """Best configs of :class:`~cachedb.live._store.LiveStore`."""

    # -- best configs ------------------------------------------------------------------------

    def _read_best_config(self, key: str) -> bytes | None:
        # the hot path of every Triton kernel's autotune-cache lookup: :meth:`safely` inlined
        try:
            db = self._db or self.db
            copy = self.best_configs
            token = db.kept.version()  # None off SQLite, or while another thread reads
            if token is not None:
                found = copy.lookup(token, key)
                if found is False and copy.due(token):
                    copy.load(db)
                    found = copy.lookup(token, key)
                if found is not False:
                    if isinstance(found, Refused):
                        raise found.error
                    return found  # type: ignore[return-value]
            rows = db.kept.fetch(best_configs_repo.GET_BY_KEY, {"key": key})
            if not rows:
                return None
            content, signature = rows[0]
            return best_configs_repo.checked_content(db.signer, key, content, signature).encode("utf-8")
        except _Unavailable:
            return None
        except Exception as exc:  # the cache must never break a compile
            self.warn_once("best config lookup", exc)
            return None

    def best_config_get(self, key: str) -> bytes | None:
        """The best config stored under ``key`` (``"<k[1:3]>/<name>.best_config"``) as JSON
        bytes, ``None`` on a miss: from the process's copy of every best config while no other
        connection has committed (:mod:`cachedb.live._best_configs`), else one indexed SELECT
        on the kept connection; then the remote tier, if any, on a local miss. Never raises."""
        found = self._read_best_config(key)
        if found is None and self.remote is not None and self.pull(sync.best_config(key)):
            found = self._read_best_config(key)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("best config lookup %s: %s", key, "hit" if found is not None else "miss")
        return found

    def best_config_put(self, key: str, data: bytes) -> None:
        def write() -> None:
            db = self.db
            content = data.decode("utf-8")
            columns = best_configs_repo.prepare_columns(db.signer, key, content)  # before BEGIN IMMEDIATE
            fp_id = self._known_fingerprint_id()
            upsert = best_configs_repo.upsert_for(db.engine.dialect.name)
            if fp_id is None or upsert is None:  # first write of this process: records its fingerprint
                with db.write() as repos:
                    fp_id = self._fingerprint_id(repos)
                    repos.best_configs.put(key, content, fingerprint_id=fp_id, columns=columns)
            else:  # one upsert on the kept connection, the write lock held for it alone
                db.kept.write(upsert, best_configs_repo.upsert_params(key, content, columns, fp_id))
            self.best_configs.wrote(key, bytes(data))  # stored (the upsert keeps equal content as is)
            log.debug("best config write %s", key)
            return True

        if self.safely("best config write", False, write):
            self.push(sync.best_config(key))

