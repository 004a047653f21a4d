"""`meridian dataset evict`: once a policy drops a region from a dataset's placement, the
region's copies go, each only where a region of the placement holds it, and the catalog
forgets them. Real agent processes of the critical world, etcd, the CLI as a user runs
it; the region's lone newer write (its only copy) stays, named with why."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from critical_helpers import critical_policy_doc, put, running_agents, topology_doc
from harness.agent_process import AgentProcess
from harness.controllers import apply_world, run_cli
from waiting import until

from agents.client import AgentClient
from agents.store import ObjectStore
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.domain.hlc import HLC, HybridClock
from controlplane.domain.version import Digest, Version
from controlplane.errors import RefusedError

DS = "tri/ev"


def policy(tri_replicas: list[str]) -> str:
    return topology_doc("critical") + critical_policy_doc("tri", "tri/*", tri_replicas, "quorum")


async def newest(proc: AgentProcess) -> dict[str, Version]:
    async with AgentClient(proc.address) as client:
        return {o.key: o.version for o in await client.list(DS, include_deleted=True)}


def evict(
    env: dict[str, str], *flags: str, dataset: str = DS
) -> tuple[int, dict[str, object], str]:
    done = run_cli(
        ["dataset", "evict", dataset, "--region", "eu-north", "--output", "json", *flags], env
    )
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else {}, done.stderr


def catalog_regions(env: dict[str, str]) -> dict[str, set[str]]:
    done = run_cli(["dataset", "show", DS, "--output", "json"], env)
    assert done.returncode == 0, done.stderr
    out: dict[str, set[str]] = {}
    for o in json.loads(done.stdout)["objects"]:
        out.setdefault(str(o["object"]), set()).add(str(o["region"]))
    return out


async def test_a_dropped_region_loses_what_the_placement_holds_and_keeps_its_only_copies(
    tmp_path: Path, critical_world: dict[str, str], coord: EtcdCoordination
) -> None:
    world = tmp_path / "world"
    apply_world(world, critical_world, policy(["eu-central", "eu-north"]))
    with running_agents(tmp_path, critical_world) as procs:
        west, central, north = (procs[r] for r in ("eu-west", "eu-central", "eu-north"))
        await Ownership(coord).claim(DS, "eu-west", expect_epoch=0, reason="home", actor="t")
        for key in ("kept", "gone", "lone"):
            await put(west.address, DS, key, f"{key}, everywhere".encode())
        async with AgentClient(west.address) as client:
            await client.delete(DS, "gone")
        expected = await newest(west)

        async def north_level() -> bool:
            return await newest(north) == expected

        await until(north_level, 30, what="eu-north holding what the owner holds")

        # Placed there still: refused, nothing touched, by the CLI and by the agent itself.
        code, _, err = await asyncio.to_thread(evict, critical_world, "--yes")
        assert code == 1 and "still places it in eu-north" in err, err
        async with AgentClient(north.address) as client:
            with pytest.raises(RefusedError, match="still places it in eu-north"):
                await client.evict(DS, [(k, v.hlc) for k, v in expected.items()])
        assert await newest(north) == expected

        # eu-north as if written there and never replicated: a lone newer "lone".
        assert north.stop() == 0
        lone = HLC(expected["lone"].hlc.wall_ms + 1, 0, "eu-north")
        data = b"only in eu-north"
        with ObjectStore(tmp_path / "eu-north", clock=HybridClock("eu-north")) as store:
            store.apply(DS, "lone", Version.put(lone, len(data), Digest.of(data)), [data])
        north.start()

        apply_world(world, critical_world, policy(["eu-central"]))
        plan = {"kept", "gone"}
        code, shown, err = await asyncio.to_thread(evict, critical_world, "--dry-run")
        assert code == 3, err
        assert shown["dry_run"] is True and shown["evictable"] == len(plan), shown
        (stays,) = shown["kept"]  # type: ignore[misc]
        assert stays["object"] == "lone" and "not replicated yet" in stays["why"], stays
        assert set(await newest(north)) == {"kept", "gone", "lone"}  # a dry run changes nothing

        # A handover to eu-north (it would own the dataset): refused by both.
        own = Ownership(coord)
        owner = await own.get(DS)
        assert owner is not None
        mark = await own.begin_handover(DS, owner, "eu-north", "t")
        try:
            code, _, err = await asyncio.to_thread(evict, critical_world, "--yes")
            assert code == 1 and "handover's target" in err, err

            async def agent_refuses_the_target() -> bool:
                async with AgentClient(north.address) as client:
                    try:
                        await client.evict(DS, [(k, v.hlc) for k, v in expected.items()])
                    except RefusedError as exc:
                        return "handover's target" in str(exc)
                raise AssertionError("eu-north's agent took an eviction as a handover's target")

            await until(agent_refuses_the_target, 30, what="the agent to refuse the target")
        finally:
            assert await own.abort_handover(mark)
        assert set(await newest(north)) == {"kept", "gone", "lone"}

        # The agent decides by the policy it sees, which follows etcd a moment later.
        result: tuple[int, dict[str, object], str] = (0, {}, "")

        async def evicted() -> bool:
            nonlocal result
            result = await asyncio.to_thread(evict, critical_world, "--yes")
            agents = result[1].get("agents")
            assert isinstance(agents, list), result
            return not any("as this agent sees it" in str(a["error"]) for a in agents)

        await until(evicted, 30, what="eu-north's agent to see the new policy", step_s=0.5)
        code, done, err = result
        assert code == 3, err  # "lone" stays
        assert (done["evicted"], done["dry_run"]) == (len(plan), False), done
        assert [k["object"] for k in done["kept"]] == ["lone"]  # type: ignore[attr-defined]
        assert {o: v.hlc for o, v in (await newest(north)).items()} == {"lone": lone}
        for proc in (west, central):  # the placement's copies are untouched
            assert await newest(proc) == expected
        # Again: nothing left to drop, yet not done (the lone write stays): exit 3.
        code, again, err = await asyncio.to_thread(evict, critical_world, "--yes")
        assert code == 3, err
        assert again["evicted"] == 0 and again["agents"] == [], again
        assert [k["object"] for k in again["kept"]] == ["lone"]  # type: ignore[attr-defined]

        # The agents' records reach the catalog: it forgets eu-north's copies of both.
        where: dict[str, set[str]] = {}

        async def forgotten() -> bool:
            nonlocal where
            where = await asyncio.to_thread(catalog_regions, critical_world)
            return all("eu-north" not in where.get(key, set()) for key in plan) and bool(where)

        await until(
            forgotten,
            30,
            what="the catalog forgetting eu-north's copies",
            step_s=0.5,
            detail=lambda: where,
        )
        assert "eu-north" in (await asyncio.to_thread(catalog_regions, critical_world))["lone"]

        # An owner outside its placement (a policy applied after a failover, say) still
        # takes writes, and replicas catch up from its store: refused by both.
        owned = "tri/owned-outside"
        await Ownership(coord).claim(owned, "eu-north", expect_epoch=0, reason="t", actor="t")
        code, _, err = await asyncio.to_thread(evict, critical_world, "--yes", dataset=owned)
        assert code == 1 and "names eu-north its owner" in err, err
        async with AgentClient(north.address) as client:
            with pytest.raises(RefusedError, match="names eu-north its owner"):
                await client.evict(owned, [])
