"""The shared Placement type: construction rules, JSON round trip, bad input, and the
planner producing it with every field of spec/policy.md."""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain.errors import PlacementError
from controlplane.domain.placement import Placement
from controlplane.errors import InvalidInputError
from controlplane.policy.compiler import compile_text

EXAMPLE = (Path(__file__).parents[1] / "policy" / "data" / "example.yaml").read_text()


def critical(**over: Any) -> Placement:
    fields: dict[str, Any] = {
        "dataset": "ckpt/llama-70b",
        "policy": "checkpoints",
        "dataset_class": "critical",
        "home": "eu-west",
        "replicas": ("eu-central",),
        "residency": ("EU",),
        "rpo_s": 0.0,
        "failover_mode": "automatic",
        "failover_order": ("eu-central",),
    }
    fields.update(over)
    return Placement(**fields)


def test_critical_ack_defaults_to_quorum_and_regions_lists_home_first() -> None:
    p = critical()
    assert p.ack == "quorum"
    assert p.regions == ("eu-west", "eu-central")
    assert p.transfer_compression == "zstd" and p.transfer_bandwidth_bps is None
    assert p.deletes == "replicate"


def test_placement_is_frozen_hashable_and_its_labels_read_only() -> None:
    p = critical(labels={"team": "pretrain"})
    with pytest.raises(AttributeError):
        p.home = "us-east"  # type: ignore[misc]
    with pytest.raises(TypeError):
        p.labels["team"] = "x"  # type: ignore[index]
    assert hash(p) == hash(critical(labels={"other": "x"}))
    assert p != critical(labels={"other": "x"})
    assert pickle.loads(pickle.dumps(p)) == p == copy.deepcopy(p)  # noqa: S301 - our own bytes


@st.composite
def placements(draw: st.DrawFn) -> Placement:
    regions = draw(st.permutations(["eu-west", "eu-central", "us-east", "us-west", "jp-east"]))
    n = draw(st.integers(0, 4))
    cls = draw(st.sampled_from(["critical", "standard"]))
    return Placement(
        dataset=draw(st.text(min_size=1, max_size=20)),
        policy=draw(st.text(min_size=1, max_size=20)),
        dataset_class=cls,
        home=regions[0],
        replicas=tuple(regions[1 : 1 + n]),
        residency=tuple(
            draw(st.lists(st.sampled_from(["EU", "US", "JP"]), min_size=1, unique=True))
        ),
        rpo_s=0.0 if cls == "critical" else draw(st.floats(0.001, 1e6)),
        ack=draw(st.sampled_from(["quorum", "all"])) if cls == "critical" else None,
        failover_mode=draw(st.sampled_from(["automatic", "manual"])),
        failover_order=tuple(draw(st.permutations(regions[1:]))[: draw(st.integers(0, 4))]),
        transfer_compression=draw(st.sampled_from(["zstd", "none"])),
        transfer_bandwidth_bps=draw(st.none() | st.floats(1, 1e12)),
        deletes=draw(st.sampled_from(["replicate", "retain"])),
        labels=draw(st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3)),
    )


@given(placements())
def test_json_round_trips_through_text(p: Placement) -> None:
    text = json.dumps(p.as_json())
    assert Placement.from_json(json.loads(text)) == p


def test_json_names_every_field() -> None:
    assert set(critical().as_json()) == {
        "dataset",
        "policy",
        "class",
        "home",
        "replicas",
        "residency",
        "rpo_s",
        "ack",
        "failover_mode",
        "failover_order",
        "transfer_compression",
        "transfer_bandwidth_bps",
        "deletes",
        "labels",
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"class": "gold"}, "field 'class' must be one of critical, standard, got 'gold'"),
        ({"ack": "some"}, "field 'ack' must be one of quorum, all, got 'some'"),
        ({"rpo_s": "0s"}, "field 'rpo_s' must be a number, got '0s'"),
        ({"rpo_s": True}, "field 'rpo_s' must be a number, got True"),
        ({"rpo_s": 5}, "a critical dataset's rpo_s must be 0, got 5.0"),
        ({"replicas": "eu-central"}, "field 'replicas' must be a list of names"),
        ({"replicas": ["eu-central", "eu-central"]}, "field 'replicas' lists a name twice"),
        ({"replicas": ["eu-west"]}, "home eu-west is also listed in replicas"),
        ({"failover_order": ["eu-west"]}, "home eu-west is also listed in failover_order"),
        ({"residency": []}, "residency must name at least one jurisdiction"),
        ({"home": ""}, "field 'home' must be a non-empty string, got ''"),
        ({"transfer_bandwidth_bps": 0}, "transfer_bandwidth_bps must be > 0, got 0.0"),
        ({"transfer_bandwidth_bps": float("inf")}, "field 'transfer_bandwidth_bps' must be finite"),
        (
            {"transfer_compression": "gzip"},
            "field 'transfer_compression' must be one of zstd, none",
        ),
        ({"deletes": "drop"}, "field 'deletes' must be one of replicate, retain, got 'drop'"),
        ({"labels": {"a": 1}}, "field 'labels' must map strings to strings"),
        ({"labels": []}, "field 'labels' must be an object"),
        ({"colour": "red", "zz": 1}, "unknown field 'colour', 'zz'"),
    ],
)
def test_bad_json_gets_one_error_naming_the_field(change: dict[str, Any], message: str) -> None:
    data = critical().as_json() | change
    with pytest.raises(PlacementError) as err:
        Placement.from_json(data)
    assert str(err.value).startswith("placement of 'ckpt/llama-70b': ")
    assert message in str(err.value)
    assert isinstance(err.value, InvalidInputError)  # the CLI edge maps it as input


def test_missing_required_fields_are_named_and_optional_ones_default() -> None:
    data = critical().as_json()
    for key in ("home", "rpo_s"):
        del data[key]
    with pytest.raises(PlacementError, match="missing field 'home', 'rpo_s'"):
        Placement.from_json(data)
    minimal = {
        k: v
        for k, v in critical().as_json().items()
        if k not in ("ack", "transfer_compression", "transfer_bandwidth_bps", "deletes", "labels")
    }
    assert Placement.from_json(minimal) == critical()
    with pytest.raises(PlacementError, match="expected a JSON object, got list"):
        Placement.from_json([])


def test_standard_class_rules() -> None:
    std = critical(dataset_class="standard", rpo_s=30, ack=None)
    assert std.rpo_s == 30.0 and isinstance(std.rpo_s, float) and std.ack is None
    with pytest.raises(PlacementError, match="ack applies only to critical datasets"):
        critical(dataset_class="standard", rpo_s=30, ack="all")
    with pytest.raises(PlacementError, match="a standard dataset's rpo_s must be > 0"):
        critical(dataset_class="standard", rpo_s=0, ack=None)


def test_planner_fills_every_field_from_the_policy() -> None:
    policy, problems = compile_text(EXAMPLE)
    assert problems == [] and policy is not None
    placements = policy.placements({"corpus/web": {}})
    ckpt = placements["ckpt/llama-70b"]
    assert ckpt.as_json() == {
        "dataset": "ckpt/llama-70b",
        "policy": "checkpoints",
        "class": "critical",
        "home": "eu-west",
        "replicas": ["eu-central"],
        "residency": ["EU"],
        "rpo_s": 0.0,
        "ack": "quorum",
        "failover_mode": "automatic",
        "failover_order": ["eu-central"],
        "transfer_compression": "zstd",
        "transfer_bandwidth_bps": 500 * 1024**2,
        "deletes": "replicate",
        "labels": {"team": "pretrain"},
    }
    web = placements["corpus/web"]
    assert (web.dataset_class, web.rpo_s, web.ack, web.failover_mode) == (
        "standard",
        30.0,
        None,
        "manual",
    )
