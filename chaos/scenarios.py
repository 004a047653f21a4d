"""The scenarios the suite can run now: their fault, timing and invariants.

Numbers are issue 14's. Each scenario is data: the fault kinds its nemesis
cycles through, the targets it draws from, how long each fault holds, and the
invariants (checker names) it reports. The injectors live in `chaos.faults`.
"""

from __future__ import annotations

from dataclasses import dataclass

from chaos.checkers import (
    changelog,
    clock_skew,
    convergence,
    journal,
    lost_writes,
    ownership,
    residency,
    split_brain,
    visibility,
)
from chaos.checkers import critical as critical_checks


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
    # Agents and replicators in every region, and the standard-class data workload
    # writing objects of `object_size` bytes (above 256 KiB: fetched by Sync, not inline).
    data_plane: bool = False
    object_size: int = 4096
    # Critical-class writes through the owner's agent with its epoch (sync replication),
    # beside the standard workload (needs `data_plane`).
    critical_plane: bool = False
    # Scenario 13: the target region's agent and replicator run with their HLC's
    # physical clock shifted by this many ms (from their start).
    clock_offset_ms: int = 0

    @property
    def agents(self) -> bool:
        """Agents and replicators run in every region (for either workload)."""
        return self.data_plane or self.critical_plane


SAFETY = (
    split_brain.NAME,
    lost_writes.NAME,
    ownership.RESUMED,
    journal.JOURNALED,
    journal.VIEWS,
)
# With the critical workload through the agents (sync replication, epochs from etcd).
CRIT = (critical_checks.LOST, critical_checks.ONE_OWNER, convergence.NAME)

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
        (*SAFETY, *CRIT),
        critical_plane=True,
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
        (*SAFETY, *CRIT),
        critical_plane=True,
    ),
    Scenario(
        "owner-sigstop",
        3,
        "the owner region's agent and controller SIGSTOPped (and its clients held between "
        "reading their epoch and writing) past the lease TTL, then resumed",
        ("sigstop",),
        ("owner",),
        (8.0, 11.0),
        (3.0, 5.0),
        (*SAFETY, *CRIT),
        critical_plane=True,
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
        (*SAFETY, *CRIT),
        critical_plane=True,
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
        (*SAFETY, ownership.STABLE, *CRIT),
        stable_during=("kill-etcd-leader", "etcd-quorum-loss"),
        critical_plane=True,
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
        (*SAFETY, ownership.STABLE, ownership.DURING, *CRIT),
        stable_during=("stop-catalog",),
        progress_during=("stop-catalog",),
        critical_plane=True,
    ),
)

DATA = (
    split_brain.NAME,
    lost_writes.NAME,
    convergence.NAME,
    changelog.NAME,
    visibility.NAME,
    residency.NAME,
)
EU = ("eu-west", "eu-central", "eu-north")

SCENARIOS += (
    Scenario(
        "kafka-and-crashes",
        7,
        "the Kafka broker SIGKILLed and restarted under load; an agent SIGKILLed mid-publish "
        "(its outbox not yet drained); a replicator SIGKILLed mid-apply; each restarted",
        ("restart-kafka", "kill-agent", "kill-replicator"),
        EU,
        (4.0, 6.0),
        (3.0, 4.0),
        DATA,
        data_plane=True,
    ),
    Scenario(
        "torn-transfers",
        9,
        "limit_data, reset_peer and slicer toxics on one region's agent links during large "
        "Syncs (objects fetched as deltas of the key's previous version), and an agent "
        "SIGKILLed mid-patch",
        ("limit-data", "kill-agent", "reset-peer", "slicer"),
        EU,
        (3.0, 4.0),
        (2.0, 3.0),
        DATA,
        data_plane=True,
        object_size=1536 * 1024,
    ),
    Scenario(
        "flapping-links",
        11,
        "one region's agent and Kafka links disabled and enabled every 1-2 s; then reset_peer "
        "at toxicity 0.3 on every agent link",
        ("flap", "reset-peer-0.3"),
        EU,
        (6.0, 9.0),
        (2.0, 3.0),
        DATA,
        data_plane=True,
        object_size=384 * 1024,
    ),
)

CRITICAL_DATA = (*DATA, critical_checks.LOST, critical_checks.ONE_OWNER)  # DATA converges
PAIRS = ("eu-west|eu-central", "eu-west|eu-north", "eu-central|eu-north")

SCENARIOS += (
    Scenario(
        "partial-partition",
        5,
        "a partial partition: the agent links between two EU regions cut both ways while "
        "both still reach the third (and etcd, Kafka, the catalog): pushes and Fetches "
        "between them must go another way or wait",
        ("cut-pair",),
        PAIRS,
        (4.0, 6.0),
        (2.0, 3.0),
        CRITICAL_DATA,
        data_plane=True,
        critical_plane=True,
        object_size=384 * 1024,
    ),
    Scenario(
        "wan-degraded",
        8,
        "WAN degradation: 100 +/- 50 ms latency each way on every agent and Kafka link and "
        "a 1 MiB/s bandwidth cap on the agent (delta) links, under a checkpoint series "
        "(1.5 MiB objects rewritten: fetched as deltas)",
        ("wan",),
        ("all",),
        (6.0, 8.0),
        (2.0, 3.0),
        DATA,
        data_plane=True,
        object_size=1536 * 1024,
    ),
    Scenario(
        "residency-failover",
        10,
        "residency under failover: the owner of the EU-only datasets isolated and the other "
        "EU regions cut from etcd, so only us-east (US, not allowed) can reach etcd: no "
        "dataset may fail over there, no byte may land there",
        ("strand-compliant",),
        ("owner",),
        (6.0, 8.0),
        (3.0, 4.0),
        (*CRITICAL_DATA, residency.OWNERS, ownership.RESUMED),
        data_plane=True,
        critical_plane=True,
    ),
    Scenario(
        "clock-skew",
        13,
        "clock skew: eu-north's agent and replicator run with their HLC's physical clock "
        "30 s ahead (setting clock_offset_ms; max_clock_skew_ms is 1000) for the whole run: "
        "its versions are quarantined elsewhere (dead letter `clock skew`), never applied, "
        "while the other regions' writes reach it and everyone else",
        ("skewed",),
        ("eu-north",),
        (6.0, 8.0),
        (3.0, 4.0),
        (*DATA, clock_skew.NAME),
        data_plane=True,
        clock_offset_ms=30_000,
    ),
)

SCENARIOS = tuple(sorted(SCENARIOS, key=lambda s: s.number))
BY_NAME = {s.name: s for s in SCENARIOS}
