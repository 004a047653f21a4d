"""The loopback port allocator keeps clear of the ephemeral range and of bound ports."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from controlplane import loopback


def ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_ports_lie_below_the_ephemeral_range_and_never_repeat() -> None:
    ports = [loopback.free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(20000 <= p < min(32000, ephemeral_low()) for p in ports)


class Scripted:
    """Stands in for the random source: hands out the given ports in turn."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports

    def randrange(self, low: int, high: int) -> int:
        return self.ports.pop(0)


def test_a_port_someone_listens_on_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = int(taken.getsockname()[1])
        spare = loopback.free_port()
        loopback._given.discard(spare)
        monkeypatch.setattr(loopback, "_random", Scripted([busy, spare]))
        assert loopback.free_port() == spare


def test_a_port_handed_out_once_is_not_handed_out_again(monkeypatch: pytest.MonkeyPatch) -> None:
    first = loopback.free_port()
    second = loopback.free_port()
    loopback._given.discard(second)
    monkeypatch.setattr(loopback, "_random", Scripted([first, second]))
    assert loopback.free_port() == second


def test_a_block_is_passed_over_when_any_of_its_ports_is_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    offsets = (0, 1, 10, 11, 20, 21)
    spare = loopback.free_block(offsets)
    with socket.socket() as taken:
        # A block whose last member's port is bound: the whole block must be refused.
        taken.bind(("127.0.0.1", spare + 21 + 100))
        taken.listen()
        blocked = spare + 100
        for offset in offsets:
            loopback._given.discard(spare + offset)
        monkeypatch.setattr(loopback, "_random", Scripted([blocked, spare]))
        assert loopback.free_block(offsets) == spare
    assert spare + max(offsets) < min(32000, ephemeral_low())
