"""What a routed read ends with when no agent of the region served the object, and
which copies it does not serve (agents/routing/service.py `_Answers`)."""

from __future__ import annotations

import pytest

from agents.placement import Member
from agents.routing.service import _Answers
from agents.store.errors import DeletedError
from controlplane.domain.hlc import HLC
from controlplane.errors import InvalidInputError, NotFoundError, UnavailableError

OWNER, OTHER = Member("owner", "127.0.0.1:1", 1), Member("other", "127.0.0.1:2", 1)
T1, T2, T3 = (str(HLC(1_000 * n, 0, "eu-west")) for n in (1, 2, 3))


def answers() -> _Answers:
    return _Answers(frozenset({OWNER.agent_id}))


def test_a_copy_older_than_a_tombstone_seen_is_not_served_a_newer_one_is() -> None:
    # A rebalance may not yet have dropped an older copy elsewhere (not served); a put
    # after the delete may sit on an owner the tombstone's holder lagged (served).
    got = answers()
    got.failed(OWNER, DeletedError(f"object d/k was deleted (tombstone {T2})"))
    assert got.older(HLC.parse(T1)) and got.older(HLC.parse(T2))
    assert not got.older(HLC.parse(T3))
    final = got.final("not stored")
    assert isinstance(final, DeletedError) and T2 in str(final)


def test_the_newest_tombstone_seen_decides() -> None:
    got = answers()
    got.failed(OTHER, DeletedError(f"object d/k was deleted (tombstone {T3})"))
    got.failed(OWNER, DeletedError(f"object d/k was deleted (tombstone {T1})"))
    assert got.older(HLC.parse(T2))


def test_a_tombstone_whose_version_cannot_be_read_is_only_not_found() -> None:
    got = answers()
    got.failed(OTHER, DeletedError("deleted there"))
    assert not got.older(HLC.parse(T1))
    assert isinstance(got.final("not stored"), NotFoundError)


def test_an_owner_out_of_reach_makes_not_found_unknowable() -> None:
    got = answers()
    got.failed(OWNER, UnavailableError("the owner did not answer"))
    got.failed(OTHER, NotFoundError("not here"))
    final = got.final("not stored")
    assert isinstance(final, UnavailableError) and final.retriable


def test_another_agent_out_of_reach_leaves_the_owners_not_found() -> None:
    got = answers()
    got.failed(OWNER, NotFoundError("not here"))
    got.failed(OTHER, UnavailableError("gone"))
    assert type(got.final("not stored")) is NotFoundError


def test_any_other_error_is_raised_at_once() -> None:
    with pytest.raises(InvalidInputError):
        answers().failed(OTHER, InvalidInputError("bad name"))


def test_no_answer_at_all_is_not_found_naming_the_object() -> None:
    assert str(answers().final("object d/k is not stored in eu-west")).startswith("object d/k")
