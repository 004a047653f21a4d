"""`Placement`: where one dataset lives and how it replicates, as the applied policy says.

One frozen type shared by the policy planner (which makes it), the catalog (which
stores it), coordination (which fails datasets over with it) and the data plane
(agents and replicator, which admit, replicate and transfer by it). Fields, from
spec/policy.md:

- `dataset`, `policy`: the dataset and the governing policy's name;
- `dataset_class`: `critical` (one owner, synchronous, fenced) or `standard`;
- `home`, `replicas`: the owner (or preferred writer) and the replica regions;
- `residency`: the jurisdictions where copies may exist;
- `rpo_s`: the RPO in seconds (0 for critical; the lag target, > 0, for standard);
- `ack`: critical only, `quorum` (the default) or `all`; None for standard;
- `failover_mode`, `failover_order`: `automatic` | `manual`, candidates in order;
- `transfer_compression` (`zstd` | `none`), `transfer_bandwidth_bps` (per-link cap in
  bytes per second, None for none);
- `deletes`: `replicate` | `retain`;
- `labels`: the dataset's labels (read-only mapping).

The constructor checks every field and the class rules, so a `Placement` that
exists is consistent. `as_json()` gives a flat JSON object with these names
(`dataset_class` is written `class`), and `from_json()` reads it back, refusing
an unknown, missing or malformed field with one `PlacementError` naming it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, get_args

from controlplane.domain.errors import PlacementError

DatasetClass = Literal["critical", "standard"]
Ack = Literal["quorum", "all"]
FailoverMode = Literal["automatic", "manual"]
Compression = Literal["zstd", "none"]
Deletes = Literal["replicate", "retain"]

DEFAULT_ACK: Ack = "quorum"
DATASET_CLASSES: tuple[str, ...] = get_args(DatasetClass)
ACKS: tuple[str, ...] = get_args(Ack)
FAILOVER_MODES: tuple[str, ...] = get_args(FailoverMode)
COMPRESSIONS: tuple[str, ...] = get_args(Compression)
DELETES: tuple[str, ...] = get_args(Deletes)

# JSON key -> attribute, in the order `as_json` writes them.
_JSON_FIELDS: dict[str, str] = {
    "dataset": "dataset",
    "policy": "policy",
    "class": "dataset_class",
    "home": "home",
    "replicas": "replicas",
    "residency": "residency",
    "rpo_s": "rpo_s",
    "ack": "ack",
    "failover_mode": "failover_mode",
    "failover_order": "failover_order",
    "transfer_compression": "transfer_compression",
    "transfer_bandwidth_bps": "transfer_bandwidth_bps",
    "deletes": "deletes",
    "labels": "labels",
}
# Keys `from_json` may miss: they take the constructor's defaults.
_OPTIONAL_JSON = frozenset(
    {"ack", "transfer_compression", "transfer_bandwidth_bps", "deletes", "labels"}
)


@dataclass(frozen=True, kw_only=True)
class Placement:
    """The desired placement of one dataset, as compiled by the last `policy apply`."""

    dataset: str
    policy: str
    dataset_class: DatasetClass
    home: str
    replicas: tuple[str, ...]
    residency: tuple[str, ...]
    rpo_s: float
    ack: Ack | None = None
    failover_mode: FailoverMode
    failover_order: tuple[str, ...]
    transfer_compression: Compression = "zstd"
    transfer_bandwidth_bps: float | None = None
    deletes: Deletes = "replicate"
    # Not hashed (a mapping is not hashable); still compared.
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        where = f"placement of {self.dataset!r}" if isinstance(self.dataset, str) else "placement"
        _text(where, "dataset", self.dataset)
        _text(where, "policy", self.policy)
        _choice(where, "class", self.dataset_class, DATASET_CLASSES)
        _text(where, "home", self.home)
        self._set("replicas", _names(where, "replicas", self.replicas))
        self._set("residency", _names(where, "residency", self.residency))
        if not self.residency:
            raise PlacementError(f"{where}: residency must name at least one jurisdiction")
        if self.home in self.replicas:
            raise PlacementError(f"{where}: home {self.home} is also listed in replicas")
        rpo = _number(where, "rpo_s", self.rpo_s)
        if rpo < 0:
            raise PlacementError(f"{where}: rpo_s must be >= 0, got {rpo!r}")
        self._set("rpo_s", rpo)
        if self.dataset_class == "critical":
            if rpo != 0:
                raise PlacementError(f"{where}: a critical dataset's rpo_s must be 0, got {rpo!r}")
            if self.ack is None:
                self._set("ack", DEFAULT_ACK)
            _choice(where, "ack", self.ack, ACKS)
        else:
            if rpo == 0:
                raise PlacementError(f"{where}: a standard dataset's rpo_s must be > 0")
            if self.ack is not None:
                raise PlacementError(
                    f"{where}: ack applies only to critical datasets, got {self.ack!r}"
                )
        _choice(where, "failover_mode", self.failover_mode, FAILOVER_MODES)
        self._set("failover_order", _names(where, "failover_order", self.failover_order))
        if self.home in self.failover_order:
            raise PlacementError(f"{where}: home {self.home} is also listed in failover_order")
        _choice(where, "transfer_compression", self.transfer_compression, COMPRESSIONS)
        if self.transfer_bandwidth_bps is not None:
            bps = _number(where, "transfer_bandwidth_bps", self.transfer_bandwidth_bps)
            if bps <= 0:
                raise PlacementError(f"{where}: transfer_bandwidth_bps must be > 0, got {bps!r}")
            self._set("transfer_bandwidth_bps", bps)
        _choice(where, "deletes", self.deletes, DELETES)
        self._set("labels", _labels(where, self.labels))

    def _set(self, name: str, value: object) -> None:
        # Normalising in a frozen dataclass: only ever during __post_init__.
        object.__setattr__(self, name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickle and deepcopy through the JSON form: the labels' read-only view
        # cannot be pickled itself.
        return (Placement.from_json, (self.as_json(),))

    @property
    def regions(self) -> tuple[str, ...]:
        """Home first, then the replicas: every region that holds a copy."""
        return (self.home, *self.replicas)

    def as_json(self) -> dict[str, Any]:
        """A flat JSON object (lists for tuples); `from_json` reads it back."""
        out: dict[str, Any] = {}
        for key, attr in _JSON_FIELDS.items():
            value = getattr(self, attr)
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            out[key] = value
        return out

    @classmethod
    def from_json(cls, data: object) -> Placement:
        """Read `as_json()`'s form; refuse an unknown, missing or malformed field."""
        if not isinstance(data, Mapping):
            raise PlacementError(f"placement: expected a JSON object, got {type(data).__name__}")
        dataset = data.get("dataset")
        where = f"placement of {dataset!r}" if isinstance(dataset, str) else "placement"
        unknown = sorted(str(k) for k in data if k not in _JSON_FIELDS)
        if unknown:
            raise PlacementError(f"{where}: unknown field {', '.join(map(repr, unknown))}")
        missing = [k for k in _JSON_FIELDS if k not in data and k not in _OPTIONAL_JSON]
        if missing:
            raise PlacementError(f"{where}: missing field {', '.join(map(repr, missing))}")
        kwargs: dict[str, Any] = {}
        for key, attr in _JSON_FIELDS.items():
            if key not in data:
                continue
            value = data[key]
            if key in ("replicas", "residency", "failover_order"):
                if not isinstance(value, list):
                    raise PlacementError(
                        f"{where}: field {key!r} must be a list of names, got {value!r}"
                    )
                value = tuple(value)
            kwargs[attr] = value
        return cls(**kwargs)


def _text(where: str, name: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise PlacementError(f"{where}: field {name!r} must be a non-empty string, got {value!r}")


def _choice(where: str, name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise PlacementError(
            f"{where}: field {name!r} must be one of {', '.join(allowed)}, got {value!r}"
        )


def _names(where: str, name: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, tuple | list):
        raise PlacementError(f"{where}: field {name!r} must be a list of names, got {value!r}")
    for item in value:
        _text(where, f"{name} entry", item)
    if len(set(value)) != len(value):
        raise PlacementError(f"{where}: field {name!r} lists a name twice: {list(value)!r}")
    return tuple(value)


def _number(where: str, name: str, value: object) -> float:
    # bool is an int to Python, never a number to a user.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PlacementError(f"{where}: field {name!r} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise PlacementError(f"{where}: field {name!r} must be finite, got {value!r}")
    return number


def _labels(where: str, value: object) -> Mapping[str, str]:
    if not isinstance(value, Mapping):
        raise PlacementError(f"{where}: field 'labels' must be an object, got {value!r}")
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise PlacementError(
                f"{where}: field 'labels' must map strings to strings, got {k!r}: {v!r}"
            )
    return MappingProxyType(dict(value))
