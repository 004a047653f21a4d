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

from chaos.checkers import journal, lost_writes, ownership, split_brain
from chaos.checkers.verdict import Verdict
from chaos.faults import Injector
from chaos.history import History
from chaos.nemesis import Fault, schedule
from chaos.policy import CRITICAL, REGIONS, policy_yaml
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


@dataclass
class Result:
    scenario: str
    seed: int
    operations: int
    acked: int
    verdicts: list[Verdict]
    faults: list[str] = field(default_factory=list)
    run_dir: str = ""

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
    await _wipe_etcd(stack.etcd_endpoints)
    policy = run_dir / "policy.yaml"
    policy.write_text(policy_yaml(), encoding="utf-8")
    await asyncio.to_thread(world.create_catalog, policy)
    phases = {"catalog_s": round(time.monotonic() - t_setup, 1)}
    await world.make_proxies()
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
    try:
        await asyncio.to_thread(world.start_controllers)
        phases["processes_s"] = round(time.monotonic() - t_setup, 1)
        sampler.start()

        async def all_owned() -> bool:
            return len(sampler.latest()) == len(CRITICAL)

        if not await _until("home claims", all_owned, 30):
            raise StackError("the home region never claimed every critical dataset within 30 s")
        setup_s = round(time.monotonic() - t_setup, 1)
        log.info("chaos_ready", scenario=scenario.name, seed=seed, setup_s=setup_s, **phases)
        workload.start()
        injector = Injector(world, workload, sampler)
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
        exited = world.exited()
    finally:
        await workload.stop()
        await sampler.stop()
        await asyncio.to_thread(world.stop_all)
        with contextlib.suppress(Exception):
            await world.heal()
        await world.drop_proxies()
        await world.toxi.close()
    history.save(run_dir / "history.jsonl")
    ops = history.operations()
    verdicts: list[Verdict] = []
    for name in scenario.invariants:
        if name == split_brain.NAME:
            verdicts.append(split_brain.check(workload.accept_log(), sampler.samples))
        elif name == lost_writes.NAME:
            required = {ds: [FENCE_REGION] for ds in CRITICAL}
            verdicts.append(lost_writes.check(ops, workload.final_state(), required))
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
    )
