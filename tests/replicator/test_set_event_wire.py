"""The change log's form of a version set (ChangeEvent schema 2, `version_set`): it
round-trips, a reader of changes of one object refuses it (the dead letter an
applier that knows only schema 1 gives it), and a mangled mix of the two forms is
refused naming the field."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from controlplane.domain.errors import MessageError, VersionError
from controlplane.domain.events import SET_EVENT_SCHEMA, ChangeEvent, SetEvent, set_log_key
from controlplane.domain.hlc import HLC
from controlplane.domain.version import Digest, Version
from controlplane.domain.version_set import SetMember, VersionSet
from meridian.convert import (
    decode_change_event,
    decode_log_event,
    encode_change_event,
    encode_set_event,
    set_event_to_wire,
)
from meridian.v1 import change_event_pb2, types_pb2

STAMP = HLC(1_700_000_000_000, 2, "eu-west")


def set_event(**over: object) -> SetEvent:
    members = (
        SetMember("shard-0", HLC(1_700_000_000_000, 0, "eu-west")),
        SetMember("shard-1", STAMP),
    )
    fields: dict[str, object] = {
        "event_id": "ev-set-1",
        "version_set": VersionSet(
            "ckpt/run", "step-100", members, HLC(1_700_000_000_001, 0, "eu-west")
        ),
        "origin_region": "eu-west",
        "policy_revision": 7,
    }
    fields.update(over)
    return SetEvent(**fields)  # type: ignore[arg-type]


def test_a_set_event_round_trips_and_is_keyed_apart_from_every_object() -> None:
    event = set_event()
    data = encode_set_event(event)
    assert decode_log_event(data) == event
    assert event.schema == SET_EVENT_SCHEMA == 2
    assert event.log_key == set_log_key("ckpt/run", "step-100")
    # No object name holds a NUL, so no object's `dataset/key` equals a set's key.
    assert "\0" in event.log_key
    # A change of one object still reads the same way through either decoder.
    change = ChangeEvent(
        event_id="ev-1",
        dataset="ckpt/run",
        key="shard-0",
        version=Version.put(STAMP, 3, Digest.of(b"abc")),
        origin_region="eu-west",
        policy_revision=7,
        inline=b"abc",
    )
    assert decode_log_event(encode_change_event(change)) == change


def test_a_reader_of_object_changes_refuses_a_set_event_instead_of_misapplying_it() -> None:
    data = encode_set_event(set_event())
    with pytest.raises(MessageError) as err:
        decode_change_event(data)
    assert err.value.field == "ChangeEvent.schema"
    # What schema 1 code made of it: the schema is not 1, so it is refused (dead letter);
    # and even a reader that ignored the schema would find no key and no version.
    msg = change_event_pb2.ChangeEvent.FromString(data)
    assert msg.schema != 1 and not msg.key and not msg.HasField("version")


def _mangled(edit: Callable[[change_event_pb2.ChangeEvent], object]) -> bytes:
    msg = set_event_to_wire(set_event())
    edit(msg)
    return msg.SerializeToString()


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (_mangled(lambda m: setattr(m, "key", "shard-0")), "ChangeEvent.key"),
        (_mangled(lambda m: m.version.CopyFrom(types_pb2.Version())), "ChangeEvent.version"),
        (_mangled(lambda m: setattr(m, "inline", b"x")), "ChangeEvent.content"),
        (_mangled(lambda m: m.ClearField("version_set")), "ChangeEvent.version_set"),
        (_mangled(lambda m: setattr(m.version_set, "hlc", "")), "ChangeEvent.version_set.hlc"),
        (_mangled(lambda m: setattr(m, "dataset", "other/ds")), "ChangeEvent.dataset"),
        (_mangled(lambda m: m.ClearField("policy_revision")), "ChangeEvent.policy_revision"),
        # A set record under schema 1: neither form, refused rather than half read.
        (_mangled(lambda m: setattr(m, "schema", 1)), "ChangeEvent.version_set"),
    ],
)
def test_a_mangled_set_event_is_refused_naming_the_field(data: bytes, field: str) -> None:
    with pytest.raises(MessageError) as err:
        decode_log_event(data)
    assert err.value.field == field, str(err.value)


def test_a_set_event_whose_origin_did_not_stamp_it_is_refused() -> None:
    with pytest.raises(VersionError, match="differs from the region"):
        set_event(origin_region="eu-central")
    unstamped = VersionSet("ckpt/run", "s", (SetMember("a", STAMP),))
    with pytest.raises(VersionError, match="carries no HLC"):
        set_event(version_set=unstamped)
