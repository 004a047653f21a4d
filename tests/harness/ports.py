"""Loopback ports for the processes and proxies a test starts itself: the package's
allocator, which keeps clear of the ephemeral range (see controlplane/loopback.py)."""

from __future__ import annotations

from controlplane.loopback import free_port

__all__ = ["free_port"]
