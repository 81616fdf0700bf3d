"""How cachedb stores rows and bytes: the engine and its SQLite settings, the schema (tables
and typed models), payload encoding, prebuilt statements, bulk writes, WAL checkpoints,
fork safety, atomic files, signing and trust, and schema migration.

Imports nothing of cachedb but :mod:`cachedb._errors`.
"""
