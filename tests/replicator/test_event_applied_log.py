"""One `event_applied` log line per event: the chaos suite's change-log checker reads it
(chaos/records.py, `applies_from_replicator_log`), so its fields are a contract."""

from __future__ import annotations

import json

import repl_builders as b
from repl_rig import Rig
from structlog.testing import capture_logs

from chaos.records import applies_from_replicator_log
from controlplane.domain.hlc import system_ms
from controlplane.ports.changelog import Record


async def test_every_event_logs_one_apply_record_the_chaos_suite_parses(rig: Rig) -> None:
    t = system_ms() - 10_000
    put = b.put("a", b"v1", wall_ms=t)
    own = b.put("b", b"mine", wall_ms=t, origin=rig.applier.region, event_id="own-1")
    with capture_logs() as logs:
        for i, e in enumerate((put, put, own)):
            await rig.applier.handle(Record("meridian.changes", 0, i, b"k", b.value(e)))
    lines = [json.dumps(entry) for entry in logs if entry["event"] == "event_applied"]
    records = applies_from_replicator_log(lines, "captured")
    assert [(r.event_id, r.outcome) for r in records] == [
        (put.event_id, "applied"),
        (put.event_id, "superseded"),  # the replay: held already, no second effect
        ("own-1", "own"),
    ]
    assert {r.region for r in records} == {rig.applier.region}
    assert records[0].version == str(put.version.hlc)
    assert (records[0].dataset, records[0].key) == (put.dataset, "a")
