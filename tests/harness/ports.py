"""Loopback ports for the processes and proxies a test starts itself."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port nobody listens on right now (the OS picked it; closed again, so
    a child or a proxy can bind it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
