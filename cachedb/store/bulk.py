"""Driver-level bulk row I/O for ``copy``, ``merge`` and the fleet tiers' point sync.

SQLAlchemy's per-row work (result rows, type processors, compiled parameters) costs more than
the databases do when thousands of small rows or megabytes of payloads move between two of
them; this module moves rows through the DBAPI driver under the caller's SQLAlchemy
transaction, with the same values SQLAlchemy would have stored:

- :func:`stream` reads the rows of a ``SELECT`` in batches of tuples: SQLite through its own
  cursor (timestamps as stored: SQLAlchemy's ``YYYY-MM-DD HH:MM:SS.ffffff`` strings, booleans
  as 0/1), PostgreSQL through a server-side binary cursor (aware datetimes, ``bytea`` as
  bytes, no hex round trip);
- :func:`matching` narrows a ``SELECT`` to a batch of keys in one indexed query;
- :func:`bulk_insert` writes dict rows: PostgreSQL through one binary ``COPY ... FROM STDIN``,
  SQLite through the driver's ``executemany`` (timestamps formatted as SQLAlchemy's SQLite
  dialect formats them, UTC); any other database through SQLAlchemy's ``insert``.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from sqlalchemy import Connection, DateTime, Select, String, Table, and_, bindparam, func, insert, select, tuple_
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import Insert

UTC = dt.timezone.utc

#: PostgreSQL type OIDs of ``(table, columns)`` (built-in types: the same on every server).
_PG_OIDS: dict[tuple[str, tuple[str, ...]], list[int]] = {}
_cursor_names = itertools.count()
_NOTHING = object()
#: PostgreSQL integer type OIDs (int2, int4, int8) and the bound of their values: -b <= v < b.
_PG_INT_LIMITS = {21: 2**15, 23: 2**31, 20: 2**63}
#: Whether this process's SQLite has the JSON functions (built in since 3.38, usually before).
_SQLITE_JSON: list[bool] = []


def _sqlite_json(conn: Connection) -> bool:
    """Whether SQLite's JSON functions (``json_each``, ``json_extract``) work here (probed once)."""
    if not _SQLITE_JSON:
        try:
            conn.connection.driver_connection.execute("SELECT json_extract(?, '$[0]') FROM json_each(?)", ("[1]", "[1]"))  # type: ignore[union-attr]
            _SQLITE_JSON.append(True)
        except Exception:  # noqa: BLE001 - no JSON1: row-value IN
            _SQLITE_JSON.append(False)
    return _SQLITE_JSON[0]


def dialect_insert(dialect: str) -> Callable[[Table], Insert] | None:
    """The ``insert()`` of ``dialect`` (``"sqlite"`` or ``"postgresql"``) that has ``ON CONFLICT``
    clauses, imported on first use (PostgreSQL's dialect package costs ~20 ms to import, which a
    process on SQLite does not pay); ``None`` for any other dialect."""
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert  # type: ignore[no-any-return]
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert  # type: ignore[no-any-return]
    return None


def _psycopg(conn: Connection) -> bool:
    return conn.dialect.name == "postgresql" and conn.dialect.driver == "psycopg"


def utc(value: Any) -> Any:
    """Datetimes as timezone-aware UTC (naive ones are taken as UTC, which is what SQLite
    holds); anything else unchanged."""
    if isinstance(value, dt.datetime):
        tz = value.tzinfo
        if tz is UTC:
            return value
        return value.replace(tzinfo=UTC) if tz is None else value.astimezone(UTC)
    return value


def parse_timestamp(value: Any) -> Any:
    """A stored timestamp as an aware UTC datetime: SQLite's text (``2026-11-23
    13:38:41.792803``, UTC), or a datetime from either driver; ``None`` stays ``None``.

    Raises ValueError for text that is not an ISO 8601 timestamp."""
    if isinstance(value, str):
        parsed = dt.datetime.fromisoformat(value)
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    return utc(value)


def sqlite_timestamp(value: dt.datetime) -> str:
    """``value`` (naive = UTC) as SQLAlchemy's SQLite dialect stores a ``DateTime``:
    ``YYYY-MM-DD HH:MM:SS.ffffff`` in UTC."""
    tz = value.tzinfo
    if tz is not None:
        value = (value if tz is UTC else value.astimezone(UTC)).replace(tzinfo=None)
    return value.isoformat(" ", "microseconds")


def stream(conn: Connection, stmt: Select[Any], batch_rows: int) -> Iterator[list[tuple[Any, ...]]]:
    """The rows of ``stmt`` (a ``SELECT`` whose parameters may be rendered as literals:
    numbers, strings) in batches of at most ``batch_rows`` tuples, in the transaction of
    ``conn``; values as the driver returns them (see the module docstring)."""
    driver = conn.connection.driver_connection
    if conn.dialect.name == "sqlite" or _psycopg(conn):
        sql = str(stmt.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
        if conn.dialect.name == "sqlite":
            cursor = driver.cursor()  # type: ignore[union-attr]
            try:
                cursor.execute(sql)
                while rows := cursor.fetchmany(batch_rows):
                    yield rows
            finally:
                cursor.close()
            return
        with driver.cursor(name=f"cachedb_stream_{next(_cursor_names)}", binary=True) as cursor:  # type: ignore[union-attr]
            cursor.itersize = batch_rows
            cursor.execute(sql)
            while rows := cursor.fetchmany(batch_rows):
                yield rows
        return
    result = conn.execution_options(yield_per=batch_rows).execute(stmt)
    for part in result.partitions():
        yield [tuple(row) for row in part]


def _pg_oids(driver: Any, table: Table, names: tuple[str, ...], quoted_table: str, quoted: str) -> list[int]:
    key = (table.name, names)
    oids = _PG_OIDS.get(key)
    if oids is None:
        with driver.cursor() as cursor:
            cursor.execute(f"SELECT {quoted} FROM {quoted_table} WHERE false")
            oids = [d.type_code for d in cursor.description]
        _PG_OIDS[key] = oids
    return oids


def bulk_insert(conn: Connection, table: Table, rows: Sequence[dict[str, Any]], *,
                exclude: Sequence[str] = ()) -> None:
    """INSERT ``rows`` (dicts with the same keys; those in ``exclude`` are left out) into
    ``table`` in the transaction of ``conn``.

    PostgreSQL (psycopg 3): one binary ``COPY ... FROM STDIN`` (psycopg's ``executemany``
    sends one INSERT per row; text COPY sends ``bytea`` as hex, twice its size). SQLite: the
    driver's ``executemany`` with SQLAlchemy's stored forms (timestamps as UTC text). Columns
    the rows lack get no Python-side default on those paths, so rows that lack a column with
    one go through SQLAlchemy's ``insert``, as does any other database.

    Raises the :class:`sqlalchemy.exc.DBAPIError` subclass SQLAlchemy would raise for the
    driver's error (``DataError`` for a value the column refuses, ...), on every path.
    """
    if not rows:
        return
    first = rows[0]
    names = tuple(c.name for c in table.c if c.name in first and c.name not in exclude)
    lacking_default = any(c.default is not None and c.name not in first and not c.primary_key for c in table.c)
    if lacking_default or not _fast(conn) or not names:
        _wrapped(conn, table, lambda: conn.execute(insert(table), [{k: r[k] for k in names} for r in rows]))
        return
    bulk_insert_values(conn, table, names, [[r[n] for n in names] for r in rows])


def bulk_insert_values(conn: Connection, table: Table, names: Sequence[str], values: list[list[Any]]) -> None:
    """INSERT ``values`` (lists of the values of the columns ``names``, in that order; the lists
    are changed in place) into ``table`` in the transaction of ``conn``, as :func:`bulk_insert`
    writes dict rows, without building them. Every column with a Python-side default must be
    among ``names``. Raises as :func:`bulk_insert` does."""
    if not values:
        return
    names = tuple(names)
    if not _fast(conn):
        _wrapped(conn, table, lambda: conn.execute(insert(table), [dict(zip(names, v)) for v in values]))
        return
    _wrapped(conn, table, lambda: _insert_values(conn, table, names, values))


def _fast(conn: Connection) -> bool:
    """Whether rows go through the driver (SQLite, psycopg 3) rather than SQLAlchemy's insert."""
    return conn.dialect.name == "sqlite" or _psycopg(conn)


def _wrapped(conn: Connection, table: Table, write: Callable[[], object]) -> None:
    try:
        write()
    except conn.dialect.loaded_dbapi.Error as exc:
        raise DBAPIError.instance(f"bulk insert into {table.name}", None, exc, conn.dialect.loaded_dbapi.Error,
                                  dialect=conn.dialect) from exc


def _insert_values(conn: Connection, table: Table, names: tuple[str, ...], values: list[list[Any]]) -> None:
    columns = [table.c[n] for n in names]
    timestamps = [i for i, c in enumerate(columns) if isinstance(c.type, DateTime)]
    quote = conn.dialect.identifier_preparer.quote
    quoted = ", ".join(quote(n) for n in names)
    driver: Any = conn.connection.driver_connection
    if conn.dialect.name == "sqlite":
        last: Any = _NOTHING  # rows written together mostly share their timestamps: format each once
        last_text = ""
        for row in values:
            for i in timestamps:
                v = row[i]
                if v is last:
                    row[i] = last_text
                elif isinstance(v, dt.datetime):
                    last, last_text = v, sqlite_timestamp(v)
                    row[i] = last_text
        sql = f"INSERT INTO {quote(table.name)} ({quoted}) VALUES ({', '.join('?' * len(names))})"
        driver.executemany(sql, values)
        return
    oids = _pg_oids(driver, table, names, quote(table.name), quoted)
    # psycopg's binary dumpers keep the low bits of an int too large for an int2/int4 column
    # (2**40 is stored as 0): refuse it as the server refuses it in an INSERT, before the COPY.
    limits = [(i, _PG_INT_LIMITS[oid]) for i, oid in enumerate(oids) if oid in _PG_INT_LIMITS]
    for row in values:
        for i in timestamps:
            v = row[i]
            if v.__class__ is dt.datetime and v.tzinfo is None:
                row[i] = v.replace(tzinfo=UTC)
        for i, limit in limits:
            v = row[i]
            if isinstance(v, int) and not -limit <= v < limit:
                raise conn.dialect.loaded_dbapi.errors.NumericValueOutOfRange(
                    f"{names[i]} = {v}: integer out of range for its column"
                )
    with driver.cursor() as cursor, cursor.copy(f"COPY {quote(table.name)} ({quoted}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(oids)
        for row in values:
            copy.write_row(row)


def matching(conn: Connection, stmt: Select[Any], t: Table, columns: Sequence[str],
             keys: Sequence[tuple[Any, ...]]) -> Select[Any]:
    """``stmt`` (a SELECT from ``t``) narrowed to the rows whose ``columns`` (none of them
    nullable) equal one of ``keys``, each key an index lookup: on PostgreSQL a join with
    ``unnest`` of one array per column (one parameter each); on SQLite, for keys of strings
    and integers, a join with the rows of one JSON parameter (``json_each``). A row-value
    ``IN`` list (SQLite's other keys, any other database) is planned by both as a scan of the
    whole table or index, per query. One parameter keeps the statement SQLAlchemy's to cache:
    a ``VALUES`` list of 500 keys cost more to compile (23 ms) than the scan it avoids at
    20,000 stored keys (7.5 ms; the JSON join: 1.7 ms)."""
    cols = [t.c[c] for c in columns]
    names = [f"k{i}" for i in range(len(cols))]
    if (conn.dialect.name == "sqlite" and _sqlite_json(conn)
            and all(type(v) is str or type(v) is int for key in keys for v in key)):
        text = json.dumps(list(dict.fromkeys(keys)), ensure_ascii=False)
        each = func.json_each(bindparam("batch_keys_json", text, type_=String)).table_valued("value").alias("batch_keys_json")
        batch = select(
            *(func.json_extract(each.c.value, f"$[{i}]").label(n) for i, n in enumerate(names))
        ).select_from(each).cte("batch_keys")
        return stmt.join(batch, and_(*(c == batch.c[n] for n, c in zip(names, cols))))
    if conn.dialect.name != "postgresql":
        return stmt.where(tuple_(*cols).in_(list(keys)))
    from sqlalchemy.dialects.postgresql import ARRAY  # only here: PostgreSQL connections

    arrays = [bindparam(n, [k[i] for k in keys], type_=ARRAY(c.type)) for i, (n, c) in enumerate(zip(names, cols))]
    v = func.unnest(*arrays).table_valued(*names).render_derived(name="batch_keys")
    return stmt.join(v, and_(*(c == v.c[n] for n, c in zip(names, cols))))


__all__ = ["UTC", "bulk_insert", "bulk_insert_values", "matching", "parse_timestamp", "sqlite_timestamp", "stream", "utc"]
