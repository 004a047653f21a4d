"""Errors of the node agent's admission, beyond the project's tree (`controlplane.errors`)
and the store's (`agents.store.errors`)."""

from __future__ import annotations

from controlplane.errors import RefusedError


class ResidencyError(RefusedError):
    """A copy would be stored, or sent, in a region outside its dataset's residency
    (PERMISSION_DENIED); it is recorded as a refused transfer and never retried."""
