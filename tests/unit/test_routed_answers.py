"""What a routed read ends with when no agent of the region served the object
(agents/routing/service.py `_Answers`): the owners' word is final."""

from __future__ import annotations

import pytest

from agents.placement import Member
from agents.routing.service import _Answers
from agents.store.errors import DeletedError
from controlplane.errors import InvalidInputError, NotFoundError, UnavailableError

OWNER, OTHER = Member("owner", "127.0.0.1:1", 1), Member("other", "127.0.0.1:2", 1)


def answers() -> _Answers:
    return _Answers(frozenset({OWNER.agent_id}))


def test_an_owners_tombstone_ends_the_search() -> None:
    # A rebalance may not yet have dropped an older copy elsewhere: it is not served.
    got = answers()
    with pytest.raises(DeletedError):
        got.failed(OWNER, DeletedError("object d/k was deleted (tombstone 1.0@eu-west)"))


def test_a_tombstone_elsewhere_is_only_not_found() -> None:
    got = answers()
    got.failed(OTHER, DeletedError("deleted there"))
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
