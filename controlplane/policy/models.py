"""Pydantic v2 models of the policy documents of spec/policy.md.

Unknown fields are rejected everywhere (`extra="forbid"`), units are parsed into
numbers (durations in seconds, bandwidths in bytes per second) while the JSON
Schema still shows the string forms users write. Rules that need more than one
field or document live in `rules.py`, so they can point at the right node.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StrictInt,
    WithJsonSchema,
)

from controlplane.domain.names import check_name
from controlplane.errors import MeridianError
from controlplane.policy.units import (
    BANDWIDTH_SCHEMA_PATTERN,
    DURATION_RE,
    JURISDICTION_RE,
    REGION_RE,
    check_jurisdiction,
    check_region_name,
    format_bandwidth,
    format_duration,
    parse_policy_bandwidth_bps,
    parse_policy_duration_s,
)

API_VERSION = "meridian/v1"


def _duration(value: object) -> object:
    return parse_policy_duration_s(value) if isinstance(value, str) else value


def _bandwidth(value: object) -> object:
    return parse_policy_bandwidth_bps(value) if isinstance(value, str) else value


def _must_be_str(value: object) -> object:
    # Only strings carry a unit; a bare number is ambiguous, so it is refused.
    if not isinstance(value, str):
        raise ValueError(f"expected a string with a unit, got {type(value).__name__} {value!r}")
    return value


Duration = Annotated[
    float,
    BeforeValidator(_duration),
    BeforeValidator(_must_be_str),
    PlainSerializer(format_duration, return_type=str),
    WithJsonSchema({"type": "string", "pattern": DURATION_RE.pattern}),
]
Bandwidth = Annotated[
    float,
    BeforeValidator(_bandwidth),
    BeforeValidator(_must_be_str),
    PlainSerializer(format_bandwidth, return_type=str),
    WithJsonSchema({"type": "string", "pattern": BANDWIDTH_SCHEMA_PATTERN}),
]
RegionName = Annotated[
    str,
    AfterValidator(check_region_name),
    WithJsonSchema({"type": "string", "pattern": REGION_RE.pattern}),
]
Jurisdiction = Annotated[
    str,
    AfterValidator(check_jurisdiction),
    WithJsonSchema({"type": "string", "pattern": JURISDICTION_RE.pattern}),
]
Name = Annotated[str, Field(min_length=1, max_length=255)]


def _dataset_name(value: str) -> str:
    # The data plane's own rule (dataplane.md, names): a dataset declared here is one
    # the agents and `meridian object` will be asked to store under this name.
    try:
        return check_name("dataset", value)
    except MeridianError as exc:
        raise ValueError(str(exc)) from None


# At most 255 characters as any name here (the catalog's column), and a data-plane name.
DatasetName = Annotated[str, Field(min_length=1, max_length=255), AfterValidator(_dataset_name)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=False)


class Metadata(Strict):
    name: Name
    labels: dict[str, str] = Field(default_factory=dict)


class DatasetMetadata(Metadata):
    name: DatasetName


class RegionSpec(Strict):
    name: RegionName
    jurisdiction: Jurisdiction


class LinkSpec(Strict):
    between: Annotated[list[RegionName], Field(min_length=2, max_length=2)]
    rtt: Duration | None = None
    bandwidth: Bandwidth | None = None


class TopologySpec(Strict):
    regions: Annotated[list[RegionSpec], Field(min_length=1)]
    links: list[LinkSpec] = Field(default_factory=list)


class Selector(Strict):
    datasets: Annotated[list[Name], Field(min_length=1)]
    labels: dict[str, str] = Field(default_factory=dict)


class ReplicasSpec(Strict):
    regions: list[RegionName] | None = None
    # Strict: YAML's `true` or `"1"` is refused, not taken for 1 (policy.md, rule 2).
    count: Annotated[StrictInt, Field(ge=1)] | None = None


class FailoverSpec(Strict):
    mode: Literal["automatic", "manual"] = "manual"
    order: list[RegionName] | None = None


class TransferSpec(Strict):
    compression: Literal["zstd", "none"] = "zstd"
    bandwidth: Bandwidth | None = None


class PolicySpec(Strict):
    priority: StrictInt = 0
    selector: Selector
    class_: Literal["critical", "standard"] = Field(alias="class")
    home: RegionName
    replicas: ReplicasSpec
    residency: Annotated[list[Jurisdiction], Field(min_length=1)]
    rpo: Duration
    ack: Literal["quorum", "all"] | None = None
    failover: FailoverSpec = Field(default_factory=FailoverSpec)
    transfer: TransferSpec = Field(default_factory=TransferSpec)
    deletes: Literal["replicate", "retain"] = "replicate"


class Topology(Strict):
    api_version: Literal["meridian/v1"] = Field(alias="apiVersion")
    kind: Literal["Topology"]
    metadata: Metadata
    spec: TopologySpec


class ReplicationPolicy(Strict):
    api_version: Literal["meridian/v1"] = Field(alias="apiVersion")
    kind: Literal["ReplicationPolicy"]
    metadata: Metadata
    spec: PolicySpec


class DatasetDoc(Strict):
    api_version: Literal["meridian/v1"] = Field(alias="apiVersion")
    kind: Literal["Dataset"]
    metadata: DatasetMetadata


Document = Annotated[Topology | ReplicationPolicy | DatasetDoc, Field(discriminator="kind")]
KINDS: dict[str, type[Strict]] = {
    "Topology": Topology,
    "ReplicationPolicy": ReplicationPolicy,
    "Dataset": DatasetDoc,
}
