"""Every rejection rule of spec/policy.md, each with at least two failing cases,
checking the reported line (and column where it is unambiguous)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

from controlplane.policy.compiler import compile_files, compile_text

TOPOLOGY = """\
apiVersion: meridian/v1
kind: Topology
metadata:
  name: prod
spec:
  regions:
    - name: eu-west
      jurisdiction: EU
    - name: eu-central
      jurisdiction: EU
    - name: us-east
      jurisdiction: US
  links:
    - between: [eu-west, eu-central]
      rtt: 12ms
      bandwidth: 10Gbps
"""

POLICY = """\
apiVersion: meridian/v1
kind: ReplicationPolicy
metadata:
  name: checkpoints
spec:
  priority: 100
  selector:
    datasets: ["ckpt/*"]
  class: critical
  home: eu-west
  replicas:
    regions: [eu-central]
  residency: [EU]
  rpo: 0s
  ack: quorum
  failover:
    mode: automatic
    order: [eu-central]
"""

STANDARD = """\
apiVersion: meridian/v1
kind: ReplicationPolicy
metadata:
  name: corpus
spec:
  selector:
    datasets: ["corpus/*"]
  class: standard
  home: us-east
  replicas:
    count: 2
  residency: [EU, US]
  rpo: 30s
"""

DATASET = """\
apiVersion: meridian/v1
kind: Dataset
metadata:
  name: ckpt/llama
"""


def join(*docs: str) -> str:
    return "---\n".join(docs)


def line_of(text: str, needle: str, nth: int = 1) -> int:
    """1-based line of the nth occurrence of needle."""
    start = -1
    for _ in range(nth):
        start = text.index(needle, start + 1)
    return text.count("\n", 0, start) + 1


def problems_of(text: str) -> list[tuple[int, int, str]]:
    policy, problems = compile_text(text, "p.yaml")
    assert (policy is None) == bool(problems)
    return [(p.line, p.column, p.message) for p in problems]


def assert_problem(text: str, needle: str, fragment: str, nth: int = 1) -> None:
    found = problems_of(text)
    line = line_of(text, needle, nth)
    assert any(ln == line and fragment in msg for ln, _, msg in found), (line, fragment, found)


def test_valid_base_set() -> None:
    assert problems_of(join(TOPOLOGY, POLICY, STANDARD, DATASET)) == []


def test_spec_example_validates() -> None:
    policy, problems = compile_files([Path(__file__).parent / "data" / "example.yaml"])
    assert problems == []
    assert policy is not None and len(policy.policies) == 2


# Rule 1: YAML that does not parse; duplicate keys.
@pytest.mark.parametrize(
    ("text", "needle", "fragment"),
    [
        (TOPOLOGY + "  bad: [unclosed\n", "bad:", "YAML does not parse"),
        (
            join(TOPOLOGY, POLICY.replace("  rpo: 0s\n", "  rpo: 0s\n  rpo: 0s\n")),
            "rpo: 0s",
            "duplicate key 'rpo'",
        ),
        (
            join(TOPOLOGY.replace("  name: prod\n", "  name: prod\n  name: again\n"), POLICY),
            "name: again",
            "duplicate key 'name'",
        ),
    ],
)
def test_rule1_parse_and_duplicate_keys(text: str, needle: str, fragment: str) -> None:
    found = problems_of(text)
    assert any(fragment in m for _, _, m in found), found
    if "duplicate" in fragment:
        nth = 2 if needle == "rpo: 0s" else 1
        assert_problem(text, needle, fragment, nth)
    else:
        # The parser reports where it gave up: at or after the broken line.
        assert min(ln for ln, _, m in found if fragment in m) >= line_of(text, needle)


def test_rule1_duplicate_key_column() -> None:
    text = join(TOPOLOGY, POLICY.replace("  home: eu-west\n", "  home: eu-west\n  home: us-east\n"))
    found = problems_of(text)
    line = line_of(text, "home: us-east")
    assert (line, 3, f"duplicate key 'home' (first given on line {line - 1})") in found


# Rule 2: unknown apiVersion/kind; unknown field with "did you mean"; missing; wrong type.
@pytest.mark.parametrize(
    ("text", "needle", "fragment"),
    [
        (
            join(TOPOLOGY, POLICY.replace("apiVersion: meridian/v1", "apiVersion: meridian/v2")),
            "meridian/v2",
            "unknown apiVersion",
        ),
        (
            join(TOPOLOGY, POLICY.replace("kind: ReplicationPolicy", "kind: ReplicationPolcy")),
            "ReplicationPolcy",
            "did you mean 'ReplicationPolicy'",
        ),
        (
            join(TOPOLOGY, POLICY.replace("  priority: 100", "  prioirty: 100")),
            "prioirty",
            "unknown field 'prioirty' in spec; did you mean 'priority'?",
        ),
        (
            join(TOPOLOGY, POLICY.replace("    mode: automatic", "    mdoe: automatic")),
            "mdoe",
            "did you mean 'mode'?",
        ),
        (
            join(TOPOLOGY, POLICY.replace("  home: eu-west\n", "")),
            "spec:\n  priority",
            "missing required field 'spec.home'",
        ),
        (
            join(TOPOLOGY, POLICY.replace("priority: 100", "priority: high")),
            "priority: high",
            "spec.priority",
        ),
        (
            join(TOPOLOGY, POLICY.replace("class: critical", "class: [critical]")),
            "class: [critical]",
            "spec.class",
        ),
        # A number of the wrong type is refused, not converted (YAML's true, a string).
        (
            join(TOPOLOGY, POLICY.replace("priority: 100", "priority: true")),
            "priority: true",
            "spec.priority: Input should be a valid integer",
        ),
        (
            join(TOPOLOGY, STANDARD.replace("count: 2", 'count: "2"')),
            'count: "2"',
            "spec.replicas.count: Input should be a valid integer",
        ),
        (
            join(TOPOLOGY, STANDARD.replace("count: 2", "count: 2.0")),
            "count: 2.0",
            "spec.replicas.count: Input should be a valid integer",
        ),
    ],
)
def test_rule2_schema(text: str, needle: str, fragment: str) -> None:
    assert_problem(text, needle, fragment)


def test_rule2_unknown_field_points_at_key_column() -> None:
    text = join(TOPOLOGY, POLICY.replace("  priority: 100", "  prioirty: 100"))
    line = line_of(text, "prioirty")
    assert any(ln == line and col == 3 for ln, col, _ in problems_of(text))


# Rule 3: no Topology, or more than one.
def test_rule3_no_topology() -> None:
    found = problems_of(join(POLICY, STANDARD))
    assert found == [(1, 1, "no Topology document: exactly one is required")]


def test_rule3_two_topologies() -> None:
    text = join(TOPOLOGY, POLICY, TOPOLOGY)
    assert_problem(text, "kind: Topology", "more than one Topology", nth=2)
    assert all(ln != line_of(text, "kind: Topology") for ln, _, _ in problems_of(text))


def test_rule3_invalid_topology_is_not_reported_as_missing() -> None:
    found = problems_of(join(TOPOLOGY.replace("regions:", "regons:"), POLICY))
    assert not any("no Topology" in m for _, _, m in found)
    assert any("did you mean 'regions'" in m for _, _, m in found)


# Rule 4: duplicate region names; duplicate policy names.
def test_rule4_duplicate_region() -> None:
    text = join(TOPOLOGY.replace("name: us-east", "name: eu-west"), POLICY)
    assert_problem(text, "name: eu-west", "duplicate region 'eu-west'", nth=2)


def test_rule4_duplicate_policy() -> None:
    text = join(TOPOLOGY, POLICY, POLICY.replace('"ckpt/*"', '"other/*"'))
    assert_problem(text, "name: checkpoints", "duplicate policy name 'checkpoints'", nth=2)


# Rule 5: unknown regions in links/home/replicas/failover order; link to itself.
@pytest.mark.parametrize(
    ("text", "needle", "fragment"),
    [
        (
            join(TOPOLOGY.replace("[eu-west, eu-central]", "[eu-west, eu-centrl]"), POLICY),
            "eu-centrl",
            "did you mean 'eu-central'",
        ),
        (
            join(TOPOLOGY.replace("[eu-west, eu-central]", "[eu-west, eu-west]"), POLICY),
            "[eu-west, eu-west]",
            "link from region 'eu-west' to itself",
        ),
        (
            join(TOPOLOGY, POLICY.replace("home: eu-west", "home: eu-wset")),
            "home: eu-wset",
            "home 'eu-wset' of policy 'checkpoints' is not a region",
        ),
        (
            join(TOPOLOGY, POLICY.replace("regions: [eu-central]", "regions: [eu-north]")),
            "[eu-north]",
            "replica region 'eu-north'",
        ),
        (
            join(TOPOLOGY, POLICY.replace("order: [eu-central]", "order: [ap-south]")),
            "[ap-south]",
            "failover candidate 'ap-south'",
        ),
    ],
)
def test_rule5_unknown_regions(text: str, needle: str, fragment: str) -> None:
    assert_problem(text, needle, fragment)


# Rule 6: residency of home, replicas and failover candidates.
@pytest.mark.parametrize(
    ("text", "needle", "fragment"),
    [
        (
            join(TOPOLOGY, POLICY.replace("home: eu-west", "home: us-east")),
            "home: us-east",
            "home 'us-east' (jurisdiction US) is outside the residency ['EU'] "
            "of policy 'checkpoints'",
        ),
        (
            join(TOPOLOGY, POLICY.replace("regions: [eu-central]", "regions: [us-east]")),
            "regions: [us-east]",
            "replica region 'us-east' (jurisdiction US)",
        ),
        (
            join(TOPOLOGY, POLICY.replace("order: [eu-central]", "order: [eu-central, us-east]")),
            "order: [eu-central, us-east]",
            "failover candidate 'us-east' (jurisdiction US)",
        ),
    ],
)
def test_rule6_residency(text: str, needle: str, fragment: str) -> None:
    assert_problem(text, needle, fragment)


# Rule 7: count too large; both or neither of count and regions.
@pytest.mark.parametrize(
    ("text", "needle", "fragment"),
    [
        (
            join(TOPOLOGY, STANDARD.replace("count: 2", "count: 3")),
            "count: 3",
            "replicas.count is 3 but residency ['EU', 'US'] allows only 2",
        ),
        (
            join(TOPOLOGY, POLICY.replace("regions: [eu-central]", "count: 2")),
            "count: 2",
            "allows only 1 region",
        ),
        (
            join(TOPOLOGY, STANDARD.replace("count: 2", "count: 1\n    regions: [eu-west]")),
            "replicas:",
            "not both",
        ),
        (
            join(TOPOLOGY, STANDARD.replace("    count: 2\n", "    {}\n")),
            "replicas:",
            "give one of replicas.count or replicas.regions",
        ),
    ],
)
def test_rule7_count(text: str, needle: str, fragment: str) -> None:
    line = line_of(text, needle, 1)
    found = problems_of(text)
    if needle == "replicas:":
        line = line_of(text, "replicas:", 1) + 1  # the mapping's first node
    assert any(ln == line and fragment in m for ln, _, m in found), (line, found)


# Rule 8: class against rpo and ack.
@pytest.mark.parametrize(
    ("text", "needle", "fragment"),
    [
        (join(TOPOLOGY, POLICY.replace("rpo: 0s", "rpo: 5s")), "rpo: 5s", "rpo must be 0s"),
        (join(TOPOLOGY, STANDARD.replace("rpo: 30s", "rpo: 0s")), "rpo: 0s", "must be > 0s"),
        (join(TOPOLOGY, STANDARD.replace("rpo: 30s", "rpo: 0ms")), "rpo: 0ms", "must be > 0s"),
        (join(TOPOLOGY, STANDARD + "  ack: all\n"), "ack: all", "ack applies only to critical"),
    ],
)
def test_rule8_class(text: str, needle: str, fragment: str) -> None:
    assert_problem(text, needle, fragment)


# Rule 9: home in its own replicas or failover order.
@pytest.mark.parametrize(
    ("text", "needle", "fragment"),
    [
        (
            join(
                TOPOLOGY, POLICY.replace("regions: [eu-central]", "regions: [eu-central, eu-west]")
            ),
            "regions: [eu-central, eu-west]",
            "home 'eu-west' is listed in its own replicas",
        ),
        (
            join(TOPOLOGY, POLICY.replace("order: [eu-central]", "order: [eu-west]")),
            "order: [eu-west]",
            "home 'eu-west' is listed in its own failover.order",
        ),
    ],
)
def test_rule9_home_listed(text: str, needle: str, fragment: str) -> None:
    assert_problem(text, needle, fragment)


# Rule 10: equal priority and identical glob.
def test_rule10_equal_priority_same_glob() -> None:
    other = POLICY.replace("name: checkpoints", "name: other")
    text = join(TOPOLOGY, POLICY, other)
    assert_problem(text, '"ckpt/*"', "equal priority 100 and the same dataset glob 'ckpt/*'", 2)


def test_rule10_default_priority() -> None:
    other = STANDARD.replace("name: corpus", "name: corpus-2").replace(
        '["corpus/*"]', '["x/*", "corpus/*"]'
    )
    text = join(TOPOLOGY, STANDARD, other)
    assert_problem(text, '"corpus/*"', "equal priority 0", 2)


def test_rule10_different_priority_is_fine() -> None:
    other = POLICY.replace("name: checkpoints", "name: other").replace("100", "50")
    assert problems_of(join(TOPOLOGY, POLICY, other)) == []


# Rule 11: malformed durations, bandwidths, names, jurisdictions.
@pytest.mark.parametrize(
    ("text", "needle", "fragment"),
    [
        (join(TOPOLOGY.replace("rtt: 12ms", "rtt: 12 msec"), POLICY), "12 msec", "duration"),
        (join(TOPOLOGY, STANDARD.replace("rpo: 30s", "rpo: 30")), "rpo: 30", "unit"),
        (join(TOPOLOGY.replace("10Gbps", "10 gigabits"), POLICY), "10 gigabits", "bandwidth"),
        (
            join(TOPOLOGY.replace("name: us-east", "name: US_East"), POLICY),
            "US_East",
            "malformed region name",
        ),
        (
            join(TOPOLOGY.replace("jurisdiction: US", "jurisdiction: usa"), POLICY),
            "usa",
            "malformed jurisdiction",
        ),
        (
            join(TOPOLOGY, POLICY.replace("residency: [EU]", "residency: [E]")),
            "[E]",
            "malformed jurisdiction",
        ),
        # A declared dataset's name follows the data plane's rules (dataplane.md).
        (
            join(TOPOLOGY, POLICY, DATASET.replace("ckpt/llama", "../escape")),
            "../escape",
            "dataset name '../escape' has a '..' segment",
        ),
        (
            join(TOPOLOGY, POLICY, DATASET.replace("ckpt/llama", '"/abs/x"')),
            "/abs/x",
            "dataset name '/abs/x' starts with '/'",
        ),
        (
            join(TOPOLOGY, POLICY, DATASET.replace("ckpt/llama", "ckpt/" + "x" * 300)),
            "xxxx",
            "metadata.name: String should have at most 255 characters",
        ),
        (
            join(TOPOLOGY, POLICY, DATASET.replace("ckpt/llama", '"ckpt/a\\0b"')),
            "ckpt/a",
            "contains a NUL character",
        ),
    ],
)
def test_rule11_malformed(text: str, needle: str, fragment: str) -> None:
    assert_problem(text, needle, fragment)


@pytest.mark.parametrize(
    ("old", "new", "column", "fragment"),
    [
        # Review P6: a number and its unit are written together, for every unit.
        ("rtt: 12ms", "rtt: 12 ms", 12, "malformed duration '12 ms'"),
        ("bandwidth: 10Gbps", "bandwidth: 10 Gbps", 18, "malformed bandwidth '10 Gbps'"),
        ("bandwidth: 10Gbps", "bandwidth: 0B/s", 18, "bandwidth '0B/s' must be greater than 0"),
        ("bandwidth: 10Gbps", "bandwidth: 0.0MiB/s", 18, "must be greater than 0"),
    ],
)
def test_rule11_units_spacing_and_zero_bandwidth(
    old: str, new: str, column: int, fragment: str
) -> None:
    text = join(TOPOLOGY.replace(old, new), POLICY)
    found = problems_of(text)
    assert len(found) == 1 and found[0][:2] == (line_of(text, new), column), found
    assert fragment in found[0][2]


def test_schema_patterns_agree_with_the_validator() -> None:
    """The JSON Schema's unit patterns accept exactly what `validate` accepts."""
    from controlplane.policy.models import Bandwidth, Duration

    schema = {
        name: re.compile(TypeAdapter(kind).json_schema()["pattern"])
        for name, kind in (("d", Duration), ("b", Bandwidth))
    }
    samples = {
        "d": ["0s", "12ms", "1.5h", "12 ms", "12", "ms", "-1s", " 1s", "1s\n", "٠s", "1٠ms"],
        "b": [
            "500MiB/s",
            "0.5Gbps",
            "0B/s",
            "0.0KB/s",
            "500 MiB/s",
            "10gbps",
            "1e3B/s",
            "10Gbps\n",
            "５00MiB/s",
        ],
    }
    for name, values in samples.items():
        adapter = TypeAdapter(Duration if name == "d" else Bandwidth)
        for value in values:
            try:
                adapter.validate_python(value)
                accepted = True
            except ValidationError:
                accepted = False
            assert accepted == ecma_search(schema[name], value), (name, value)


def ecma_search(pattern: re.Pattern[str], value: str) -> bool:
    """A JSON Schema `pattern` as editors run it (ECMA-262, no flags): `$` is the end of
    the text, never before a final newline as in Python, and `\\d` is ASCII only."""
    return re.search(pattern.pattern.replace("$", r"\Z"), value, re.ASCII) is not None


# Rule 12: declared dataset selected by no policy; duplicate declared datasets.
def test_rule12_unselected_dataset() -> None:
    text = join(TOPOLOGY, POLICY, DATASET.replace("ckpt/llama", "logs/app"))
    assert_problem(text, "name: logs/app", "dataset 'logs/app' is selected by no policy")


def test_rule12_label_mismatch() -> None:
    policy = POLICY.replace('["ckpt/*"]\n', '["ckpt/*"]\n    labels: {team: pretrain}\n')
    text = join(TOPOLOGY, policy, DATASET + "  labels: {team: infer}\n")
    assert_problem(text, "name: ckpt/llama", "selected by no policy")


def test_rule12_duplicate_dataset() -> None:
    text = join(TOPOLOGY, POLICY, DATASET, DATASET)
    assert_problem(text, "name: ckpt/llama", "duplicate dataset 'ckpt/llama'", 2)


def test_all_problems_in_all_files_reported(tmp_path: Path) -> None:
    a = tmp_path / "a.yaml"
    b = tmp_path / "b.yaml"
    a.write_text(
        join(TOPOLOGY.replace("rtt: 12ms", "rtt: soon"), POLICY.replace("rpo: 0s", "rpo: 1s"))
    )
    b.write_text(STANDARD.replace("count: 2", "count: 9").replace("home: us-east", "home: mars"))
    policy, problems = compile_files([a, b])
    assert policy is None
    files = {p.file for p in problems}
    assert files == {str(a), str(b)}
    assert len(problems) >= 4
    assert all(str(p).startswith(f"{p.file}:{p.line}:{p.column}: error: ") for p in problems)


# Review item P1: one run reports every problem of a document, even when some of its
# fields are invalid, and never a false follow-on error caused by an invalid field.


def exact(text: str, expected: list[tuple[str, int, str]]) -> None:
    """The problems are exactly `expected`: (needle, column, message fragment) each; the
    line of each is that of its needle's first occurrence."""
    found = problems_of(text)
    assert len(found) == len(expected), found
    for needle, col, frag in expected:
        line = line_of(text, needle)
        assert any((ln, c) == (line, col) and frag in m for ln, c, m in found), (
            (line, col, frag),
            found,
        )


def test_unknown_field_does_not_hide_residency_violation() -> None:
    text = join(
        TOPOLOGY,
        POLICY.replace("  priority: 100\n", "  priority: 100\n  colour: red\n").replace(
            "    order: [eu-central]\n", "    order: [eu-central, us-east]\n"
        ),
    )
    exact(
        text,
        [
            ("colour:", 3, "unknown field 'colour' in spec"),
            ("order: [eu-central, us-east]", 25, "failover candidate 'us-east' (jurisdiction US)"),
        ],
    )


def test_misspelt_priority_hides_nothing() -> None:
    policy = (
        POLICY.replace("  priority: 100\n", "  priorty: 100\n")
        .replace("  rpo: 0s\n", "  rpo: 5s\n")
        .replace(
            "    regions: [eu-central]\n",
            "    regions: [eu-central, eu-west, mars]\n    count: 1\n",
        )
        .replace("  home: eu-west\n", "  home: eu-west\n  residency: [US]\n")
        .replace("  residency: [EU]\n", "")
        .replace("    order: [eu-central]\n", "    order: [eu-west]\n")
    )
    text = join(TOPOLOGY, policy)
    exact(
        text,
        [
            ("priorty:", 3, "did you mean 'priority'?"),
            ("  home: eu-west", 9, "home 'eu-west' (jurisdiction EU) is outside the residency"),
            # "not both" points at the replicas mapping: its first node.
            ("regions: [eu-central, eu-west, mars]", 5, "not both"),
            ("regions: [eu-central, eu-west, mars]", 15, "replica region 'eu-central'"),
            ("regions: [eu-central, eu-west, mars]", 27, "home 'eu-west' is listed in its own"),
            ("regions: [eu-central, eu-west, mars]", 27, "replica region 'eu-west'"),
            ("regions: [eu-central, eu-west, mars]", 36, "'mars' of policy 'checkpoints' is not"),
            ("rpo: 5s", 8, "is critical, so its rpo must be 0s"),
            ("order: [eu-west]", 13, "home 'eu-west' is listed in its own failover.order"),
            ("order: [eu-west]", 13, "failover candidate 'eu-west'"),
        ],
    )


def test_misspelt_field_is_not_also_missing_nor_defaulted() -> None:
    # `clas` is meant as `class`: no second "missing field" error. `priorty` is meant as
    # `priority`: its default 0 must not clash with another priority-0 policy's glob.
    other = STANDARD.replace('["corpus/*"]', '["ckpt/*"]')
    policy = POLICY.replace("  priority: 100\n", "  priorty: 0\n").replace(
        "  class: critical\n", "  clas: critical\n"
    )
    text = join(TOPOLOGY, policy, other)
    exact(
        text,
        [
            ("priorty:", 3, "did you mean 'priority'?"),
            ("clas:", 3, "did you mean 'class'?"),
        ],
    )


def test_bad_region_name_hides_no_topology_rule() -> None:
    topology = (
        TOPOLOGY.replace(
            "  regions:\n", "  regions:\n    - name: Bad_Region\n      jurisdiction: EU\n"
        ).replace(
            "      jurisdiction: US\n",
            "      jurisdiction: US\n    - name: eu-west\n      jurisdiction: EU\n",
        )
        + "    - between: [eu-west, eu-west]\n    - between: [eu-west, mars]\n"
    )
    text = join(topology, POLICY)
    exact(
        text,
        [
            ("Bad_Region", 13, "malformed region name 'Bad_Region'"),
            ("    - name: eu-west\n      jurisdiction: EU\n  links", 13, "duplicate region"),
            ("[eu-west, eu-west]", 16, "link from region 'eu-west' to itself"),
            ("[eu-west, mars]", 26, "link names region 'mars'"),
        ],
    )


def test_bad_jurisdiction_keeps_its_region() -> None:
    text = join(TOPOLOGY.replace("jurisdiction: US", "jurisdiction: us"), POLICY, STANDARD)
    exact(text, [("jurisdiction: us", 21, "malformed jurisdiction 'us'")])


def test_invalid_dataset_still_checked_for_duplicates() -> None:
    text = join(
        TOPOLOGY,
        POLICY,
        DATASET,
        DATASET.replace("  name: ckpt/llama\n", "  name: ckpt/llama\n  colour: x\n"),
    )
    exact(
        text,
        [
            ("colour:", 3, "unknown field 'colour' in metadata"),
            # The second document's name: the 2nd occurrence of the Dataset header block.
            ("ckpt/llama\n  colour", 9, "duplicate dataset 'ckpt/llama'"),
        ],
    )


def test_wrong_api_version_does_not_hide_the_rest() -> None:
    policy = POLICY.replace("meridian/v1", "meridian/v2").replace("rpo: 0s", "rpo: 1s")
    text = join(TOPOLOGY, policy)
    exact(
        text,
        [
            ("meridian/v2", 13, "unknown apiVersion 'meridian/v2'"),
            ("rpo: 1s", 8, "is critical, so its rpo must be 0s"),
        ],
    )


def test_empty_documents_are_ignored() -> None:
    """Review P2: a trailing `---`, an empty or comment-only document are well formed."""
    text = "---\n# a comment only\n---\n" + join(TOPOLOGY, "", POLICY) + "---\n...\n---\n"
    assert problems_of(text) == []
    assert problems_of(join(TOPOLOGY, POLICY) + "---\n") == []


def test_null_document_is_not_empty() -> None:
    text = join(TOPOLOGY, POLICY, "~\n")
    assert_problem(text, "~", "a policy document must be a mapping")


def test_rule1_an_unclosed_bracket_at_the_end_points_at_the_bracket() -> None:
    # The parser gives up past the end of the text; the offending node is the bracket.
    text = join(TOPOLOGY, POLICY.rstrip("\n") + "\n  labels: [unclosed\n")
    [(line, column, message)] = problems_of(text)
    assert (line, column) == (line_of(text, "[unclosed"), 11)
    assert message.startswith("YAML does not parse")


# Review of the validator, round 2: what `validate` let through and plan, apply or the
# placer then failed on, or decided silently.


@pytest.mark.parametrize(
    ("old", "new", "column", "message"),
    [
        (
            "regions: [eu-central]",
            "regions: [eu-central, eu-central]",
            27,
            "replica region 'eu-central' is listed twice in replicas.regions",
        ),
        (
            "order: [eu-central]",
            "order: [eu-central, eu-central]",
            25,
            "failover candidate 'eu-central' is listed twice in failover.order",
        ),
        (
            "residency: [EU]",
            "residency: [EU, EU]",
            19,
            "jurisdiction 'EU' is listed twice in residency",
        ),
    ],
)
def test_a_repeated_list_entry_is_refused_at_the_repeat(
    old: str, new: str, column: int, message: str
) -> None:
    text = join(TOPOLOGY, POLICY.replace(old, new), DATASET)
    line = line_of(text, new)
    exact(text, [(new, column, f"{message} of policy 'checkpoints' (first on line {line})")])


@pytest.mark.parametrize(
    ("replicas", "message"),
    [
        ("count: null", "give one of replicas.count or replicas.regions"),
        ("count:", "give one of replicas.count or replicas.regions"),
        ("regions: ~", "give one of replicas.count or replicas.regions"),
        ("regions: []", "policy 'checkpoints' is critical, so replicas.regions needs at least"),
    ],
)
def test_a_policy_needs_a_replica(replicas: str, message: str) -> None:
    text = join(TOPOLOGY, POLICY.replace("regions: [eu-central]", replicas))
    exact(text, [(f"    {replicas}", 5 if "give" in message else 14, message)])


def test_a_standard_policy_may_keep_a_single_copy() -> None:
    """policy.md sets no minimum: `regions: []` is one copy, in the home region."""
    single = POLICY.replace("regions: [eu-central]", "regions: []")
    single = single.replace("class: critical", "class: standard")
    assert "class: standard" in single
    text = join(TOPOLOGY, single)
    assert [m for _, _, m in problems_of(text) if "replicas" in m] == []


def test_an_explicit_null_count_beside_regions_means_no_count() -> None:
    plain = join(TOPOLOGY, POLICY)
    with_null = plain.replace("regions: [eu-central]\n", "regions: [eu-central]\n    count: ~\n")
    assert with_null != plain
    assert problems_of(with_null) == []
    one, _ = compile_text(plain)
    other, _ = compile_text(with_null)
    assert one is not None and other is not None and one.digest == other.digest


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        ("jurisdiction: US", 'jurisdiction: "US\\n"', "malformed jurisdiction 'US\\n'"),
        ("name: us-east", 'name: "us-east\\n"', "malformed region name 'us-east\\n'"),
        ("rtt: 12ms", 'rtt: "12ms\\n"', "malformed duration '12ms\\n'"),
        ("rtt: 12ms", "rtt: ١٢ms", "malformed duration '١٢ms'"),
        ("bandwidth: 10Gbps", "bandwidth: ５00MiB/s", "malformed bandwidth '５00MiB/s'"),
        ("bandwidth: 10Gbps", 'bandwidth: "10Gbps\\n"', "malformed bandwidth '10Gbps\\n'"),
    ],
)
def test_units_are_ascii_and_end_at_the_end(old: str, new: str, fragment: str) -> None:
    text = join(TOPOLOGY.replace(old, new), POLICY)
    [(line, _, message)] = problems_of(text)
    assert line == line_of(text, new) and fragment in message


def test_a_standard_rpo_with_a_newline_or_other_digits_is_malformed() -> None:
    for rpo in ('"30s\\n"', "٠s"):
        text = join(TOPOLOGY, STANDARD.replace("rpo: 30s", f"rpo: {rpo}"))
        assert_problem(text, f"rpo: {rpo}", "malformed duration")


def test_a_second_link_for_the_same_pair_is_refused() -> None:
    topology = TOPOLOGY + "    - between: [eu-central, eu-west]\n      rtt: 100ms\n"
    text = join(topology, POLICY)
    exact(
        text,
        [
            (
                "[eu-central, eu-west]",
                16,
                "duplicate link between 'eu-central' and 'eu-west' (first given on line "
                f"{line_of(text, '[eu-west, eu-central]')})",
            )
        ],
    )


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        (
            "rpo: 30s",
            "rpo: 0.0000000001s",
            "duration '0.0000000001s' is too small to store: it would be stored as '0ms'",
        ),
        (
            "rpo: 30s",
            "rpo: 1.0000001s",
            "duration '1.0000001s' is more precise than a policy keeps: it would be stored as '1s'",
        ),
        ("rpo: 30s", "rpo: " + "9" * 400 + "s", "(401 characters) is too large"),
        (
            "rpo: 30s",
            "rpo: 30s\n  transfer:\n    bandwidth: 0.0000001B/s",
            "bandwidth '0.0000001B/s' is too small to store: it would be stored as '0B/s'",
        ),
        ("rpo: 30s", "rpo: 30s\n  transfer:\n    bandwidth: " + "9" * 400 + "GB/s", "too large"),
    ],
)
def test_a_value_its_stored_form_would_change_is_refused(old: str, new: str, fragment: str) -> None:
    text = join(TOPOLOGY, STANDARD.replace(old, new))
    [(line, _, message)] = problems_of(text)
    assert line == line_of(text, new.splitlines()[-1]) and fragment in message, message


def test_values_with_a_float_last_digit_error_are_stored_and_read_back() -> None:
    # 1.1h is 3960.0000000000005 seconds, stored as 3960s: the same value, accepted.
    text = join(
        TOPOLOGY.replace("rtt: 12ms", "rtt: 1.1h"),
        STANDARD.replace("rpo: 30s", "rpo: 0.3ms\n  transfer:\n    bandwidth: 1.1Mbps"),
    )
    policy, problems = compile_text(text)
    assert problems == [] and policy is not None
    again = type(policy).from_document(policy.document())
    assert again.placements({"corpus/x": {}}) == policy.placements({"corpus/x": {}})


@pytest.mark.parametrize("after", ["  deletes: retain\n", ""])
def test_an_empty_value_is_reported_at_its_key(after: str) -> None:
    text = join(TOPOLOGY, STANDARD + "  transfer:\n" + after)
    exact(text, [("  transfer:", 3, "spec.transfer: Input should be a valid dictionary")])


def test_a_file_named_twice_is_read_once(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(join(TOPOLOGY, POLICY))
    link = tmp_path / "link.yaml"
    link.symlink_to(path)
    for paths in ([path, path], [path, link], [path, tmp_path / "." / "policy.yaml"]):
        policy, problems = compile_files(paths)
        assert problems == [] and policy is not None, (paths, problems)
