"""Acked critical writes over a WAN (issue 13), the issue's table:

    python benchmarks/critical_bench.py            # the table (a few minutes)
    python benchmarks/critical_bench.py --quick    # a smoke run

Three real agent processes of the critical world of tests/critical/critical_helpers.py
(eu-west the owner of `tri/*`: replicas eu-central and eu-north, `ack: quorum` = 2 of
3), on the stack's etcd. The owner reaches each replica through a Toxiproxy proxy
adding half the round trip each way (`--rtt-ms`, default 20; MERIDIAN_AGENT_ROUTES);
the client is beside the owner and keeps one connection (as a real writer would).

Measures, against the issue's targets:

* acked latency of 1 KiB Puts, one at a time: p50 <= 1 RTT + 10 ms, p99 <= 2 RTT + 20 ms;
* a 16 MiB new version over the previous one (0.4 % of it changed: pushed as a delta)
  against an unreplicated local write of 16 MiB (a standard dataset on the same agent,
  acked after its local commit) plus one round trip: ratio <= 1.5;
* throughput of 1 KiB Puts from 32 concurrent writers: >= 1,000 acked writes/s.

The throughput row is also compared, in the same run, with its floor on this machine:
`relay_floor_bench.py --duties` (the same writers, RTT, ack rule and calls in flight,
fsynced commits and a fresh etcd read per replica call, but nothing of Meridian), run
after the agents stopped (`--no-floor` skips it; --quick does unless `--floor`). The
floor's rate moves with the machine; our share of it is what a change moves.

Needs the stack (`meridian stack up`): etcd and Toxiproxy on the MERIDIAN_STACK_* ports.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from prometheus_client.parser import text_string_to_metric_families

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests" / "critical"), str(HERE.parent / "tests")]

from critical_helpers import prepare_critical_world  # noqa: E402
from harness.agent_fixtures import clear_keyspace  # noqa: E402
from harness.agent_process import AgentProcess  # noqa: E402

from agents.client import SMALL_BYTES  # noqa: E402
from agents.replication.push_lanes import IN_FLIGHT  # noqa: E402
from controlplane.adapters.etcd import EtcdCoordination  # noqa: E402
from controlplane.adapters.toxiproxy import ToxiproxyClient  # noqa: E402
from controlplane.coordination.protocols.ownership import Ownership  # noqa: E402
from controlplane.loopback import free_port  # noqa: E402
from controlplane.settings import load_settings  # noqa: E402
from meridian.v1 import agent_pb2, agent_pb2_grpc  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
CHUNK = MiB


async def claim_all(etcd: str, datasets: list[str]) -> None:
    coord = EtcdCoordination([etcd], timeout_s=5.0)
    await coord.connect()
    try:
        own = Ownership(coord)
        for ds in datasets:
            await own.claim(ds, "eu-west", expect_epoch=0, reason="home", actor="bench")
    finally:
        await coord.close()


async def put(
    stub: agent_pb2_grpc.AgentAsyncStub, dataset: str, key: str, data: bytes
) -> agent_pb2.PutResponse:
    """As `AgentClient.put` sends it: a small object in one PutSmall call, a large one
    in a Put stream of 1 MiB chunks."""
    if len(data) <= SMALL_BYTES:
        header = agent_pb2.PutHeader(dataset=dataset, key=key)
        return await stub.PutSmall(agent_pb2.PutSmallRequest(header=header, data=data), timeout=120)

    async def frames() -> AsyncIterator[agent_pb2.PutRequest]:
        yield agent_pb2.PutRequest(header=agent_pb2.PutHeader(dataset=dataset, key=key))
        for at in range(0, len(data), CHUNK):
            yield agent_pb2.PutRequest(chunk=data[at : at + CHUNK])
        yield agent_pb2.PutRequest(end=agent_pb2.PutEnd())

    return await stub.Put(frames(), timeout=120)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def small_latency(
    stub: agent_pb2_grpc.AgentAsyncStub, dataset: str, runs: int
) -> list[float]:
    data = os.urandom(KiB)
    for n in range(10):  # warm the owner's channels to its replicas
        await put(stub, dataset, f"warm-{n}", data)
    out = []
    for n in range(runs):
        started = time.perf_counter()
        await put(stub, dataset, f"k-{n % 50}", data)
        out.append(time.perf_counter() - started)
    return out


def next_version(data: bytes, step: int) -> bytes:
    """16 MiB with 64 KiB rewritten at a place that moves each step."""
    at = (step * 1_234_567) % (len(data) - 64 * KiB)
    return data[:at] + os.urandom(64 * KiB) + data[at + 64 * KiB :]


async def big_versions(stub: agent_pb2_grpc.AgentAsyncStub, dataset: str, runs: int) -> list[float]:
    data = os.urandom(16 * MiB)
    await put(stub, dataset, "big", data)  # the first version: pushed whole
    out = []
    for step in range(runs):
        data = next_version(data, step)
        started = time.perf_counter()
        await put(stub, dataset, "big", data)
        out.append(time.perf_counter() - started)
    return out


async def throughput(
    stub: agent_pb2_grpc.AgentAsyncStub,
    dataset: str,
    writers: int,
    seconds: float,
    rate: float | None = None,
) -> tuple[float, int, int, float]:
    """Acked writes/s of `writers` concurrent writers of 1 KiB for `seconds`; also the
    acked and refused counts, and the mean time a writer waited for an ack. With
    `rate`, the writers together start at most `rate` writes a second (each on its own
    schedule; one behind it goes at once): an offered load below saturation, at which
    the CPU per acked write of two builds compares without the noise of a saturated
    machine."""
    data = os.urandom(KiB)
    acked = refused = 0
    waited = 0.0
    begun = time.monotonic()
    until = begun + seconds

    async def writer(w: int) -> None:
        nonlocal acked, refused, waited
        for n in range(1_000_000):  # bounded by the clock below
            if rate is not None:
                due = begun + (n * writers + w) / rate
                if due > time.monotonic():
                    await asyncio.sleep(due - time.monotonic())
            if time.monotonic() >= until:
                return
            started = time.perf_counter()
            try:
                await put(stub, dataset, f"w{w}-{n % 100}", data)
                acked += 1
                waited += time.perf_counter() - started
            except grpc.aio.AioRpcError:
                refused += 1

    started = time.monotonic()
    await asyncio.gather(*(writer(w) for w in range(writers)))
    return acked / (time.monotonic() - started), acked, refused, waited / max(acked, 1)


# The agents' own timings (their metrics' histograms, sums and counts): where an acked
# write's time goes under load, as means.
TIMINGS = {
    "owner": ("meridian_agent_request_seconds", {"call": "PutSmall"}),
    "queued": ("meridian_critical_push_seconds", {"stage": "queued"}),
    "call": ("meridian_critical_push_seconds", {"stage": "call"}),
    "items": ("meridian_critical_push_items", {}),
    "replica": ("meridian_agent_request_seconds", {"call": "ReplicatePushes"}),
}


def scrape_timings(procs: dict[str, AgentProcess]) -> dict[str, tuple[float, float]]:
    """Each of TIMINGS' (sum, count), added over every agent and label set."""
    out = dict.fromkeys(TIMINGS, (0.0, 0.0))
    for proc in procs.values():
        if not proc.metrics_address:
            continue
        url = f"http://{proc.metrics_address}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            text = answer.read().decode()
        for family in text_string_to_metric_families(text):
            for what, (name, labels) in TIMINGS.items():
                if family.name != name:
                    continue
                total, count = out[what]
                for sample in family.samples:
                    if any(sample.labels.get(k) != v for k, v in labels.items()):
                        continue
                    if sample.name == f"{name}_sum":
                        total += sample.value
                    elif sample.name == f"{name}_count":
                        count += sample.value
                out[what] = (total, count)
    return out


def mean_timings(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, float]:
    """The mean of each timing over the run (NaN when nothing was timed)."""
    out = {}
    for what in TIMINGS:
        total = after[what][0] - before[what][0]
        count = after[what][1] - before[what][1]
        out[what] = total / count if count else float("nan")
    return out


def start_profiles(procs: dict[str, AgentProcess], folder: Path, seconds: float) -> list[object]:
    """py-spy (when installed) samples each agent during the throughput run, 100 times a
    second, only threads holding the GIL (where the agent's Python CPU goes), as collapsed
    stacks in FOLDER/REGION.txt: `python benchmarks/stack_summary.py FILE` sums them."""
    spy = shutil.which("py-spy")
    if spy is None:
        print("--profile: py-spy is not installed (pip install py-spy); no profiles")
        return []
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for region, proc in procs.items():
        argv = [spy, "record", "-p", str(proc.pid), "-d", str(int(seconds)), "-f", "raw"]
        argv += ["-r", "100", "--gil", "-o", str(folder / f"{region}.txt"), "--nonblocking"]
        argv += os.environ.get("MERIDIAN_BENCH_PYSPY_ARGS", "").split()
        # What py-spy says (a refused option, a process it cannot read) is kept beside.
        with (folder / f"{region}.err").open("w") as err:
            out.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err))
    return out


def start_perf(procs: dict[str, AgentProcess], folder: Path, seconds: float) -> list[object]:
    """`perf record -g` (when installed) of each agent during the throughput run: every
    thread and the kernel's share, which py-spy does not see (`perf report -i FILE`)."""
    perf = shutil.which("perf")
    if perf is None:
        print("--perf: perf is not installed; no records")
        return []
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for region, proc in procs.items():
        argv = [perf, "record", "-F", "499", "-g", "-p", str(proc.pid)]
        argv += ["-o", str(folder / f"{region}.perf"), "--", "sleep", str(int(seconds))]
        out.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return out


def cpu_seconds(procs: dict[str, AgentProcess]) -> dict[str, tuple[float, float]]:
    """User and system CPU time each agent process has used (/proc/PID/stat)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for region, proc in procs.items():
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        out[region] = (int(fields[11]) / tick, int(fields[12]) / tick)
    return out


# Keys of `throughput_cpu`'s figures beside the agents' regions.
WRITERS, MACHINE = "(writers)", "(machine)"


def machine_busy_seconds() -> float:
    """CPU time every process of the machine has used, all cores (/proc/stat's first
    line: everything but idle and iowait)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


async def throughput_cpu(
    stub: agent_pb2_grpc.AgentAsyncStub,
    dataset: str,
    args: argparse.Namespace,
    procs: dict[str, AgentProcess],
) -> tuple[float, int, int, dict[str, float], dict[str, float], dict[str, float]]:
    """`throughput`, the agents' CPU milliseconds per acked write during it (all, and
    the system part of it): what bounds the rate when the agents share the machine's
    cores; and the mean timings: the writers' wait (`writers`) and the agents' own."""
    timed = await asyncio.to_thread(scrape_timings, procs)
    before = cpu_seconds(procs)
    busy, own = machine_busy_seconds(), time.process_time()
    rate, acked, refused, waited = await throughput(
        stub, dataset, args.writers, args.seconds, args.rate
    )
    after = cpu_seconds(procs)
    timings = mean_timings(timed, await asyncio.to_thread(scrape_timings, procs))
    timings["writers"] = waited
    per_write = {r: (sum(after[r]) - sum(before[r])) * 1e3 / max(acked, 1) for r in procs}
    system = {r: (after[r][1] - before[r][1]) * 1e3 / max(acked, 1) for r in procs}
    # What the agents' ceiling leaves out: the writers (this process) and everything else
    # on the machine (Toxiproxy, etcd, the catalog's database, the other services).
    per_write[WRITERS] = (time.process_time() - own) * 1e3 / max(acked, 1)
    per_write[MACHINE] = (machine_busy_seconds() - busy) * 1e3 / max(acked, 1)
    return rate, acked, refused, per_write, system, timings


async def measure(
    west: str, args: argparse.Namespace, procs: dict[str, AgentProcess] | None = None
) -> dict[str, object]:
    async with grpc.aio.insecure_channel(
        west,
        options=[
            ("grpc.max_send_message_length", 4 * MiB),
            ("grpc.max_receive_message_length", 4 * MiB),
        ],
    ) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        small: list[float] = []
        local: list[float] = []
        big: list[float] = []
        small_local: list[float] = []
        if args.only in ("all", "small"):
            small_local = await small_latency(stub, "plain/lat", args.small_runs // 3)
            small = await small_latency(stub, "tri/lat", args.small_runs)
        if args.only in ("all", "big"):
            local = await big_versions(stub, "plain/big", args.big_runs)
            big = await big_versions(stub, "tri/big", args.big_runs)
        rate, acked, refused, local_rate = 0.0, 0, 0, 0.0
        local_cpu: dict[str, float] = {}
        cpu: dict[str, float] = {}
        system: dict[str, float] = {}
        timings: dict[str, float] = {}
        if args.only in ("all", "throughput"):
            # The same load on a standard dataset: the owner's local commits alone.
            local_rate, _, _, local_cpu, _, _ = await throughput_cpu(
                stub, "plain/tput", args, procs or {}
            )
            spies = start_profiles(procs or {}, args.profile, args.seconds) if args.profile else []
            if args.perf:
                spies += start_perf(procs or {}, args.perf, args.seconds)
            rate, acked, refused, cpu, system, timings = await throughput_cpu(
                stub, "tri/tput", args, procs or {}
            )
            for spy in spies:
                code = await asyncio.to_thread(spy.wait)  # type: ignore[attr-defined]
                if code != 0:
                    print(f"a profiler ended with exit {code}: {' '.join(spy.args)}")  # type: ignore[attr-defined]
    return {
        "small_local": small_local,
        "local_rate": local_rate,
        "small": small,
        "local": local,
        "big": big,
        "rate": rate,
        "acked": acked,
        "refused": refused,
        "local_cpu": local_cpu,
        "cpu": cpu,
        "system": system,
        "timings": timings,
    }


def floor_rate(args: argparse.Namespace) -> float | None:
    """The relay floor's acked writes/s with this bench's shape, or None if it failed."""
    argv = [sys.executable, str(HERE / "relay_floor_bench.py"), "--duties"]
    argv += ["--in-flight", str(IN_FLIGHT), "--rtt-ms", str(args.rtt_ms)]
    argv += ["--writers", str(args.writers), "--seconds", str(args.seconds)]
    # Its own session, so that a timeout stops its owner and replicas too: SIGINT first
    # (its `finally` deletes its Toxiproxy proxies), then SIGKILL.
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=args.seconds + 120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        print(f"the relay floor did not end within {args.seconds + 120:.0f} s: no floor")
        return None
    for line in out.splitlines():
        if line.startswith("acked writes/s: "):
            return float(line.split()[2])
    print(f"the relay floor failed (exit {proc.returncode}): {err.strip()[-500:]}")
    return None


def report(figures: dict[str, object], rtt_ms: float, args: argparse.Namespace) -> None:
    small = figures["small"] or [float("nan")]
    local = figures["local"] or [float("nan")]
    big = figures["big"] or [float("nan")]
    assert isinstance(small, list) and isinstance(local, list) and isinstance(big, list)
    rtt = rtt_ms / 1e3
    p50, p99 = statistics.median(small), pct(small, 0.99)
    local_p50, big_p50 = statistics.median(local), statistics.median(big)
    rate = float(figures["rate"])  # type: ignore[arg-type]
    rows = [
        (
            "acked 1 KiB, ack quorum, p50",
            f"{p50 * 1e3:.1f} ms",
            f"<= {(rtt + 0.010) * 1e3:.0f} ms",
            p50 / (rtt + 0.010),
        ),
        (
            "acked 1 KiB, ack quorum, p99",
            f"{p99 * 1e3:.1f} ms",
            f"<= {(2 * rtt + 0.020) * 1e3:.0f} ms",
            p99 / (2 * rtt + 0.020),
        ),
        (
            "16 MiB new version, p50",
            f"{big_p50 * 1e3:.0f} ms",
            f"<= 1.5 x ({local_p50 * 1e3:.0f} ms local + {rtt_ms:.0f} ms)",
            big_p50 / (local_p50 + rtt) / 1.5,
        ),
        (
            f"throughput 1 KiB, {args.writers} writers",
            f"{rate:.0f} /s",
            ">= 1000 /s",
            1000 / rate if rate else float("inf"),
        ),
    ]
    print(f"three regions, {rtt_ms:.0f} ms RTT owner <-> each replica (Toxiproxy), tri/*: 2 of 3")
    print(f"{'measure':<34} {'measured':>12}  {'target':<36} {'of target':>9}")
    for name, got, target, ratio in rows:
        verdict = "ok" if ratio <= 1.0 else "MISSED"
        print(f"{name:<34} {got:>12}  {target:<36} {ratio:>8.2f}x {verdict}")
    print(
        f"16 MiB: ratio to (local + 1 RTT) {big_p50 / (local_p50 + rtt):.2f} (target 1.5); "
        f"local p50 {local_p50 * 1e3:.0f} ms, replicated p50 {big_p50 * 1e3:.0f} ms, "
        f"p99 {pct(big, 0.99) * 1e3:.0f} ms"
    )
    small_local = figures["small_local"] or [float("nan")]
    assert isinstance(small_local, list)
    print(
        f"reference, unreplicated (standard dataset, same owner agent): 1 KiB p50 "
        f"{statistics.median(small_local) * 1e3:.1f} ms, p99 {pct(small_local, 0.99) * 1e3:.1f} "
        f"ms; {args.writers} writers {float(figures['local_rate']):.0f} writes/s"  # type: ignore[arg-type]
    )
    cpu, local_cpu = figures["cpu"], figures["local_cpu"]
    assert isinstance(cpu, dict) and isinstance(local_cpu, dict)
    if cpu:
        # Every agent here shares this machine's cores: the rate cannot pass cores / CPU
        # per write, however the writes are scheduled.
        cores = os.cpu_count() or 1
        writers, machine = cpu.pop(WRITERS), cpu.pop(MACHINE)
        local_writers, local_machine = local_cpu.pop(WRITERS), local_cpu.pop(MACHINE)
        total, local_total = sum(cpu.values()), sum(local_cpu.values())
        print(
            f"agent CPU per acked write: {total:.1f} ms ("
            + ", ".join(f"{r} {ms:.1f}" for r, ms in cpu.items())
            + f"); unreplicated {local_total:.1f} ms; ceiling on {cores} cores: "
            f"{cores * 1e3 / total:.0f} /s replicated, {cores * 1e3 / local_total:.0f} /s "
            "unreplicated (the agents alone, nothing else running)"
        )
        print(
            f"machine CPU per acked write: {machine:.1f} ms (agents {total:.1f}, the writers' "
            f"process {writers:.1f}, everything else {machine - total - writers:.1f}); "
            f"unreplicated {local_machine:.1f} ms (writers {local_writers:.1f}); ceiling on "
            f"{cores} cores: {cores * 1e3 / machine:.0f} /s replicated, "
            f"{cores * 1e3 / local_machine:.0f} /s unreplicated"
        )
        system = figures.get("system") or {}
        assert isinstance(system, dict)
        print(
            "agent CPU per acked write, of it in the kernel (system time): "
            + ", ".join(f"{r} {ms:.1f}" for r, ms in system.items())
        )
    timings = figures.get("timings") or {}
    assert isinstance(timings, dict)
    if timings and timings.get("writers", 0) > 0:
        # Little's law: writers that each wait for their ack before the next write reach
        # at most writers / mean wait; the target asks that wait to be at most this.
        need = args.writers / 1000
        ms = {what: value * 1e3 for what, value in timings.items() if what != "items"}
        print(
            f"under load, means: a writer waits {ms['writers']:.1f} ms per ack ({args.writers} "
            f"writers / {ms['writers']:.1f} ms = {args.writers * 1e3 / ms['writers']:.0f} /s; "
            f"1000 /s needs <= {need * 1e3:.0f} ms); the owner's PutSmall {ms['owner']:.1f} ms. "
            f"Over every push to either replica (an ack waits for the first of the two): "
            f"a push waits {ms['queued']:.1f} ms for a call, a call takes {ms['call']:.1f} ms "
            f"({rtt_ms:.0f} ms RTT, the replica's handler {ms['replica']:.1f} ms) and carries "
            f"{timings['items']:.1f} versions"
        )
    floor = figures.get("floor")
    if isinstance(floor, float) and floor > 0:
        print(
            f"floor on this machine (relay_floor_bench.py --duties, {IN_FLIGHT} calls in flight, "
            f"nothing of Meridian): {floor:.0f} acked/s; we reach {100 * rate / floor:.0f} % of "
            f"it; 1000 /s is {100 * 1000 / floor:.0f} % of it"
        )
    print(
        f"throughput: {figures['acked']} acked, {figures['refused']} refused in "
        f"{args.seconds:.0f} s; runs: 1 KiB x{args.small_runs}, 16 MiB x{args.big_runs}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rtt-ms", type=int, default=20)
    parser.add_argument("--writers", type=int, default=32)
    parser.add_argument("--only", choices=["all", "small", "big", "throughput"], default="all")
    parser.add_argument("--seconds", type=float, help="the throughput run's length")
    parser.add_argument(
        "--rate",
        type=float,
        help="the throughput run's writers start at most this many writes a second "
        "(CPU per acked write at a fixed load, for before/after comparisons)",
    )
    parser.add_argument(
        "--profile", type=Path, help="py-spy profiles of the agents during the throughput run"
    )
    parser.add_argument(
        "--perf", type=Path, help="perf records of the agents during the throughput run"
    )
    parser.add_argument(
        "--floor",
        action=argparse.BooleanOptionalAction,
        help="also run the relay floor after the throughput run (default: not with --quick)",
    )
    args = parser.parse_args()
    if args.rate is not None and args.rate <= 0:
        parser.error(f"--rate must be a positive number of writes a second, got {args.rate}")
    # Only beside a throughput run (there is nothing to compare it with otherwise).
    wanted = not args.quick if args.floor is None else args.floor
    args.floor = wanted and args.only in ("all", "throughput")
    args.small_runs = 40 if args.quick else 300
    args.big_runs = 3 if args.quick else 12
    args.seconds = args.seconds or (3.0 if args.quick else 15.0)
    settings = load_settings()
    etcd = f"127.0.0.1:{settings.stack_etcd_port}"
    clear_keyspace(etcd)
    with tempfile.TemporaryDirectory(prefix="crit-bench-") as tmp:
        root = Path(tmp)
        env = prepare_critical_world(root / "world", etcd)
        asyncio.run(claim_all(etcd, ["tri/lat", "tri/big", "tri/tput"]))
        procs = {
            r: AgentProcess(r, root / r, dict(env), root / f"{r}.log", lease_ttl_s=10, metrics=True)
            for r in ("eu-west", "eu-central", "eu-north")
        }
        toxi = ToxiproxyClient(f"http://127.0.0.1:{settings.stack_toxiproxy_port}", timeout_s=5)
        proxies: list[str] = []
        try:
            procs["eu-central"].start()
            procs["eu-north"].start()
            routes = []
            for region in ("eu-central", "eu-north"):
                name, port = f"crit-bench-{region}-{os.getpid()}", free_port()
                toxi.create_proxy(name, f"127.0.0.1:{port}", procs[region].address)
                toxi.add_latency(name, args.rtt_ms // 2)
                proxies.append(name)
                routes.append(f"{region}=127.0.0.1:{port}")
            procs["eu-west"].env["MERIDIAN_AGENT_ROUTES"] = ",".join(routes)
            west = procs["eu-west"].start()
            figures = asyncio.run(measure(west.address, args, procs))
        finally:
            for name in proxies:
                toxi.delete_proxy(name)
            for proc in procs.values():
                if proc.running:
                    proc.stop()
    if args.floor:
        figures["floor"] = floor_rate(args)
    report(figures, args.rtt_ms, args)


if __name__ == "__main__":
    main()
