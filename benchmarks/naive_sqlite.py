"""STRAWMAN — a deliberately naive SQLite key/value store, for comparison only.

This is *not* cachedb and not a recommendation: it is the "just put it in SQLite" design the
best-config benchmark (§3) compares against, to show what cachedb's engine setup (WAL,
``synchronous=NORMAL``, pooled connections) buys. Every operation opens a new connection with
Python's ``sqlite3`` defaults — rollback journal (``journal_mode=DELETE``),
``synchronous=FULL`` (an fsync per commit) — runs one statement, commits and closes.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path


class NaiveSQLiteStore:
    """STRAWMAN: key -> text in one table, one connection per operation, default journal."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        with sqlite3.connect(self.path) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.close()

    def put(self, key: str, value: str) -> None:
        """Insert or replace ``key`` (one connection, one transaction, one fsync'd commit)."""
        conn = sqlite3.connect(self.path)
        try:
            conn.execute("INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)", (key, value))
            conn.commit()
        finally:
            conn.close()

    def get(self, key: str) -> str | None:
        """The value of ``key`` or ``None`` (one connection per call)."""
        conn = sqlite3.connect(self.path)
        try:
            row = conn.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        finally:
            conn.close()
        return None if row is None else row[0]
