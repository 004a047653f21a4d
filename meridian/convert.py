"""Protobuf messages <-> domain types, checked at the boundary.

Every `*_from_wire` function either returns a valid domain value or raises one
`MessageError` whose text starts with the dotted path of the offending field
(`ChangeEvent.version.hlc: malformed HLC ...`) and whose `.field` holds that
path: a missing required field (proto3 sends an empty string, a zero or an
unset message for it), bad HLC text, a digest without a known algorithm, a bad
name, an unknown schema. Callers map it once: an applier sends the event to the
dead-letter topic with the message as reason, an agent answers INVALID_ARGUMENT.
`*_to_wire` functions take valid domain values and cannot fail.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from google.protobuf.message import DecodeError

from controlplane.domain.errors import DomainInputError, MessageError
from controlplane.domain.events import (
    CHANGE_EVENT_SCHEMA,
    SET_EVENT_SCHEMA,
    ChangeEvent,
    LogEvent,
    SetEvent,
)
from controlplane.domain.hlc import HLC
from controlplane.domain.names import check_name
from controlplane.domain.version import Digest, Op, Version
from controlplane.domain.version_set import SetMember, VersionSet
from meridian.v1 import change_event_pb2, types_pb2

T = TypeVar("T")

_OP_TO_WIRE: dict[Op, types_pb2.Op.ValueType] = {
    "put": types_pb2.OP_PUT,
    "delete": types_pb2.OP_DELETE,
}
_OP_FROM_WIRE: dict[int, Op] = {v: k for k, v in _OP_TO_WIRE.items()}


def _at(path: str, exc: DomainInputError) -> MessageError:
    """A domain input error met while reading `path`, as a MessageError on it."""
    return MessageError(f"{path}: {exc}", field=path)


def _missing(path: str) -> MessageError:
    return MessageError(f"{path} is missing", field=path)


def _required(path: str, value: str) -> str:
    if not value:
        raise _missing(path)
    return value


def _parsed(path: str, parse: Callable[[str], T], value: str) -> T:
    """`parse` of the required field `value` at `path`."""
    # try/except, not a context manager: this runs for every field of every event.
    try:
        return parse(_required(path, value))
    except MessageError:
        raise
    except DomainInputError as exc:
        raise _at(path, exc) from exc


def _built(path: str, build: Callable[[], T]) -> T:
    """The domain value `build` makes of the message at `path`, its own checks included."""
    try:
        return build()
    except DomainInputError as exc:
        raise _at(path, exc) from exc


# ---- HLC, digest, version ---------------------------------------------------


def hlc_to_wire(hlc: HLC) -> str:
    return str(hlc)


def hlc_from_wire(text: str, path: str) -> HLC:
    return _parsed(path, HLC.parse, text)


def version_to_wire(version: Version) -> types_pb2.Version:
    return types_pb2.Version(
        hlc=str(version.hlc),
        op=_OP_TO_WIRE[version.op],
        size=version.size,
        digest="" if version.digest is None else str(version.digest),
    )


def version_from_wire(msg: types_pb2.Version, path: str = "Version") -> Version:
    hlc = hlc_from_wire(msg.hlc, f"{path}.hlc")
    op = _OP_FROM_WIRE.get(msg.op)
    if op is None:
        if msg.op == types_pb2.OP_UNSPECIFIED:
            raise _missing(f"{path}.op")
        raise MessageError(f"{path}.op: unknown op {msg.op}", field=f"{path}.op")
    if op == "delete":
        if msg.digest:
            raise MessageError(
                f"{path}.digest: a delete version carries no digest, got {msg.digest!r}",
                field=f"{path}.digest",
            )
        if msg.size:
            raise MessageError(
                f"{path}.size: a delete version has size 0, got {msg.size}", field=f"{path}.size"
            )
        return Version.delete(hlc)
    digest = _parsed(f"{path}.digest", Digest.parse, msg.digest)
    return _built(path, lambda: Version.put(hlc, msg.size, digest))


# ---- version sets -------------------------------------------------------------


def version_set_to_wire(vs: VersionSet) -> types_pb2.VersionSet:
    return types_pb2.VersionSet(
        dataset=vs.dataset,
        id=vs.id,
        members=[types_pb2.SetMember(key=m.key, version=str(m.version)) for m in vs.members],
        hlc="" if vs.hlc is None else str(vs.hlc),
    )


def version_set_from_wire(
    msg: types_pb2.VersionSet, path: str = "VersionSet", *, stamped: bool = True
) -> VersionSet:
    """`stamped`: the set must carry its HLC (False for a CommitSet request, which the
    agent stamps)."""
    dataset = _parsed(f"{path}.dataset", lambda v: check_name("dataset", v), msg.dataset)
    set_id = _required(f"{path}.id", msg.id)
    if not msg.members:
        raise _missing(f"{path}.members")
    members: list[SetMember] = []
    for i, m in enumerate(msg.members):
        where = f"{path}.members[{i}]"
        key = _parsed(f"{where}.key", lambda v: check_name("key", v), m.key)
        members.append(SetMember(key, hlc_from_wire(m.version, f"{where}.version")))
    hlc: HLC | None = None
    if msg.hlc or stamped:
        hlc = hlc_from_wire(msg.hlc, f"{path}.hlc")
    return _built(path, lambda: VersionSet(dataset, set_id, tuple(members), hlc))


# ---- change events --------------------------------------------------------------


def change_event_to_wire(event: ChangeEvent) -> change_event_pb2.ChangeEvent:
    msg = change_event_pb2.ChangeEvent(
        schema=event.schema,
        event_id=event.event_id,
        dataset=event.dataset,
        key=event.key,
        version=version_to_wire(event.version),
        origin_region=event.origin_region,
        epoch=event.epoch,
        policy_revision=event.policy_revision,
    )
    if event.set is not None:
        msg.set = event.set
    if event.inline is not None:
        msg.inline = event.inline
    elif event.origin_agent is not None:
        msg.origin_agent = event.origin_agent
    return msg


def set_event_to_wire(event: SetEvent) -> change_event_pb2.ChangeEvent:
    return change_event_pb2.ChangeEvent(
        schema=event.schema,
        event_id=event.event_id,
        dataset=event.dataset,
        origin_region=event.origin_region,
        epoch=event.epoch,
        policy_revision=event.policy_revision,
        version_set=version_set_to_wire(event.version_set),
    )


def set_event_from_wire(msg: change_event_pb2.ChangeEvent) -> SetEvent:
    path = "ChangeEvent"
    if msg.schema != SET_EVENT_SCHEMA:
        raise MessageError(
            f"{path}.schema: schema {msg.schema} is not the set form ({SET_EVENT_SCHEMA})",
            field=f"{path}.schema",
        )
    event_id = _required(f"{path}.event_id", msg.event_id)
    if not msg.HasField("version_set"):
        raise _missing(f"{path}.version_set")
    # The set form carries nothing of an object's change: a field of one is a mangled
    # event (which of the two is meant cannot be told), not something to ignore.
    stray = {
        "key": bool(msg.key),
        "version": msg.HasField("version"),
        "set": msg.HasField("set"),
        "content": msg.WhichOneof("content") is not None,
    }
    for name, present in stray.items():
        if present:
            raise MessageError(
                f"{path}.{name}: a set event (schema {SET_EVENT_SCHEMA}) carries no {name}",
                field=f"{path}.{name}",
            )
    vs = version_set_from_wire(msg.version_set, f"{path}.version_set", stamped=True)
    if msg.dataset != vs.dataset:
        raise MessageError(
            f"{path}.dataset: {msg.dataset!r} differs from {path}.version_set.dataset "
            f"({vs.dataset!r})",
            field=f"{path}.dataset",
        )
    origin_region = _required(f"{path}.origin_region", msg.origin_region)
    if msg.policy_revision == 0:
        raise _missing(f"{path}.policy_revision")
    return _built(
        path,
        lambda: SetEvent(
            event_id=event_id,
            version_set=vs,
            origin_region=origin_region,
            policy_revision=msg.policy_revision,
            epoch=msg.epoch,
        ),
    )


def change_event_from_wire(msg: change_event_pb2.ChangeEvent) -> ChangeEvent:
    path = "ChangeEvent"
    if msg.schema == 0:
        raise _missing(f"{path}.schema")
    if msg.schema != CHANGE_EVENT_SCHEMA:
        if msg.schema == SET_EVENT_SCHEMA:
            raise MessageError(
                f"{path}.schema: schema {SET_EVENT_SCHEMA} is a version set's event, not a "
                "change of one object (decode_log_event reads both)",
                field=f"{path}.schema",
            )
        raise MessageError(
            f"{path}.schema: schema {msg.schema} is not known (this code reads "
            f"{CHANGE_EVENT_SCHEMA} and {SET_EVENT_SCHEMA})",
            field=f"{path}.schema",
        )
    if msg.HasField("version_set"):
        raise MessageError(
            f"{path}.version_set: a schema {CHANGE_EVENT_SCHEMA} event carries no set record",
            field=f"{path}.version_set",
        )
    event_id = _required(f"{path}.event_id", msg.event_id)
    dataset = _parsed(f"{path}.dataset", lambda v: check_name("dataset", v), msg.dataset)
    key = _parsed(f"{path}.key", lambda v: check_name("key", v), msg.key)
    if not msg.HasField("version"):
        raise _missing(f"{path}.version")
    version = version_from_wire(msg.version, f"{path}.version")
    origin_region = _required(f"{path}.origin_region", msg.origin_region)
    if msg.policy_revision == 0:
        raise _missing(f"{path}.policy_revision")
    content = msg.WhichOneof("content")
    if version.is_tombstone and content is not None:
        raise MessageError(
            f"{path}.{content}: a delete carries no content", field=f"{path}.{content}"
        )
    if not version.is_tombstone:
        if content is None:
            raise MessageError(
                f"{path}.content is missing: a put needs inline bytes or an origin_agent",
                field=f"{path}.content",
            )
        if content == "origin_agent":
            _required(f"{path}.origin_agent", msg.origin_agent)
        elif len(msg.inline) != version.size:
            raise MessageError(
                f"{path}.inline: holds {len(msg.inline)} bytes but {path}.version.size "
                f"is {version.size}",
                field=f"{path}.inline",
            )
    if msg.HasField("set"):
        _required(f"{path}.set", msg.set)
    return _built(
        path,
        lambda: ChangeEvent(
            schema=msg.schema,
            event_id=event_id,
            dataset=dataset,
            key=key,
            version=version,
            origin_region=origin_region,
            epoch=msg.epoch,
            policy_revision=msg.policy_revision,
            set=msg.set if msg.HasField("set") else None,
            inline=msg.inline if content == "inline" else None,
            origin_agent=msg.origin_agent if content == "origin_agent" else None,
        ),
    )


def encode_change_event(event: ChangeEvent) -> bytes:
    """The Kafka record value of `event`."""
    return change_event_to_wire(event).SerializeToString(deterministic=True)


def encode_set_event(event: SetEvent) -> bytes:
    """The Kafka record value of a version set's event."""
    return set_event_to_wire(event).SerializeToString(deterministic=True)


def encode_log_event(event: LogEvent) -> bytes:
    if isinstance(event, SetEvent):
        return encode_set_event(event)
    return encode_change_event(event)


def decode_change_event(data: bytes) -> ChangeEvent:
    """A Kafka record value back into a change of one object; bytes that are no
    ChangeEvent, one that is malformed, or a set's event (schema 2) raise MessageError
    (the dead-letter reason). `decode_log_event` reads set events too."""
    return change_event_from_wire(_parse_event(data))


def decode_log_event(data: bytes) -> LogEvent:
    """`decode_change_event`, and a version set's event (schema 2) as a SetEvent."""
    msg = _parse_event(data)
    if msg.schema == SET_EVENT_SCHEMA:
        return set_event_from_wire(msg)
    return change_event_from_wire(msg)


def _parse_event(data: bytes) -> change_event_pb2.ChangeEvent:
    msg = change_event_pb2.ChangeEvent()
    try:
        msg.ParseFromString(data)
    except DecodeError as exc:
        raise MessageError(f"ChangeEvent: cannot be decoded ({exc})") from exc
    return msg
