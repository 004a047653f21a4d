"""A standby whose campaign fails logs no `step_down`: it had no term to end.

Operators and alerts read `step_down` (and `meridian_controller_step_downs_total`) as
"this region's active controller lost its term". A standby retrying its campaign
while etcd is unreachable logs `campaign_retry` and `campaign_ended` instead, and
still starts its next term recovering (it saw etcd fail, most likely an outage).
"""

from __future__ import annotations

from fakes.catalog import MemoryJournal
from fakes.coordination import ManualClock, MemoryCoordination
from structlog.testing import capture_logs
from waiting import until

from controlplane.controller.config import ControllerConfig
from controlplane.controller.daemon import RegionController


async def test_a_failed_campaign_is_not_logged_or_counted_as_a_step_down() -> None:
    coord = MemoryCoordination(ManualClock())
    coord.set_unavailable(True)
    ctl = RegionController(
        coord,
        MemoryJournal(),
        None,
        ControllerConfig("eu-west", "w", lease_ttl_s=2, retry_initial_s=0.01),
    )
    with capture_logs() as logs:
        await ctl.election.start()
        try:

            async def retried_twice() -> bool:
                return sum(e["event"] == "campaign_retry" for e in logs) >= 2

            await until(retried_twice, 10, what="two campaign retries")
        finally:
            await ctl.election.stop()
    events = [e["event"] for e in logs]
    assert "step_down" not in events, events
    ended = [e for e in logs if e["event"] == "campaign_ended"]
    assert ended and "unavailable" in str(ended[0]["why"])
    assert ctl.metrics.registry.get_sample_value("meridian_controller_step_downs_total") == 0
    assert not ctl.active.is_set()
    assert ctl._stepped_down  # the next term starts recovering, as after a step-down


async def test_an_active_controller_that_loses_its_term_logs_and_counts_a_step_down() -> None:
    ctl = RegionController(
        MemoryCoordination(ManualClock()), MemoryJournal(), None, ControllerConfig("eu-west", "w")
    )
    ctl.active.set()  # as _serve sets it once the term has begun
    with capture_logs() as logs:
        ctl._step_down("the lease was lost")
    assert [e["event"] for e in logs] == ["step_down"]
    assert ctl.metrics.registry.get_sample_value("meridian_controller_step_downs_total") == 1
    assert not ctl.active.is_set()
