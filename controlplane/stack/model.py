"""What every stack service reports about itself (the `stack status` row)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol


@dataclass(frozen=True)
class ServiceStatus:
    service: str
    state: Literal["up", "down"]
    endpoint: str
    pid: int | None
    log: str

    def as_json(self) -> dict[str, object]:
        return {
            "service": self.service,
            "state": self.state,
            "endpoint": self.endpoint,
            "pid": self.pid,
            "log": self.log,
        }


class Service(Protocol):
    """A local engine: `start` is idempotent and returns only once a real health check passed."""

    name: str

    def install(self) -> None: ...

    def start(self) -> bool:
        """Start if not running and wait until healthy; True if this call started it."""
        ...

    def status(self) -> list[ServiceStatus]: ...

    def stop(self) -> bool:
        """Stop our processes (idempotent); True if something was running."""
        ...
