"""Errors of the catalog, subclassing the project's tree.

SQLAlchemy and driver errors never leave the catalog: `translate.py` turns each into
one of these, and the class says whether retrying may help (`retriable`)."""

from __future__ import annotations

from controlplane.errors import (
    ConfigError,
    ConflictError,
    InvalidInputError,
    MeridianError,
    RefusedError,
    UnavailableError,
)


class CatalogError(MeridianError):
    """The catalog failed in a way retrying will not fix (a bug, or a damaged schema)."""


class CatalogUnavailableError(UnavailableError):
    """The catalog database cannot be reached, or is busy; retry with backoff."""


class CatalogNotMigratedError(ConfigError):
    """The catalog exists but its schema is missing or not at the head migration."""


class CatalogConflictError(ConflictError):
    """A concurrent writer changed what this operation was based on; retry it."""


class CatalogInputError(InvalidInputError):
    """A write named something the catalog does not hold, or carried a bad value."""


class StrandedReplicasError(RefusedError):
    """Applying a policy would leave existing replicas outside their dataset's residency."""
