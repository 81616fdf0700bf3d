"""Prebuilt Core statements, compiled once per process and dialect, run on the driver.

SQLAlchemy's ``Connection.execute`` of an already compiled statement costs ~20-30 µs per call
(its execution context, result metadata, row processors) around a SQLite point read of
~6-10 µs. The hot paths (:class:`cachedb.store.engine.KeptConnection`) and the repositories' point
reads and single-row writes run their statements here instead: compiled once
(:func:`compiled_for`), bound through the same type processors SQLAlchemy would apply, and
executed on the connection's DBAPI connection, inside whatever transaction the
:class:`~sqlalchemy.Connection` holds, so a repository read in ``CacheDB.read()`` still sees
that block's one snapshot. Driver errors come out as SQLAlchemy's own ``DBAPIError``
subclasses, as ``Connection.execute`` raises them.
"""

from __future__ import annotations

import datetime as dt
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, DateTime
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ClauseElement


@dataclass(frozen=True, slots=True)
class _Compiled:
    """A Core statement compiled once for one dialect: SQL text, its parameter order, and the
    bind processors of the types that need one (``DateTime`` on SQLite, ...)."""

    sql: str
    names: tuple[str, ...] | None  # positional dialects (SQLite): bind names in order
    defaults: Mapping[str, Any]  # values bound when the statement was built (LIMIT 1, ...)
    processors: Mapping[str, Callable[[Any], Any]]  # bind name -> the type's bind processor
    #: The parameter tuple straight from the caller's mapping, where nothing needs merging or
    #: processing (a positional statement without defaults or bind processors): a point read's
    #: ``{"key": k}`` becomes ``(k,)`` without building a dict.
    pick: Callable[[Mapping[str, Any]], tuple[Any, ...]] | None = None

    def params(self, values: Mapping[str, Any]) -> Any:
        if self.pick is not None:
            return self.pick(values)
        merged = {**self.defaults, **values} if self.defaults else values
        if self.names is not None:  # positional: the tuple straight away, each value processed once
            processors = self.processors
            out = []
            for name in self.names:
                value = merged[name]
                process = processors.get(name)
                out.append(value if process is None or value is None else process(value))
            return tuple(out)
        if self.processors:
            merged = dict(merged)
            for name, process in self.processors.items():
                if merged.get(name) is not None:
                    merged[name] = process(merged[name])
        return merged


#: The last datetime :func:`_sqlite_datetime` formatted and its text: a write binds the same
#: ``utcnow()`` to several columns (replaced whole, so threads never see a torn pair).
_LAST_DATETIME: tuple[Any, str] = (None, "")


def _sqlite_datetime(fallback: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """SQLAlchemy's SQLite ``DateTime`` bind processor (``fallback``, sqlalchemy/dialects/
    sqlite/base.py ``DATETIME.bind_processor``) for a datetime, in about a third of its time:
    the same ``%04d-%02d-%02d %02d:%02d:%02d.%06d`` text of the value's own fields (an aware
    value's offset is dropped without converting it, as SQLAlchemy drops it), and the text of
    the last value again when the same object comes twice (``created_at`` and ``updated_at``
    of one write). Anything else (a ``date``, a string) goes to ``fallback``."""
    datetime_class = dt.datetime

    def process(value: Any) -> Any:
        global _LAST_DATETIME
        if value.__class__ is not datetime_class:
            return fallback(value)
        last = _LAST_DATETIME
        if last[0] is value:
            return last[1]
        text = "%04d-%02d-%02d %02d:%02d:%02d.%06d" % (
            value.year, value.month, value.day, value.hour, value.minute, value.second, value.microsecond
        )
        _LAST_DATETIME = (value, text)
        return text

    return process


def _picker(
    names: tuple[str, ...] | None, defaults: Mapping[str, Any], processors: Mapping[str, Any]
) -> Callable[[Mapping[str, Any]], tuple[Any, ...]] | None:
    """:attr:`_Compiled.pick` for a statement, ``None`` where :meth:`_Compiled.params` must
    merge defaults, apply bind processors or pass a mapping (named-parameter dialects)."""
    if names is None or defaults or processors:
        return None
    if len(names) == 1:
        (name,) = names
        return lambda values: (values[name],)
    get = operator.itemgetter(*names) if names else (lambda _values: ())
    return get  # type: ignore[return-value]


#: The prebuilt Core statements compiled so far in this process, per dialect (its class,
#: parameter style and server version), for every kept connection and every statement run
#: through :func:`fetch` / :func:`execute`: SQLAlchemy's compile of a hot-path statement takes
#: 1-2 ms (the FX graph lookup's, ``FIRST_VARIANT``: 1.3-2.0 ms on the AMD VM), which each new
#: :class:`~cachedb.store.engine.KeptConnection` (each ``cachedb.installed``, each database a
#: process opens) paid again on its first lookup before.
_COMPILED: dict[tuple[Any, ...], tuple[ClauseElement, _Compiled]] = {}


def compiled_for(stmt: ClauseElement, dialect: Dialect) -> _Compiled:
    """``stmt`` compiled for ``dialect``, once per process (:data:`_COMPILED`): its SQL text,
    bind order and bind processors (SQLite's ``DateTime`` through :func:`_sqlite_datetime`)."""
    cache_key = (id(stmt), type(dialect), dialect.paramstyle, dialect.server_version_info)
    found = _COMPILED.get(cache_key)
    if found is not None and found[0] is stmt:
        return found[1]
    compiled = stmt.compile(dialect=dialect)
    positions = getattr(compiled, "positiontup", None)
    defaults = {k: v for k, v in compiled.params.items() if v is not None}
    processors: dict[str, Callable[[Any], Any]] = {}
    for bind, name in compiled.bind_names.items():
        process = bind.type.dialect_impl(dialect).bind_processor(dialect)
        if process is not None:
            if dialect.name == "sqlite" and isinstance(bind.type, DateTime):
                process = _sqlite_datetime(process)
            processors[name] = process
    names = tuple(positions) if dialect.positional else None
    entry = _Compiled(compiled.string, names, defaults, processors, _picker(names, defaults, processors))
    _COMPILED[cache_key] = (stmt, entry)  # keeps stmt alive: its id stays unique
    return entry


def _run(conn: Connection, stmt: ClauseElement, params: Mapping[str, Any], rows: bool) -> Any:
    dialect = conn.dialect
    compiled = compiled_for(stmt, dialect)
    bound = compiled.params(params)
    dbapi = conn.connection.driver_connection
    cursor = dbapi.cursor()
    try:
        cursor.execute(compiled.sql, bound)
        return cursor.fetchall() if rows else int(cursor.rowcount)
    except dialect.loaded_dbapi.Error as exc:
        raise DBAPIError.instance(
            compiled.sql, bound, exc, dialect.loaded_dbapi.Error, dialect=dialect
        ) from exc
    finally:
        cursor.close()


def _driver_in_transaction(conn: Connection) -> bool:
    """Whether ``conn``'s SQLite driver connection is in a transaction SQLAlchemy did not begin
    (:meth:`cachedb.store.engine.KeptConnection.snapshot`'s ``BEGIN``)."""
    return conn.dialect.name == "sqlite" and bool(conn.connection.driver_connection.in_transaction)


def _connection(bind: Any) -> Connection:
    """``bind`` itself, or an ORM ``Session``'s connection, after the flush of what was added
    to it that ``Session.execute`` would have made first (autoflush)."""
    if bind.__class__ is Connection or isinstance(bind, Connection):
        return bind  # type: ignore[no-any-return]
    if bind.autoflush:
        bind.flush()
    return bind.connection()  # type: ignore[no-any-return]


def fetch(bind: Any, stmt: ClauseElement, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """All rows (tuples, in the ``SELECT``'s column order) of the prebuilt Core ``SELECT``
    ``stmt`` with ``params``. On a :class:`~sqlalchemy.Connection` it runs on the driver
    connection, inside the transaction the ``Connection`` holds (one is begun first when it
    holds none, as ``Connection.execute`` would autobegin it). ``bind`` may also be an ORM
    ``Session``: then on its connection, after the flush ``Session.execute`` would make.

    Raises:
        sqlalchemy.exc.DBAPIError: the driver failed (the subclass ``Connection.execute``
            would raise: ``OperationalError``, ``IntegrityError``, ...).
    """
    conn = _connection(bind)
    if not conn.in_transaction() and not _driver_in_transaction(conn):
        conn.begin()
    return _run(conn, stmt, params, True)  # type: ignore[no-any-return]


def execute(bind: Any, stmt: ClauseElement, params: Mapping[str, Any]) -> int:
    """Run the prebuilt Core statement ``stmt`` (an INSERT/UPDATE/upsert) with ``params``,
    as :func:`fetch` runs a ``SELECT`` (on the driver connection of a ``Connection``, or of a
    ``Session``'s, inside its transaction); the caller commits. Returns the rows it changed
    (the driver's rowcount: 0 for an upsert whose ``WHERE`` kept the stored row).

    Raises:
        sqlalchemy.exc.DBAPIError: the driver failed, as :func:`fetch`.
    """
    conn = _connection(bind)
    if not conn.in_transaction():
        conn.begin()
    return _run(conn, stmt, params, False)  # type: ignore[no-any-return]


def execute_many(bind: Any, stmt: ClauseElement, rows: Sequence[Mapping[str, Any]]) -> int:
    """:func:`execute` of ``stmt`` once per mapping of ``rows``, in one driver ``executemany``
    (SQLAlchemy's own costs ~0.3 ms more for ten rows of a dozen columns on SQLite). Returns the
    driver's rowcount: on SQLite the rows changed, summed; other drivers may not sum it.

    Raises:
        sqlalchemy.exc.DBAPIError: the driver failed, as :func:`fetch`.
    """
    conn = _connection(bind)
    if not conn.in_transaction():
        conn.begin()
    dialect = conn.dialect
    compiled = compiled_for(stmt, dialect)
    bound = [compiled.params(r) for r in rows]
    cursor = conn.connection.driver_connection.cursor()
    try:
        cursor.executemany(compiled.sql, bound)
        return int(cursor.rowcount)
    except dialect.loaded_dbapi.Error as exc:
        raise DBAPIError.instance(compiled.sql, bound, exc, dialect.loaded_dbapi.Error, dialect=dialect) from exc
    finally:
        cursor.close()
