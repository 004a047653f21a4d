"""Run one scenario end to end and judge it.

Set up (fresh etcd keys, a fresh catalog database, proxies, controllers) →
workload and owner sampling → the nemesis schedule from the seed → heal → a
bounded recovery wait (every dataset owned and written again) → final reads →
every invariant of the scenario. Everything the run saw is kept under its
folder: the history (`history.jsonl`), the accept log, the daemons' logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
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
    accepts_from_agent_log,
    applies_from_replicator_log,
)
from chaos.scenarios import Scenario
from chaos.stack import PrivateStack
from chaos.workload import FENCE_REGION, FencedWorkload, OwnerSampler
from chaos.world import ChaosWorld
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.errors import StackError
from controlplane.logs import get_logger

log = get_logger("meridian.chaos")

RECOVERY_S = 40.0
JOURNAL_WAIT_S = 30.0
CONVERGENCE_S = 45.0  # after recovery: every replicator caught up, every Fetch retried


@dataclass
class Result:
    scenario: str
    seed: int
    operations: int
    acked: int
    verdicts: list[Verdict]
    faults: list[str] = field(default_factory=list)
    run_dir: str = ""
    elapsed_s: float = 0.0  # the whole run: set-up, faults, recovery, checks, teardown

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
        }


async def _wipe_etcd(endpoints: list[str]) -> None:
    async with EtcdCoordination(endpoints, timeout_s=5) as coord:
        await coord.delete("/meridian/", prefix=True)


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


async def run_scenario(
    stack: PrivateStack, scenario: Scenario, seed: int, duration_s: float, runs_dir: Path
) -> Result:
    run_dir = runs_dir / f"{scenario.name}-{seed}-{int(time.time())}"
    run_dir.mkdir(parents=True, exist_ok=True)
    world = ChaosWorld(stack, run_dir, REGIONS, lease_ttl_s=3)
    history = History()
    t_setup = time.monotonic()
    # The harness's wall clock at monotonic 0: a completion's wall time, to tell a
    # skewed version (HLC ahead of when it was acked) from an on-time one.
    wall_anchor = time.time() - time.monotonic()
    run_start_ms = int(time.time() * 1000)
    await _wipe_etcd(stack.etcd_endpoints)
    policy = run_dir / "policy.yaml"
    policy.write_text(policy_yaml(standard=scenario.data_plane), encoding="utf-8")
    await asyncio.to_thread(world.create_catalog, policy)
    phases = {"catalog_s": round(time.monotonic() - t_setup, 1)}
    await world.make_proxies(agents=scenario.data_plane)
    sampler = OwnerSampler(stack.etcd_endpoints)
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
    # Every region's clients write through their own agent (us-east's are refused by
    # residency: a write there must never leave a byte behind).
    data = (
        dataplane.StandardWorkload(
            history,
            {r.name: r.agent_listen for r in world.regions.values()},
            STANDARD,
            seed=seed,
            size=scenario.object_size,
            interval_s=0.05 if scenario.object_size < 1 << 20 else 0.2,
        )
        if scenario.data_plane
        else None
    )
    crit = (
        CriticalWorkload(
            history,
            workload.regions,
            {r.name: r.agent_listen for r in world.regions.values()},
            CRITICAL,
            seed=seed,
        )
        if scenario.critical_plane
        else None
    )
    skewed = scenario.targets[0] if scenario.clock_offset_ms else None
    # What must converge: the standard datasets' holders (a skewed region's versions are
    # quarantined elsewhere by design, so it is left out), and with the critical
    # workload the critical datasets' holders (catch-up fills every replica).
    must_hold = {
        ds: [r for r in regions if r != skewed] for ds, regions in STANDARD_HOLDERS.items()
    }
    if crit is not None:
        must_hold.update(HOLDERS)
    final_data: list[ObjectState] = []
    try:
        await asyncio.to_thread(world.start_controllers)
        if skewed is not None:
            world.data_env[skewed] = {"MERIDIAN_CLOCK_OFFSET_MS": str(scenario.clock_offset_ms)}
        if scenario.data_plane:
            await asyncio.to_thread(world.start_data_plane)
        phases["processes_s"] = round(time.monotonic() - t_setup, 1)
        sampler.start()

        async def all_owned() -> bool:
            return len(sampler.latest()) == len(CRITICAL)

        if not await _until("home claims", all_owned, 30):
            raise StackError("the home region never claimed every critical dataset within 30 s")
        setup_s = round(time.monotonic() - t_setup, 1)
        log.info("chaos_ready", scenario=scenario.name, seed=seed, setup_s=setup_s, **phases)
        workload.start()
        if data is not None:
            data.start()
        if crit is not None:
            crit.start()
        injector = Injector(world, workload, sampler, clock_offset_ms=scenario.clock_offset_ms)
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

        async def recovered() -> bool:
            written = {
                op.invoke.dataset
                for op in history.operations()
                if op.outcome == "ok" and op.invoke.time_ns >= heal_ns
            }
            return len(sampler.latest()) == len(CRITICAL) and written >= set(CRITICAL)

        await _until("recovery after heal", recovered, RECOVERY_S)
        # Records catch up: the journal may lag by the controllers' grace for moves
        # whose mover crashed before journaling (ControllerConfig.journal_grace_s).
        journal_rows: list[dict[str, object]] = []

        async def journal_caught_up() -> bool:
            rows = await asyncio.to_thread(world.journal)
            if rows is None:
                return False
            journal_rows[:] = rows
            return journal.journaled(sampler.samples, rows).held

        await _until("the failover journal", journal_caught_up, JOURNAL_WAIT_S)
        gauges: dict[str, float | None] = {}
        truth: dict[str, str] = {}

        async def views_agree() -> bool:
            gauges.update(await world.owned_gauges())
            truth.update({ds: s.region for ds, s in sampler.latest().items()})
            return journal.views_agree(gauges, truth).held

        await _until("controllers' views", views_agree, 10)
        if data is not None:
            await data.stop()
            if crit is not None:
                await crit.stop()
            final_data = await dataplane.settled_state(
                {n: world.regions[n].agent_listen for n in STANDARD_HOLDERS[STANDARD[0]]},
                STANDARD + (CRITICAL if crit is not None else []),
                must_hold,
                CONVERGENCE_S,
            )
        exited = world.exited()
    finally:
        if data is not None:
            await data.stop()
        if crit is not None:
            await crit.stop()
        await workload.stop()
        await sampler.stop()
        await asyncio.to_thread(world.stop_all)
        with contextlib.suppress(Exception):
            await world.heal()
        await world.drop_proxies()
        await world.toxi.close()
    history.save(run_dir / "history.jsonl")
    ops = history.operations()
    accepts = workload.accept_log()
    published = []
    catalog_claims: list[Copy] = []
    dead_letters: list[Copy] = []
    if residency.NAME in scenario.invariants:
        url = world.catalog_direct.replace("postgresql+psycopg://", "postgresql://", 1)
        catalog_claims = await asyncio.to_thread(catalog_copies, url)
        dead_letters = await dlq_copies(stack.kafka_endpoint, run_start_ms)
    if scenario.data_plane:
        for region, lines in world.logs_of("agent").items():
            accepts += accepts_from_agent_log(lines, region, f"{region}-agent", region)
        published = await dataplane.published_events(stack.kafka_endpoint, run_start_ms)

    def all_applies() -> list[ApplyRecord]:
        return [
            a
            for region, lines in world.logs_of("replicator").items()
            for a in applies_from_replicator_log(lines, f"{region} replicator log")
            if dataplane.of_run(a.version, run_start_ms)
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
            verdicts.append(critical_checks.lost(critical_ops, final_data, HOLDERS))
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
            roots = {r.name: run_dir / "agents" / r.name for r in world.regions.values()}
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
            verdicts.append(journal.journaled(sampler.samples, journal_rows))
        elif name == journal.VIEWS:
            verdicts.append(journal.views_agree(gauges, truth))
        elif name == ownership.DURING:
            ns_windows = [(d[2], d[3]) for d in done if d[0].kind in scenario.progress_during]
            verdicts.append(ownership.progress(ops, ns_windows))
    if all(v.held for v in verdicts):
        # A held run's catalog is of no further use; a failed one's is kept to inspect.
        await asyncio.to_thread(world.drop_catalog)
    with (run_dir / "result.json").open("w") as out:
        json.dump({"faults": [d[1] for d in done], "exited": exited}, out)
    return Result(
        scenario.name,
        seed,
        len(ops),
        sum(1 for op in ops if op.outcome == "ok" and op.f == "write"),
        verdicts,
        [f"{d[0].describe()}: {d[1]}" for d in done],
        str(run_dir),
        round(time.monotonic() - t_setup, 1),
    )
