"""Reading the transfer record an agent journals, as the recorder ships it to the
catalog's `transfers` table.

Transfers write it (agents/transfer/records.py, `TransferTally.record`) through the
store's `transfer=` when a version is committed, or `store.record_transfer` for one
that committed nothing (refused, failed, skipped, or the sender's side). The object
and version come from the journal row. `id` is the transfer's own id (the catalog
keeps one row per id, so a sender and a receiver that both journal one transfer
make one row, as does a record shipped twice). Fields the catalog has no column
for (direction, method, seconds, ...) stay in the journal only.
"""

from __future__ import annotations

from dataclasses import dataclass

from agents.store.model import JsonValue
from controlplane.errors import InvalidInputError

OUTCOMES: tuple[str, ...] = ("completed", "failed", "refused", "skipped")
ID_MAX = 64  # the catalog's transfers.id


@dataclass(frozen=True)
class TransferFacts:
    id: str
    from_region: str
    to_region: str
    logical_bytes: int
    wire_bytes: int
    outcome: str
    policy_revision: int | None = None
    object: str | None = None
    # In force when the copy was made (None: not journaled, an older agent's record).
    from_jurisdiction: str | None = None
    to_jurisdiction: str | None = None
    residency: tuple[str, ...] | None = None
    residency_revision: int | None = None


def read_transfer(data: dict[str, JsonValue]) -> TransferFacts:
    """The facts of a journalled transfer; InvalidInputError naming the bad field."""

    def required(name: str) -> str:
        value = data.get(name)
        if not isinstance(value, str) or not value:
            raise InvalidInputError(
                f"transfer record: {name} must be a non-empty string, got {value!r}"
            )
        return value

    def count(name: str) -> int:
        value = data.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidInputError(
                f"transfer record: {name} must be an integer >= 0, got {value!r}"
            )
        return value

    tid = required("id")
    if len(tid) > ID_MAX:
        raise InvalidInputError(f"transfer record: id {tid!r} is longer than {ID_MAX} characters")
    outcome = data.get("outcome")
    if not isinstance(outcome, str) or outcome not in OUTCOMES:
        raise InvalidInputError(
            f"transfer record {tid}: outcome {outcome!r} is not one of {', '.join(OUTCOMES)}"
        )
    revision = data.get("policy_revision")
    if revision is not None and (isinstance(revision, bool) or not isinstance(revision, int)):
        raise InvalidInputError(
            f"transfer record {tid}: policy_revision must be an integer, got {revision!r}"
        )
    obj = data.get("object")

    def jurisdiction(name: str) -> str | None:
        value = data.get(name)
        if value is not None and (not isinstance(value, str) or not value):
            raise InvalidInputError(
                f"transfer record {tid}: {name} must be a non-empty string, got {value!r}"
            )
        return value

    residency_revision = data.get("residency_revision")
    if residency_revision is not None and (
        isinstance(residency_revision, bool) or not isinstance(residency_revision, int)
    ):
        raise InvalidInputError(
            f"transfer record {tid}: residency_revision must be an integer, "
            f"got {residency_revision!r}"
        )
    residency = data.get("residency")
    if residency is not None and (
        not isinstance(residency, list) or not all(isinstance(j, str) and j for j in residency)
    ):
        raise InvalidInputError(
            f"transfer record {tid}: residency must be a list of jurisdictions, got {residency!r}"
        )
    return TransferFacts(
        id=tid,
        from_region=required("from_region"),
        to_region=required("to_region"),
        logical_bytes=count("logical_bytes"),
        wire_bytes=count("wire_bytes"),
        outcome=outcome,
        policy_revision=revision,
        object=obj if isinstance(obj, str) and obj else None,
        from_jurisdiction=jurisdiction("from_jurisdiction"),
        to_jurisdiction=jurisdiction("to_jurisdiction"),
        residency=None if residency is None else tuple(str(j) for j in residency),
        residency_revision=residency_revision,
    )
