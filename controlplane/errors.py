"""The exception tree of Meridian.

Each class says, through class attributes, whether the failed operation may be
retried as it is (`retriable`) and which exit status the CLI edge uses. Callers
ask `err.retriable` instead of matching lists of types (as aiokafka's errors do).
Messages are one sentence that says what failed and, where useful, what to do;
the CLI edge prints them as they are.
"""

from __future__ import annotations

from typing import ClassVar


class MeridianError(Exception):
    """Base of every error Meridian raises on purpose."""

    retriable: ClassVar[bool] = False
    exit_code: ClassVar[int] = 1


class ConfigError(MeridianError):
    """A setting or flag is malformed or missing."""


class InvalidInputError(MeridianError):
    """A file, request or message given by a user is malformed."""


class NotFoundError(MeridianError):
    """A named thing (region, dataset, service) does not exist."""


class UnavailableError(MeridianError):
    """A dependency (etcd, Kafka, the catalog, a service) cannot be reached right now."""

    retriable = True


class OperationTimeoutError(UnavailableError):
    """An operation did not finish within its deadline."""


class WatchCompactedError(MeridianError):
    """A watch asked for history the store has compacted away: re-read, then watch again
    from the revision of that read."""

    retriable = True


class ConflictError(MeridianError):
    """A compare-and-set lost a race; re-read and try again."""

    retriable = True


class RefusedError(MeridianError):
    """An operation was refused by a safety rule; the message says which and why."""


class FencedError(MeridianError):
    """A write carried an epoch older than the newest one seen; the writer must step down."""


class HandingOverError(MeridianError):
    """A dataset is being handed over to another region; retry once ownership has moved."""

    retriable = True


class StackError(MeridianError):
    """A local stack service could not be installed, started, checked or stopped."""
