"""Session fixtures: the real engines, started with the same code as `meridian stack up`.

If the stack is already up (as in CI, where .ci/run starts it), the fixtures only
health-check it; what they start themselves they stop at the end. A service that
cannot start fails the tests that need it: nothing is ever skipped for a missing
engine.
"""

from __future__ import annotations

import os

# Before anything imports grpc: with fork support on (grpcio's default now), a child
# forked with a `preexec_fn` (harness/children.py: every agent and controller) restarts
# grpc's poller thread between fork and exec, and `close_fds` then closes its epoll
# descriptor: the child aborts ("epoll_wait error: Bad file descriptor") before it ever
# runs (grpc/grpc#43055, seen in this suite's runs). The tests' children exec at once
# and never use the parent's grpc, so the handlers have nothing to do for them.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import pytest
from harness.children import install_signal_handlers
from sqlalchemy.orm import Session

from controlplane.catalog.engine import make_engine
from controlplane.settings import Settings, load_settings
from controlplane.stack.manager import Stack
from controlplane.stack.postgres import postgres_url as make_postgres_url


def pytest_configure(config: pytest.Config) -> None:
    # A pytest terminated by `timeout` or CI never runs the fixtures' teardown: the
    # agents and controllers it started must not outlive it (harness/children.py).
    install_signal_handlers()


@pytest.fixture(scope="session")
def stack_settings() -> Iterator[Settings]:
    base = load_settings()
    stack = Stack(base)
    report = stack.up(postgres=True)
    settings = load_settings(
        etcd=f"127.0.0.1:{base.stack_etcd_port}",
        kafka=f"127.0.0.1:{base.stack_kafka_port}",
        toxiproxy=f"127.0.0.1:{base.stack_toxiproxy_port}",
    )
    yield settings
    services = stack.services()
    for name in reversed(report.started):
        services[name].stop()


@pytest.fixture(scope="session")
def etcd_endpoint(stack_settings: Settings) -> str:
    host, port = stack_settings.etcd_endpoints[0]
    return f"{host}:{port}"


@pytest.fixture(scope="session")
def kafka_bootstrap(stack_settings: Settings) -> str:
    return stack_settings.kafka


@pytest.fixture(scope="session")
def toxiproxy_url(stack_settings: Settings) -> str:
    return f"http://{stack_settings.toxiproxy}"


@pytest.fixture(scope="session")
def postgres_url(stack_settings: Settings) -> str:
    return make_postgres_url(stack_settings.stack_postgres_port)


SqlSession = Callable[[str], AbstractContextManager[Session]]


@pytest.fixture
def sql() -> SqlSession:
    """Raw SQL into a catalog, for tests that assert on rows the API does not show
    (the catalog keeps its own sessions private)."""

    @contextmanager
    def open_sql(url: str) -> Iterator[Session]:
        engine = make_engine(url)
        try:
            with Session(engine) as session:
                yield session
        finally:
            engine.dispose()

    return open_sql
