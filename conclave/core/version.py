"""The package's version, importable from every layer (`conclave.__version__` re-exports it)."""

__version__ = "0.1.0"
