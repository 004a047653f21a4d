"""Transfers between two agents against rsync (issue 10, *Benchmark*), one table with
ratios in one run:

    python benchmarks/transfer_bench.py            # the issue's sizes (1 GiB, 10,000 files)
    python benchmarks/transfer_bench.py --quick    # a smoke run (CI, a test)
    python benchmarks/transfer_bench.py --only files   # one workload (repeatable)

Two agent processes (tests/transfer/agent_main.py: the real store, admission,
servicer and transfers) on loopback, and the same pair through a Toxiproxy link with
a 40 ms round trip (20 ms each way) and a 12,500 KB/s bandwidth toxic. The peer is
`rsync` in daemon mode through an identical link (`rsync://`, `--no-whole-file`),
with and without `-z`, the best of the two. The floor of the no-basis case is a
plain TCP copy into a fresh file with fsync, measured in the same run.

Workloads:
- checkpoint: a new version of a file, 2% of it rewritten in scattered 64 KiB runs,
  over the old one the receiver holds; through the link;
- no basis: a file new to the receiver, loopback without toxics (received,
  verified, fsynced, committed), against the TCP floor;
- files: 4 KiB files new to the receiver, through the link (FetchMany: bundles);
- cut: a Sync cut at 50% (a `limit_data` toxic) and resumed; bytes sent in total
  against an uncut transfer.
Wire bytes are the payload bytes the agents count (delta, content and signature
bytes); rsync's are its own `--stats` totals (sent + received). For the small files,
the bytes that crossed the link both ways (requests, framing, gRPC and HTTP/2
included) are read from Toxiproxy's own counter (/proc/PID/io of the stack's
Toxiproxy), for both. The files go in FetchMany calls as large as the request cap
allows (768 KiB: three calls of 3,334). rsync does not fsync what it writes; the agents
do.

Needs the stack's Toxiproxy (`meridian stack up`; MERIDIAN_STACK_TOXIPROXY_PORT) and
rsync. Peak RSS of each agent is read from /proc (VmHWM) when it stops.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests" / "transfer"), str(HERE.parent / "tests")]

import grpc  # noqa: E402
from agent_proc import AgentProc, write_policy  # noqa: E402
from blake3 import blake3  # noqa: E402

from agents.store import ObjectStore  # noqa: E402
from agents.transfer.pull import CHANNEL_OPTIONS  # noqa: E402
from controlplane.adapters.toxiproxy import ToxiproxyClient  # noqa: E402
from controlplane.domain.hlc import HybridClock  # noqa: E402
from controlplane.domain.placement import Placement  # noqa: E402
from controlplane.domain.version import Version  # noqa: E402
from controlplane.loopback import free_port  # noqa: E402
from controlplane.settings import load_settings  # noqa: E402
from meridian.convert import version_to_wire  # noqa: E402
from meridian.v1 import agent_pb2, agent_pb2_grpc  # noqa: E402

REGIONS = {"eu-west": "EU", "eu-central": "EU"}
LATENCY_MS = 20  # each way: a 40 ms round trip
BANDWIDTH_KB_S = 12_500
# A FetchMany request's size: under the agent's 1 MiB + 64 KiB message cap, with room.
FETCH_MANY_BYTES = 768 << 10


@dataclass(frozen=True)
class Sizes:
    checkpoint: int
    fresh: int
    files: int
    cut: int


FULL = Sizes(checkpoint=1 << 30, fresh=1 << 30, files=10_000, cut=1 << 30)
QUICK = Sizes(checkpoint=32 << 20, fresh=32 << 20, files=300, cut=32 << 20)


def random_bytes(size: int, seed: bytes) -> bytes:
    """Deterministic bytes that neither compress nor repeat (blake3's XOF: GB/s)."""
    return blake3(seed).digest(length=size)


def rewrite(data: bytes, fraction: float, seed: int = 2, run: int = 64 << 10) -> bytes:
    rng = random.Random(seed)
    out = bytearray(data)
    for _ in range(max(1, int(len(data) * fraction / run))):
        at = rng.randrange(0, max(1, len(data) - run))
        out[at : at + run] = rng.randbytes(run)
    return bytes(out)


def cpu_seconds(pid: int, *, children: bool = False) -> float:
    """User + system CPU time of a process (with `children`: of its reaped children,
    e.g. the rsync daemon's per-connection workers), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # after the command: state is field 3, so utime/stime are 14/15, cutime/cstime 16/17
    first = 13 if children else 11
    ticks = int(fields[first]) + int(fields[first + 1])
    return ticks / os.sysconf("SC_CLK_TCK")


def own_children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def proxy_pid(port: int) -> int | None:
    """The process listening on `port` (the stack's Toxiproxy), from `ss`; None if it
    cannot be told (another user's process, no `ss`)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["ss", "-ltnpH", f"sport = :{port}"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout
        found = re.search(r"pid=(\d+)", out)
        if found:
            return int(found.group(1))
    return None


def forwarded(pid: int | None) -> int:
    """Bytes the proxy process has written so far (/proc/PID/io wchar): each byte it
    forwards, either way, is written once, so a delta is what crossed the link both
    ways, framing included."""
    if pid is None:
        return 0
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("wchar:"):
                return int(line.split()[1])
    return 0


def timed(fn: Callable[[], object]) -> float:
    begin = time.monotonic()
    fn()
    return time.monotonic() - begin


# -- the peers -------------------------------------------------------------------------


def rsync_daemon(src: Path, work: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    conf = work / "rsyncd.conf"
    conf.write_text(
        f"use chroot = false\nuid = root\ngid = root\npid file = {work}/rsyncd.pid\n"
        f"[bench]\npath = {src}\nread only = true\n"
    )
    proc = subprocess.Popen(
        [
            "rsync",
            "--daemon",
            "--no-detach",
            f"--config={conf}",
            f"--port={port}",
            "--address=127.0.0.1",
        ],
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, port
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("rsync --daemon did not start")


def rsync(
    url: str, dest: Path, *, compress: bool, proxy: int | None = None
) -> tuple[float, int, int]:
    """(seconds, rsync's --stats total, bytes the proxy forwarded)."""
    args = ["rsync", "-a", "--no-whole-file", "--stats", url, str(dest)]
    if compress:
        args.insert(2, "-z")
    link0 = forwarded(proxy)
    begin = time.monotonic()
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    elapsed = time.monotonic() - begin
    link = forwarded(proxy) - link0
    sent = int(re.search(r"Total bytes sent: ([\d,]+)", out).group(1).replace(",", ""))  # type: ignore[union-attr]
    got = int(re.search(r"Total bytes received: ([\d,]+)", out).group(1).replace(",", ""))  # type: ignore[union-attr]
    return elapsed, sent + got, link


def best_rsync(
    url: str, dest: Path, reset: Callable[[], None], proxy: int | None = None
) -> tuple[float, int, str, int]:
    """The faster of plain and -z: (seconds, --stats bytes, mode, proxy bytes)."""
    runs = []
    for compress in (False, True):
        reset()
        elapsed, wire, link = rsync(url, dest, compress=compress, proxy=proxy)
        runs.append((elapsed, wire, "-z" if compress else "plain", link))
    return min(runs)


def tcp_floor(src: Path, dest: Path) -> float:
    """A plain TCP copy of `src` into a fresh file with fsync: the disk's floor."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def send() -> None:
        conn, _ = server.accept()
        with conn, open(src, "rb") as f:
            conn.sendfile(f)
        server.close()

    sender = threading.Thread(target=send)
    sender.start()
    begin = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as conn, open(dest, "wb") as out:
        while chunk := conn.recv(1 << 20):
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    elapsed = time.monotonic() - begin
    sender.join()
    return elapsed


def store_floor(root: Path, names: list[str], versions: list[Version]) -> float:
    """The receiver's store alone: apply_many of the small files into a fresh store in
    the bundle receiver's batches (no network, no gRPC)."""
    from agents.transfer.bundle import BATCH_ITEMS

    contents = [random_bytes(4096, k.encode()) for k in names]
    with ObjectStore(root, clock=HybridClock("eu-central")) as store:
        begin = time.monotonic()
        for n in range(0, len(names), BATCH_ITEMS):
            store.apply_many(
                [
                    ("files", k, v, [data])
                    for k, v, data in zip(
                        names[n : n + BATCH_ITEMS],
                        versions[n : n + BATCH_ITEMS],
                        contents[n : n + BATCH_ITEMS],
                        strict=True,
                    )
                ]
            )
        return time.monotonic() - begin


# -- the agents ------------------------------------------------------------------------


async def fetch(
    address: str, dataset: str, key: str, version: Version, source: str
) -> agent_pb2.FetchResponse:
    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        request = agent_pb2.FetchRequest(
            dataset=dataset,
            key=key,
            version=version_to_wire(version),
            sources=[agent_pb2.FetchSource(region="eu-west", address=source)],
        )
        response: agent_pb2.FetchResponse = await agent_pb2_grpc.AgentStub(channel).Fetch(
            request, timeout=1800
        )
        return response


async def fetch_many(
    address: str, items: list[tuple[str, Version]], source: str, dataset: str = "files"
) -> None:
    async def one(request: agent_pb2.FetchManyRequest) -> None:
        async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
            got = await agent_pb2_grpc.AgentStub(channel).FetchMany(request, timeout=1800)
            bad = [e for e in got.errors if e]
            if bad:
                raise RuntimeError(f"FetchMany failed {len(bad)} items: {bad[0]}")

    def request(part: list[tuple[str, Version]]) -> agent_pb2.FetchManyRequest:
        out = agent_pb2.FetchManyRequest()
        for k, v in part:
            item = out.items.add(dataset=dataset, key=k, version=version_to_wire(v))
            item.sources.add(region="eu-west", address=source)
        return out

    # As few calls as the request cap allows, of even sizes (each call's bundles are
    # streams of their own on the link, and every stream's end waits for its last
    # batch's commit); each call leaves once built, while the next one is built.
    item_bytes = request(items[:1]).ByteSize() + 8 if items else 1
    count = max(1, -(-len(items) * item_bytes // FETCH_MANY_BYTES))
    step = -(-len(items) // count)
    calls: list[asyncio.Task[None]] = []
    for n in range(0, len(items), step):
        calls.append(asyncio.ensure_future(one(request(items[n : n + step]))))
        await asyncio.sleep(0)  # it leaves while the next one is built
    await asyncio.gather(*calls)


WORKLOADS = ("checkpoint", "fresh", "files", "cut")


def run(
    sizes: Sizes, work: Path, only: frozenset[str] = frozenset(WORKLOADS)
) -> list[tuple[str, str, str, str, str]]:
    settings = load_settings()
    toxi = ToxiproxyClient(f"http://127.0.0.1:{settings.stack_toxiproxy_port}")
    print("preparing content...", flush=True)
    placements = [
        Placement(
            dataset=d,
            policy="bench",
            dataset_class="standard",
            home="eu-west",
            replicas=("eu-central",),
            residency=("EU",),
            rpo_s=60.0,
            failover_mode="manual",
            failover_order=(),
            # The small files ride several bundle streams at once, each its own TCP
            # connection, and Toxiproxy caps each connection on its own: the agents'
            # per-link cap (shared by every transfer on the link) holds them to the
            # link's bandwidth, as rsync's one connection is.
            transfer_bandwidth_bps=BANDWIDTH_KB_S * 1000.0 if d == "files" else None,
        )
        for d in ("ckpt", "files", "files-lo")
    ]
    policy = write_policy(
        work / "policy.json", REGIONS, placements, [("eu-west", "eu-central", 0.04)]
    )
    a_root, b_root = work / "a", work / "b"
    src, dst = work / "rsync-src", work / "rsync-dst"
    (src / "files").mkdir(parents=True)
    dst.mkdir()
    # One content at a time (1 GiB each at the full size), written where it is needed.
    # Workloads left out of the run get empty content (cheap to prepare).
    ckpt_size = sizes.checkpoint if "checkpoint" in only else 0
    fresh_size = sizes.fresh if "fresh" in only else 0
    cut_size = sizes.cut if "cut" in only else 0
    file_count = sizes.files if "files" in only else 0
    with (
        ObjectStore(a_root, clock=HybridClock("eu-west")) as a,
        ObjectStore(b_root, clock=HybridClock("eu-central")) as b,
    ):
        old = random_bytes(ckpt_size, b"old")
        v_old = a.put("ckpt", "ckpt.bin", [old])
        b.apply("ckpt", "ckpt.bin", v_old, [old])
        (work / "old.bin").write_bytes(old)
        new = rewrite(old, 0.02)
        del old
        v_new = a.put("ckpt", "ckpt.bin", [new])
        (src / "ckpt.bin").write_bytes(new)
        del new
        fresh = random_bytes(fresh_size, b"fresh")
        v_fresh = a.put("ckpt", "fresh.bin", [fresh])
        (work / "fresh.bin").write_bytes(fresh)
        del fresh
        cut = random_bytes(cut_size, b"cut")
        v_cut = a.put("ckpt", "cut.bin", [cut])
        v_cut_ref = a.put("ckpt", "cut-ref.bin", [cut])
        del cut
        names = [f"f{n:05d}.bin" for n in range(file_count)]
        v_small: list[Version] = []
        v_small_lo: list[Version] = []
        for n in range(0, len(names), 1000):
            part = {k: random_bytes(4096, k.encode()) for k in names[n : n + 1000]}
            v_small += a.put_many([("files", k, [data]) for k, data in part.items()])
            v_small_lo += a.put_many([("files-lo", k, [data]) for k, data in part.items()])
            for k, data in part.items():
                (src / "files" / k).write_bytes(data)

    # The content just written is still dirty in the page cache: flushed now, so the
    # first measured commit's syncfs does not pay for the preparation's writes (about
    # 0.4 s on the first batches of the small files, which rsync, not syncing, never
    # pays).
    os.sync()
    agent_a = AgentProc(a_root, "eu-west", policy, work / "a.log").start()
    agent_b = AgentProc(b_root, "eu-central", policy, work / "b.log").start()
    daemon, rsync_port = rsync_daemon(src, work)
    link, rlink, cutlink = (
        f"127.0.0.1:{free_port()}",
        f"127.0.0.1:{free_port()}",
        f"127.0.0.1:{free_port()}",
    )
    rows: list[tuple[str, str, str, str, str]] = []
    try:
        for name, listen, upstream in (
            ("xb-link", link, agent_a.address),
            ("xb-rsync", rlink, f"127.0.0.1:{rsync_port}"),
        ):
            toxi.create_proxy(name, listen, upstream)
            toxi.add_latency(name, LATENCY_MS)
            toxi.add_bandwidth(name, BANDWIDTH_KB_S)
        toxi.create_proxy("xb-cut", cutlink, agent_a.address)

        # 1. checkpoint, new over old, through the link
        if "checkpoint" in only:
            print("checkpoint: agents...", flush=True)
            begin = time.monotonic()
            got = asyncio.run(fetch(agent_b.address, "ckpt", "ckpt.bin", v_new, link))
            ours_t, ours_w = time.monotonic() - begin, got.wire_bytes
            print("checkpoint: rsync...", flush=True)
            rs_t, rs_w, rs_mode, _ = best_rsync(
                f"rsync://{rlink}/bench/ckpt.bin",
                dst / "ckpt.bin",
                lambda: shutil.copyfile(work / "old.bin", dst / "ckpt.bin"),
            )
            rows.append(
                (
                    "checkpoint 2% rewritten, over the old (link)",
                    "wall time",
                    f"{ours_t:.2f} s",
                    f"rsync {rs_mode} {rs_t:.2f} s",
                    f"{ours_t / rs_t:.2f}x (target <= 0.8x)",
                )
            )
            rows.append(
                (
                    "",
                    "wire bytes",
                    f"{ours_w:,}",
                    f"rsync {rs_w:,}",
                    f"{ours_w / rs_w:.2f}x (target <= 1x)",
                )
            )

        # 2. no basis, loopback
        if "fresh" in only:
            print("no basis: floor and agents...", flush=True)
            floor = tcp_floor(work / "fresh.bin", b_root / "tmp" / "floor.bin")
            (b_root / "tmp" / "floor.bin").unlink()
            begin = time.monotonic()
            asyncio.run(fetch(agent_b.address, "ckpt", "fresh.bin", v_fresh, agent_a.address))
            fresh_t = time.monotonic() - begin
            rows.append(
                (
                    "no basis, loopback",
                    "end to end",
                    f"{fresh_t:.2f} s",
                    f"TCP copy + fsync {floor:.2f} s",
                    f"{fresh_t / floor:.2f}x (target <= 1.4x)",
                )
            )

        # 3. small files through the link
        if "files" in only:
            print("files: agents...", flush=True)
            pids = [p.proc.pid for p in (agent_a, agent_b) if p.proc is not None]
            cpu0 = [cpu_seconds(pid) for pid in pids]
            proxy = proxy_pid(settings.stack_toxiproxy_port)
            link0 = forwarded(proxy)
            begin = time.monotonic()
            asyncio.run(fetch_many(agent_b.address, list(zip(names, v_small, strict=True)), link))
            files_t = time.monotonic() - begin
            files_link = forwarded(proxy) - link0
            send_cpu, recv_cpu = (cpu_seconds(pid) - c for pid, c in zip(pids, cpu0, strict=True))
            files_cpu = send_cpu + recv_cpu
            print("files: rsync...", flush=True)
            rcpu0 = own_children_cpu() + cpu_seconds(daemon.pid, children=True)
            rf_t, _, rf_mode, rf_link = best_rsync(
                f"rsync://{rlink}/bench/files/",
                dst / "files",
                lambda: shutil.rmtree(dst / "files", ignore_errors=True),
                proxy,
            )
            # both rsync runs (plain and -z), halved: a rough per-run figure
            rsync_cpu = (own_children_cpu() + cpu_seconds(daemon.pid, children=True) - rcpu0) / 2
            rows.append(
                (
                    f"{sizes.files:,} files of 4 KiB, new (link)",
                    "wall time",
                    f"{files_t:.2f} s",
                    f"rsync {rf_mode} {rf_t:.2f} s",
                    f"{files_t / rf_t:.2f}x (target <= 1x)",
                )
            )
            # Where the floor is: the same files over loopback (the agents' own cost,
            # no link), and the receiver's store alone (apply_many in batches, in
            # process: staging, syncfs, SQLite), against the same rsync run.
            print("files: agents over loopback...", flush=True)
            begin = time.monotonic()
            asyncio.run(
                fetch_many(
                    agent_b.address,
                    list(zip(names, v_small_lo, strict=True)),
                    agent_a.address,
                    "files-lo",
                )
            )
            lo_t = time.monotonic() - begin
            store_t = store_floor(work / "floor-store", names, v_small)
            rows.append(
                (
                    "",
                    "CPU s (sender + receiver)",
                    f"{send_cpu:.2f} + {recv_cpu:.2f} s",
                    f"rsync ~{rsync_cpu:.2f} s",
                    f"{files_cpu / max(rsync_cpu, 0.01):.2f}x",
                )
            )
            if proxy is not None and rf_link:
                # What crossed the link both ways (Toxiproxy's writes), framing and
                # requests included, and per file beyond the files' own 4 KiB.
                extra = 4096 * sizes.files
                rows.append(
                    (
                        "",
                        "link bytes (both ways)",
                        f"{files_link:,} ({(files_link - extra) / sizes.files:.0f} B/file over)",
                        f"rsync {rf_link:,} ({(rf_link - extra) / sizes.files:.0f} B/file)",
                        f"{files_link / rf_link:.3f}x",
                    )
                )
            rows.append(
                ("", "agents, loopback", f"{lo_t:.2f} s", "", f"{lo_t / rf_t:.2f}x of rsync")
            )
            rows.append(
                (
                    "",
                    "receiver's store alone",
                    f"{store_t:.2f} s",
                    "",
                    f"{store_t / rf_t:.2f}x of rsync",
                )
            )

        # 4. a Sync cut at 50% and resumed
        if "cut" in only:
            print("cut and resume...", flush=True)
            uncut = asyncio.run(
                fetch(agent_b.address, "ckpt", "cut-ref.bin", v_cut_ref, cutlink)
            ).wire_bytes
            toxi.add_limit_data("xb-cut", uncut // 2)
            try:
                asyncio.run(fetch(agent_b.address, "ckpt", "cut.bin", v_cut, cutlink))
                raise RuntimeError("the cut transfer was not cut")
            except grpc.aio.AioRpcError:
                pass
            toxi.remove_toxics("xb-cut")
            resumed = asyncio.run(
                fetch(agent_b.address, "ckpt", "cut.bin", v_cut, cutlink)
            ).wire_bytes
            agent_b.stop()
            with ObjectStore(b_root, clock=HybridClock("eu-central")) as b:
                records = [
                    e.data
                    for e in b.journal_pending(100_000)
                    if e.kind == "transfer" and e.hlc == v_cut.hlc.text
                ]
            first = sum(int(r["wire_bytes"]) for r in records if r["outcome"] == "failed")  # type: ignore[call-overload]
            total = first + resumed
            rows.append(
                (
                    "Sync cut at 50%, resumed",
                    "bytes sent in total",
                    f"{total:,}",
                    f"uncut {uncut:,}",
                    f"{total / uncut:.3f}x (target <= 1.1x)",
                )
            )
    finally:
        for name in ("xb-link", "xb-rsync", "xb-cut"):
            with contextlib.suppress(Exception):  # best effort in cleanup
                toxi.delete_proxy(name)
        daemon.kill()
        daemon.wait()
        agent_a.stop()
        agent_b.stop()
    rows.append(("peak RSS", "sender agent", f"{agent_a.peak_rss_kib / 1024:.0f} MiB", "", ""))
    rows.append(("", "receiver agent", f"{agent_b.peak_rss_kib / 1024:.0f} MiB", "", ""))
    return rows


def print_table(rows: list[tuple[str, str, str, str, str]], sizes: Sizes) -> None:
    print(
        f"\ntransfer benchmark: checkpoint {sizes.checkpoint >> 20} MiB, no-basis "
        f"{sizes.fresh >> 20} MiB, {sizes.files} files, cut {sizes.cut >> 20} MiB; link "
        f"{2 * LATENCY_MS} ms RTT, {BANDWIDTH_KB_S:,} KB/s"
    )
    header = ("workload", "measure", "agents", "peer", "ratio")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(5)]
    for row in [header, *rows]:
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--work", type=Path, help="scratch folder (default: a temporary one)")
    parser.add_argument(
        "--only",
        choices=WORKLOADS,
        action="append",
        help="run only this workload (repeatable; default: all)",
    )
    args = parser.parse_args()
    if shutil.which("rsync") is None:
        raise SystemExit("rsync is not installed (apt-get install rsync)")
    sizes = QUICK if args.quick else FULL
    base = args.work or Path(tempfile.mkdtemp(prefix="transfer-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=base))
    try:
        rows = run(sizes, work, frozenset(args.only or WORKLOADS))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(rows, sizes)


if __name__ == "__main__":
    main()
