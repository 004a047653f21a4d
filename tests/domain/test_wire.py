"""The protobuf boundary: domain values round-trip, and each kind of bad message gets
one MessageError naming the field."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain.errors import MessageError
from controlplane.domain.events import ChangeEvent
from controlplane.domain.hlc import HLC
from controlplane.domain.version import Digest, Version
from controlplane.domain.version_set import SetMember, VersionSet
from controlplane.errors import InvalidInputError
from meridian.convert import (
    change_event_from_wire,
    change_event_to_wire,
    decode_change_event,
    encode_change_event,
    version_from_wire,
    version_set_from_wire,
    version_set_to_wire,
    version_to_wire,
)
from meridian.v1 import change_event_pb2, types_pb2

STAMP = HLC(1764579123456, 3, "eu-west")
DATA = b"shard bytes"


def put_event(**over: object) -> ChangeEvent:
    fields: dict[str, object] = {
        "event_id": "e-1",
        "dataset": "corpus/web",
        "key": "part-0001.bin",
        "version": Version.put(STAMP, len(DATA), Digest.of(DATA)),
        "origin_region": "eu-west",
        "policy_revision": 7,
        "inline": DATA,
    }
    fields.update(over)
    return ChangeEvent(**fields)  # type: ignore[arg-type]


def test_events_round_trip_through_bytes() -> None:
    events = [
        put_event(),
        put_event(inline=b"", version=Version.put(STAMP, 0, Digest.of(b""))),  # empty inline
        put_event(inline=None, origin_agent="10.0.0.5:7400", epoch=12, set="ckpt-step-100"),
        put_event(inline=None, version=Version.delete(STAMP)),
    ]
    for event in events:
        assert decode_change_event(encode_change_event(event)) == event
    assert events[0].log_key == "corpus/web/part-0001.bin"
    assert change_event_to_wire(events[1]).WhichOneof("content") == "inline"


regions = st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True)
names = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\0/"), min_size=1
).filter(lambda n: n != "..")


@st.composite
def events(draw: st.DrawFn) -> ChangeEvent:
    stamp = HLC(draw(st.integers(0, 10**13 - 1)), draw(st.integers(0, 99999)), draw(regions))
    body = draw(st.none() | st.binary(max_size=64))
    if draw(st.booleans()):
        version = Version.delete(stamp)
        inline, agent = None, None
    else:
        data = body or b""
        version = Version.put(stamp, len(data), Digest.of(data))
        inline, agent = (data, None) if body is not None else (None, "agent:7400")
    return ChangeEvent(
        event_id=draw(st.uuids()).hex,
        dataset=draw(names),
        key="/".join(draw(st.lists(names, min_size=1, max_size=3))),
        version=version,
        origin_region=stamp.region,  # the origin stamps its versions
        policy_revision=draw(st.integers(1, 2**63)),
        epoch=draw(st.integers(0, 2**63)),
        set=draw(st.none() | names),
        inline=inline,
        origin_agent=agent,
    )


@given(events())
def test_any_event_round_trips(event: ChangeEvent) -> None:
    assert decode_change_event(encode_change_event(event)) == event


@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_message_error_only(data: bytes) -> None:
    with contextlib.suppress(MessageError):
        decode_change_event(data)


def edit(change: Callable[[change_event_pb2.ChangeEvent], object]) -> bytes:
    msg = change_event_to_wire(put_event())
    change(msg)
    return msg.SerializeToString()


BLAKE_HEX = Digest.of(DATA).hex


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        (edit(lambda m: m.ClearField("schema")), "ChangeEvent.schema", "is missing"),
        (edit(lambda m: setattr(m, "schema", 3)), "ChangeEvent.schema", "schema 3 is not known"),
        # Schema 2 is a version set's event: never read as a change of one object.
        (
            edit(lambda m: setattr(m, "schema", 2)),
            "ChangeEvent.schema",
            "schema 2 is a version set's event",
        ),
        (edit(lambda m: m.ClearField("event_id")), "ChangeEvent.event_id", "is missing"),
        (edit(lambda m: m.ClearField("dataset")), "ChangeEvent.dataset", "is missing"),
        (edit(lambda m: m.ClearField("key")), "ChangeEvent.key", "is missing"),
        (edit(lambda m: setattr(m, "key", "a/../../etc")), "ChangeEvent.key", "'..' segment"),
        (edit(lambda m: setattr(m, "key", "/etc/passwd")), "ChangeEvent.key", "starts with '/'"),
        (edit(lambda m: setattr(m, "dataset", "a\0b")), "ChangeEvent.dataset", "NUL"),
        (edit(lambda m: m.ClearField("version")), "ChangeEvent.version", "is missing"),
        (
            edit(lambda m: m.version.ClearField("hlc")),
            "ChangeEvent.version.hlc",
            "is missing",
        ),
        (
            edit(lambda m: setattr(m.version, "hlc", "1764579123456.3@eu-west")),
            "ChangeEvent.version.hlc",
            "malformed HLC '1764579123456.3@eu-west': logical '3' is not 5 digits",
        ),
        (edit(lambda m: m.version.ClearField("op")), "ChangeEvent.version.op", "is missing"),
        (edit(lambda m: setattr(m.version, "op", 9)), "ChangeEvent.version.op", "unknown op 9"),
        (
            edit(lambda m: m.version.ClearField("digest")),
            "ChangeEvent.version.digest",
            "is missing",
        ),
        (
            edit(lambda m: setattr(m.version, "digest", f"sha256:{BLAKE_HEX}")),
            "ChangeEvent.version.digest",
            "digest algorithm 'sha256' is not known (known: blake3)",
        ),
        (
            edit(lambda m: setattr(m.version, "digest", BLAKE_HEX)),
            "ChangeEvent.version.digest",
            "names no algorithm",
        ),
        (
            edit(lambda m: setattr(m.version, "digest", "blake3:abc")),
            "ChangeEvent.version.digest",
            "blake3 digest has 3 hex digits, not 64",
        ),
        (edit(lambda m: m.ClearField("origin_region")), "ChangeEvent.origin_region", "is missing"),
        (
            edit(lambda m: m.ClearField("policy_revision")),
            "ChangeEvent.policy_revision",
            "is missing",
        ),
        (
            edit(lambda m: m.ClearField("content")),
            "ChangeEvent.content",
            "a put needs inline bytes or an origin_agent",
        ),
        (
            edit(lambda m: setattr(m, "origin_agent", "")),
            "ChangeEvent.origin_agent",
            "is missing",
        ),
        (
            edit(lambda m: setattr(m, "inline", b"short")),
            "ChangeEvent.inline",
            "holds 5 bytes but ChangeEvent.version.size is 11",
        ),
        (edit(lambda m: setattr(m, "set", "")), "ChangeEvent.set", "is missing"),
        (
            edit(lambda m: (setattr(m.version, "op", types_pb2.OP_DELETE),)),
            "ChangeEvent.version.digest",
            "a delete version carries no digest",
        ),
        (b"\xff\xff\xff", "", "ChangeEvent: cannot be decoded"),
        (b"", "ChangeEvent.schema", "is missing"),
    ],
)
def test_each_bad_message_gets_one_error_naming_the_field(
    data: bytes, field: str, message: str
) -> None:
    with pytest.raises(MessageError) as err:
        decode_change_event(data)
    assert err.value.field == field
    assert str(err.value).startswith(field or "ChangeEvent")
    assert message in str(err.value)
    assert isinstance(err.value, InvalidInputError)  # INVALID_ARGUMENT / dead letter


def test_a_delete_with_content_is_refused() -> None:
    msg = change_event_to_wire(put_event(inline=None, version=Version.delete(STAMP)))
    msg.origin_agent = "agent:1"
    with pytest.raises(MessageError, match=r"ChangeEvent\.origin_agent: a delete carries no"):
        change_event_from_wire(msg)
    tomb = version_to_wire(Version.delete(STAMP))
    tomb.size = 4
    with pytest.raises(MessageError, match=r"Version.size: a delete version has size 0, got 4"):
        version_from_wire(tomb)


def test_versions_round_trip() -> None:
    for version in (Version.put(STAMP, 11, Digest.of(DATA)), Version.delete(STAMP)):
        assert version_from_wire(version_to_wire(version)) == version
    assert version_to_wire(Version.delete(STAMP)).digest == ""


def test_version_sets_round_trip_and_are_checked() -> None:
    vs = VersionSet(
        "ckpt/llama-70b",
        "step-100",
        (SetMember("shard-0", STAMP), SetMember("shard-1", HLC(1764579123457, 0, "eu-west"))),
        HLC(1764579123460, 0, "eu-west"),
    )
    assert version_set_from_wire(version_set_to_wire(vs)) == vs
    request = version_set_to_wire(VersionSet(vs.dataset, vs.id, vs.members))
    assert version_set_from_wire(request, stamped=False).hlc is None
    with pytest.raises(MessageError, match=r"^VersionSet\.hlc is missing$"):
        version_set_from_wire(request)
    request.members[1].key = "shard-0"
    with pytest.raises(MessageError, match=r"VersionSet: version set step-100 .* a key twice"):
        version_set_from_wire(request, stamped=False)
    request.members[1].version = "yesterday"
    with pytest.raises(MessageError, match=r"^VersionSet.members\[1\].version: malformed HLC"):
        version_set_from_wire(request, stamped=False)
    del request.members[:]
    with pytest.raises(MessageError, match=r"^VersionSet\.members is missing$"):
        version_set_from_wire(request, stamped=False)
