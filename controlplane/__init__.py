"""Meridian control plane: policy, catalog, coordination, CLI.

`__version__` is the package's version, written here and read by the build
(pyproject.toml's dynamic version), so that knowing it costs no importlib.metadata
lookup: every `meridian` command imports this package, and that lookup took a
quarter of `meridian --version`.
"""

__version__ = "0.1.0"
