"""The store root as the daemon sees it before opening the store: writable, and whose.

An agent's id names its registration (`/meridian/agents/<region>/<id>`) and its
metrics. It is kept in the root (`agent.json`), so a restart of the same root is
the same agent (a region's view of its agents does not grow a ghost per restart),
and the root remembers its region: a root started in another region would put
copies where their residency may forbid them, so that is refused.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from controlplane.errors import ConfigError

IDENTITY_FILE = "agent.json"


@dataclass(frozen=True)
class Identity:
    agent_id: str
    region: str


def check_writable(root: Path) -> None:
    """Create `root` if needed and prove a file can be written and synced in it, or raise
    one `ConfigError` saying why."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(
            f"the store root {root} cannot be created: {err.strerror or err}"
        ) from None
    if not root.is_dir():
        raise ConfigError(f"the store root {root} is not a folder")
    probe = root / f".write-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, b"meridian")
            os.fsync(fd)
        finally:
            os.close(fd)
        probe.unlink()
    except OSError as err:
        raise ConfigError(f"the store root {root} is not writable: {err.strerror or err}") from None


def load_or_create(root: Path, region: str) -> Identity:
    """The root's identity; a root without one gets a new id, written durably."""
    path = root / IDENTITY_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return _create(path, region)
    except OSError as err:
        raise ConfigError(f"cannot read {path}: {err.strerror or err}") from None
    try:
        doc = json.loads(raw)
        found = Identity(agent_id=str(doc["id"]), region=str(doc["region"]))
    except (ValueError, KeyError, TypeError):
        raise ConfigError(
            f"{path} is not an agent identity (JSON with id and region); restore it or "
            "remove it to give this root a new id"
        ) from None
    if found.region != region:
        raise ConfigError(
            f"the store root {root} belongs to region {found.region} (see {path}); "
            f"start it with --region {found.region}, or give region {region} a root of its own"
        )
    return found


def _create(path: Path, region: str) -> Identity:
    found = Identity(agent_id=f"{region}-{uuid.uuid4().hex[:12]}", region=region)
    tmp = path.with_name(f".{path.name}.tmp")
    data = json.dumps({"id": found.agent_id, "region": region}).encode()
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as err:
        raise ConfigError(f"cannot write {path}: {err.strerror or err}") from None
    return found
