"""A node agent in a process of its own, for the transfer tests and the transfer
benchmark until `meridian agent serve` is on main: the real store, admission,
AgentService and TransferService behind the real server factory, with the applied
policy read from a JSON file instead of etcd (so no etcd is needed).

    python tests/transfer/agent_main.py --root DIR --region R --policy FILE

The policy file: {"regions": {name: jurisdiction}, "links": [[a, b, rtt_s]],
"placements": [Placement.as_json(), ...]}. It prints `serving <port>` once it serves
and stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from datetime import UTC, datetime
from pathlib import Path

from agents.admission import Admission
from agents.metrics import AgentMetrics
from agents.service.server import start_server
from agents.service.servicer import AgentService
from agents.store import ObjectStore
from agents.transfer.service import TransferService
from controlplane.coordination.protocols.fencing import FencedResource
from controlplane.domain.hlc import HybridClock
from controlplane.domain.placement import Placement
from controlplane.policy.current import CompiledPolicy, Link


class _FixedPolicy:
    def __init__(self, policy: CompiledPolicy) -> None:
        self.current = policy

    def require(self) -> CompiledPolicy:
        return self.current


class _NoOwners:
    async def owner(self, dataset: str) -> None:
        return None

    def known(self, dataset: str) -> None:
        return None


def load_policy(path: Path) -> CompiledPolicy:
    doc = json.loads(path.read_text())
    links = {
        frozenset((a, b)): Link(frozenset((a, b)), float(rtt), None) for a, b, rtt in doc["links"]
    }
    placements = [Placement.from_json(p) for p in doc["placements"]]
    return CompiledPolicy(
        digest="file",
        revision=1,
        applied_at=datetime.now(UTC),
        regions=doc["regions"],
        links=links,
        placements={p.dataset: p for p in placements},
        rules={},
    )


async def serve(args: argparse.Namespace) -> None:
    policy = load_policy(Path(args.policy))
    store = ObjectStore(args.root, clock=HybridClock(args.region))
    metrics = AgentMetrics(args.region, f"{args.region}-1")
    admission = Admission(args.region, _FixedPolicy(policy), FencedResource(), _NoOwners(), metrics)
    transfers = TransferService(
        store, admission, args.region, metrics, None, lambda: policy, threads=args.threads
    )
    service = AgentService(store, admission, args.region, f"{args.region}-1", metrics, transfers)
    server, port = await start_server(service, args.listen)
    print(f"serving {port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(grace=1)
    store.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--region", required=True)
    parser.add_argument("--policy", required=True)
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--threads", type=int, default=2)
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
