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


def policy_yaml() -> str:
    regions = "\n".join(f"    - name: {n}\n      jurisdiction: {j}" for n, j in REGIONS)
    docs = [
        "apiVersion: meridian/v1\nkind: Topology\nmetadata:\n  name: chaos\n"
        f"spec:\n  regions:\n{regions}\n",
        "apiVersion: meridian/v1\nkind: ReplicationPolicy\nmetadata:\n  name: checkpoints\n"
        'spec:\n  selector:\n    datasets: ["ckpt/*"]\n  class: critical\n  home: eu-west\n'
        "  replicas:\n    regions: [eu-central, eu-north]\n  residency: [EU]\n  rpo: 0s\n"
        "  failover:\n    mode: automatic\n    order: [eu-central, eu-north]\n",
    ]
    head = "apiVersion: meridian/v1\nkind: Dataset\nmetadata:\n"
    docs += [f"{head}  name: {ds}\n" for ds in CRITICAL]
    return "---\n".join(docs)
