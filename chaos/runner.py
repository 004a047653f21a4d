"""Run scenarios end to end and judge them, several on one world when they can share it.

A *world* (`OpenWorld`): a fresh catalog database with the policy applied, fresh
etcd keys, the proxies, every region's controller (and with the data plane its
agent and replicator), and the owner sampler. Setting one up costs most of a
scenario's time on a loaded machine, so consecutive scenarios needing the same
kind of world (`world_kind`) run on one, one after another: sound because each
scenario ends healed and recovered (every dataset owned and written again, the
data converged), which its own invariants check, so the next begins from a world
its invariants held in.

A scenario on a world: workload and owner sampling → the nemesis schedule from
its seed → heal → a bounded recovery wait → final reads → every invariant of the
scenario. What a scenario judges is its own: its history, and the records from
its start on (accepts, change events and applies by time; objects by a key prefix
of its own). The final state, the inventory and the owner samples are the whole
world's: what earlier scenarios left must still be right. Each scenario keeps
its history and result under its folder; the daemons' logs are the world's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from chaos import dataplane
from chaos.catalog_inventory import catalog_copies, dlq_copies
from chaos.checkers import (
    changelog,
    clock_skew,
    convergence,
    journal,
    lost_writes,
    ownership,
    residency,
    split_brain,
    visibility,
)
from chaos.checkers import critical as critical_checks
from chaos.checkers.verdict import Verdict
from chaos.critical_workload import CriticalWorkload
from chaos.faults import Injector
from chaos.history import History, Operation
from chaos.nemesis import Fault, schedule
from chaos.policy import (
    CRITICAL,
    HOLDERS,
    JURISDICTIONS,
    REGIONS,
    RESIDENCY,
    STANDARD,
    STANDARD_HOLDERS,
    STANDARD_RESIDENCY,
    policy_yaml,
)
from chaos.records import (
    ApplyRecord,
    Copy,
    ObjectState,
    OwnerSample,
    accepts_from_agent_log,
    applies_from_replicator_log,
)
from chaos.scenarios import Scenario
from chaos.stack import PrivateStack
from chaos.workload import FENCE_REGION, FencedWorkload, OwnerSampler
from chaos.world import ChaosWorld
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.errors import MeridianError, StackError
from controlplane.logs import get_logger

log = get_logger("meridian.chaos")

RECOVERY_S = 40.0
JOURNAL_WAIT_S = 60.0  # rows of moves made under load came 30-40 s after the heal
# After recovery: every replicator caught up, every Fetch retried. Scenario 7 at 30 s
# (two broker restarts, agent and replicator SIGKILLs) left a backlog that took 47 s
# to apply on a loaded machine; the bound is a limit, the wait ends when it holds.
CONVERGENCE_S = 90.0
CLAIMS_S = 30.0
QUORUM = 2  # copies a critical ack promises: `ack: quorum` of home + 2 replicas

WorldKind = tuple[bool, int, str | None]  # agents, clock offset, the skewed region


def world_kind(scenario: Scenario) -> WorldKind:
    skewed = scenario.targets[0] if scenario.clock_offset_ms else None
    return (scenario.agents, scenario.clock_offset_ms, skewed)


@dataclass
class Result:
    scenario: str
    seed: int
    operations: int
    acked: int
    verdicts: list[Verdict]
    faults: list[str] = field(default_factory=list)
    run_dir: str = ""
    elapsed_s: float = 0.0  # this scenario on its world: faults, recovery, checks
    world_s: float = 0.0  # its share of setting the world up and tearing it down

    @property
    def held(self) -> bool:
        return all(v.held for v in self.verdicts)

    def as_json(self) -> dict[str, object]:
        return {
            "scenario": self.scenario,
            "seed": self.seed,
            "operations": self.operations,
            "acked": self.acked,
            "invariants": [v.as_json() for v in self.verdicts],
            "faults": self.faults,
            "run_dir": self.run_dir,
            "elapsed_s": self.elapsed_s,
            "world_s": self.world_s,
        }


async def _wipe_etcd(endpoints: list[str]) -> None:
    async with EtcdCoordination(endpoints, timeout_s=5) as coord:
        await coord.delete("/meridian/", prefix=True)


def _judged_something(verdict: Verdict, judged: int, why_none: str) -> Verdict:
    """`verdict`, or a failed one when it held on nothing at all."""
    if not verdict.held or judged > 0:
        return verdict
    problem = f"nothing to judge: {why_none}"
    return Verdict(verdict.name, False, problem, (problem,))


async def _until(what: str, check: object, timeout_s: float) -> bool:
    """Poll the async predicate `check` every 0.2 s, at most `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / 0.2) + 2):
        if await check():  # type: ignore[operator]
            return True
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.2)
    log.warning("chaos_wait_gave_up", waiting_for=what, seconds=timeout_s)
    return False


@dataclass
class OpenWorld:
    stack: PrivateStack
    world: ChaosWorld
    sampler: OwnerSampler
    kind: WorldKind
    all_held: bool = True

    @property
    def agents(self) -> bool:
        return self.kind[0]

    @property
    def skewed(self) -> str | None:
        return self.kind[2]


async def open_world(stack: PrivateStack, kind: WorldKind, world_dir: Path) -> OpenWorld:
    agents, offset_ms, skewed = kind
    await asyncio.to_thread(world_dir.mkdir, parents=True, exist_ok=True)
    world = ChaosWorld(stack, world_dir, REGIONS, lease_ttl_s=3)
    t_setup = time.monotonic()
    await _wipe_etcd(stack.etcd_endpoints)
    policy = world_dir / "policy.yaml"
    # With agents, the standard datasets too (a world of agents serves both workloads).
    policy.write_text(policy_yaml(standard=agents), encoding="utf-8")
    await asyncio.to_thread(world.create_catalog, policy)
    phases = {"catalog_s": round(time.monotonic() - t_setup, 1)}
    sampler = OwnerSampler(stack.etcd_endpoints)
    opened = OpenWorld(stack, world, sampler, kind)
    try:
        # Inside: proxies made before a failure here are dropped by close_world (a
        # leftover holds its listen port, the fixed Kafka WAN ports among them, in
        # Toxiproxy until the stack stops, and the next world could not make its own).
        await world.make_proxies(agents=agents)
        await asyncio.to_thread(world.start_controllers)
        if skewed is not None:
            world.data_env[skewed] = {"MERIDIAN_CLOCK_OFFSET_MS": str(offset_ms)}
        if agents:
            await asyncio.to_thread(world.start_data_plane)
        phases["processes_s"] = round(time.monotonic() - t_setup, 1)
        sampler.start()

        async def all_owned() -> bool:
            return len(sampler.latest()) == len(CRITICAL)

        if not await _until("home claims", all_owned, CLAIMS_S):
            raise StackError("the home region never claimed every critical dataset within 30 s")
    except BaseException:
        await close_world(opened)
        raise
    log.info("chaos_world_ready", setup_s=round(time.monotonic() - t_setup, 1), **phases)
    return opened


async def close_world(w: OpenWorld) -> None:
    """Stop the world's processes and drop its proxies, the proxies whatever failed
    before (an error stopping a process still leaves Toxiproxy clean)."""
    try:
        await w.sampler.stop()
        await asyncio.to_thread(w.world.stop_all)
        with contextlib.suppress(Exception):
            await w.world.heal()
    finally:
        try:
            await w.world.drop_proxies()
        finally:
            await w.world.toxi.close()
    if w.all_held:
        # A held world's catalog is of no further use; a failed one's is kept to inspect.
        await asyncio.to_thread(w.world.drop_catalog)


async def run_on_world(
    w: OpenWorld, scenario: Scenario, seed: int, duration_s: float, run_dir: Path
) -> Result:
    """One scenario on an open world (healed and recovered when it returns)."""
    world, sampler, stack = w.world, w.sampler, w.stack
    await asyncio.to_thread(run_dir.mkdir, parents=True, exist_ok=True)
    history = History()
    t_start = time.monotonic()
    start_t = time.time()
    start_ms = int(start_t * 1000)
    # The harness's wall clock at monotonic 0: a completion's wall time, to tell a
    # skewed version (HLC ahead of when it was acked) from an on-time one.
    wall_anchor = time.time() - time.monotonic()
    prefix = f"s{scenario.number}-"  # this scenario's objects, apart from earlier ones'
    workload = FencedWorkload(
        history,
        world.fence_dir,
        {r.name: r.etcd.split(",") for r in world.regions.values()},
        CRITICAL,
        seed=seed,
        interval_s=0.1,
    )
    faults = schedule(
        seed,
        scenario.kinds,
        scenario.targets,
        duration_s=duration_s,
        hold_s=scenario.hold_s,
        gap_s=scenario.gap_s,
    )
    done: list[tuple[Fault, str, int, int, float, float]] = []  # fault, what, ns and wall
    agents = {r.name: r.agent_listen for r in world.regions.values()}
    # Every region's clients write through their own agent (us-east's are refused by
    # residency: a write there must never leave a byte behind).
    data = (
        dataplane.StandardWorkload(
            history,
            agents,
            STANDARD,
            seed=seed,
            size=scenario.object_size,
            interval_s=0.05 if scenario.object_size < 1 << 20 else 0.2,
            key_prefix=prefix,
        )
        if scenario.data_plane
        else None
    )
    crit = (
        CriticalWorkload(history, workload.regions, agents, CRITICAL, seed=seed, key_prefix=prefix)
        if scenario.critical_plane
        else None
    )
    skewed = w.skewed
    # What must converge: the standard datasets' holders (a skewed region's versions are
    # quarantined elsewhere by design, so it is left out), and with the critical
    # workload the critical datasets' holders (catch-up fills every replica).
    must_hold: dict[str, list[str]] = {}
    if data is not None:
        must_hold.update(
            {ds: [r for r in rs if r != skewed] for ds, rs in STANDARD_HOLDERS.items()}
        )
    if crit is not None:
        must_hold.update(HOLDERS)
    final_data: list[ObjectState] = []
    journal_rows: list[dict[str, object]] = []
    gauges: dict[str, float | None] = {}
    truth: dict[str, str] = {}
    spent: dict[str, float] = {}  # seconds from the scenario's start to the end of each step
    answers: list[str] = []  # what operator actions of the faults were told

    async def all_owned() -> bool:
        return len(sampler.latest()) == len(CRITICAL)

    def own_samples() -> list[OwnerSample]:
        """The owner samples of this scenario, each dataset's last earlier one first: the
        moves an earlier scenario made were judged there (a catalog that is slow to
        answer after this scenario's faults must not fail them again)."""
        before = {x.dataset: x for x in sampler.samples if x.t < start_t}
        return [*before.values(), *(x for x in sampler.samples if x.t >= start_t)]

    try:
        if not await _until("every dataset owned", all_owned, CLAIMS_S):
            raise StackError("a critical dataset was left unowned by the previous scenario")
        log.info("chaos_ready", scenario=scenario.name, seed=seed)
        workload.start()
        if data is not None:
            data.start()
        if crit is not None:
            crit.start()
        injector = Injector(world, workload, sampler, clock_offset_ms=scenario.clock_offset_ms)
        answers = injector.operator_log
        t0 = time.monotonic()
        for fault in faults:
            await asyncio.sleep(max(0.0, t0 + fault.start_s - time.monotonic()))
            start_ns, start_wall = time.monotonic_ns(), time.time()
            what = await injector.begin(fault)
            log.info("chaos_fault", scenario=scenario.name, seed=seed, fault=what)
            await asyncio.sleep(max(0.0, t0 + fault.end_s - time.monotonic()))
            await injector.end(fault)
            done.append((fault, what, start_ns, time.monotonic_ns(), start_wall, time.time()))
        await world.heal()
        heal_ns = time.monotonic_ns()
        first_fault_ns = done[0][2] if done else heal_ns
        spent["faults_s"] = round(time.monotonic() - t_start, 1)

        async def recovered() -> bool:
            # With agents, the critical workload's own acks: the fence stand-in is a
            # local file no fault touches, so its writes prove nothing of recovery.
            written = {
                op.invoke.dataset
                for op in history.operations()
                if op.outcome == "ok"
                and op.invoke.time_ns >= heal_ns
                and (crit is None or op.invoke.process.endswith("/critical"))
            }
            return len(sampler.latest()) == len(CRITICAL) and written >= set(CRITICAL)

        await _until("recovery after heal", recovered, RECOVERY_S)
        spent["recovery_s"] = round(time.monotonic() - t_start, 1)
        # Records catch up: the journal may lag by the controllers' grace for moves
        # whose mover crashed before journaling (ControllerConfig.journal_grace_s).

        async def journal_caught_up() -> bool:
            rows = await asyncio.to_thread(world.journal)
            if rows is None:
                return False
            journal_rows[:] = rows
            return journal.journaled(own_samples(), rows).held

        # Each poll runs `meridian history` (seconds on a loaded machine): only when judged.
        if journal.JOURNALED in scenario.invariants:
            await _until("the failover journal", journal_caught_up, JOURNAL_WAIT_S)

        async def views_agree() -> bool:
            gauges.update(await world.owned_gauges())
            truth.update({ds: s.region for ds, s in sampler.latest().items()})
            return journal.views_agree(gauges, truth).held

        if journal.VIEWS in scenario.invariants:
            await _until("controllers' views", views_agree, 10)
        spent["journal_s"] = round(time.monotonic() - t_start, 1)
        if data is not None:
            await data.stop()
        if crit is not None:
            await crit.stop()
        if must_hold:
            final_data = await dataplane.settled_state(
                {n: agents[n] for n in STANDARD_HOLDERS[STANDARD[0]]},
                sorted(must_hold),
                must_hold,
                CONVERGENCE_S,
            )
        spent["settled_s"] = round(time.monotonic() - t_start, 1)
        exited = world.exited()
    finally:
        if data is not None:
            await data.stop()
        if crit is not None:
            await crit.stop()
        await workload.stop()
        with contextlib.suppress(Exception):
            await world.heal()
    history.save(run_dir / "history.jsonl")
    ops = history.operations()
    accepts = [a for a in workload.accept_log() if a.t >= start_t]
    published = []
    catalog_claims: list[Copy] = []
    dead_letters: list[Copy] = []
    if residency.NAME in scenario.invariants:
        url = world.catalog_direct.replace("postgresql+psycopg://", "postgresql://", 1)
        catalog_claims = await asyncio.to_thread(catalog_copies, url)
        dead_letters = await dlq_copies(stack.kafka_endpoint, start_ms)
    if w.agents:
        for region, lines in world.logs_of("agent").items():
            found = accepts_from_agent_log(lines, region, f"{region}-agent", region)
            accepts += [a for a in found if a.t >= start_t]
    if changelog.NAME in scenario.invariants:
        published = await dataplane.published_events(stack.kafka_endpoint, start_ms)

    def all_applies() -> list[ApplyRecord]:
        return [
            a
            for region, lines in world.logs_of("replicator").items()
            for a in applies_from_replicator_log(lines, f"{region} replicator log")
            if dataplane.of_run(a.version, start_ms)
        ]

    critical_ops = [op for op in ops if op.invoke.process.endswith("/critical")]
    other_ops = [op for op in ops if not op.invoke.process.endswith("/critical")]
    max_skew_ms = stack.settings.max_clock_skew_ms

    def skewed_write(op: Operation) -> list[str] | None:
        """A write of the skewed region acked with an HLC ahead of the harness's clock
        by more than the allowed skew: it must stay in its own region only."""
        wall = clock_skew.wall_ms(str(op.seen("version") or ""))
        if skewed is None or op.invoke.region != skewed or op.complete is None or wall is None:
            return None
        acked_ms = (wall_anchor + op.complete.time_ns / 1e9) * 1000
        return [skewed] if wall > acked_ms + max_skew_ms else None

    verdicts: list[Verdict] = []
    for name in scenario.invariants:
        if name == split_brain.NAME:
            verdicts.append(split_brain.check(accepts, sampler.samples))
        elif name == lost_writes.NAME:
            required: dict[str, list[str]] = {ds: [FENCE_REGION] for ds in CRITICAL}
            if scenario.data_plane:
                required.update(STANDARD_HOLDERS)
            verdicts.append(
                lost_writes.check(
                    other_ops, workload.final_state() + final_data, required, only_in=skewed_write
                )
            )
        elif name == critical_checks.LOST:
            owners = {ds: s.region for ds, s in sampler.latest().items()}
            verdicts.append(critical_checks.lost(critical_ops, final_data, HOLDERS, owners, QUORUM))
        elif name == critical_checks.ONE_OWNER:
            verdicts.append(critical_checks.one_owner(accepts, CRITICAL))
        elif name == residency.OWNERS:
            verdicts.append(residency.owners(sampler.samples, RESIDENCY, JURISDICTIONS))
        elif name == clock_skew.NAME:
            verdicts.append(clock_skew.check(all_applies(), max_skew_ms))
        elif name == convergence.NAME:
            verdicts.append(convergence.check(final_data, must_hold))
        elif name == changelog.NAME:
            verdicts.append(changelog.check(published, all_applies(), STANDARD_HOLDERS))
        elif name == visibility.NAME:
            verdicts.append(visibility.check(ops))
        elif name == residency.NAME:
            roots = {r.name: world.run_dir / "agents" / r.name for r in world.regions.values()}
            allowed = {**RESIDENCY, **STANDARD_RESIDENCY}
            copies = dataplane.inventory(roots) + catalog_claims + dead_letters
            verdicts.append(residency.check(copies, allowed, JURISDICTIONS))
        elif name == ownership.RESUMED:
            verdicts.append(ownership.resumed(ops, first_fault_ns, heal_ns))
        elif name == ownership.STABLE:
            windows = [(d[4], d[5]) for d in done if d[0].kind in scenario.stable_during]
            bad: list[str] = []
            for lo, hi in windows:
                v = ownership.stable(sampler.samples, lo, hi + world.lease_ttl_s)
                bad.extend(v.offending)
            verdicts.append(Verdict.of(ownership.STABLE, bad, "no dataset changed owner"))
        elif name == journal.JOURNALED:
            verdicts.append(journal.journaled(own_samples(), journal_rows))
        elif name == journal.VIEWS:
            verdicts.append(journal.views_agree(gauges, truth))
        elif name == ownership.DURING:
            ns_windows = [(d[2], d[3]) for d in done if d[0].kind in scenario.progress_during]
            verdicts.append(ownership.progress(ops, ns_windows))
    # A verdict on nothing holds vacuously: with a workload running, its checks must
    # have judged some of its acked writes (or the agents' accepts) to mean anything.
    critical_acked = sum(1 for op in critical_ops if op.outcome == "ok")
    standard_acked = sum(
        1 for op in other_ops if op.outcome == "ok" and op.invoke.dataset in STANDARD
    )
    agent_accepts = sum(1 for a in accepts if a.accepted and a.writer.endswith("-agent"))
    floors: dict[str, tuple[int, str]] = {}
    if crit is not None:
        floors[critical_checks.LOST] = (critical_acked, "the critical workload acked no write")
        floors[critical_checks.ONE_OWNER] = (agent_accepts, "no agent accepted a critical write")
    if data is not None:
        floors[lost_writes.NAME] = (standard_acked, "the standard workload acked no write")
        floors[convergence.NAME] = (standard_acked, "the standard workload acked no write")
        # A clean inventory proves residency only if copies were asked for where the
        # policy forbids them: us-east's clients write there, and must be refused.
        refused = sum(
            1
            for op in other_ops
            if JURISDICTIONS.get(op.invoke.region) != "EU"
            and op.outcome == "fail"
            and str(op.seen("error") or "").startswith("ResidencyError")
        )
        floors[residency.NAME] = (refused, "no write outside the EU was refused by residency")
    verdicts = [_judged_something(v, *floors[v.name]) if v.name in floors else v for v in verdicts]
    if not all(v.held for v in verdicts):
        w.all_held = False
    spent["checked_s"] = round(time.monotonic() - t_start, 1)
    log.info("chaos_scenario_times", scenario=scenario.name, **spent)
    with (run_dir / "result.json").open("w") as out:
        json.dump(
            {
                "faults": [d[1] for d in done],
                "exited": exited,
                "world": str(world.run_dir),
                "invariants": [{**v.as_json(), "offending": list(v.offending)} for v in verdicts],
                "times": spent,
            },
            out,
        )
    return Result(
        scenario.name,
        seed,
        len(ops),
        sum(1 for op in ops if op.outcome == "ok" and op.f == "write"),
        verdicts,
        [f"{d[0].describe()}: {d[1]}" for d in done] + [f"operator: {a}" for a in answers],
        str(run_dir),
        round(time.monotonic() - t_start, 1),
    )


def groups(scenarios: Sequence[Scenario]) -> list[list[int]]:
    """Indexes of consecutive scenarios that can share one world."""
    out: list[list[int]] = []
    for i, s in enumerate(scenarios):
        if out and world_kind(scenarios[out[-1][-1]]) == world_kind(s):
            out[-1].append(i)
        else:
            out.append([i])
    return out


async def run_group(
    stack: PrivateStack,
    scenarios: Sequence[Scenario],
    seeds: Sequence[int],
    duration_s: float,
    runs_dir: Path,
    announce: Callable[[str], None] = lambda _: None,
) -> list[Result]:
    """Scenarios of one world kind on one world, in order."""
    t0 = time.monotonic()
    stamp = int(time.time())
    world_dir = runs_dir / f"world-{scenarios[0].name}-{seeds[0]}-{stamp}"
    w = await open_world(stack, world_kind(scenarios[0]), world_dir)
    results: list[Result] = []
    try:
        for scenario, seed in zip(scenarios, seeds, strict=True):
            announce(f"chaos: {scenario.name} with seed {seed} (re-run: --seed {seed})")
            run_dir = world_dir / f"{scenario.name}-{seed}"
            try:
                results.append(await run_on_world(w, scenario, seed, duration_s, run_dir))
            except MeridianError as exc:
                # The world broke (an engine that did not come back): this scenario fails
                # with why, and the rest of the group is not run on it; earlier results stand.
                w.all_held = False
                broken = Verdict.of("run-completed", [f"{type(exc).__name__}: {exc}"])
                results.append(Result(scenario.name, seed, 0, 0, [broken], [], str(run_dir)))
                announce(f"chaos: {scenario.name} could not finish: {exc}")
                break
            announce(f"chaos: {scenario.name} {'held' if results[-1].held else 'FAILED'}")
    finally:
        await close_world(w)
    overhead = time.monotonic() - t0 - sum(r.elapsed_s for r in results)
    for r in results:
        r.world_s = round(overhead / max(1, len(results)), 1)
    return results


async def run_scenario(
    stack: PrivateStack, scenario: Scenario, seed: int, duration_s: float, runs_dir: Path
) -> Result:
    """One scenario on a world of its own."""
    return (await run_group(stack, [scenario], [seed], duration_s, runs_dir))[0]
