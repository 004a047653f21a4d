"""The agent process's runtime: its event loop and its collector (agents/daemon/runtime.py)."""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from agents.daemon import runtime


async def loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def ran_on(loop: runtime.Loop) -> str:
    seen: list[str] = []

    async def main() -> None:
        seen.append(await loop_module())

    runtime.run(main(), loop)
    return seen[0]


def test_the_agent_runs_on_uvloop_by_default_and_on_asyncio_when_told() -> None:
    assert ran_on("uvloop").startswith("uvloop")
    assert ran_on("asyncio").startswith("asyncio")


def test_without_uvloop_it_runs_on_asyncio_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    with capture_logs() as logs:
        assert ran_on("uvloop").startswith("asyncio")
    assert {
        "event": "agent_loop",
        "log_level": "warning",
        "wanted": "uvloop",
        "used": "asyncio",
        "reason": "not installed",
    } in logs


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.mark.usefixtures("restored_gc")
def test_settling_freezes_startup_and_collects_the_young_less_often() -> None:
    gc.unfreeze()
    runtime.settle_gc()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (runtime.GC_GEN0, runtime.GC_GEN1, runtime.GC_GEN2)
