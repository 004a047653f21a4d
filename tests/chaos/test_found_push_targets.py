"""A bug the chaos suite found (scenario 1, owner isolated then healed): after a
failover the new owner pushed its critical writes to `replicas` (itself among them)
and never to the home region, so the home never caught up (convergence failed) and
a push to itself could count as a second copy. The owner pushes to every other copy
region, the home included."""

from __future__ import annotations

from placements import critical as placed

from agents.replication.sync import copies_needed, copy_regions, push_targets
from controlplane.domain.placement import Placement


def critical(home: str, replicas: tuple[str, ...]) -> Placement:
    return placed(
        "ckpt/a", home=home, replicas=replicas, policy="checkpoints", failover_mode="automatic"
    )


def test_the_home_owner_pushes_to_the_replicas() -> None:
    p = critical("eu-west", ("eu-central", "eu-north"))
    assert push_targets(p, "eu-west") == ("eu-central", "eu-north")


def test_a_failed_over_owner_pushes_to_the_home_and_never_to_itself() -> None:
    p = critical("eu-west", ("eu-central", "eu-north"))
    assert push_targets(p, "eu-central") == ("eu-west", "eu-north")
    assert copy_regions(p) == ("eu-west", "eu-central", "eu-north")
    assert copies_needed(p) == 2
