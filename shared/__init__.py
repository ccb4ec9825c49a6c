"""Owns tokenferry's version, written here and nowhere else; shared/ is what both tiers import.

pyproject.toml reads ``__version__`` from this file (setuptools' dynamic version),
so the installed metadata, ``/version``, ``/info`` and the OpenAPI schema all say
the same thing. It is a literal rather than ``importlib.metadata.version(...)``:
a source checkout without installed metadata still knows its version, and
setuptools reads the literal without importing the package.
"""

__version__ = "0.1.0"
