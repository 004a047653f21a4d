"""Digests (blake3, validation), versions and tombstones, and the LWW rule."""

from __future__ import annotations

import itertools

import blake3
import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain.errors import DigestError, VersionError
from controlplane.domain.hlc import HLC
from controlplane.domain.version import (
    ContentHasher,
    Digest,
    Verdict,
    Version,
    lww,
    newest,
)
from controlplane.domain.version_set import SetMember, VersionSet
from controlplane.errors import InvalidInputError

EMPTY = "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"  # blake3 of b""


def test_digest_of_content_is_blake3_with_its_prefix() -> None:
    assert str(Digest.of(b"")) == f"blake3:{EMPTY}"
    data = b"checkpoint shard" * 1000
    assert Digest.of(data) == Digest("blake3", blake3.blake3(data).hexdigest())
    hasher = ContentHasher()
    for start in range(0, len(data), 4096):
        hasher.update(memoryview(data)[start : start + 4096])
    assert hasher.digest() == Digest.of(data)


@given(st.binary(max_size=256))
def test_digest_text_round_trips(data: bytes) -> None:
    digest = Digest.of(data)
    assert Digest.parse(digest.text) == digest


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (EMPTY, "names no algorithm; expected <algorithm>:<hex>"),
        (f"sha256:{EMPTY}", "digest algorithm 'sha256' is not known (known: blake3)"),
        (f"BLAKE3:{EMPTY}", "digest algorithm 'BLAKE3' is not known"),
        (f":{EMPTY}", "digest algorithm '' is not known"),
        ("blake3:" + "g" * 64, "is not lower-case hexadecimal"),
        ("blake3:" + EMPTY.upper(), "is not lower-case hexadecimal"),
        ("blake3:" + EMPTY[:-2], "blake3 digest has 62 hex digits, not 64"),
        ("blake3:" + EMPTY + "00", "blake3 digest has 66 hex digits, not 64"),
        ("blake3:", "blake3 digest has 0 hex digits, not 64"),
        (f"blake3:{EMPTY} ", "is not lower-case hexadecimal"),
        (f"blake3:{EMPTY[:-1]}\n", "is not lower-case hexadecimal"),
    ],
)
def test_bad_digest_gets_one_error(text: str, message: str) -> None:
    with pytest.raises(DigestError) as err:
        Digest.parse(text)
    assert message in str(err.value)
    assert isinstance(err.value, InvalidInputError)


def test_non_text_digest_is_refused() -> None:
    with pytest.raises(DigestError, match="digest must be a string, got NoneType"):
        Digest.parse(None)


def hlc(wall: int, logical: int = 0, region: str = "eu-west") -> HLC:
    return HLC(wall, logical, region)


D1 = Digest.of(b"one")
D2 = Digest.of(b"two")


def test_versions_and_tombstones_are_checked() -> None:
    tomb = Version.delete(hlc(5))
    assert tomb.is_tombstone and tomb.size == 0 and tomb.digest is None
    assert not Version.put(hlc(5), 3, D1).is_tombstone
    with pytest.raises(VersionError, match="a put version needs its content digest"):
        Version(hlc(5), "put", 3, None)
    with pytest.raises(VersionError, match="a delete version \\(tombstone\\) has no content"):
        Version(hlc(5), "delete", 0, D1)
    with pytest.raises(VersionError, match="a delete version \\(tombstone\\) has no content"):
        Version(hlc(5), "delete", 4, None)
    with pytest.raises(VersionError, match="version op must be one of put, delete, got 'copy'"):
        Version(hlc(5), "copy", 3, D1)  # type: ignore[arg-type]
    with pytest.raises(VersionError, match="version size must be an integer >= 0, got -1"):
        Version(hlc(5), "put", -1, D1)
    with pytest.raises(VersionError, match="version hlc must be an HLC"):
        Version("0000000000005.00000@eu-west", "put", 1, D1)  # type: ignore[arg-type]


def test_lww_strictly_greater_hlc_wins() -> None:
    old = Version.put(hlc(100), 3, D1)
    new = Version.put(hlc(100, 1), 3, D2)
    assert lww(new, old) is Verdict.APPLY and lww(new, old).applies
    assert lww(old, new) is Verdict.OLDER and not lww(old, new).applies
    assert lww(old, None) is Verdict.APPLY


def test_lww_equal_hlc_is_a_no_op() -> None:
    v = Version.put(hlc(100), 3, D1)
    assert lww(v, Version.put(hlc(100), 3, D1)) is Verdict.SAME  # a replay
    other = Version.put(hlc(100), 4, D2)  # same stamp, other content
    assert lww(other, v) is Verdict.COLLISION and not lww(other, v).applies
    tomb = Version.delete(hlc(100))
    assert lww(tomb, v) is Verdict.COLLISION and lww(v, tomb) is Verdict.COLLISION


def test_lww_region_breaks_ties_byte_wise() -> None:
    west = Version.put(hlc(100, 0, "eu-west"), 1, D1)
    east = Version.put(hlc(100, 0, "eu-east"), 1, D2)
    assert lww(west, east) is Verdict.APPLY  # "eu-west" > "eu-east"
    assert lww(east, west) is Verdict.OLDER


def test_tombstones_take_part_in_ordering() -> None:
    put = Version.put(hlc(100), 3, D1)
    tomb = Version.delete(hlc(200))
    late_put = Version.put(hlc(150, 0, "us-east"), 3, D2)  # older than the delete
    assert lww(tomb, put) is Verdict.APPLY
    assert lww(late_put, tomb) is Verdict.OLDER  # no resurrection
    assert newest([put, tomb, late_put]) == tomb
    assert lww(Version.put(hlc(201), 3, D2), tomb) is Verdict.APPLY


versions = st.builds(
    lambda wall, logical, region, delete, data: (
        Version.delete(HLC(wall, logical, region))
        if delete
        else Version.put(HLC(wall, logical, region), len(data), Digest.of(data))
    ),
    st.integers(0, 3),
    st.integers(0, 2),
    st.sampled_from(["eu-west", "us-east"]),
    st.booleans(),
    st.binary(max_size=2),
)


@given(st.lists(versions, max_size=8))
def test_every_arrival_order_converges_on_the_same_newest(arrivals: list[Version]) -> None:
    """A region applying arrivals with lww ends on the version of the highest HLC,
    whatever the order; for ties the first arrival stays (equal is a no-op)."""
    for order in itertools.islice(itertools.permutations(arrivals), 50):
        held: Version | None = None
        for v in order:
            if lww(v, held).applies:
                held = v
        if not arrivals:
            assert held is None
            continue
        assert held is not None
        assert held.hlc == max(v.hlc for v in arrivals)
        unique_hlcs = {v.hlc: v for v in arrivals}
        if len(unique_hlcs) == len(set(arrivals)):  # no collisions: one winner everywhere
            assert held == newest(arrivals)


def test_a_set_naming_keys_twice_names_a_few_of_them_however_large_it_is() -> None:
    at = HLC(1, 0, "eu-west")
    keys = [f"shard-{i:05d}" for i in range(20_000)]
    keys += [f"shard-{i:05d}" for i in range(12)]  # twelve named twice
    members = tuple(SetMember(k, at) for k in keys)
    with pytest.raises(VersionError) as err:
        VersionSet("ckpt", "s1", members)
    message = str(err.value)
    assert "names a key twice: shard-00000, shard-00001," in message
    assert "shard-00009 and 2 more" in message
    assert "shard-00011" not in message  # a few named, not all
