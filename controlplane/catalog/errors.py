"""Errors of the catalog, subclassing the project's tree."""

from __future__ import annotations

from controlplane.errors import ConfigError, ConflictError, InvalidInputError, UnavailableError


class CatalogUnavailableError(UnavailableError):
    """The catalog database cannot be reached."""


class CatalogNotMigratedError(ConfigError):
    """The catalog exists but its schema is missing or not at the head migration."""


class CatalogConflictError(ConflictError):
    """A concurrent writer changed what this operation was based on; retry it."""


class CatalogInputError(InvalidInputError):
    """A write named something the catalog does not hold, or carried a bad value."""
