"""Errors of the node agent's admission, beyond the project's tree (`controlplane.errors`)
and the store's (`agents.store.errors`)."""

from __future__ import annotations

from controlplane.errors import FencedError, RefusedError, UnavailableError


class ResidencyError(RefusedError):
    """A copy would be stored, or sent, in a region outside its dataset's residency
    (PERMISSION_DENIED); it is recorded as a refused transfer and never retried."""


class NotGovernedError(UnavailableError):
    """No applied policy governs the dataset (or names the region): admission cannot be
    decided, so the copy or write is refused (fail closed). Retriable: it goes away once
    `meridian policy apply` publishes a policy that places it (UNAVAILABLE)."""


class NotOwnerError(FencedError):
    """A client write of a critical dataset reached an agent of a region that does not own
    it (FAILED_PRECONDITION): only the owner region's agents accept client writes; write
    through an agent of the owner region."""
