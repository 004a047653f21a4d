"""The etcd key layout of ARCHITECTURE.md, in one place (prefix `/meridian/`)."""

from __future__ import annotations

ROOT = "/meridian/"
REGIONS = ROOT + "regions/"
OWNERS = ROOT + "owners/"
HANDOVER = ROOT + "handover/"
LOCKS = ROOT + "locks/"
POLICY_CURRENT = ROOT + "policy/current"
MAINTENANCE = ROOT + "maintenance"
AGENTS = ROOT + "agents/"
DATASETS = ROOT + "datasets/"
FAST_FAIL = ROOT + "fast-fail/"


def alive(region: str) -> str:
    return f"{REGIONS}{region}/alive"


def state(region: str) -> str:
    return f"{REGIONS}{region}/state"


def election(region: str) -> str:
    return f"{REGIONS}{region}/election/"


def owner(dataset: str) -> str:
    return OWNERS + dataset


def dataset(name: str) -> str:
    """A dataset first seen after the policy that places it was applied (see datasets.py)."""
    return DATASETS + name


def handover(dataset: str) -> str:
    return HANDOVER + dataset


def agent(region: str, agent_id: str) -> str:
    """An agent's registration, on its lease."""
    return f"{AGENTS}{region}/{agent_id}"


def agents_of(region: str) -> str:
    """The prefix of a region's agent registrations."""
    return f"{AGENTS}{region}/"


def down_votes(region: str, agent_id: str, lease: int) -> str:
    """The prefix of the votes that the registration of `agent_id` on `lease` is down
    (agents/placement/fastfail.py): one key per voting peer, on a short lease of its own."""
    return f"{FAST_FAIL}{region}/{agent_id}/{lease:x}/"


def lock(name: str) -> str:
    return f"{LOCKS}{name}/"


def region_of(key: str) -> tuple[str, str] | None:
    """("eu-west", "alive") for "/meridian/regions/eu-west/alive", else None."""
    if not key.startswith(REGIONS):
        return None
    name, _, rest = key.removeprefix(REGIONS).partition("/")
    return (name, rest) if name and rest else None
