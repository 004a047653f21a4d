"""The replicator's journal for a batch (`handle_many`): a version the agent answers
APPLIED in an `apply_many` call is journalled by the agent itself (its version and
transfer rows, in the same commit as the data), so the replicator writes no
`completed` row of its own; a version already held (SAME, a replay) still gets one,
as does anything applied one by one."""

from __future__ import annotations

import repl_builders as b
from repl_rig import Rig

from controlplane.domain.hlc import system_ms


async def test_a_batch_journals_no_completed_row_for_what_the_agent_applied(rig: Rig) -> None:
    t = system_ms() - 1_000
    first = [b.put(f"k{i}", wall_ms=t) for i in range(3)]
    results = await rig.applier.handle_many([b.rec_of(e, n) for n, e in enumerate(first)])
    assert results == ["applied"] * 3
    assert len(rig.agent.batches) == 1  # one apply_many call: the batch path
    assert rig.journal.pending() == []

    # A replay of the same events: the agent already holds them (SAME) and journals
    # nothing, so the replicator's own row is what says the replica is complete.
    again = await rig.applier.handle_many([b.rec_of(e, n) for n, e in enumerate(first)])
    assert again == ["same"] * 3
    rows = rig.journal.pending()
    assert sorted((x.record.key, x.record.state) for x in rows) == [
        (f"k{i}", "completed") for i in range(3)
    ]


async def test_an_event_applied_alone_still_journals_its_completed_row(rig: Rig) -> None:
    event = b.put("alone", wall_ms=system_ms() - 1_000)
    assert await rig.applier.handle_many([b.rec_of(event, 0)]) == ["applied"]
    assert [(x.record.key, x.record.state) for x in rig.journal.pending()] == [
        ("alone", "completed")
    ]
