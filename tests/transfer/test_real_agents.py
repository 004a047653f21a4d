"""Transfers between real `meridian agent serve` processes (etcd, the catalog and the
world policy of harness.agent_process): a new version over an old one sends about
the engine's delta and arrives byte-identical; a region outside the residency
refuses the copy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.agent_fixtures import world
from harness.agent_process import AgentProcess
from xfer_helpers import content, rewrite

import native
from agents.client import AgentClient, FetchSource
from agents.errors import ResidencyError

__all__ = ["world"]

SIZE = 8 << 20


@pytest.fixture
def processes(tmp_path: Path, world: dict[str, str]) -> Iterator[dict[str, AgentProcess]]:
    started: dict[str, AgentProcess] = {}
    try:
        for region in ("eu-west", "eu-central", "us-east"):
            started[region] = AgentProcess(
                region, tmp_path / region, world, tmp_path / f"{region}.log"
            ).start()
        yield started
    finally:
        for proc in started.values():
            proc.stop()


@pytest.mark.integration
async def test_new_version_over_old_between_agent_processes(
    processes: dict[str, AgentProcess], tmp_path: Path
) -> None:
    west, central, us = processes["eu-west"], processes["eu-central"], processes["us-east"]
    old = content(SIZE)
    new = rewrite(old, 0.02)
    (tmp_path / "old").write_bytes(old)
    (tmp_path / "new").write_bytes(new)
    source = [FetchSource("eu-west", west.address)]
    async with (
        AgentClient(west.address) as w,
        AgentClient(central.address) as c,
        AgentClient(us.address) as u,
    ):
        v1 = await w.put("eu/models", "m.bin", tmp_path / "old")
        first = await c.fetch("eu/models", "m.bin", v1, source, origin_region="eu-west")
        v2 = await w.put("eu/models", "m.bin", tmp_path / "new")
        second = await c.fetch("eu/models", "m.bin", v2, source, origin_region="eu-west")
        held, data = await c.get_bytes("eu/models", "m.bin")
        with pytest.raises(ResidencyError):
            await u.fetch("eu/models", "m.bin", v2, source, origin_region="eu-west")

    assert first.wire_bytes >= SIZE  # no basis: the content itself
    assert held == v2 and data == new
    native.delta_basis(tmp_path / "old", tmp_path / "new", tmp_path / "delta")
    delta = (tmp_path / "delta").stat().st_size
    assert delta <= second.wire_bytes <= delta + 4096
