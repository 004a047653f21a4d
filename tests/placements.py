"""Placements for tests that build one by hand (most take theirs from a policy): a
critical dataset in the EU, owned at home, with its replicas as the failover order
unless a test says otherwise."""

from __future__ import annotations

from collections.abc import Sequence

from controlplane.domain.placement import Ack, FailoverMode, Placement


def critical(
    dataset: str,
    home: str = "eu-west",
    replicas: Sequence[str] = ("eu-central", "eu-north"),
    *,
    policy: str = "crit",
    ack: Ack = "quorum",
    failover_mode: FailoverMode = "manual",
    failover_order: Sequence[str] | None = None,
) -> Placement:
    return Placement(
        dataset=dataset,
        policy=policy,
        dataset_class="critical",
        home=home,
        replicas=tuple(replicas),
        residency=("EU",),
        rpo_s=0,
        ack=ack,
        failover_mode=failover_mode,
        failover_order=tuple(replicas if failover_order is None else failover_order),
    )
