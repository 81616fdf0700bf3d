"""Serve ``torch.compile`` from the database: Inductor reads and writes cachedb, not files.

Four ways to turn it on (all equivalent):

- ``cachedb.install(path=None)`` in the process, before compiling;
- ``with cachedb.installed(path): ...`` for a block (the seams are restored after it);
- ``cachedb run [--db PATH] [--remote URL] -- python train.py`` for a whole program;
- ``CACHEDB_ENABLE=1`` (with ``CACHEDB_PATH`` or ``CACHEDB_URL``, and ``CACHEDB_REMOTE_URL``
  for a shared remote tier, :mod:`cachedb.live._remote`) and cachedb's bootstrap
  directory on ``PYTHONPATH``: set by the three above, so processes torch starts (compile
  workers) turn it on too when torch imports its cache modules (:mod:`cachedb.live._autoload`).
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from dataclasses import dataclass
from typing import Any

from .. import settings as _settings
from ..store.engine import default_location, to_url
from .._errors import TorchUnavailableError
from ..fleet.trust import ENV_REMOTE_TRUST, TrustPolicy
from ..keys._versions import untested_torch_warning
from . import _autoload, _precompile, _scopes, _seams
from ._remote import ENV_REMOTE_TIMEOUT, ENV_REMOTE_URL, RemoteTier
from ._seams import SeamMissingError
from ._store import LiveStore
from ._writer import ENV_WRITE_BEHIND

log = logging.getLogger("cachedb.live")

#: Environment variables read by processes started under an active cachedb.
ENV_ENABLE = "CACHEDB_ENABLE"
ENV_TIMEOUT = "CACHEDB_TIMEOUT"
#: A file that every process with cachedb active appends a debug trace of its lookups to.
ENV_LOG_FILE = "CACHEDB_LOG_FILE"

#: ``1``: keep torch's runtime re-tuning of kernels whose best config is stored.
ENV_RETUNE = "CACHEDB_RETUNE"

#: Triton's cache-manager variable (``triton.knobs.cache.manager_class``) and cachedb's value.
ENV_TRITON_MANAGER = "TRITON_CACHE_MANAGER"
TRITON_MANAGER_SPEC = "cachedb.live._triton_cache:CacheDBTritonCacheManager"

#: torch's override of its compile workers' ``PYTHONPATH`` (torch/_inductor/utils.py).
ENV_TORCH_PYTHONPATH = "TORCH_CUSTOM_PYTHONPATH"

#: The directory holding cachedb's ``sitecustomize.py`` (activation in child processes).
BOOTSTRAP_DIR = str(Path(__file__).resolve().parent.parent / "_bootstrap")

_lock = threading.RLock()
_active: tuple[LiveStore, list[_seams._Patch], dict[str, str | None]] | None = None


def _location_env(location: str) -> dict[str, str]:
    url = to_url(location)
    if url.get_backend_name() == "sqlite" and url.database:
        return {"CACHEDB_PATH": url.database}
    return {"CACHEDB_URL": url.render_as_string(hide_password=False)}


def child_environment(
    location: str, base: dict[str, str] | None = None, *, remote: str | None = None,
    remote_timeout_s: float | None = None,
) -> dict[str, str]:
    """``base`` (default ``os.environ``) plus what makes a child process activate cachedb on
    ``location`` (and the remote tier ``remote``, a URL, if given) when it imports Inductor's cache
    modules (:mod:`cachedb.live._autoload`)."""
    env = dict(os.environ if base is None else base)
    env.pop("CACHEDB_PATH", None)
    env.pop("CACHEDB_URL", None)
    env.update(_location_env(location))
    if remote is not None:
        env[ENV_REMOTE_URL] = remote
        if remote_timeout_s is not None:
            env[ENV_REMOTE_TIMEOUT] = str(remote_timeout_s)
    env[ENV_ENABLE] = "1"
    if not env.get(ENV_TRITON_MANAGER):
        env[ENV_TRITON_MANAGER] = TRITON_MANAGER_SPEC
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOTSTRAP_DIR]
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *paths])
    # Inductor's compile workers get PYTHONPATH = $TORCH_CUSTOM_PYTHONPATH, else the parent's
    # sys.path (torch/_inductor/utils.py python_subprocess_env), not $PYTHONPATH.
    if env.get(ENV_TORCH_PYTHONPATH):
        custom = [p for p in env[ENV_TORCH_PYTHONPATH].split(os.pathsep) if p and p != BOOTSTRAP_DIR]
        env[ENV_TORCH_PYTHONPATH] = os.pathsep.join([BOOTSTRAP_DIR, *custom])
    return env


def install(
    path: str | os.PathLike[str] | None = None,
    *,
    timeout_s: float | None = None,
    trust: bool = False,
    retune: bool | None = None,
    remote: str | None = None,
    remote_timeout_s: float | None = None,
    write_behind: bool | None = None,
    precompile: bool | None = None,
    remote_trust: bool | None = None,
) -> LiveStore:
    """Make Inductor store and find its caches in the database at ``path``.

    ``path`` is an SQLite file or SQLAlchemy URL (default: :func:`cachedb.default_location`).
    ``timeout_s`` (seconds, default ``$CACHEDB_TIMEOUT`` or 10) bounds how long a lookup waits
    on a locked database (and for another process's schema upgrade); past it, the lookup is a
    miss and torch's own files serve for 30 s. Child processes inherit the activation through
    the environment. Calling it again with another path switches databases.

    Every ``CACHEDB_*`` variable is checked first (:mod:`cachedb.settings`); a value of the
    wrong form raises :class:`cachedb.settings.SettingError` naming it, and nothing is patched.
    Pickled entries are not loaded from a database owned by another user or writable by
    others unless ``trust=True`` (or ``CACHEDB_TRUST=1``).

    Kernels whose best config is stored start with it and are not tuned again at run time
    (:mod:`cachedb.live._autotune`); ``retune=True`` (default ``$CACHEDB_RETUNE == "1"``) keeps
    torch's own behaviour, which re-measures them (the new results are stored).

    ``remote`` (default ``$CACHEDB_REMOTE_URL``): a shared database, e.g.
    ``postgresql+psycopg://cache-host/inductor``, behind ``path`` (:mod:`cachedb.live._remote`):
    a local miss is looked up there (one query) and copied into ``path``; what is written to
    ``path`` is copied there by a background thread (flushed at exit). Processes sharing
    ``path`` (the ranks of a machine) ask the remote once per entry between them; a remote
    connection is held per burst and closed ``$CACHEDB_REMOTE_IDLE`` seconds (1) after it.
    ``remote_timeout_s`` (seconds, default ``$CACHEDB_REMOTE_TIMEOUT`` or 2) bounds each lookup,
    waits for a full or restarting server included, each connect and each statement; a remote
    that is down past it, slow or refuses writes costs one warning, then ``path`` alone serves.
    What the remote holds is taken only when trust is configured (:mod:`cachedb.fleet.trust`):
    rows signed by a key of ``$CACHEDB_TRUSTED_KEYS`` (Ed25519 public keys), or any row with
    ``remote_trust=True`` (default ``$CACHEDB_REMOTE_TRUST == "1"``: the risk accepted); with
    neither, one warning and the remote is only written to. ``$CACHEDB_SIGNING_KEY`` (a
    writer's private key) signs what is sent.

    ``write_behind`` (default ``$CACHEDB_WRITE_BEHIND``, on unless ``0``): FX graph and
    AOTAutograd entries are written by a background thread after torch's put returns
    (:mod:`cachedb.live._writer`): this process reads its own puts (a lookup waits for a
    queued key), other processes see them once written (milliseconds later;
    ``store.flush()`` writes the queue now), and the queue is written at exit and by
    ``uninstall``. A ``kill -9`` loses the entries still queued, never part of one.

    Compiled kernels are served too: C++ kernel libraries through ``CppCodeCache``'s build
    seams, and Triton's cache through ``TRITON_CACHE_MANAGER`` (set here unless the user set
    another manager, which is then kept with a warning). Inductor's compile workers copy the
    environment when the first compile starts them, so install before the first
    ``torch.compile``.

    In a process started under ``CACHEDB_ENABLE=1``, cachedb activates itself when torch
    imports Inductor's cache modules (:mod:`cachedb.live._autoload`); an explicit ``install``
    replaces that activation.

    Dynamo's PGO profiles (with ``TORCH_COMPILE_JOB_ID`` set) are served from the database
    too (:mod:`cachedb.live._pgo`). ``precompile=True`` turns on torch's experimental caching
    precompile in this process (``torch._dynamo.config.caching_precompile``, what
    ``TORCH_CACHING_PRECOMPILE=1`` sets; ``False`` turns it off, ``None`` leaves it): the
    precompiled Dynamo packages are read from the database when ``torch.compile`` wraps a
    function, and those this process compiled are stored when it exits (or at ``uninstall``),
    without a ``torch.compiler.save_cache_artifacts()`` call (:mod:`cachedb.live._precompile`).
    With it on, Dynamo drops some guards (docs/dynamo-caches.md): off unless asked.

    torch's own isolation is kept (:mod:`cachedb.live._scopes`): a ``fresh_cache()`` block is
    served by a database of its own in its directory, a ``temporary_cache_dir()`` block by
    torch's files; ``FxGraphCache.clear()`` and the other cache classes' ``clear()`` clear the
    database that serves too.

    Raises :class:`TorchUnavailableError` without torch, :class:`SeamMissingError` when the
    installed torch (or Triton) lacks a seam or has it with another signature, and
    :class:`cachedb.settings.SettingError` for a bad ``CACHEDB_*`` value (nothing is patched
    then). A database that cannot be opened does not raise: it logs one warning and torch's
    own files serve.
    """
    _disarm_watch()  # an explicit install replaces the environment's deferred activation
    _flush_active()  # a store this replaces writes its queue first
    settings = _Settings.resolve(path, timeout_s, retune, remote, remote_timeout_s, write_behind, remote_trust)
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise TorchUnavailableError(f"cachedb.install needs torch: {exc}") from exc
    if precompile is not None:
        import torch._dynamo.config as dynamo_config

        dynamo_config.caching_precompile = bool(precompile)
    _setup_trace_log()
    with _lock:
        if _active is not None:
            active_remote = _active[0].remote.url if _active[0].remote is not None else None
            same_writer = (_active[0].writer is not None) == settings.write_behind
            active_trust = _active[0].remote.trust.accept_unsigned if _active[0].remote is not None else False
            if (_active[0].location == settings.location and active_remote == settings.remote
                    and same_writer and _deferred is None
                    and (settings.remote is None or active_trust == settings.remote_trust)):
                return _active[0]
            uninstall()
        store = settings.store(trust=trust)
        patches = _seams.build(store, retune=settings.retune)
        _seams.apply(patches)
        _start(store, patches, settings, has_triton=_seams.triton_available())
        return store


@dataclass(frozen=True)
class _Settings:
    """What ``install`` runs with: its arguments, each defaulting to the environment."""

    location: str
    timeout_s: float
    retune: bool
    remote: str | None
    remote_timeout_s: float
    write_behind: bool
    remote_trust: bool = False

    @classmethod
    def resolve(cls, path: str | os.PathLike[str] | None = None, timeout_s: float | None = None,
                retune: bool | None = None, remote: str | None = None,
                remote_timeout_s: float | None = None, write_behind: bool | None = None,
                remote_trust: bool | None = None) -> _Settings:
        """The arguments given, each missing one from its ``CACHEDB_*`` variable; every
        variable is checked (:func:`cachedb.settings.check_environment`). Raises
        :class:`cachedb.settings.SettingError` for a value of the wrong form."""
        env = _settings.check_environment()
        location = os.fspath(path) if path is not None else default_location()
        if "://" not in location:
            location = str(Path(location).expanduser().resolve())
        return cls(
            location=location,
            timeout_s=timeout_s if timeout_s is not None else env[ENV_TIMEOUT],
            retune=retune if retune is not None else env[ENV_RETUNE],
            remote=remote if remote is not None else env[ENV_REMOTE_URL],
            remote_timeout_s=remote_timeout_s if remote_timeout_s is not None else env[ENV_REMOTE_TIMEOUT],
            write_behind=write_behind if write_behind is not None else env[ENV_WRITE_BEHIND],
            remote_trust=remote_trust if remote_trust is not None else env[ENV_REMOTE_TRUST],
        )

    def store(self, *, trust: bool = False) -> LiveStore:
        tier = None
        if self.remote:
            try:
                policy = TrustPolicy.from_environment(remote_trust=self.remote_trust)
            except Exception as exc:  # a key that does not load: trust nothing (warned)
                log.warning("cachedb: remote cache: %s; its entries are not used", exc)
                policy = TrustPolicy(accept_unsigned=self.remote_trust)
            tier = RemoteTier(self.remote, timeout_s=self.remote_timeout_s, trust=policy)
        return LiveStore(self.location, timeout_s=self.timeout_s, trust=trust, remote=tier,
                         write_behind=self.write_behind)


_warned_untested_torch = False


def _warn_if_untested_torch() -> None:
    """One warning per process where the torch in use is outside the releases cachedb's keys
    and seams were checked against (docs/compatibility.md); cachedb runs on regardless."""
    global _warned_untested_torch
    version = getattr(sys.modules.get("torch"), "__version__", None)
    warning = untested_torch_warning(str(version)) if version is not None else None
    if warning is not None and not _warned_untested_torch:
        _warned_untested_torch = True
        log.warning("cachedb: %s", warning)


def _start(store: LiveStore, patches: list[_seams._Patch], settings: _Settings, *, has_triton: bool) -> None:
    """Make ``store`` (with ``patches`` applied) the active one: the environment for child
    processes, the exit hook, the database opened. Called with ``_lock`` held."""
    global _active
    _warn_if_untested_torch()
    previous = {
        k: os.environ.get(k)
        for k in ("CACHEDB_PATH", "CACHEDB_URL", ENV_ENABLE, "PYTHONPATH", ENV_TRITON_MANAGER,
                  ENV_TORCH_PYTHONPATH, ENV_REMOTE_URL, ENV_REMOTE_TIMEOUT, ENV_WRITE_BEHIND, ENV_REMOTE_TRUST)
    }
    remote = settings.remote
    child = child_environment(store.location, remote=remote, remote_timeout_s=settings.remote_timeout_s if remote else None)
    if not remote:
        child.pop(ENV_REMOTE_URL, None)
        child.pop(ENV_REMOTE_TIMEOUT, None)
    elif settings.remote_trust:  # compile workers take what this process takes
        child[ENV_REMOTE_TRUST] = "1"
    if not settings.write_behind or previous[ENV_WRITE_BEHIND] is not None:  # unset: on
        child[ENV_WRITE_BEHIND] = "1" if settings.write_behind else "0"
    user_manager = os.environ.get(ENV_TRITON_MANAGER)
    if has_triton and user_manager and user_manager != TRITON_MANAGER_SPEC:
        log.warning(
            "cachedb: %s=%s is set; Triton kernels stay in Triton's own cache (not the database)",
            ENV_TRITON_MANAGER, user_manager,
        )
    for key in previous:
        if key in child:
            os.environ[key] = child[key]
        else:
            os.environ.pop(key, None)
    # Inductor starts its compile workers with the parent's sys.path as PYTHONPATH: put the
    # bootstrap there too, so they activate cachedb (best configs, timings, kernels).
    if BOOTSTRAP_DIR not in sys.path:
        sys.path.insert(0, BOOTSTRAP_DIR)
    _active = (store, patches, previous)
    _register_exit()
    store.safely("opening the database", None, lambda: store.db)
    log.info("cachedb: serving Inductor caches from %s (pid %d)", store.location, os.getpid())


# --------------------------------------------------------------------------- deferred activation
# Under CACHEDB_ENABLE=1 (``cachedb run``, and every process started under an active cachedb),
# the bootstrap's SeamWatch (cachedb/live/_autoload.py) calls _on_seam_module as each of torch's
# seam modules finishes importing: the first call opens the store (settings from the
# environment, as ``install()`` with no arguments), each call patches its module.


class _Deferred:
    """The state of an activation made by :class:`~cachedb.live._autoload.SeamWatch`."""

    def __init__(self, watch: Any, retune: bool) -> None:
        self.watch = watch
        self.retune = retune
        self.patched: set[str] = set()


_deferred: _Deferred | None = None


def _disarm_watch() -> None:
    watch = _autoload.find_watch()
    if watch is not None:
        watch.disarm()


def _activate_deferred(watch: Any) -> None:
    """Open the store from the environment and patch every seam module that is imported
    and complete (the others are patched as they complete). Called with ``_lock`` held."""
    global _deferred
    settings = _Settings.resolve()
    _setup_trace_log()
    store = settings.store()
    _deferred = _Deferred(watch, retune=settings.retune)
    _start(store, [], settings, has_triton="triton" in sys.modules)
    executing = watch.executing()
    for name in _autoload.SEAM_MODULES:
        if name in sys.modules and name not in executing:
            _patch_deferred(name)


def _patch_deferred(name: str) -> None:
    """Patch seam module ``name`` (imported, complete) for the deferred activation, once;
    a missing seam undoes every patch and deactivates cachedb (it raises on)."""
    assert _active is not None and _deferred is not None
    if name in _deferred.patched:
        return
    _deferred.patched.add(name)
    try:
        patches = _seams.module_patches(name, _active[0], retune=_deferred.retune)
        _seams.apply(patches)
    except BaseException:
        uninstall()
        raise
    _active[1].extend(patches)


def _on_seam_module(name: str, watch: Any) -> None:
    """SeamWatch's callback: seam module ``name`` has just finished importing. Raises
    :class:`SeamMissingError` (cachedb is then not active in this process)."""
    with _lock:
        if watch.disarmed:
            return
        if _active is None:
            if name in _autoload.PATCHED_AT_ACTIVATION:
                return  # patched when a cache module activates cachedb
            _activate_deferred(watch)
        elif _deferred is None or _deferred.watch is not watch:
            return  # an explicit install() is active: it patched everything itself
        _patch_deferred(name)


def _active_or_deferred() -> LiveStore | None:
    """The active store, activating the environment's deferred activation first if it is
    armed and has not happened yet (a seam reached before any seam module completed: e.g.
    the best-config backend unpickled in a compile worker)."""
    if _active is None:
        watch = _autoload.find_watch()
        if watch is not None:
            with _lock:
                if _active is None and not watch.disarmed:
                    try:
                        _activate_deferred(watch)
                    except Exception as exc:  # noqa: BLE001 - a miss, never the user's failure
                        watch.disarm()
                        log.warning("cachedb: not activated in process %d: %s", os.getpid(), exc)
    return active_store()


_exit_registered = False


def _exit_flush_s() -> float:
    """``$CACHEDB_EXIT_FLUSH`` (seconds, 5): how long a process waits at exit for its queued
    writes; a bad value is the default (it was reported at install)."""
    try:
        return float(_settings.read("CACHEDB_EXIT_FLUSH"))
    except _settings.SettingError:
        return float(_settings.VARIABLES["CACHEDB_EXIT_FLUSH"].default)


def _close_at_exit() -> None:
    """Close the active store when the process exits, waiting at most ``$CACHEDB_EXIT_FLUSH``
    seconds (5) for what is queued (FX graph / AOTAutograd puts, then the remote tier's
    copies); pending hit counts are written, and a passive checkpoint moves SQLite's
    write-ahead log into the ``.db`` file as far as no other process is reading it (it never
    waits; the last connection to close checkpoints the rest), so that the file alone holds
    everything (it is what users copy to other machines)."""
    _scopes.close_all()
    if _active is None:
        return
    store = _active[0]
    budget = _exit_flush_s()
    deadline = time.monotonic() + budget
    _precompile.save_packages()  # what save_cache_artifacts() saves of precompile, stored
    if not store.flush(budget):  # queued FX graph / AOTAutograd puts, before the checkpoint
        log.warning("cachedb: queued FX graph/AOTAutograd writes were not all written within "
                    "CACHEDB_EXIT_FLUSH (%g s) at exit", budget)
    if store.serving():
        store.flush_hits()
        db = store._db
        if db is not None and db.path is not None:
            try:
                with db.engine.connect() as conn:
                    conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")
            except Exception as exc:  # unreadable: the WAL stays beside the file
                log.debug("cachedb: WAL checkpoint at exit failed: %s", exc)
    store.close(max(0.0, deadline - time.monotonic()))


def _register_exit() -> None:
    global _exit_registered
    if not _exit_registered:
        _exit_registered = True
        atexit.register(_close_at_exit)


def _setup_trace_log() -> None:
    path = os.environ.get(ENV_LOG_FILE)
    if not path or any(getattr(h, "_cachedb_trace", False) for h in log.handlers):
        return
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s pid=%(process)d %(levelname)s %(message)s"))
    handler._cachedb_trace = True  # type: ignore[attr-defined]
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)


def _flush_active() -> None:
    """Write the active store's queued puts, outside ``_lock``: the writer thread's first write
    may import torch modules, and the seam watch takes ``_lock`` as they finish importing."""
    active = _active
    if active is not None:
        active[0].flush()


def uninstall() -> None:
    """Restore torch's own file caches and the environment ``install`` changed (a deferred
    activation from the environment is disarmed: it does not come back in this process)."""
    global _active, _deferred
    if _active is not None:
        _precompile.save_packages()  # the packages compiled while installed, stored
    _flush_active()
    with _lock:
        if _active is None:
            return
        store, patches, previous = _active
        if _deferred is not None:
            _deferred.watch.disarm()
            _deferred = None
        _seams.restore(patches)
        _scopes.close_all()
        while BOOTSTRAP_DIR in sys.path:
            sys.path.remove(BOOTSTRAP_DIR)
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        store.close()
        _active = None


def is_installed() -> bool:
    return _active is not None


def active_store() -> LiveStore | None:
    return _active[0] if _active is not None else None


@contextmanager
def installed(
    path: str | os.PathLike[str] | None = None,
    *,
    timeout_s: float | None = None,
    trust: bool = False,
    retune: bool | None = None,
    remote: str | None = None,
    remote_timeout_s: float | None = None,
    write_behind: bool | None = None,
    precompile: bool | None = None,
    remote_trust: bool | None = None,
) -> Iterator[LiveStore]:
    """``with cachedb.installed("cache.db"): model = torch.compile(model); model(x)``
    (:func:`install`'s arguments; the queued writes, and with ``precompile`` the packages
    compiled, are written when the block ends, and ``caching_precompile`` is set back)."""
    before = None
    if precompile is not None:
        import torch._dynamo.config as dynamo_config

        before = dynamo_config.caching_precompile
    store = install(path, timeout_s=timeout_s, trust=trust, retune=retune, remote=remote,
                    remote_timeout_s=remote_timeout_s, write_behind=write_behind, precompile=precompile,
                    remote_trust=remote_trust)
    try:
        yield store
    finally:
        uninstall()
        if before is not None:
            dynamo_config.caching_precompile = before


__all__ = [
    "BOOTSTRAP_DIR",
    "SeamMissingError",
    "active_store",
    "child_environment",
    "install",
    "installed",
    "is_installed",
    "uninstall",
]
