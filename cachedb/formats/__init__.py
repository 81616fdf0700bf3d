"""Readers and writers of torch's on-disk formats that need no torch: the pickle scanner and
cachedb's own pickle, Inductor's LocalCache JSON document, Triton's cache layout, and
CUTLASS op lists.

Imports :mod:`cachedb.keys` and :mod:`cachedb._errors` only.
"""
