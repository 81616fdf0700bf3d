"""The remote tier's lookups straight on psycopg: one connection, one prebuilt query, no engine.

A process's first remote lookup through SQLAlchemy pays for more than its query: creating the
engine (~3 ms of CPU on the 2-core AMD VM), the dialect's first-connect set-up (the server's
version and settings, ~2 ms), the schema check's statement, and compiling
:func:`cachedb.fleet.tier_sync.fetch`'s ``SELECT`` for that new engine (~5 ms): ~20 ms in all
before the rows come, which a herd of ranks starting together pays at once on shared cores
(benchmarks §11). :class:`DriverReader` runs the same ``SELECT`` on a psycopg connection of
its own, compiled once per process for the PostgreSQL dialect (:meth:`DriverReader.prepare`,
on the thread that imports the driver, off the lookup's path): a first lookup costs the
connect, the schema revision's read and the query.

It reads what :func:`~cachedb.fleet.tier_sync.fetch` reads, the same rows as the same Python
values (the statement is the one ``fetch`` runs, its columns' result processors applied), for
the kinds that ``fetch`` answers in one query (:data:`KINDS`): FX graph / AOTAutograd entries
with their factor ids, best configs, LocalCache values, kernel files, Dynamo's caches. Timings
(and their choices) and CUTLASS op lists take the engine's path.

The connection is autocommit (a lookup is one statement: no ``BEGIN``/``ROLLBACK`` round
trips), never prepares statements on the server (PgBouncer in transaction mode), and carries
the engine's connect arguments (:func:`cachedb.store.engine.postgres_connect_args`: connect and
statement timeouts, ``application_name``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import URL, make_url

from ..keys.factors import Factor
from ..store import migrate
from ..store.tables import metadata
from ..store.engine import postgres_connect_args
from . import tier_sync as sync

#: The kinds of :data:`cachedb.fleet.tier_sync.KINDS` that :func:`~cachedb.fleet.tier_sync.fetch`
#: answers in one query, served here.
KINDS = frozenset(kind for kind in sync.KINDS if kind not in ("timings", "timings_op", "cutlass", "choices"))

KEY_FACTORS = metadata.tables["key_factors"]
#: The ``key_factors`` rows of some ids (:meth:`DriverReader.factors`).
_FACTORS = (f"SELECT id, factor, hash, value FROM {KEY_FACTORS.name} "
            "WHERE id = ANY(%(ids)s::bigint[]) ORDER BY id")

#: What a bound value is while a statement is compiled: the bind parameter holding value
#: ``i`` of an entry is found by it.
_MARK = "\x00cachedb-bind-{}"


class ReaderClosed(Exception):
    """The reader was closed (:meth:`DriverReader.close`): the engine's path reads instead."""


class OpenFailed(Exception):
    """Connecting (or the connect's revision check) failed; the driver's error is the cause."""


class StaleSchema(Exception):
    """The remote is not at the code's schema revision (empty, older or newer): the caller
    opens it through the engine, which creates, refuses or reports it."""


@dataclass(frozen=True, slots=True)
class _Query:
    """One kind's ``SELECT`` compiled for psycopg: its text, the bind name of each of the
    entry's values (``None`` for a value matched with ``IS NULL``), and the result processor
    of each column (``None``: the driver's value as it is)."""

    sql: str
    binds: tuple[str | None, ...]
    processors: tuple[Callable[[Any], Any] | None, ...]


def serves(url: str) -> bool:
    """Whether ``url`` is a PostgreSQL URL with the psycopg driver (what this reader speaks)."""
    if "://" not in url:
        return False
    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - not a URL: the engine's path reports it
        return False
    return parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() == "psycopg"


class DriverReader:
    """Lookups of one remote PostgreSQL database on one psycopg connection of its own.

    ``url``: a ``postgresql+psycopg://`` URL (:func:`serves`); ``timeout_s`` (seconds) bounds
    the connect and, with ``statement_timeout``, each statement (as the engine's connections:
    :func:`~cachedb.store.engine.postgres_connect_args`). The connection is opened by the
    first :meth:`fetch` and closed by :meth:`dispose` (an idle closer's call) or :meth:`close`.
    Thread-safe: one lookup at a time. After :meth:`close` it serves nothing (:attr:`closed`).
    Not to be used across a fork: a forked child makes its own.
    """

    def __init__(self, url: str, *, timeout_s: float, statement_timeout: bool = True) -> None:
        self.url: URL = make_url(url)
        self.timeout_s = timeout_s
        self.statement_timeout = statement_timeout
        self.closed = False
        #: connections opened
        self.connections = 0
        self._lock = threading.Lock()
        self._conn: Any = None
        self._dialect: Any = None
        self._queries: dict[tuple[str, tuple[bool, ...], bool], _Query] = {}

    # -- statements ---------------------------------------------------------------------------

    def _dialect_of(self) -> Any:
        if self._dialect is None:
            from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

            self._dialect = PGDialect_psycopg()
        return self._dialect

    def query(self, entry: sync.Entry, *, with_blobs: bool = True) -> _Query:
        """The compiled ``SELECT`` of ``entry``'s kind (built once per kind, which values are
        ``None`` and ``with_blobs``): the statement :func:`~cachedb.fleet.tier_sync.fetch`
        runs, compiled for the PostgreSQL dialect before any connection (its text does not
        depend on the server: ``tests/test_remote_tier.py`` compares it with an initialized
        dialect's)."""
        nulls = tuple(v is None for v in entry.values)
        shape = (entry.kind, nulls, with_blobs)
        found = self._queries.get(shape)
        if found is not None:
            return found
        dialect = self._dialect_of()
        marks = tuple(None if null else _MARK.format(i) for i, null in enumerate(nulls))
        stmt = sync._statement(sync.Entry(entry.kind, marks), with_blobs)
        compiled = stmt.compile(dialect=dialect)
        by_mark = {v: k for k, v in compiled.construct_params().items() if isinstance(v, str)}
        binds = tuple(None if m is None else by_mark[m] for m in marks)
        processors = tuple(
            column[3].dialect_impl(dialect).result_processor(dialect, None) for column in compiled._result_columns
        )
        built = _Query(compiled.string, binds, processors)
        self._queries[shape] = built
        return built

    def prepare(self, kinds: tuple[str, ...] = ("guarded", "best_config")) -> None:
        """Compile the queries of ``kinds`` (for entries without ``None`` values) ahead of the
        first lookup: ~5 ms of CPU each, once per process."""
        for kind in kinds:
            _, columns = sync.KINDS[kind]
            self.query(sync.Entry(kind, tuple("" for _ in columns)))

    # -- the connection -----------------------------------------------------------------------

    def _connect(self) -> Any:
        import psycopg

        cargs, cparams = self._dialect_of().create_connect_args(self.url)
        cparams.pop("context", None)  # SQLAlchemy's adapters map: the driver's own loaders here
        cparams.update(postgres_connect_args(self.url, self.timeout_s, statement_timeout=self.statement_timeout))
        try:
            conn = psycopg.connect(*cargs, autocommit=True, **cparams)
        except psycopg.Error as exc:
            raise OpenFailed(str(exc)) from exc
        self.connections += 1
        try:
            row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        except psycopg.errors.UndefinedTable:  # an empty database: the engine creates its schema
            conn.close()
            raise StaleSchema("no schema") from None
        except psycopg.Error as exc:
            conn.close()
            raise OpenFailed(str(exc)) from exc
        except BaseException:
            conn.close()
            raise
        if row is None or row[0] != migrate.HEAD_REVISION:
            conn.close()
            raise StaleSchema(f"revision {row[0] if row else None}")
        return conn

    def fetch(self, entry: sync.Entry, *, with_blobs: bool = True) -> sync.Bundle:
        """The rows of ``entry`` (one of :data:`KINDS`), as :func:`~cachedb.fleet.tier_sync.fetch`
        reads them on the engine: one statement (after the connect's revision check).

        Raises:
            StaleSchema: the remote is not at the code's revision (nothing is kept open).
            OpenFailed: connecting failed (its cause: the driver's error).
            psycopg.Error: the statement failed (the connection is dropped; the caller
                decides whether to try again: :func:`~cachedb.fleet.connections.transient`).
            ReaderClosed: the reader is closed.
        """
        query = self.query(entry, with_blobs=with_blobs)
        params = {name: value for name, value in zip(query.binds, entry.values) if name is not None}
        names, raw = self._run(query.sql, params)
        processors = query.processors
        rows = [dict(zip(names, (v if p is None or v is None else p(v) for v, p in zip(r, processors)))) for r in raw]
        return sync.bundle_of(entry, rows, with_blobs=with_blobs)

    def factors(self, ids: Sequence[int]) -> dict[int, Factor]:
        """``{id: Factor}`` of the remote's ``key_factors`` rows of ``ids`` (those not stored
        left out): what :func:`~cachedb.fleet.tier_sync.resolve_factors` looks up, in one
        statement. Raises as :meth:`fetch`."""
        out: dict[int, Factor] = {}
        for i, name, h, v in self._run(_FACTORS, {"ids": sorted(set(ids))})[1]:
            out[int(i)] = Factor(name, h, v)
        return out

    def _run(self, sql: str, params: dict[str, Any]) -> tuple[list[str], list[tuple[Any, ...]]]:
        """``(column names, rows)`` of ``sql`` on the connection, opened first if need be."""
        with self._lock:
            if self.closed:
                raise ReaderClosed()
            if self._conn is None or self._conn.closed:
                self._conn = self._connect()
            try:
                cursor = self._conn.execute(sql, params)
                names = [d.name for d in cursor.description or ()]
                rows = cursor.fetchall()
            except BaseException:
                self._drop()
                raise
        return names, rows

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - a broken connection: nothing left to close
                pass

    def dispose(self) -> None:
        """Close the connection (the next :meth:`fetch` opens another): the idle closer's call
        (:class:`~cachedb.fleet.connections.IdleCloser`)."""
        with self._lock:
            self._drop()

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed

    def close(self) -> None:
        """Close the connection and serve nothing more (the engine's path takes over)."""
        with self._lock:
            self.closed = True
            self._drop()
