"""The ``cachedb`` command line (also ``python -m cachedb``).

:mod:`._common` holds the ``main`` group and what every command shares; each command module
registers its commands on it when imported here.
"""

from . import artifacts, cache, copy, cutlass, fleet, report  # noqa: F401  (register their commands)
from ._common import main

__all__ = ["main"]
