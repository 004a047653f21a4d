"""A policy snapshot that cannot decide an event (its published rules do not rebuild,
for a dataset first seen after the apply) holds the event back, fails closed, instead
of ending its whole batch undone: once a readable policy is applied, every event of
the batch is applied and said done (so its offsets are committed)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import repl_builders as b
from repl_rig import RigFactory
from structlog.testing import capture_logs
from waiting import until

from controlplane.errors import InvalidInputError
from controlplane.policy.current import CompiledPolicy

NEW = "new/ds"  # first seen after the apply: placed by the published rules


class UnreadableRules:
    """A snapshot whose rules do not rebuild: a dataset it has no placement of raises."""

    def __init__(self, inner: CompiledPolicy) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def placement(self, dataset: str, labels: Mapping[str, str] | None = None) -> Any:
        if dataset not in self._inner.placements:
            raise InvalidInputError("meridian/policy: the published rules cannot be rebuilt")
        return self._inner.placement(dataset, labels)


async def test_an_event_the_policy_cannot_decide_waits_and_its_batch_is_not_lost(
    rig_factory: RigFactory,
) -> None:
    rig = rig_factory()
    rig.current[0] = UnreadableRules(b.policy())  # type: ignore[assignment]

    async def short_sleep(_s: float) -> None:
        await asyncio.sleep(0.01)

    rig.applier._sleep = short_sleep
    events = [b.put("a"), b.put("x", dataset=NEW), b.put("c")]
    records = [b.rec_of(e, offset=n) for n, e in enumerate(events)]
    done: list[int] = []

    def on_done(indices: Sequence[int]) -> None:
        done.extend(indices)

    with capture_logs() as logs:
        run = asyncio.create_task(rig.applier.handle_many(records, on_done))

        async def waiting_for_a_policy() -> bool:
            return any(e["event"] == "policy_cannot_decide" for e in logs)

        await until(waiting_for_a_policy, 10, what="the applier to wait for a readable policy")
        assert not run.done()
        # A readable policy that places the new dataset here too.
        rig.current[0] = b.policy(b.placement(), b.placement(dataset=NEW))
        results = await asyncio.wait_for(run, 10)
    assert results == ["applied", "applied", "applied"]
    assert sorted(done) == [0, 1, 2]
    assert {k for k in rig.agent.held} == {("corpus/web", "a"), (NEW, "x"), ("corpus/web", "c")}
    cannot = [e for e in logs if e["event"] == "policy_cannot_decide"]
    assert cannot[0]["dataset"] == NEW and "cannot be rebuilt" in str(cannot[0]["error"])


async def test_a_run_whose_apply_crashed_is_run_again_not_dropped(
    rig_factory: RigFactory,
) -> None:
    # A bug in the applier (it handles every failure of an event itself) must not drop
    # the run: its events would be left undone and its offsets never committed.
    rig = rig_factory(retry_initial_s=0.01, retry_max_s=0.02)
    handle_many = rig.applier.handle_many
    crashes = [1]

    async def crashing_once(*args: Any, **kwargs: Any) -> list[str]:
        if crashes[0]:
            crashes[0] -= 1
            raise RuntimeError("a bug")
        return await handle_many(*args, **kwargs)

    rig.applier.handle_many = crashing_once  # type: ignore[method-assign]
    rig.publish(b.put("a"), b.put("b"))
    with capture_logs() as logs:
        async with rig.loop():
            await b.until(rig.log.changed, lambda: rig.log.lag() == 0)
    assert crashes == [0]
    assert {k for _, k in rig.agent.held} == {"a", "b"}
    assert [e["event"] for e in logs if e["event"] in ("apply_crashed", "apply_retry")] == [
        "apply_crashed",
        "apply_retry",
    ]
