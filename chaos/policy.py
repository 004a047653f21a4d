"""The topology and policy every chaos run applies (through `meridian policy apply`)."""

from __future__ import annotations

REGIONS: list[tuple[str, str]] = [
    ("eu-west", "EU"),
    ("eu-central", "EU"),
    ("eu-north", "EU"),
    ("us-east", "US"),
]
CRITICAL = [f"ckpt/c{i}" for i in range(4)]
RESIDENCY: dict[str, set[str]] = {ds: {"EU"} for ds in CRITICAL}
HOLDERS: dict[str, list[str]] = {ds: ["eu-west", "eu-central", "eu-north"] for ds in CRITICAL}
# Standard-class datasets of the data-plane scenarios: written anywhere in the EU,
# replicated asynchronously to every EU region, never to us-east.
STANDARD = [f"std/s{i}" for i in range(2)]
STANDARD_RESIDENCY: dict[str, set[str]] = {ds: {"EU"} for ds in STANDARD}
STANDARD_HOLDERS: dict[str, list[str]] = {
    ds: ["eu-west", "eu-central", "eu-north"] for ds in STANDARD
}
JURISDICTIONS: dict[str, str] = dict(REGIONS)


def policy_yaml(*, standard: bool = False) -> str:
    regions = "\n".join(f"    - name: {n}\n      jurisdiction: {j}" for n, j in REGIONS)
    docs = [
        "apiVersion: meridian/v1\nkind: Topology\nmetadata:\n  name: chaos\n"
        f"spec:\n  regions:\n{regions}\n",
        "apiVersion: meridian/v1\nkind: ReplicationPolicy\nmetadata:\n  name: checkpoints\n"
        'spec:\n  selector:\n    datasets: ["ckpt/*"]\n  class: critical\n  home: eu-west\n'
        "  replicas:\n    regions: [eu-central, eu-north]\n  residency: [EU]\n  rpo: 0s\n"
        "  failover:\n    mode: automatic\n    order: [eu-central, eu-north]\n",
    ]
    if standard:
        docs.append(
            "apiVersion: meridian/v1\nkind: ReplicationPolicy\nmetadata:\n  name: shared\n"
            'spec:\n  selector:\n    datasets: ["std/*"]\n  class: standard\n'
            "  home: eu-west\n  replicas:\n    regions: [eu-central, eu-north]\n"
            "  residency: [EU]\n  rpo: 30s\n  failover:\n    mode: manual\n"
        )
    head = "apiVersion: meridian/v1\nkind: Dataset\nmetadata:\n"
    docs += [f"{head}  name: {ds}\n" for ds in CRITICAL + (STANDARD if standard else [])]
    return "---\n".join(docs)
