"""The scenarios the suite can run now: their fault, timing and invariants.

Numbers are issue 14's. Each scenario is data: the fault kinds its nemesis
cycles through, the targets it draws from, how long each fault holds, and the
invariants (checker names) it reports. The injectors live in `chaos.faults`.
"""

from __future__ import annotations

from dataclasses import dataclass

from chaos.checkers import journal, lost_writes, ownership, split_brain


@dataclass(frozen=True)
class Scenario:
    name: str
    number: int
    fault: str
    kinds: tuple[str, ...]
    targets: tuple[str, ...]
    hold_s: tuple[float, float]
    gap_s: tuple[float, float]
    invariants: tuple[str, ...]
    # Invariant `no-ownership-change` holds over these kinds' windows only.
    stable_during: tuple[str, ...] = ()
    # Invariant `writes-during-fault`: the data path must keep acking through these.
    progress_during: tuple[str, ...] = ()


SAFETY = (
    split_brain.NAME,
    lost_writes.NAME,
    ownership.RESUMED,
    journal.JOURNALED,
    journal.VIEWS,
)

SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "owner-isolated",
        1,
        "the region owning the critical datasets isolated from everything (etcd, Kafka, "
        "catalog, agent links) past the lease TTL, then healed",
        ("isolate",),
        ("owner",),
        (8.0, 11.0),
        (3.0, 5.0),
        SAFETY,
    ),
    Scenario(
        "owner-cut-from-etcd",
        2,
        "the owner region's controller and clients cut from every etcd member (their data "
        "path stays up) past the lease TTL, then healed: the lease-expiry race",
        ("cut-etcd",),
        ("owner",),
        (8.0, 11.0),
        (3.0, 5.0),
        SAFETY,
    ),
    Scenario(
        "owner-sigstop",
        3,
        "the owner region's controller SIGSTOPped (and its clients held between reading "
        "their epoch and writing) past the lease TTL, then resumed",
        ("sigstop",),
        ("owner",),
        (8.0, 11.0),
        (3.0, 5.0),
        SAFETY,
    ),
    Scenario(
        "owner-one-way-etcd",
        4,
        "a one-way partition of the owner region from etcd (a timeout toxic with 0 ms on "
        "one direction only): its replies lost (its keepalives still arrive), then its "
        "requests lost, in turn",
        ("cut-etcd-down", "cut-etcd-up"),
        ("owner",),
        (8.0, 11.0),
        (3.0, 5.0),
        SAFETY,
    ),
    Scenario(
        "etcd-leader-and-quorum",
        6,
        "the etcd leader killed and restarted; then two of three members killed and "
        "restored (quorum loss: no ownership change, no acked write without a valid epoch)",
        ("kill-etcd-leader", "etcd-quorum-loss"),
        ("etcd",),
        (6.0, 9.0),
        (3.0, 5.0),
        (*SAFETY, ownership.STABLE),
        stable_during=("kill-etcd-leader", "etcd-quorum-loss"),
    ),
    Scenario(
        "catalog-stopped",
        12,
        "the catalog (PostgreSQL) stopped under load and started again: the data path "
        "keeps working and no region fails over",
        ("stop-catalog",),
        ("catalog",),
        (12.0, 16.0),
        (3.0, 5.0),
        (*SAFETY, ownership.STABLE, ownership.DURING),
        stable_during=("stop-catalog",),
        progress_during=("stop-catalog",),
    ),
)

BY_NAME = {s.name: s for s in SCENARIOS}
