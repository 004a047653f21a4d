"""Loopback ports for the processes and proxies a run starts itself (the demo's regions,
the chaos worlds, the tests' daemons and the benchmarks).

Why not bind port 0 and hand the result on: the kernel takes that port from the
ephemeral range, and once the probe socket is closed, any outgoing connection of any
process on the machine may take the same number as its source port before the child
binds it, or while a SIGKILLed agent is down and about to be restarted on it. A busy
chaos run makes thousands of such connections, and CI lost a whole group of scenarios
to one `Address already in use`. Ports below the ephemeral range are never handed out
as source ports, so a port chosen there stays free until someone binds it on purpose.
"""

from __future__ import annotations

import random
import socket
import threading
from collections.abc import Sequence
from pathlib import Path

# Below Linux's default ephemeral range (32768-60999) and above the stack's fixed ports
# (etcd 2379+, Toxiproxy 8474, Kafka 9092+ and its proxies at +10002).
_LOW, _HIGH = 20000, 32000
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_MEMORY = 8000  # ports handed out and remembered by this process, so none twice

_given: set[int] = set()
_lock = threading.Lock()
_random = random.SystemRandom()  # independent of any seeded `random` in a test or a run


def _window() -> tuple[int, int]:
    """Our window, cut short where this machine's ephemeral range starts lower."""
    try:
        ephemeral_low = int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _LOW, _HIGH
    high = min(_HIGH, ephemeral_low)
    return (_LOW, high) if high - _LOW >= 1000 else (0, 0)


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _from_kernel() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port() -> int:
    """A loopback port nobody listens on now, outside the ephemeral range where the
    machine allows it, and not handed out before by this process."""
    _, high = _window()
    if not high:  # a machine whose ephemeral range leaves no room below it
        return _from_kernel()
    return free_block((0,))


def free_block(offsets: Sequence[int]) -> int:
    """A base port such that `base + offset` is free for every offset, by the same
    rules as `free_port`: for a group of processes that derive their ports from one
    base, such as an etcd cluster's members (client and peer port per member)."""
    low, high = _window()
    if not high:
        low, high = 1024, 32768  # no room below the range: the registered ports
    span = max(offsets)
    with _lock:
        if len(_given) > _MEMORY:
            _given.clear()
        for _ in range(500):
            base = _random.randrange(low, high - span)
            ports = [base + offset for offset in offsets]
            if all(port not in _given and _bindable(port) for port in ports):
                _given.update(ports)
                return base
    raise RuntimeError(f"no free loopback ports at offsets {list(offsets)} in {low}-{high}")
