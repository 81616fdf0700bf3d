"""Looking at a database: stats, verify, recover, the HTML report, Datasette metadata.

Imports :mod:`cachedb.layout`, :mod:`cachedb.fleet`, :mod:`cachedb.db` and the layers below.
"""
