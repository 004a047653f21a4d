"""The data workload's pure parts: contents that make deltas, digests of our own."""

from __future__ import annotations

from agents.errors import ResidencyError
from chaos.dataplane import content, definite_refusal, digest_of, of_run
from controlplane.domain.version import Digest
from controlplane.errors import UnavailableError


def test_writes_of_one_key_share_their_base_and_differ_by_their_id() -> None:
    one = content(7, "std/s0", "k1", "d-aaaa", 4096)
    two = content(7, "std/s0", "k1", "d-bbbb", 4096)
    assert len(one) == len(two) == 4096
    same = sum(a == b for a, b in zip(one, two, strict=True))
    assert same >= 4096 - 2 * len("d-aaaa")  # a rewrite is mostly the same bytes: a delta
    assert digest_of(one) != digest_of(two)
    assert digest_of(one) == str(Digest.of(one))  # the agent's digest, computed here


def test_only_this_runs_versions_and_only_definite_refusals_fail() -> None:
    assert of_run("1796128488000.00000@eu-west", 1796128488000)
    assert not of_run("1796128487999.00003@eu-west", 1796128488000)
    assert not of_run("garbage", 0)
    assert definite_refusal(ResidencyError("us-east may not hold std/s0"))
    assert not definite_refusal(UnavailableError("the agent is gone"))
