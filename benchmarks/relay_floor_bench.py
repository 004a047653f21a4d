"""The floor under issue 13's throughput row: the same shape with nothing of Meridian in it.

    python benchmarks/relay_floor_bench.py                 # 10 s of 32 writers
    python benchmarks/relay_floor_bench.py --seconds 5 --in-flight 4

Three Python gRPC aio processes as the critical bench runs them: 32 writers in one
process send 1 KiB unary calls to an "owner" beside them; the owner hands each one to
a lane per "replica" (two), which sends whatever is queued in one unary call as soon as
one of its `--in-flight` call slots is free, through a Toxiproxy proxy adding half of
`--rtt-ms` each way, and answers the writer once the first replica has answered (2 of
3, as `ack: quorum`). The replicas answer at once: no store, no etcd, no fence, no
records. What it prints is what the language and gRPC alone cost on this machine for
that traffic, so the real bench's figures can be read against it: acked writes/s, each
process's CPU per write, and the machine's ceiling on its cores at that CPU.

`--duties` adds the least a durable, fenced ack needs, and nothing more: the owner
commits each write to SQLite (WAL, synchronous=FULL, group commit in one thread) while
it is pushed, and acks once both are done; a replica reads the owner key from etcd
(shared by the calls that arrive while one read is under way, as the agents do), then
commits the call's versions the same way, then answers.

Needs Toxiproxy (`meridian stack up`) on MERIDIAN_STACK_TOXIPROXY_PORT, and etcd with
`--duties`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.adapters.toxiproxy import ToxiproxyClient
from controlplane.loopback import free_port
from controlplane.ports.coordination import Get
from controlplane.settings import load_settings

PUT, PUSH = "/floor.Floor/Put", "/floor.Floor/Push"


def handlers(methods: dict[str, object]) -> grpc.GenericRpcHandler:
    """Raw-bytes unary handlers: no protobuf, so the floor has no codec cost either."""
    return grpc.method_handlers_generic_handler(
        "floor.Floor",
        {name: grpc.unary_unary_rpc_method_handler(fn) for name, fn in methods.items()},  # type: ignore[arg-type]
    )


async def serve(port: int, methods: dict[str, object]) -> None:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([handlers(methods)])
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


class GroupCommit:
    """Rows committed durably to SQLite by one thread, all that wait in each transaction."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute("CREATE TABLE v (id INTEGER PRIMARY KEY, data BLOB)")
        self.waiting: list[tuple[list[bytes], asyncio.Future[None]]] = []
        self.busy = False

    def commit(self, rows: list[bytes]) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append((rows, done))
        if not self.busy:
            self.busy = True
            asyncio.get_running_loop().create_task(self.run())
        return done

    def write(self, rows: list[bytes]) -> None:
        self.conn.execute("BEGIN")
        self.conn.executemany("INSERT INTO v (data) VALUES (?)", [(r,) for r in rows])
        self.conn.execute("COMMIT")

    async def run(self) -> None:
        while self.waiting:
            group, self.waiting = self.waiting, []
            await asyncio.to_thread(self.write, [row for rows, _ in group for row in rows])
            for _, done in group:
                done.set_result(None)
        self.busy = False


class SharedRead:
    """One etcd read of the owner key at a time; callers arriving meanwhile share the next."""

    def __init__(self, etcd: EtcdCoordination) -> None:
        self.etcd = etcd
        self.next: asyncio.Future[None] | None = None
        self.running = False

    async def fresh(self) -> None:
        if self.next is None:
            self.next = asyncio.get_running_loop().create_future()
            if not self.running:
                asyncio.get_running_loop().create_task(self.run())
        await asyncio.shield(self.next)

    async def run(self) -> None:
        self.running = True
        while self.next is not None:
            waiting, self.next = self.next, None
            await self.etcd.txn([], [Get("/meridian-floor/owner"), Get("/meridian-floor/mark")])
            waiting.set_result(None)
        self.running = False


def unpack(body: bytes) -> list[bytes]:
    (count,), at, rows = struct.unpack_from("!I", body), 4, []
    for _ in range(count):
        (size,) = struct.unpack_from("!I", body, at)
        rows.append(body[at + 4 : at + 4 + size])
        at += 4 + size
    return rows


async def replica(port: int, etcd: str, folder: str) -> None:
    store = GroupCommit(Path(folder) / "store.db") if folder else None
    reads = None
    if etcd:
        coord = EtcdCoordination([etcd])
        await coord.connect()
        reads = SharedRead(coord)

    async def push(request: bytes, context: object) -> bytes:
        rows = unpack(request)
        if reads is not None:
            await reads.fresh()
        if store is not None:
            await store.commit(rows)
        return struct.pack("!I", len(rows))

    await serve(port, {"Push": push})


class Lane:
    """Pushes to one replica: at most `in_flight` calls, each taking all that waits."""

    def __init__(self, channel: grpc.aio.Channel, in_flight: int) -> None:
        self.call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(PUSH)
        self.free = in_flight
        self.waiting: list[tuple[bytes, asyncio.Future[None]]] = []
        self.calls = 0

    def push(self, data: bytes) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append((data, done))
        if self.free:
            self.free -= 1
            asyncio.get_running_loop().create_task(self.send())
        return done

    async def send(self) -> None:
        while self.waiting:
            batch, self.waiting = self.waiting, []
            body = struct.pack("!I", len(batch)) + b"".join(
                struct.pack("!I", len(data)) + data for data, _ in batch
            )
            self.calls += 1
            await self.call(body, timeout=10)
            for _, done in batch:
                if not done.done():
                    done.set_result(None)
        self.free += 1


async def owner(port: int, replicas: list[str], in_flight: int, folder: str) -> None:
    lanes = [Lane(grpc.aio.insecure_channel(address), in_flight) for address in replicas]
    store = GroupCommit(Path(folder) / "store.db") if folder else None

    async def put(request: bytes, context: object) -> bytes:
        local = store.commit([request]) if store is not None else None
        pushes = [lane.push(request) for lane in lanes]
        await asyncio.wait(pushes, return_when=asyncio.FIRST_COMPLETED)
        if local is not None:
            await local  # committed while the pushes were under way
        return b"ok"

    await serve(port, {"Put": put})


async def writers(address: str, count: int, seconds: float) -> tuple[int, list[float]]:
    """`count` writers, each one acked 1 KiB write at a time, for `seconds`."""
    channel = grpc.aio.insecure_channel(address)
    put: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(PUT)
    data = os.urandom(1024)
    await put(data, timeout=10)
    waits: list[float] = []
    end = time.monotonic() + seconds

    async def one() -> None:
        while (now := time.monotonic()) < end:
            await put(data, timeout=10)
            waits.append(time.monotonic() - now)

    await asyncio.gather(*(one() for _ in range(count)))
    await channel.close()
    return len(waits), waits


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(role: str, *argv: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--role", role, *argv], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise SystemExit(f"the {role} did not start")
    return proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=["bench", "owner", "replica"], default="bench")
    parser.add_argument("--port", type=int)
    parser.add_argument("--replicas", default="")
    parser.add_argument("--in-flight", type=int, default=2)
    parser.add_argument("--rtt-ms", type=int, default=20)
    parser.add_argument("--writers", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--duties", action="store_true", help="durable commits, owner reads")
    parser.add_argument("--etcd", default="", help=argparse.SUPPRESS)
    parser.add_argument("--folder", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "replica":
        asyncio.run(replica(args.port, args.etcd, args.folder))
        return
    if args.role == "owner":
        asyncio.run(owner(args.port, args.replicas.split(","), args.in_flight, args.folder))
        return
    settings = load_settings()
    tmp = tempfile.TemporaryDirectory(prefix="relay-floor-")
    duties: dict[str, list[str]] = {}
    for name in ("replica-1", "replica-2", "owner"):
        folder = Path(tmp.name) / name
        folder.mkdir()
        duties[name] = ["--folder", str(folder)] if args.duties else []
    if args.duties:
        for name in ("replica-1", "replica-2"):
            duties[name] += ["--etcd", f"127.0.0.1:{settings.stack_etcd_port}"]
    toxi = ToxiproxyClient(f"http://127.0.0.1:{settings.stack_toxiproxy_port}", timeout_s=5)
    procs: dict[str, subprocess.Popen[str]] = {}
    proxies: list[str] = []
    try:
        routes = []
        for name in ("replica-1", "replica-2"):
            port = free_port()
            procs[name] = start("replica", "--port", str(port), *duties[name])
            proxy, front = f"relay-floor-{name}-{os.getpid()}", free_port()
            toxi.create_proxy(proxy, f"127.0.0.1:{front}", f"127.0.0.1:{port}")
            toxi.add_latency(proxy, args.rtt_ms // 2)
            proxies.append(proxy)
            routes.append(f"127.0.0.1:{front}")
        port = free_port()
        procs["owner"] = start(
            "owner",
            "--port",
            str(port),
            "--replicas",
            ",".join(routes),
            "--in-flight",
            str(args.in_flight),
            *duties["owner"],
        )
        before = {name: cpu_s(p.pid) for name, p in procs.items()}
        me, wall = time.process_time(), time.monotonic()
        acked, waits = asyncio.run(writers(f"127.0.0.1:{port}", args.writers, args.seconds))
        wall = time.monotonic() - wall
        used = {name: cpu_s(p.pid) - before[name] for name, p in procs.items()}
        used["writers"] = time.process_time() - me
    finally:
        for proxy in proxies:
            toxi.delete_proxy(proxy)
        for proc in procs.values():
            proc.terminate()
            proc.wait(timeout=10)
        tmp.cleanup()
    rate = acked / wall
    waits.sort()
    per = {name: 1000 * s / acked for name, s in used.items()}
    machine = sum(per.values())
    print(
        f"relay floor: {args.writers} writers, 1 KiB, {args.rtt_ms} ms RTT through Toxiproxy, "
        f"{args.in_flight} calls in flight per replica, ack on the first of two replicas; "
        + (
            "durable commits on all three, a fresh etcd read per replica call"
            if args.duties
            else "no duties"
        )
    )
    print(f"acked writes/s: {rate:.0f} ({acked} in {wall:.1f} s)")
    p50, p99 = waits[len(waits) // 2], waits[len(waits) * 99 // 100]
    print(
        f"a writer's wait: mean {1000 * sum(waits) / len(waits):.1f} ms, "
        f"p50 {1000 * p50:.1f} ms, p99 {1000 * p99:.1f} ms"
    )
    print(
        "CPU per acked write: "
        + ", ".join(f"{name} {ms:.2f} ms" for name, ms in per.items())
        + f"; these processes {machine:.2f} ms (Toxiproxy not counted): "
        + f"their ceiling on {os.cpu_count()} cores {1000 * (os.cpu_count() or 1) / machine:.0f} /s"
    )


if __name__ == "__main__":
    main()
