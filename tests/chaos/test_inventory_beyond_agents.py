"""Dead letters in the residency inventory, and the clock offset scenario 13 sets."""

from __future__ import annotations

from chaos.catalog_inventory import dlq_copy
from controlplane.domain.events import ChangeEvent, SetEvent
from controlplane.domain.hlc import HLC, HybridClock, offset_ms, system_ms
from controlplane.domain.version import ContentHasher, Version
from controlplane.domain.version_set import SetMember, VersionSet
from controlplane.settings import Settings
from meridian.convert import encode_change_event, encode_set_event


def event(inline: bytes | None) -> bytes:
    hlc = HLC.parse("1764579123456.00000@eu-west")
    hasher = ContentHasher()
    hasher.update(inline or b"x")
    version = Version.put(hlc, len(inline or b"x"), hasher.digest())
    e = ChangeEvent(
        event_id="e1",
        dataset="std/s0",
        key="k1",
        version=version,
        origin_region="eu-west",
        policy_revision=1,
        inline=inline,
        origin_agent=None if inline is not None else "127.0.0.1:1",
    )
    return encode_change_event(e)


def test_a_dead_letter_with_inline_bytes_is_a_copy_in_the_refusing_region() -> None:
    copy = dlq_copy({"region": b"us-east", "dataset": b"std/s0"}, event(b"secret"), 1, 7)
    assert copy is not None
    assert (copy.region, copy.dataset, copy.key, copy.kind) == ("us-east", "std/s0", "k1", "dlq")
    assert copy.where == "meridian.dlq/1/7"


def test_a_dead_letter_naming_its_origin_only_holds_no_bytes() -> None:
    assert dlq_copy({"region": b"us-east", "dataset": b"std/s0"}, event(None), 0, 1) is None


def test_a_dead_lettered_version_set_event_holds_no_bytes() -> None:
    # It names member versions only; counted as bytes it would be a residency violation
    # in the refusing region that never was (a schema-1 decoder cannot read it).
    hlc = HLC.parse("1764579123456.00001@eu-west")
    members = (SetMember("k1", HLC.parse("1764579123456.00000@eu-west")),)
    data = encode_set_event(
        SetEvent(
            event_id="e2",
            version_set=VersionSet("std/s0", "step-1", members, hlc),
            origin_region="eu-west",
            policy_revision=1,
        )
    )
    assert dlq_copy({"region": b"us-east", "dataset": b"std/s0"}, data, 0, 2) is None


def test_an_undecodable_dead_letter_without_a_dataset_is_unattributed() -> None:
    copy = dlq_copy({"region": b"us-east", "dataset": b""}, b"\x00garbage", 2, 3)
    assert copy is not None and copy.dataset is None and copy.region == "us-east"


def test_the_clock_offset_setting_shifts_the_hlc_only() -> None:
    assert Settings(clock_offset_ms=30_000).clock_offset_ms == 30_000
    assert offset_ms(0) is system_ms
    ahead = HybridClock("eu-north", physical_ms=offset_ms(30_000)).now()
    assert 29_000 < ahead.wall_ms - system_ms() <= 30_000
