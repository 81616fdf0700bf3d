"""cachedb's version (one place; ``cachedb.__version__`` and ``cachedb --version`` read it)."""

__version__ = "0.1.0"
