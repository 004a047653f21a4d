"""Helpers of the records tests: the example catalog, constants, bounded waiting, and
reading `meridian.changes` back (test scaffolding; a name of its own, so that test
folders collected together do not shadow each other's modules)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

from agents.store import ObjectStore
from controlplane.adapters.kafka import CHANGES_TOPIC, KafkaConsumer
from controlplane.catalog.api import Catalog, open_catalog
from controlplane.policy.apply import apply_policy
from controlplane.policy.compiler import compile_files
from controlplane.policy.placer import place
from controlplane.ports.changelog import Record

EXAMPLE = Path(__file__).parents[1] / "policy" / "data" / "example.yaml"
REGION = "eu-west"
DATASET = "corpus/web"  # standard, residency EU and US

StoreFactory = Callable[..., ObjectStore]


def applied_catalog(url: str) -> Catalog:
    """The catalog at `url` with the example policy applied (its regions and datasets)."""
    catalog = open_catalog(url, placer=place)
    policy, problems = compile_files([EXAMPLE])
    if policy is None:
        raise RuntimeError(f"the example policy does not compile: {problems}")
    apply_policy(catalog, policy, source="test", publisher=None, applied_by="tester")
    return catalog


async def records_of(
    bootstrap: str, dataset: str, *, at_least: int, timeout_s: float = 60.0
) -> list[Record]:
    """The records of `meridian.changes` whose key is `dataset/...`, from the start of the
    topic in a fresh consumer group: polls until `at_least` arrived and a poll then
    comes back empty (so duplicates written after them are seen too)."""
    prefix = f"{dataset}/".encode()
    consumer = KafkaConsumer(
        bootstrap, topics=[CHANGES_TOPIC.name], group_id=f"records-test-{uuid.uuid4().hex[:8]}"
    )
    found: list[Record] = []
    deadline = time.monotonic() + timeout_s
    async with consumer:
        while time.monotonic() < deadline:
            batch = await consumer.poll(max_records=1000, timeout_ms=1000)
            found += [r for r in batch if r.key is not None and r.key.startswith(prefix)]
            if not batch and len(found) >= at_least:
                return found
    raise AssertionError(
        f"read {len(found)} records of {dataset} in {timeout_s} s, expected {at_least}"
    )
