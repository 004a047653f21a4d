"""Real agent processes for the `meridian object` tests (see harness.agent_fixtures)."""

from harness.agent_fixtures import agent, world

__all__ = ["agent", "world"]
