"""Inductor's cache directory in and out of the database: import (walk and worker pool),
export, torch's Mega-Cache blobs, and CUTLASS op-list generation.

Imports :mod:`cachedb.db` and the layers below it.
"""
