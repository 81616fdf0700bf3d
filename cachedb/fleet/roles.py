"""Least-privilege roles on a shared PostgreSQL tier: consumers read, trusted writers write.

:func:`grant_statements` is the SQL ``cachedb fleet grant`` runs (``--print`` shows it): two
group roles, NOLOGIN,

- a **reader** role: ``CONNECT`` on the database, ``USAGE`` on the schema, ``SELECT`` on its
  tables and views. A consumer logged in with it gets every hit; its writes are refused by
  the server, so they stay in its local file (the remote tier warns once and goes on);
- a **writer** role: the reader's rights plus ``INSERT`` and ``UPDATE`` on the tables and
  ``USAGE`` on their sequences (the remote tier's pushes; no ``DELETE``, no DDL).

``ALTER DEFAULT PRIVILEGES`` gives both the same rights on tables a later migration creates
(run by the schema's owner: ``cachedb --db URL upgrade``). Each login role named is granted
its group (created with ``LOGIN`` when missing; set its password or certificate mapping
yourself). Pair the writer role with ``CACHEDB_SIGNING_KEY`` and consumers with
``CACHEDB_TRUSTED_KEYS`` (:mod:`cachedb.fleet.trust`): the role keeps strangers from writing,
the signature keeps a writer's mistake or a stolen URL from being served.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, text

#: Default group role names.
READER_ROLE = "cachedb_reader"
WRITER_ROLE = "cachedb_writer"


def _ident(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def grant_statements(database: str, schema: str, *, readers: Sequence[str] = (), writers: Sequence[str] = (),
                     reader_role: str = READER_ROLE, writer_role: str = WRITER_ROLE) -> list[str]:
    """The SQL that sets up the two group roles on ``database``/``schema`` and grants them to
    the login roles ``readers`` and ``writers``. Idempotent (roles created only when missing)."""
    db, sch, r, w = _ident(database), _ident(schema), _ident(reader_role), _ident(writer_role)
    out: list[str] = []
    for role in (reader_role, writer_role):
        lit = role.replace("'", "''")
        out.append(f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{lit}') THEN "
                   f"CREATE ROLE {_ident(role)} NOLOGIN; END IF; END $$")
    out += [
        f"GRANT CONNECT ON DATABASE {db} TO {r}, {w}",
        f"GRANT USAGE ON SCHEMA {sch} TO {r}, {w}",
        f"GRANT SELECT ON ALL TABLES IN SCHEMA {sch} TO {r}, {w}",
        f"GRANT INSERT, UPDATE ON ALL TABLES IN SCHEMA {sch} TO {w}",
        f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {sch} TO {w}",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {sch} GRANT SELECT ON TABLES TO {r}, {w}",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {sch} GRANT INSERT, UPDATE ON TABLES TO {w}",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {sch} GRANT USAGE, SELECT ON SEQUENCES TO {w}",
    ]
    for logins, group in ((readers, reader_role), (writers, writer_role)):
        for login in logins:
            lit = login.replace("'", "''")
            out.append(f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{lit}') THEN "
                       f"CREATE ROLE {_ident(login)} LOGIN; END IF; END $$")
            out.append(f"GRANT {_ident(group)} TO {_ident(login)}")
    return out


def grant(conn: Connection, *, readers: Sequence[str] = (), writers: Sequence[str] = (),
          reader_role: str = READER_ROLE, writer_role: str = WRITER_ROLE) -> list[str]:
    """Run :func:`grant_statements` for the database and schema of ``conn`` (PostgreSQL; in
    the caller's transaction; needs a role that may create roles and owns the schema).
    Returns the statements run. Raises ``ValueError`` on another database."""
    if conn.dialect.name != "postgresql":
        raise ValueError("roles exist on PostgreSQL only")
    database, schema = conn.execute(text("SELECT current_database(), current_schema()")).one()
    statements = grant_statements(database, schema, readers=readers, writers=writers,
                                  reader_role=reader_role, writer_role=writer_role)
    for sql in statements:
        conn.execute(text(sql))
    return statements


__all__ = ["READER_ROLE", "WRITER_ROLE", "grant", "grant_statements"]
