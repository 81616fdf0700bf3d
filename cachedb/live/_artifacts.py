"""Kernel files between the database and the local cache directories of one process.

Used by the Triton cache manager (:mod:`cachedb.live._triton_cache`) and the C++ library seam
(:mod:`cachedb.live._cpp_cache`). Compilers need real files (the CUDA launcher reads the cubin
from disk, ``cdll.LoadLibrary`` opens the ``.so``), so a hit *materializes* the stored files:
each is written to a temporary in the parent directory and renamed into place, so no reader
ever sees a partial file, and files already present are left alone. Like every live path,
failures are one warning and a miss.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import uuid
from collections.abc import Sequence

from ..fleet import tier_sync as sync
from .._errors import CorruptBlobError
from ..keys.factors import CPP_HOST, Factor
from ..store.tables import utcnow
from ._store import LiveStore

log = logging.getLogger("cachedb.live")


def write_file_atomic(directory: str, name: str, data: bytes) -> str:
    """Write ``data`` to ``directory/name`` through a temporary in ``directory``'s parent and
    ``os.replace`` (so the directory itself never lists a temporary: Inductor's
    ``TritonBundler.collect`` bundles every file it finds there). Returns the path."""
    path = os.path.join(directory, name)
    parent = os.path.dirname(os.path.abspath(directory)) or directory
    tmp = os.path.join(parent, f".cachedb.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


class KernelArtifacts:
    """The kernel-artifact side of a :class:`~cachedb.live._store.LiveStore`."""

    def __init__(self, live: LiveStore) -> None:
        self.live = live
        self._hits: dict[tuple[str, str, str], tuple[int, object]] = {}
        self._lock = threading.Lock()
        self._atexit = False
        #: Host keys whose factors this process has stored (or found stored).
        self._hosts_written: set[str] = set()

    def _served(self) -> bool:
        """False when the database is not trusted: a kernel binary is code, like a pickle
        (same rule: not from a database owned by another user or writable by others)."""
        self.live.db  # opens it, and decides trust
        return self.live.pickles_refused is None

    # -- reads -------------------------------------------------------------------------------

    def materialize_key(
        self, kind: str, key: str, directory: str, *, host_key: str = "", require: str | None = None,
        rewrite: dict[str, bytes] | None = None, files: dict[str, bytes] | None = None,
    ) -> dict[str, bytes] | None:
        """Write every stored file of key ``key`` into ``directory`` (created if needed).

        ``require``: a file name the stored key must hold, else nothing is written (a miss).
        ``rewrite``: bytes to write instead of the stored ones, by name. ``files``: the key's
        files already fetched by :meth:`fetch_key` (no second query).
        Returns the stored files ``{name: bytes}`` (``None`` on a miss, a damaged blob or a
        database that cannot be read: one warning). Files already in ``directory`` are kept.
        The file named ``require`` is written last, so a concurrent reader that waits for it
        finds the others in place.
        """
        if files is not None:
            if require is not None and require not in files:
                return None
            return self._write_key(kind, host_key, key, directory, files, require, rewrite)

        found = self.fetch_key(kind, key, host_key=host_key)
        if found is not None and require is not None and require not in found:
            found = None
        log.debug("%s kernel lookup %s: %s", kind, key, f"{len(found)} file(s)" if found else "miss")
        if not found:
            return None
        return self._write_key(kind, host_key, key, directory, found, require, rewrite)

    def _write_key(
        self, kind: str, host_key: str, key: str, directory: str, files: dict[str, bytes],
        last: str | None, rewrite: dict[str, bytes] | None,
    ) -> dict[str, bytes] | None:
        def write() -> dict[str, bytes]:
            os.makedirs(directory, exist_ok=True)
            present = set(os.listdir(directory))
            for name in sorted(files, key=lambda n: n == last):
                if name not in present:
                    write_file_atomic(directory, name, (rewrite or {}).get(name, files[name]))
            return files

        written = self.live.safely(f"{kind} kernel materialize", None, write)
        if written is not None:
            self.note_hit(kind, host_key, key)
        return written

    def fetch_key(self, kind: str, key: str, *, host_key: str = "") -> dict[str, bytes] | None:
        """The stored files of ``key`` without writing them (``None``: miss or failure). A
        local miss is looked up in the remote tier, if there is one (and copied here)."""

        def read() -> dict[str, bytes] | None:
            if not self._served():
                return None
            try:
                with self.live.db.lookup() as repos:
                    return repos.artifacts.key_files(kind, key, host_key=host_key) or None
            except CorruptBlobError as exc:
                self.live.warn_once(f"{kind} kernel payload check", exc)
                self._quarantine(exc)
                return None

        found = self.live.safely(f"{kind} kernel lookup", None, read)
        if found is None and self.live.remote is not None and self._served_safely():
            if self.live.pull(sync.kernel(kind, host_key, key)):
                found = self.live.safely(f"{kind} kernel lookup", None, read)
        return found

    def _served_safely(self) -> bool:
        return self.live.safely("kernel lookup", False, self._served)

    def materialize_file(self, kind: str, key: str, name: str, directory: str, *, host_key: str = "") -> bool:
        """Write one stored file into ``directory``; False on a miss or a failure."""

        def run() -> bool:
            if not self._served():
                return False
            try:
                with self.live.db.lookup() as repos:
                    data = repos.artifacts.get_file(kind, key, name, host_key=host_key)
            except CorruptBlobError as exc:
                self.live.warn_once(f"{kind} kernel payload check", exc)
                self._quarantine(exc)
                return False
            if data is None and self.live.pull(sync.kernel(kind, host_key, key)):
                with self.live.db.lookup() as repos:
                    data = repos.artifacts.get_file(kind, key, name, host_key=host_key)
            if data is None:
                return False
            os.makedirs(directory, exist_ok=True)
            if not os.path.exists(os.path.join(directory, name)):
                write_file_atomic(directory, name, data)
            return True

        found = self.live.safely(f"{kind} kernel lookup", False, run)
        log.debug("%s kernel file lookup %s/%s: %s", kind, key, name, "hit" if found else "miss")
        if found:
            self.note_hit(kind, host_key, key)
        return found

    def _quarantine(self, exc: CorruptBlobError) -> None:
        """Move the damaged blob named in ``exc`` aside (its keys become misses)."""

        def write() -> None:
            with self.live.db.write() as repos:
                repos.artifacts.quarantine_blob(exc.sha256, exc.reason)
            try:
                from torch._dynamo.utils import counters

                counters["inductor"]["cachedb_corrupt_payload"] += 1
            except ImportError:
                pass

        self.live.safely("kernel blob quarantine", None, write)

    # -- writes ------------------------------------------------------------------------------

    def put_files(self, kind: str, key: str, files: Sequence[tuple[str, bytes]], *, host_key: str = "",
                  host_factors: Sequence[Factor] = ()) -> None:
        """Store the files of one key directory in one transaction (dropped on failure), and
        with the first of this process the factors of its host (``host_factors``, kind
        :data:`~cachedb.keys.factors.CPP_HOST`; kept where the host has some)."""

        def write() -> None:
            with self.live.db.write() as repos:
                fp_id = self.live._fingerprint_id(repos)
                n = repos.artifacts.put_files(kind, key, files, host_key=host_key, fingerprint_id=fp_id)
                if host_factors and host_key not in self._hosts_written:
                    repos.key_factors.put(CPP_HOST, host_key, host_factors)
                    self._hosts_written.add(host_key)
                self._take_hits(repos)
            log.debug("%s kernel write %s: %d file(s), %d new", kind, key, len(files), n)
            return True

        if self.live.safely(f"{kind} kernel write", False, write):
            self.live.push(sync.kernel(kind, host_key, key))

    # -- hits --------------------------------------------------------------------------------

    def note_hit(self, kind: str, host_key: str, key: str) -> None:
        """Count a served key; written with the next write, and at exit."""
        with self._lock:
            n, _ = self._hits.get((kind, host_key, key), (0, None))
            self._hits[(kind, host_key, key)] = (n + 1, utcnow())
            if not self._atexit:
                self._atexit = True
                atexit.register(self.flush_hits)

    def _take_hits(self, repos: object) -> None:
        with self._lock:
            hits, self._hits = self._hits, {}
        if hits:
            repos.artifacts.record_hits(hits)  # type: ignore[attr-defined]

    def flush_hits(self) -> None:
        """Write pending hit counts and last-use times."""
        if not self._hits or self.live.closed:
            return

        def write() -> None:
            with self.live.db.write() as repos:
                self._take_hits(repos)

        self.live.safely("kernel hit count write", None, write)


_lock = threading.Lock()
_standalone: LiveStore | None = None


def for_store(live: LiveStore) -> KernelArtifacts:
    """The :class:`KernelArtifacts` of ``live`` (one per store, kept on it)."""
    found = live.kernel_artifacts
    if found is None:
        with _lock:
            found = live.kernel_artifacts
            if found is None:
                found = live.kernel_artifacts = KernelArtifacts(live)
    return found  # type: ignore[no-any-return]


def current() -> KernelArtifacts | None:
    """The kernel artifacts of the store that serves now (:func:`cachedb.live._scopes.route`
    of this process's active store); else, in a process that cachedb activation reached only
    through the environment (``CACHEDB_ENABLE=1`` with ``CACHEDB_PATH``/``CACHEDB_URL``, and
    ``CACHEDB_REMOTE_URL`` if set: e.g. a Triton compile in a forked worker), of a store opened
    from it, routed the same way; else ``None`` (Triton and Inductor use their files alone)."""
    global _standalone
    from .. import settings
    from . import ENV_ENABLE, _active_or_deferred
    from ._scopes import route

    store = _active_or_deferred()
    if store is None:
        if os.environ.get(ENV_ENABLE) != "1":
            return None
        location = os.environ.get("CACHEDB_URL") or os.environ.get("CACHEDB_PATH")
        if not location:
            return None
        with _lock:
            if _standalone is None or _standalone.location != location:
                from ._remote import from_environment

                try:
                    timeout = settings.read("CACHEDB_TIMEOUT")
                except settings.SettingError as exc:
                    log.warning("cachedb: not active in process %d: %s", os.getpid(), exc)
                    return None
                _standalone = LiveStore(location, timeout_s=timeout, remote=from_environment())
                atexit.register(_standalone.close)
            store = _standalone
    served = route(store)
    return for_store(served) if served is not None else None
