"""Failover of a critical dataset under write load, with the data plane: time to a new
owner and the RPO exposure the agents told.

Each trial starts three EU regions (agent + controller processes, lease TTL 2 s,
a Toxiproxy proxy in front of each agent: tests/critical/faults_world.py), lets a
writer hammer `auto/a` (`ack: quorum`, 2 of 3) with acked writes through its owner,
then SIGKILLs the owner region's agent and controller together. Measured: the
time from the kill until etcd names a new owner, the new owner's region, the RPO
exposure journaled for the move (`rpo_versions`, from the agents' holdings
records), and the acked writes the new owner does not hold (must be 0).

    python benchmarks/critical_failover_bench.py              # 3 trials
    python benchmarks/critical_failover_bench.py --trials 1   # a quick look

Needs the local stack's etcd and Toxiproxy (`meridian stack up`); reads the
MERIDIAN_STACK_* ports like the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import bench_harness  # noqa: F401 - puts tests/ on the path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "critical"))

from faults_world import FaultsWorld, Writer, listing, wait_owner
from harness.agent_fixtures import clear_keyspace

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.catalog.api import open_catalog
from controlplane.settings import load_settings


async def trial(folder: Path, etcd: str, toxiproxy: str) -> dict[str, object]:
    clear_keyspace(etcd)
    world = FaultsWorld(folder, etcd, toxiproxy)
    await world.start(["auto/a"])
    coord = EtcdCoordination([etcd], timeout_s=5.0)
    await coord.connect()
    try:
        before = await wait_owner(coord, "auto/a", lambda o: o.region == "eu-west", timeout_s=60)
        writer = Writer(world, coord, "auto/a")
        load = asyncio.create_task(writer.run(max_writes=2000, max_s=120))
        await writer.until(lambda: len(writer.acked) >= 20, timeout_s=60)
        killed_at = time.monotonic()
        world.controllers["eu-west"].kill()
        world.agents["eu-west"].kill()
        moved = await wait_owner(coord, "auto/a", lambda o: o.epoch > before.epoch, timeout_s=60)
        to_owner_s = time.monotonic() - killed_at
        await writer.until(lambda: sum(a.region == moved.region for a in writer.acked) >= 5, 60)
        writer.stop()
        await asyncio.wait_for(load, 30)
        held = await listing(world.agents[moved.region].address, "auto/a")
        lost = sum(1 for a in writer.acked if held.get(a.key) != a.digest)
        rpo: object = None
        catalog = open_catalog(world.env["MERIDIAN_CATALOG"])
        try:
            for _ in range(200):  # the journal row follows the move closely
                row = next((r for r in catalog.list_failovers() if r.epoch == moved.epoch), None)
                if row is not None:
                    rpo = row.rpo_versions
                    source = json.loads(row.details or "{}").get("rpo_source")
                    break
                await asyncio.sleep(0.05)
        finally:
            catalog.close()
        return {
            "to_new_owner_s": round(to_owner_s, 3),
            "new_owner": moved.region,
            "rpo_versions": rpo,
            "rpo_source": source if rpo is not None else None,
            "acked": len(writer.acked),
            "acked_lost": lost,
        }
    finally:
        await coord.close()
        await world.stop()


async def main_async(args: argparse.Namespace) -> list[dict[str, object]]:
    settings = load_settings()
    etcd = f"127.0.0.1:{settings.stack_etcd_port}"
    toxiproxy = f"http://127.0.0.1:{settings.stack_toxiproxy_port}"
    out: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="critical-failover-") as tmp:
        for i in range(args.trials):
            result = await trial(Path(tmp) / f"trial{i}", etcd, toxiproxy)
            print(json.dumps(result), flush=True)
            out.append(result)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    results = asyncio.run(main_async(args))
    times = [float(str(r["to_new_owner_s"])) for r in results]
    print(
        json.dumps(
            {
                "trials": len(results),
                "to_new_owner_p50_s": statistics.median(times),
                "to_new_owner_max_s": max(times),
                "lease_ttl_s": 2,
                "rpo_versions": [r["rpo_versions"] for r in results],
                "acked_lost": sum(int(str(r["acked_lost"])) for r in results),
            }
        )
    )


if __name__ == "__main__":
    main()
