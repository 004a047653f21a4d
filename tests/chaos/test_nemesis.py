"""The nemesis schedule is a function of the seed, bounded by the duration."""

from __future__ import annotations

import itertools

import pytest

from chaos.nemesis import schedule


def test_one_seed_one_schedule() -> None:
    kw = {"duration_s": 40.0, "hold_s": (5.0, 9.0), "gap_s": (2.0, 4.0)}
    a = schedule(7, ["cut", "stop"], ["x", "y", "z"], **kw)  # type: ignore[arg-type]
    b = schedule(7, ["cut", "stop"], ["x", "y", "z"], **kw)  # type: ignore[arg-type]
    c = schedule(8, ["cut", "stop"], ["x", "y", "z"], **kw)  # type: ignore[arg-type]
    assert a == b
    assert a != c
    assert [f.kind for f in a[:2]] == ["cut", "stop"]
    for f, nxt in itertools.pairwise(a):
        assert f.end_s + 2.0 <= nxt.start_s  # a quiet gap between faults
    assert all(3.0 <= f.start_s < f.end_s for f in a)
    assert abs(sum(f.end_s - f.start_s for f in a) - 40.0) < 1e-9  # exactly the faults asked


def test_bad_ranges_are_refused() -> None:
    with pytest.raises(ValueError, match="ordered"):
        schedule(1, ["cut"], ["x"], duration_s=10, hold_s=(5, 2), gap_s=(1, 2))
    with pytest.raises(ValueError, match="at least one"):
        schedule(1, [], ["x"], duration_s=10, hold_s=(1, 2), gap_s=(1, 2))
