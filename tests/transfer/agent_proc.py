"""Start and stop agent_main.py processes (tests and the transfer benchmark)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.children import popen

from controlplane.domain.placement import Placement

MAIN = Path(__file__).with_name("agent_main.py")
REPO = Path(__file__).resolve().parents[2]


def write_policy(
    path: Path,
    regions: dict[str, str],
    placements: list[Placement],
    links: list[tuple[str, str, float]] = (),  # type: ignore[assignment]
) -> Path:
    doc = {
        "regions": regions,
        "links": [list(link) for link in links],
        "placements": [p.as_json() for p in placements],
    }
    path.write_text(json.dumps(doc))
    return path


@dataclass
class AgentProc:
    root: Path
    region: str
    policy: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    address: str = ""
    peak_rss_kib: int = field(default=0)

    def start(self, timeout_s: float = 30.0) -> AgentProc:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        out = open(self.log, "ab")  # noqa: SIM115 - the child owns it
        self.proc = popen(
            [
                sys.executable,
                str(MAIN),
                "--root",
                str(self.root),
                "--region",
                self.region,
                "--policy",
                str(self.policy),
            ],
            stdout=subprocess.PIPE,
            stderr=out,
            env=env,
        )
        out.close()
        deadline = time.monotonic() + timeout_s
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline().decode()
            if line.startswith("serving "):
                self.address = f"127.0.0.1:{int(line.split()[1])}"
                return self
            if not line and self.proc.poll() is not None:
                break
        raise RuntimeError(f"agent {self.region} did not start; see {self.log}")

    def rss_kib(self) -> int:
        """Peak resident set size so far (VmHWM)."""
        if self.proc is None:
            return self.peak_rss_kib
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_rss_kib = max(self.peak_rss_kib, int(line.split()[1]))
        except OSError:
            pass
        return self.peak_rss_kib

    def stop(self) -> int:
        return self._end(signal.SIGTERM)

    def kill(self) -> int:
        return self._end(signal.SIGKILL)

    def _end(self, sig: int) -> int:
        if self.proc is None:
            return 0
        self.rss_kib()
        self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None
        return code
