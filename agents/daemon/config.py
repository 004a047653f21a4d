"""Settings of one node agent (its flags; connection settings come from `Settings`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from controlplane.errors import ConfigError

DEFAULT_KEEP_VERSIONS = 2
DEFAULT_STOP_GRACE_S = 10.0
# How often the registration's usage figures are rewritten (only when they changed).
DEFAULT_USAGE_INTERVAL_S = 5.0


def parse_listen(addr: str, flag: str) -> tuple[str, int]:
    """`host:port` of an address this process binds; port 0 lets the OS choose."""
    host, sep, port = addr.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{flag} {addr!r} is not HOST:PORT; give e.g. 127.0.0.1:7400")
    return host, int(port)


@dataclass(frozen=True)
class AgentConfig:
    region: str
    root: Path
    listen: str  # host:port; port 0 lets the OS choose (the log and registration say which)
    metrics: str | None = None  # host:port of the Prometheus endpoint; port 0 as above
    advertise: str | None = None  # the endpoint others reach us at (default: from listen)
    keep_versions: int = DEFAULT_KEEP_VERSIONS
    weight: int = 1
    lease_ttl_s: int = 5
    stop_grace_s: float = DEFAULT_STOP_GRACE_S
    usage_interval_s: float = DEFAULT_USAGE_INTERVAL_S
    retry_initial_s: float = 0.1
    retry_max_s: float = 2.0
    # How often resume states of cut transfers are expired (agents/transfer/sweep.py).
    resume_sweep_interval_s: float = 3600.0
    # A Put of more bytes is refused (RESOURCE_EXHAUSTED); None: no cap but the disk's.
    max_object_bytes: int | None = None

    def __post_init__(self) -> None:
        parse_listen(self.listen, "--listen")
        if self.metrics is not None:
            parse_listen(self.metrics, "--metrics")
        if self.advertise is not None:
            parse_listen(self.advertise, "--advertise")
        if self.keep_versions < 1:
            raise ConfigError(f"--keep-versions must be at least 1, got {self.keep_versions}")
        if self.weight < 1:
            raise ConfigError(f"--weight must be at least 1, got {self.weight}")
        if self.resume_sweep_interval_s <= 0:
            raise ConfigError(
                f"the resume sweep interval must be > 0 s, got {self.resume_sweep_interval_s:g}"
            )
        if self.max_object_bytes is not None and self.max_object_bytes < 1:
            raise ConfigError(f"--max-object-bytes must be >= 1, got {self.max_object_bytes}")
        if self.stop_grace_s < 0:
            raise ConfigError(f"--grace must be >= 0 s, got {self.stop_grace_s:g}")
