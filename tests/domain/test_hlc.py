"""HLC: total order equal to the text order, strict parsing, and the clock's guarantees
(monotonic across any observe, skew refused, thread-safe)."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain.errors import ClockSkewError, HLCError
from controlplane.domain.hlc import HLC, LOGICAL_MAX, WALL_MS_MAX, HybridClock
from controlplane.errors import InvalidInputError, RefusedError

regions = st.from_regex(r"[a-z][a-z0-9-]{0,62}", fullmatch=True)
# Small alphabets too, so that equal fields (and so ties) are common.
hlcs = st.builds(
    HLC,
    wall_ms=st.integers(0, WALL_MS_MAX) | st.integers(0, 3),
    logical=st.integers(0, LOGICAL_MAX) | st.integers(0, 3),
    region=regions | st.sampled_from(["a", "a-", "a0", "b", "eu-west", "eu-west-2"]),
)


def test_text_form_is_the_spec_example() -> None:
    stamp = HLC(1764579123456, 0, "eu-west")
    assert str(stamp) == "1764579123456.00000@eu-west"
    assert HLC.parse("1764579123456.00000@eu-west") == stamp
    assert str(HLC(5, 42, "us-east")) == "0000000000005.00042@us-east"


@given(hlcs, hlcs)
def test_order_is_total_and_equals_the_text_order(a: HLC, b: HLC) -> None:
    assert sum((a < b, a == b, a > b)) == 1
    assert (a < b) == (str(a) < str(b))
    assert (a == b) == (str(a) == str(b))
    # The spec's order, with the region compared byte-wise.
    key_a = (a.wall_ms, a.logical, a.region.encode())
    key_b = (b.wall_ms, b.logical, b.region.encode())
    assert (a < b) == (key_a < key_b)


@given(hlcs, hlcs, hlcs)
def test_order_is_transitive(a: HLC, b: HLC, c: HLC) -> None:
    x, y, z = sorted([a, b, c])
    assert x <= y <= z and x <= z


@given(hlcs)
def test_text_round_trips(stamp: HLC) -> None:
    assert HLC.parse(str(stamp)) == stamp


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no '@region' part"),
        ("1764579123456.00000", "no '@region' part"),
        ("1764579123456@eu-west", "no '.' between wall_ms and logical"),
        ("176457912345.00000@eu-west", "wall_ms '176457912345' is not 13 digits"),
        ("17645791234567.00000@eu-west", "wall_ms '17645791234567' is not 13 digits"),
        ("1764579123456.0000@eu-west", "logical '0000' is not 5 digits"),
        ("1764579123456.-0001@eu-west", "logical '-0001' is not 5 digits"),
        ("١٧٦٤٥٧٩١٢٣٤٥٦.00000@eu-west", "is not 13 digits"),  # Arabic-Indic digits
        ("1764579123456.00000@EU-west", "region 'EU-west' is not a region name"),
        ("1764579123456.00000@", "region '' is not a region name"),
        ("1764579123456.00000@eu-west\n", "region 'eu-west\\n' is not a region name"),
        (" 1764579123456.00000@eu-west", "wall_ms ' 1764579123456' is not 13 digits"),
        ("1764579123456.00000@eu@west", "region 'eu@west' is not a region name"),
    ],
)
def test_bad_text_gets_one_error_saying_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(HLCError) as err:
        HLC.parse(text)
    assert str(err.value).startswith(f"malformed HLC {text!r}: ")
    assert message in str(err.value)
    assert "1764579123456.00000@eu-west" in str(err.value)  # shows the expected form
    assert isinstance(err.value, InvalidInputError)


def test_non_text_and_out_of_range_fields_are_refused() -> None:
    with pytest.raises(HLCError, match="HLC text must be a string, got bytes"):
        HLC.parse(b"1764579123456.00000@eu-west")
    with pytest.raises(HLCError, match="HLC wall_ms must be between 0 and 9999999999999"):
        HLC(-1, 0, "eu-west")
    with pytest.raises(HLCError, match="HLC logical must be between 0 and 99999, got 100000"):
        HLC(0, 100_000, "eu-west")
    with pytest.raises(HLCError, match="HLC logical must be an integer, got True"):
        HLC(0, True, "eu-west")
    with pytest.raises(HLCError, match="HLC region 'Eu' is not a region name"):
        HLC(0, 0, "Eu")


class FakeTime:
    """An injectable physical clock that a test moves by hand (also backwards)."""

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


START = 1_764_579_123_456

# An operation on the clock: move physical time, stamp, or observe a remote stamp
# drawn near the physical clock (within and beyond the allowed skew).
ops = st.lists(
    st.one_of(
        st.tuples(st.just("tick"), st.integers(-5_000, 5_000)),
        st.tuples(st.just("now"), st.just(0)),
        st.tuples(st.just("observe"), st.integers(-10_000, 3_000)),
    ),
    max_size=60,
)


@given(ops, st.integers(0, LOGICAL_MAX), regions)
def test_now_is_monotonic_across_observe_of_arbitrary_stamps(
    steps: list[tuple[str, int]], remote_logical: int, remote_region: str
) -> None:
    physical = FakeTime(START)
    clock = HybridClock("eu-west", max_clock_skew_ms=1000, physical_ms=physical)
    issued: list[HLC] = []
    floor = HLC(0, 0, "a")  # every later stamp must exceed the newest observed one
    for op, arg in steps:
        if op == "tick":
            physical.ms = max(0, physical.ms + arg)
        elif op == "now":
            stamp = clock.now()
            assert stamp > floor
            issued.append(stamp)
        else:
            remote = HLC(max(0, physical.ms + arg), remote_logical, remote_region)
            before = clock.last
            if arg > 1000:
                with pytest.raises(ClockSkewError):
                    clock.observe(remote)
                assert clock.last == before  # a refused stamp changes nothing
                continue
            merged = clock.observe(remote)
            assert merged > remote and merged > before
            issued.append(merged)
            floor = max(floor, remote)
    assert issued == sorted(issued) and len(set(issued)) == len(issued)


@given(st.integers(1001, 10**9))
def test_a_stamp_too_far_ahead_is_refused(ahead: int) -> None:
    clock = HybridClock("eu-west", max_clock_skew_ms=1000, physical_ms=FakeTime(START))
    remote = HLC(START + ahead, 0, "us-east")
    with pytest.raises(ClockSkewError) as err:
        clock.observe(remote)
    assert err.value.ahead_ms == ahead and err.value.max_skew_ms == 1000
    assert err.value.reason == "clock skew"
    assert isinstance(err.value, RefusedError) and not err.value.retriable
    assert f"is {ahead} ms ahead of this clock in eu-west" in str(err.value)
    with pytest.raises(ClockSkewError):
        clock.check_skew(remote)
    assert clock.last == HLC(0, 0, "eu-west")


def test_a_stamp_exactly_at_the_limit_is_accepted() -> None:
    clock = HybridClock("eu-west", max_clock_skew_ms=1000, physical_ms=FakeTime(START))
    assert clock.observe(HLC(START + 1000, 7, "us-east")) == HLC(START + 1000, 8, "eu-west")
    assert clock.now() == HLC(START + 1000, 9, "eu-west")  # physical time is behind


def test_a_full_logical_counter_borrows_the_next_millisecond() -> None:
    clock = HybridClock("eu-west", physical_ms=FakeTime(START))
    clock.observe(HLC(START, LOGICAL_MAX - 1, "us-east"))
    assert clock.now() == HLC(START + 1, 0, "eu-west")
    assert clock.now() == HLC(START + 1, 1, "eu-west")


def test_clock_settings_are_checked() -> None:
    with pytest.raises(HLCError, match="max_clock_skew_ms must be >= 0, got -1"):
        HybridClock("eu-west", max_clock_skew_ms=-1)
    with pytest.raises(HLCError, match="HLC region 'EU' is not a region name"):
        HybridClock("EU")


def test_real_clock_follows_physical_time() -> None:
    import time

    clock = HybridClock("eu-west")
    stamp = clock.now()
    assert abs(stamp.wall_ms - time.time_ns() // 1_000_000) < 60_000


def test_threads_never_get_the_same_stamp() -> None:
    clock = HybridClock("eu-west", physical_ms=FakeTime(START))  # time stands still
    per_thread = 2_000
    results: list[list[HLC]] = [[] for _ in range(4)]

    def work(out: list[HLC]) -> None:
        for _ in range(per_thread):
            out.append(clock.now())

    threads = [threading.Thread(target=work, args=(out,)) for out in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    stamps = [s for out in results for s in out]
    assert len(set(stamps)) == len(stamps) == 4 * per_thread
    for out in results:
        assert out == sorted(out)


def test_a_broken_physical_clock_is_refused_not_stamped() -> None:
    clock = HybridClock("eu-west", physical_ms=lambda: 1.5)  # type: ignore[arg-type, return-value]
    with pytest.raises(HLCError, match=r"the physical clock gave 1\.5, not integer milliseconds"):
        clock.now()
    future = HybridClock("eu-west", physical_ms=FakeTime(WALL_MS_MAX + 1))
    with pytest.raises(HLCError, match="HLC wall_ms 10000000000000 is out of range"):
        future.now()
    assert future.last == HLC(0, 0, "eu-west")
