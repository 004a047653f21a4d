"""Constants and helpers of the records tests (a module of its own: test folders each
have a conftest, and `from conftest import` would find another folder's)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agents.store import ObjectStore
from controlplane.catalog.api import Catalog, open_catalog
from controlplane.policy.apply import apply_policy
from controlplane.policy.compiler import compile_files
from controlplane.policy.placer import place

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
