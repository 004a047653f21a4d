"""Version sets of a standard dataset between regions, with real processes: an agent per
region (`meridian agent serve`, its outbox drained to the stack's Kafka; eu-west's
through the Toxiproxy WAN proxy, so the test can hold its events back) and a
`meridian replicator run` in eu-central and in us-east, on the harness's world
(`eu/*`: standard, home eu-west, a copy in eu-central, residency EU; us-east is US).

1. A set of six members written in eu-west shows in eu-central once complete.
2. A second set over new versions of the same keys: eu-west's link to Kafka is cut
   after its members and the set are committed, and the set's event (the same set,
   as eu-west committed it) is published alone, so eu-central records it before any
   of its members can arrive: it is not visible (step-2 is incomplete, `latest`
   stays step-1). The link heals; the members arrive (fetched from eu-west) and the
   set shows. A reader polling `GetSet latest` in eu-central all along sees only
   step-1, then only step-2, each with every member readable at its version with the
   content written for that set: never a mix.
3. A replay of the set's event is `same` and changes nothing: exactly one event of
   step-2 is applied in eu-central (the origin's own copy came after and was `same`).
4. us-east, outside the residency, reads every set event and skips each; its agent
   holds neither the sets nor their members.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from harness.agent_fixtures import clear_keyspace
from harness.agent_process import AgentProcess, prepare_world
from harness.catalogs import scratch_postgres
from repl_world import ReplicatorProcess, publish

from agents.client import AgentClient
from controlplane.adapters.toxiproxy import ToxiproxyClient
from controlplane.domain.events import SetEvent
from controlplane.domain.version import Version
from controlplane.domain.version_set import VersionSet
from controlplane.errors import NotFoundError, UnavailableError
from controlplane.settings import Settings
from controlplane.stack.kafka import wan_proxy_port
from controlplane.stack.manager import KAFKA_WAN_PROXY
from meridian.convert import encode_set_event

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REGIONS = ("eu-west", "eu-central", "us-east")
KEYS = [f"shard-{i:02d}" for i in range(6)]
Seen = list[VersionSet]


@pytest.fixture
def world(
    tmp_path: Path, etcd_endpoint: str, postgres_url: str, kafka_bootstrap: str
) -> Iterator[dict[str, str]]:
    clear_keyspace(etcd_endpoint)
    with scratch_postgres(postgres_url, prefix="meridian_sets") as url:
        yield prepare_world(tmp_path / "world", etcd_endpoint, url, kafka_bootstrap)


@pytest.fixture
async def agents(
    tmp_path: Path, world: dict[str, str], stack_settings: Settings
) -> AsyncIterator[dict[str, AgentProcess]]:
    wan = f"127.0.0.1:{wan_proxy_port(stack_settings)}"
    envs = {r: world for r in REGIONS} | {"eu-west": {**world, "MERIDIAN_KAFKA": wan}}
    procs = {r: AgentProcess(r, tmp_path / r, envs[r], tmp_path / f"{r}.log") for r in REGIONS}
    try:
        await asyncio.gather(*(asyncio.to_thread(p.start, 90) for p in procs.values()))
        yield procs
    finally:
        await asyncio.gather(*(asyncio.to_thread(p.stop) for p in procs.values()))


@pytest.fixture
def faults(toxiproxy_url: str) -> Iterator[ToxiproxyClient]:
    client = ToxiproxyClient(toxiproxy_url)
    yield client
    client.enable(KAFKA_WAN_PROXY)  # whatever happened, the next test finds it healed


def content(key: str, step: int) -> bytes:
    return f"{key} of step {step} ".encode() * 64


async def chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


def set_lines(repl: ReplicatorProcess, dataset: str) -> list[dict[str, object]]:
    """The replicator's `set_event_applied` lines of `dataset`, in log order."""
    out = []
    for raw in repl.log().splitlines():
        if '"set_event_applied"' not in raw:
            continue
        line = json.loads(raw)
        if line.get("event") == "set_event_applied" and line.get("dataset") == dataset:
            out.append(line)
    return out


async def eventually(
    probe: Callable[[], Awaitable[object]], want: Callable[[object], bool], what: str
) -> None:
    """Poll another process until `want(probe())`, bounded in time."""
    deadline = time.monotonic() + 90
    got: object = None
    while time.monotonic() < deadline:
        got = await probe()
        if want(got):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what}: still {got!r} after 90 s")


async def latest(client: AgentClient, dataset: str) -> VersionSet | None:
    try:
        return await client.get_set(dataset)
    except NotFoundError:
        return None


async def read_sets(
    client: AgentClient, dataset: str, steps: dict[VersionSet, int], last: Callable[[], object]
) -> Seen:
    """Poll `GetSet latest` until it answers `last()` (bounded); each time the answer
    changes, read every member at the set's version and check it is that set's content
    (the agents keep 2 versions of a key, so step-1's members outlive step-2's arrival)."""
    seen: Seen = []
    deadline = time.monotonic() + 240
    for _ in range(100_000):
        if time.monotonic() > deadline or (seen and seen[-1] == last()):
            break
        got = await latest(client, dataset)
        if got is not None and (not seen or got != seen[-1]):
            seen.append(got)
            step = steps.get(got)
            if step is not None:  # an unknown set fails the test below, with the list
                for m in got.members:
                    _, data = await client.get_bytes(dataset, m.key, version=m.version)
                    assert data == content(m.key, step), f"{m.key} of {got.id} is not its content"
        await asyncio.sleep(0.02)
    return seen


async def test_a_set_shows_in_another_region_only_whole_once_and_never_outside_the_residency(
    world: dict[str, str],
    agents: dict[str, AgentProcess],
    faults: ToxiproxyClient,
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    repls = {
        r: ReplicatorProcess(r, agents[r].address, world, tmp_path / f"repl-{r}").start()
        for r in ("eu-central", "us-east")
    }
    ds = f"eu/sets-{uuid.uuid4().hex[:8]}"
    try:
        await asyncio.gather(*(p.wait_log("replicator_started") for p in repls.values()))
        async with (
            AgentClient(agents["eu-west"].address) as west,
            AgentClient(agents["eu-central"].address) as central,
            AgentClient(agents["us-east"].address) as east,
        ):

            async def write_set(step: int) -> VersionSet:
                versions: dict[str, Version] = {}
                for k in KEYS:
                    versions[k] = await west.put(ds, k, chunks(content(k, step)))
                return await west.commit_set(
                    ds, f"step-{step}", {k: v.hlc for k, v in versions.items()}
                )

            # 1. Written and replicated as usual.
            step1 = await write_set(1)
            await eventually(lambda: latest(central, ds), lambda got: got == step1, "step-1")

            steps: dict[VersionSet, int] = {step1: 1}
            want: list[object] = [None]  # the set the reader stops at, once it is known
            reader = asyncio.create_task(read_sets(central, ds, steps, lambda: want[0]))
            # 2. eu-west's events held back in its outbox; the set's event goes alone.
            faults.disable(KAFKA_WAN_PROXY)
            try:
                step2 = await write_set(2)
                steps[step2], want[0] = 2, step2
                early = SetEvent(
                    event_id=f"early-{uuid.uuid4().hex}",
                    version_set=step2,
                    origin_region="eu-west",
                    policy_revision=1,
                )
                record = (early.log_key.encode(), encode_set_event(early))
                await publish(kafka_bootstrap, [record])

                async def central_early() -> list[object]:
                    lines = set_lines(repls["eu-central"], ds)
                    return [ln["outcome"] for ln in lines if ln["event_id"] == early.event_id]

                await eventually(central_early, lambda got: got == ["applied"], "early set")
                # Recorded in eu-central, not one member there: not visible.
                assert await central.get_set(ds) == step1
                with pytest.raises(UnavailableError, match="0 of its 6 members"):
                    await central.get_set(ds, "step-2")
            finally:
                faults.enable(KAFKA_WAN_PROXY)
            try:
                seen = await asyncio.wait_for(reader, 250)
            finally:
                reader.cancel()  # a failure above leaves it polling: not past the test
            # step-1 until step-2 was whole, then step-2 (each read member by member): no
            # mix, no set nobody committed, nothing in between.
            assert seen == [step1, step2], seen

            # 3. The origin's own copy of the event came later: the same set.
            async def step2_outcomes() -> list[object]:
                lines = set_lines(repls["eu-central"], ds)
                return [ln["outcome"] for ln in lines if ln["set"] == "step-2"]

            await eventually(
                step2_outcomes, lambda got: got == ["applied", "same"], "the origin's step-2"
            )
            await publish(kafka_bootstrap, [record])  # a replay of the very same event
            await eventually(central_early, lambda got: got == ["applied", "same"], "the replay")
            assert await central.get_set(ds) == step2
            assert await central.get_set(ds, "step-1") == step1
            assert await step2_outcomes() == ["applied", "same", "same"]  # one effect

            # 4. us-east read all four set events of the dataset and skipped each.
            async def east_lines() -> list[object]:
                return [ln["outcome"] for ln in set_lines(repls["us-east"], ds)]

            await eventually(east_lines, lambda got: got == ["skipped"] * 4, "us-east")
            assert await latest(east, ds) is None
            for k in KEYS:
                with pytest.raises(NotFoundError):
                    await east.stat(ds, k)
    finally:
        codes = {r: p.terminate() for r, p in repls.items()}
    assert codes == {"eu-central": 0, "us-east": 0}, repls["eu-central"].log()[-3000:]
