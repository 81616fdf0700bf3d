"""Alembic environment for cachedb's packaged migrations.

Run programmatically by :mod:`cachedb.store.migrate`, which passes an open connection in
``config.attributes["connection"]``; the ``alembic`` command line works too, with
``-x url=<sqlalchemy url>`` (see README).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from cachedb.store.tables import metadata

config = context.config
#: The schema as Core tables (``cachedb.store.models`` maps the same ``MetaData``): a process that
#: creates its database while it compiles does not load the ORM for it.
target_metadata = metadata


def _configure_and_run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure_and_run(connection)
        return
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
        "sqlalchemy.url"
    )
    engine = create_engine(url)
    with engine.connect() as conn:
        _configure_and_run(conn)
        conn.commit()


if context.is_offline_mode():
    raise SystemExit("cachedb migrations run online only")
run_migrations_online()
