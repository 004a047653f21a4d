"""The placement planner: governing policy, nearest allowed regions, determinism, residency."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.policy.apply import describe_source
from controlplane.policy.compiler import PolicySet, compile_text

TOPOLOGY = """\
apiVersion: meridian/v1
kind: Topology
metadata: {name: t}
spec:
  regions:
    - {name: a-home, jurisdiction: EU}
    - {name: b-far, jurisdiction: EU}
    - {name: c-near, jurisdiction: EU}
    - {name: d-tie, jurisdiction: EU}
    - {name: e-unlinked, jurisdiction: EU}
    - {name: f-us, jurisdiction: US}
  links:
    - {between: [a-home, b-far], rtt: 90ms}
    - {between: [a-home, c-near], rtt: 5ms}
    - {between: [a-home, d-tie], rtt: 90ms}
    - {between: [a-home, f-us], rtt: 1ms}
"""


def policy(name: str, glob: str, count: int, priority: int = 0, labels: str = "{}") -> str:
    return f"""\
apiVersion: meridian/v1
kind: ReplicationPolicy
metadata: {{name: {name}}}
spec:
  priority: {priority}
  selector: {{datasets: ["{glob}"], labels: {labels}}}
  class: standard
  home: a-home
  replicas: {{count: {count}}}
  residency: [EU]
  rpo: 10s
"""


def compiled(*docs: str) -> PolicySet:
    result, problems = compile_text("---\n".join(docs))
    assert result is not None, problems
    return result


def test_count_takes_nearest_allowed_with_name_ties_and_unlinked_last() -> None:
    ps = compiled(TOPOLOGY, policy("p", "x/*", 4))
    placement = ps.placements({"x/1": {}})["x/1"]
    # f-us is nearest (1ms) but outside residency; b-far and d-tie tie at 90ms (by name);
    # e-unlinked has no link, so it is farthest.
    assert placement.replicas == ("c-near", "b-far", "d-tie", "e-unlinked")
    assert placement.failover_order == placement.replicas
    assert ps.placements({"x/1": {}}) == ps.placements({"x/1": {}})  # deterministic


def test_highest_priority_then_name_governs() -> None:
    ps = compiled(
        TOPOLOGY,
        policy("low", "x/*", 1, priority=1),
        policy("high", "x/special*", 2, priority=9),
        policy("also-9", "x/spec*", 3, priority=9),
        policy("labelled", "x/*", 1, priority=50, labels="{team: ml}"),
    )
    got = ps.placements({"x/plain": {}, "x/special": {}, "x/ml": {"team": "ml"}, "y/z": {}})
    assert got["x/plain"].policy == "low"
    assert got["x/special"].policy == "also-9"  # tie at 9: the smaller name
    assert got["x/ml"].policy == "labelled"
    assert "y/z" not in got  # no policy selects it


@settings(max_examples=60, deadline=None)
@given(
    jurisdictions=st.lists(st.sampled_from(["EU", "US", "CN"]), min_size=2, max_size=8),
    rtts=st.lists(st.integers(min_value=1, max_value=50), min_size=8, max_size=8),
    residency=st.sets(st.sampled_from(["EU", "US", "CN"]), min_size=1),
    data=st.data(),
)
def test_placements_never_violate_residency(
    jurisdictions: list[str], rtts: list[int], residency: set[str], data: st.DataObject
) -> None:
    names = [f"r{i}" for i in range(len(jurisdictions))]
    allowed_homes = [n for n, j in zip(names, jurisdictions, strict=True) if j in residency]
    if not allowed_homes:
        return
    home = data.draw(st.sampled_from(allowed_homes))
    others = [n for n in allowed_homes if n != home]
    count = data.draw(st.integers(min_value=0, max_value=len(others)))
    if count == 0:
        return
    regions = "\n".join(
        f"    - {{name: {n}, jurisdiction: {j}}}" for n, j in zip(names, jurisdictions, strict=True)
    )
    links = "\n".join(
        f"    - {{between: [{home}, {n}], rtt: {rtts[i]}ms}}"
        for i, n in enumerate(names)
        if n != home
    )
    topo = (
        "apiVersion: meridian/v1\nkind: Topology\nmetadata: {name: t}\nspec:\n"
        f"  regions:\n{regions}\n  links:\n{links}\n"
    )
    pol = (
        "apiVersion: meridian/v1\nkind: ReplicationPolicy\nmetadata: {name: p}\nspec:\n"
        f"  selector: {{datasets: ['*']}}\n  class: standard\n  home: {home}\n"
        f"  replicas: {{count: {count}}}\n  residency: [{', '.join(sorted(residency))}]\n"
        "  rpo: 1s\n"
    )
    ps = compiled(topo, pol)
    placement = ps.placements({"d": {}})["d"]
    jur = dict(zip(names, jurisdictions, strict=True))
    assert len(placement.replicas) == count
    assert home not in placement.replicas
    assert all(jur[r] in residency for r in (home, *placement.replicas))
    # Nearest first: the chosen RTTs are the smallest available.
    rtt = {n: rtts[i] for i, n in enumerate(names) if n != home}
    chosen = sorted(rtt[r] for r in placement.replicas)
    assert chosen == sorted(rtt[r] for r in others)[:count]


def test_source_names_the_git_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    f = repo / "p.yaml"
    f.write_text("x: 1\n")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True, timeout=30)
    subprocess.run([*git, "add", "p.yaml"], check=True, timeout=30)
    subprocess.run([*git, "commit", "-qm", "p"], check=True, timeout=30)
    sha = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True,
                         timeout=30).stdout.strip()  # fmt: skip
    assert describe_source([f]) == f"git:{sha} {f}"
    f.write_text("x: 2\n")
    assert describe_source([f]) == f"git:{sha}+dirty {f}"
    monkeypatch.chdir(tmp_path)  # a path relative to here, not to the repository
    assert describe_source([Path("repo/p.yaml")]) == f"git:{sha}+dirty repo/p.yaml"
    outside = tmp_path / "q.yaml"
    outside.write_text("x: 1\n")
    assert describe_source([outside]) == str(outside)
