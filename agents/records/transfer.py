"""The transfer record an agent journals (the store's `transfer=` / `journal_transfer`),
as the recorder ships it to the catalog's `transfers` table.

Transfers build it with `transfer_data`; the recorder reads it back with
`read_transfer`, which names the field that is wrong. The object and version come
from the journal row (the write it was committed with), or from `version` here
for a transfer that stored nothing. `id` is the transfer's own id, the same at
both ends (the catalog keeps one row per id, so a sender and a receiver that both
journal one transfer make one row, as does a record shipped twice).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agents.store.model import JsonValue
from controlplane.errors import InvalidInputError

Outcome = Literal["completed", "failed", "refused"]
OUTCOMES: tuple[str, ...] = ("completed", "failed", "refused")
ID_MAX = 64  # the catalog's transfers.id


@dataclass(frozen=True)
class TransferFacts:
    id: str
    from_region: str
    to_region: str
    logical_bytes: int
    wire_bytes: int
    outcome: Outcome
    error: str | None = None
    policy_revision: int | None = None
    version: str | None = None


def transfer_data(
    *,
    id: str,
    from_region: str,
    to_region: str,
    logical_bytes: int,
    wire_bytes: int,
    outcome: Outcome,
    error: str | None = None,
    policy_revision: int | None = None,
    version: str | None = None,
) -> dict[str, JsonValue]:
    """The journal `data` of a transfer (checked now, so a bad one fails at the writer)."""
    data: dict[str, JsonValue] = {
        "id": id,
        "from_region": from_region,
        "to_region": to_region,
        "logical_bytes": logical_bytes,
        "wire_bytes": wire_bytes,
        "outcome": outcome,
        "error": error,
        "policy_revision": policy_revision,
        "version": version,
    }
    read_transfer(data)
    return data


def read_transfer(data: dict[str, JsonValue]) -> TransferFacts:
    """The facts of a journalled transfer; InvalidInputError naming the bad field."""

    def optional(name: str) -> str | None:
        value = data.get(name)
        return None if value is None else required(name)

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
    if outcome not in OUTCOMES:
        raise InvalidInputError(
            f"transfer record {tid}: outcome {outcome!r} is not one of {', '.join(OUTCOMES)}"
        )
    revision = data.get("policy_revision")
    if revision is not None and (isinstance(revision, bool) or not isinstance(revision, int)):
        raise InvalidInputError(
            f"transfer record {tid}: policy_revision must be an integer, got {revision!r}"
        )
    return TransferFacts(
        id=tid,
        from_region=required("from_region"),
        to_region=required("to_region"),
        logical_bytes=count("logical_bytes"),
        wire_bytes=count("wire_bytes"),
        outcome=outcome,  # type: ignore[arg-type]  # checked above
        error=optional("error"),
        policy_revision=revision,
        version=optional("version"),
    )
