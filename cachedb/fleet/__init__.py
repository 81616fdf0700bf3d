"""More than one database: copy and merge between SQLite and PostgreSQL, and the sync of a
local database with a shared tier.

Imports :mod:`cachedb.db` and the layers below it.
"""
