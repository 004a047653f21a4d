"""A chaos world's teardown drops its Toxiproxy proxies whatever failed before it.

A proxy left behind keeps its listen port (the fixed Kafka WAN ports among them) in
Toxiproxy until the stack stops, so the next world of the session could not make its
own. Fakes stand in for the world's parts: what is checked is `close_world`'s order.
"""

from __future__ import annotations

from typing import Any, cast

import pytest

from chaos.runner import OpenWorld, close_world


class Parts:
    def __init__(self, *, fail: str | None = None) -> None:
        self.fail = fail
        self.done: list[str] = []
        self.world = self  # the world, its Toxiproxy client and the sampler in one
        self.toxi = self

    def _step(self, name: str) -> None:
        self.done.append(name)
        if self.fail == name:
            raise RuntimeError(f"{name} failed")

    async def stop(self) -> None:
        self._step("sampler.stop")

    def stop_all(self) -> None:
        self._step("stop_all")

    async def heal(self) -> None:
        self._step("heal")

    async def drop_proxies(self) -> None:
        self._step("drop_proxies")

    async def close(self) -> None:
        self._step("toxi.close")

    def drop_catalog(self) -> None:
        self._step("drop_catalog")


def opened(parts: Parts) -> OpenWorld:
    fake = cast(Any, parts)
    return OpenWorld(stack=fake, world=fake, sampler=fake, kind=(True, 0, None))


async def test_a_clean_teardown_runs_every_step_in_order() -> None:
    parts = Parts()
    await close_world(opened(parts))
    assert parts.done == [
        "sampler.stop",
        "stop_all",
        "heal",
        "drop_proxies",
        "toxi.close",
        "drop_catalog",
    ]


@pytest.mark.parametrize("fail", ["sampler.stop", "stop_all"])
async def test_the_proxies_are_dropped_when_stopping_the_processes_fails(fail: str) -> None:
    parts = Parts(fail=fail)
    with pytest.raises(RuntimeError, match=fail):
        await close_world(opened(parts))
    assert parts.done[-2:] == ["drop_proxies", "toxi.close"]


async def test_the_client_is_closed_when_dropping_the_proxies_fails() -> None:
    parts = Parts(fail="drop_proxies")
    with pytest.raises(RuntimeError, match="drop_proxies"):
        await close_world(opened(parts))
    assert parts.done[-1] == "toxi.close"
    assert "drop_catalog" not in parts.done  # a failed world's catalog is kept


def test_the_fakes_cover_what_close_world_calls() -> None:
    # The chaos world's real methods have these names (a rename must fail here too).
    from chaos.world import ChaosWorld

    for name in ("stop_all", "heal", "drop_proxies", "drop_catalog"):
        assert callable(getattr(ChaosWorld, name))
