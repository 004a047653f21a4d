"""A stack service that is one process: start, health-check, report and stop it one way."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from controlplane.settings import Settings
from controlplane.stack.model import ServiceStatus
from controlplane.stack.process import ManagedProcess, require_free_ports, wait_healthy


class SingleProcessService(ABC):
    """Subclasses say how to install, prepare and check; the lifecycle is shared."""

    name: str
    stop_timeout_s: float = 15.0

    def __init__(self, settings: Settings, run_dir: Path, marker: str | None = None) -> None:
        self.settings = settings
        self.run_dir = (run_dir / self.name).resolve()
        self.process = ManagedProcess(
            name=self.name,
            pid_file=self.run_dir / f"{self.name}.pid",
            log_file=self.run_dir / f"{self.name}.log",
            # Our process is the one whose command line names our run folder.
            marker=marker or str(self.run_dir),
        )

    @property
    @abstractmethod
    def endpoint(self) -> str: ...

    @abstractmethod
    def install(self) -> None: ...

    @abstractmethod
    def ports(self) -> list[int]:
        """Every port the process listens on (checked free before it starts)."""

    @abstractmethod
    def prepare(self) -> list[str]:
        """Create config and data on first use; return the argv that starts the service."""

    @abstractmethod
    def health(self) -> None:
        """Raise unless the service really serves (a request, not just an open port)."""

    def start(self) -> bool:
        """Start if not running and wait until healthy; True if this call started it."""
        if self.process.pid() is not None or self.process.adopt_orphan() is not None:
            wait_healthy(self.name, self.process, self.health, self.settings.stack_start_timeout_s)
            return False
        require_free_ports(self.name, self.ports())
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.process.start(self.prepare())
        try:
            wait_healthy(self.name, self.process, self.health, self.settings.stack_start_timeout_s)
        except BaseException:
            self.process.stop()  # never leave a half-started service behind
            raise
        return True

    def status(self) -> list[ServiceStatus]:
        pid = self.process.pid()
        log = str(self.process.log_file)
        if pid is None:
            return [ServiceStatus(self.name, "down", self.endpoint, None, log)]
        return [ServiceStatus(self.name, "up", self.endpoint, pid, log)]

    def stop(self) -> bool:
        return self.process.stop(timeout_s=self.stop_timeout_s)
