"""Pytest fixtures for catalog tests (imported by the conftest of each test folder).

A fresh, migrated catalog per test, on SQLite and on the stack's PostgreSQL. Only
tests import this module; pytest is a development dependency.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.catalogs import scratch_catalog


def server_postgres_url(request: pytest.FixtureRequest) -> str:
    """The stack's PostgreSQL (session fixture `postgres_url`), else
    MERIDIAN_TEST_POSTGRES_URL; failing loudly when neither exists (no silent skip)."""
    try:
        return str(request.getfixturevalue("postgres_url"))
    except pytest.FixtureLookupError:
        url = os.environ.get("MERIDIAN_TEST_POSTGRES_URL")
        if not url:
            pytest.fail("no PostgreSQL: start the stack or set MERIDIAN_TEST_POSTGRES_URL")
        return url


BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)]


@pytest.fixture(params=BACKENDS)
def catalog_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh catalog migrated to head."""
    pg = server_postgres_url(request) if request.param == "postgresql" else None
    with scratch_catalog(request.param, tmp_path, pg) as url:
        yield url


@pytest.fixture(params=BACKENDS)
def empty_catalog_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database with no schema at all."""
    pg = server_postgres_url(request) if request.param == "postgresql" else None
    with scratch_catalog(request.param, tmp_path, pg, migrated=False) as url:
        yield url
