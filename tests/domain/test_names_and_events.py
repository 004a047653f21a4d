"""Dataset and object names (no escape from a store's root) and the ChangeEvent type."""

from __future__ import annotations

import pytest

from controlplane.domain.errors import DomainInputError, ObjectNameError
from controlplane.domain.events import ChangeEvent
from controlplane.domain.hlc import HLC
from controlplane.domain.names import NAME_MAX_BYTES, check_name
from controlplane.domain.version import Digest, Version

STAMP = HLC(1764579123456, 0, "eu-west")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "key name is empty"),
        ("../x", "has a '..' segment"),
        ("a/../b", "has a '..' segment"),
        ("a/..", "has a '..' segment"),
        ("/abs", "starts with '/'"),
        ("a\0b", "contains a NUL character"),
        ("\udcff", "is not valid UTF-8"),
        ("é" * 513, f"is 1026 bytes long; at most {NAME_MAX_BYTES} are allowed"),
    ],
)
def test_bad_names_are_refused(name: str, message: str) -> None:
    with pytest.raises(ObjectNameError, match=message):
        check_name("key", name)


def test_good_names_pass() -> None:
    for name in ("a", "ckpt/llama-70b", "a/.../b", "..a", "a..", "x" * NAME_MAX_BYTES, "数据/集"):
        assert check_name("dataset", name) == name
    with pytest.raises(ObjectNameError, match="dataset name must be text, got int"):
        check_name("dataset", 5)


def event(**over: object) -> ChangeEvent:
    fields: dict[str, object] = {
        "event_id": "e-1",
        "dataset": "d",
        "key": "k",
        "version": Version.put(STAMP, 2, Digest.of(b"ab")),
        "origin_region": "eu-west",
        "policy_revision": 1,
        "inline": b"ab",
    }
    fields.update(over)
    return ChangeEvent(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"event_id": ""}, "event_id is empty"),
        ({"key": "../x"}, "'..' segment"),
        ({"origin_region": ""}, "origin_region '' is not a region name"),
        ({"origin_region": "NOT A REGION"}, "'NOT A REGION' is not a region name"),
        ({"origin_region": "us-east"}, r"differs from the region of its version's HLC"),
        ({"policy_revision": 0}, "policy_revision is 0"),
        ({"epoch": -1}, "epoch must be an integer >= 0, got -1"),
        ({"schema": 2}, "schema 2 is not known"),
        ({"set": ""}, "set is empty"),
        ({"origin_agent": "a:1"}, "carries both inline bytes and an origin_agent"),
        ({"inline": None}, "a put needs inline bytes or an origin_agent"),
        ({"inline": b"abc"}, "inline holds 3 bytes but the version's size is 2"),
        ({"version": Version.delete(STAMP)}, "a delete carries no content source"),
    ],
)
def test_change_event_rules(over: dict[str, object], message: str) -> None:
    with pytest.raises(DomainInputError, match=message):
        event(**over)


def test_change_event_defaults() -> None:
    e = event()
    assert (e.schema, e.epoch, e.set, e.origin_agent) == (1, 0, None, None)
    assert event(inline=None, version=Version.delete(STAMP)).version.is_tombstone
