"""Connections to a fleet's shared database: held for a burst, closed when idle, and a full
or restarting server waited out rather than taken for an outage.

A fleet is hundreds of processes (the ranks of every machine of a job) behind one PostgreSQL
whose ``max_connections`` is 100 by default. A process that kept its connection for its whole
life, idle included, would take one server slot per process; here a process takes a
connection for a burst of statements (:meth:`IdleCloser.lease`) and the pool closes it
:data:`DEFAULT_IDLE_S` seconds after the last one, so the server's connections follow the
lookups in flight, not the processes alive.

A refusal that passes (``too many clients``, a role's ``CONNECTION LIMIT``, ``connection
refused`` or ``the database system is starting up`` while the server restarts, a backend
terminated by the administrator, PgBouncer's ``max_client_conn``) is :func:`transient`: the
caller retries it after a jittered exponential backoff (:func:`backoff`) until its deadline,
and only then counts the remote as down.

PgBouncer in transaction pooling mode refuses the startup ``options`` parameter that carries
``statement_timeout`` (:func:`options_refused`): the caller then opens the engine without it
(statements are bounded by the pooler's ``query_timeout`` and the server's, docs/design.md).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from typing import Protocol

from sqlalchemy import Engine


class Disposable(Protocol):
    """What :class:`IdleCloser` closes: an engine's pool, or the connection of a
    :class:`~cachedb.fleet.tier_read.DriverReader`."""

    def dispose(self) -> None: ...

#: Seconds a remote connection stays open after its last statement. A warm start's lookups
#: come in bursts (Dynamo traces a frame, Inductor looks up its graph, kernels and configs)
#: separated by tens to hundreds of milliseconds of compile work; a connection to a local
#: PostgreSQL costs ~3-5 ms to open (docs/design.md, Fleet), so 1 s keeps one connection per
#: compiling process through its burst and none a second after it.
DEFAULT_IDLE_S = 1.0
#: Environment variable overriding :data:`DEFAULT_IDLE_S` (seconds; ``0``: close at once).
ENV_REMOTE_IDLE = "CACHEDB_REMOTE_IDLE"

#: SQLSTATEs of refusals that pass: the caller waits and tries again within its timeout.
TRANSIENT_SQLSTATES = frozenset({
    "53300",  # too_many_connections: "sorry, too many clients already", a role's CONNECTION LIMIT
    "53400",  # configuration_limit_exceeded
    "57P01",  # admin_shutdown: the server is stopping (a restart), or pg_terminate_backend
    "57P02",  # crash_shutdown
    "57P03",  # cannot_connect_now: starting up, shutting down, in recovery
    "08000", "08001", "08003", "08004", "08006",  # connection exceptions
    # The server rolled the transaction back so that another could go on; PostgreSQL's manual
    # ("Deadlocks", "Serialization Failure Handling") says to run it again.
    "40P01",  # deadlock_detected: two hosts upserting the same rows in another order
    "40001",  # serialization_failure
})

#: What libpq and PgBouncer say (lowercased) when refusing a connection that a later try may
#: get: a connection error carries no SQLSTATE in psycopg, only libpq's message.
_TRANSIENT_TEXT = (
    "too many clients",
    "too many connections",
    "remaining connection slots are reserved",
    "connection refused",
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "terminating connection",
    "server closed the connection unexpectedly",
    "no more connections allowed",  # PgBouncer's max_client_conn
    "pgbouncer cannot connect to server",
    "server login has been failing",  # PgBouncer while the server is down
    "consuming input failed",
    "connection is lost",
    "connection is closed",
)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else current.__cause__


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` (SQLAlchemy's, or the driver's it wraps) is a refusal that a later try
    may not meet: a full server, a restart, a dropped connection, a transaction rolled back
    for a deadlock or a serialization failure (:data:`TRANSIENT_SQLSTATES`, or libpq's and
    PgBouncer's words for them). An authentication failure, an unknown
    database or role, a statement timeout or an SQL error is not."""
    for err in _chain(exc):
        if getattr(err, "connection_invalidated", False):
            return True
        state = getattr(err, "sqlstate", None) or getattr(err, "pgcode", None)
        if state in TRANSIENT_SQLSTATES:
            return True
        text = str(err).lower()
        if any(marker in text for marker in _TRANSIENT_TEXT):
            return True
    return False


def options_refused(exc: BaseException) -> bool:
    """Whether a connect failed because the server refused the startup ``options`` parameter
    (PgBouncer: ``unsupported startup parameter: options``)."""
    return any("unsupported startup parameter" in str(err) and "options" in str(err) for err in _chain(exc))


def backoff(deadline: float, *, first_s: float = 0.005, cap_s: float = 0.25) -> Iterator[float]:
    """Seconds to sleep before each retry, until ``deadline`` (``time.monotonic()`` seconds):
    "full jitter" exponential backoff (each a uniform draw below ``first_s`` doubled per try,
    at most ``cap_s``), so that a herd refused together does not come back together. The
    last sleep ends at the deadline; none is yielded past it."""
    ceiling = first_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        yield min(left, random.uniform(ceiling / 2, ceiling))
        ceiling = min(cap_s, ceiling * 2)


def idle_seconds_from_environment() -> float:
    """``$CACHEDB_REMOTE_IDLE`` as seconds (at least 0), else :data:`DEFAULT_IDLE_S`."""
    from .. import settings

    return float(settings.value_or_default(ENV_REMOTE_IDLE))


class IdleCloser:
    """Closes the pooled connections of ``engine`` (an :class:`~sqlalchemy.Engine`, or anything
    with a ``dispose()`` that closes its connections) once it has gone ``idle_s`` seconds
    without a :meth:`lease` in progress.

    Every use of the engine happens inside a :meth:`lease`; when the last one ends, a daemon
    thread (one per closer, started on first use, and again in a forked child) waits
    ``idle_s`` seconds and, if no lease began meanwhile, disposes of the engine's pool (its
    idle connections are closed; the next lease opens a new one). ``closed_idle`` counts those
    closings. Thread-safe; with ``idle_s == 0`` the pool is disposed as the last lease ends.
    """

    def __init__(self, engine: Engine | Disposable, idle_s: float) -> None:
        self.engine = engine
        self.idle_s = idle_s
        self.closed_idle = 0
        self._cond = threading.Condition(threading.Lock())
        self._in_use = 0
        self._last_used = time.monotonic()
        self._holding = True  # the pool may hold an idle connection (the engine's first use)
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._stopped = False
        self._ensure_thread()

    def _ensure_thread(self) -> None:
        if os.getpid() != self._pid:  # a forked child: the parent's thread and lock are not here
            self._pid = os.getpid()
            self._cond = threading.Condition(threading.Lock())
            self._in_use = 0
            self._thread = None
        if self.idle_s > 0 and (self._thread is None or not self._thread.is_alive()) and not self._stopped:
            self._thread = threading.Thread(target=self._run, name="cachedb-remote-idle", daemon=True)
            self._thread.start()

    @contextmanager
    def lease(self) -> Iterator[Engine | Disposable]:
        """The engine, for a burst of statements: its idle connections are not closed while
        any lease is in progress."""
        if os.getpid() != self._pid:
            self._ensure_thread()
        with self._cond:
            self._in_use += 1
            self._holding = True
        try:
            yield self.engine
        finally:
            with self._cond:
                self._in_use -= 1
                self._last_used = time.monotonic()
                if self._in_use == 0:
                    if self.idle_s <= 0:
                        self._close_idle()
                    else:
                        self._cond.notify()
            if self._thread is None and self.idle_s > 0:
                self._ensure_thread()

    def _close_idle(self) -> None:
        """Dispose of the pool (the caller holds the lock and no lease is in progress)."""
        if self._holding:
            self.engine.dispose()
            self._holding = False
            self.closed_idle += 1

    def _run(self) -> None:
        cond = self._cond
        with cond:
            while not self._stopped:
                if self._in_use or not self._holding:
                    cond.wait()
                    continue
                due = self._last_used + self.idle_s - time.monotonic()
                if due > 0:
                    cond.wait(due)
                    continue
                self._close_idle()

    def stop(self) -> None:
        """Stop the thread (the caller disposes of the engine)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
