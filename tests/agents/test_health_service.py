"""The standard gRPC health service (grpc.health.v1) on the agent's API port, which the
Helm chart's startup, readiness and liveness probes ask (deploy/helm/meridian)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from agent_api_helpers import TIMEOUT_S, Agent, start_agent, stop_agent
from grpc_health.v1 import health_pb2, health_pb2_grpc
from ruamel.yaml import YAML

from agents.service import stop_server

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "meridian"


async def check(agent: Agent, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(agent.channel)
    response = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT_S)
    status: int = response.status
    return status


async def test_the_server_and_the_agent_api_report_serving(agent: Agent) -> None:
    assert await check(agent, "") == SERVING  # what a probe without `service` asks
    assert await check(agent, "meridian.v1.Agent") == SERVING
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await check(agent, "meridian.v1.Nothing")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def test_health_turns_not_serving_as_soon_as_a_stop_begins(tmp_path: Path) -> None:
    agent = await start_agent(tmp_path / "root")
    try:
        watch = health_pb2_grpc.HealthStub(agent.channel).Watch(
            health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT_S
        )
        seen = [(await watch.read()).status]
        stopping = asyncio.ensure_future(stop_server(agent.server, 2.0))
        seen.append((await asyncio.wait_for(watch.read(), TIMEOUT_S)).status)
        assert seen == [SERVING, NOT_SERVING]
        await stopping
    finally:
        await stop_agent(agent)


def test_the_charts_probes_ask_grpc_health_on_the_api_port() -> None:
    # The probes must use the gRPC health protocol on the port the agent serves its
    # API on, with no service name (the agent answers "" for the whole server).
    values = YAML(typ="safe").load((CHART / "values.yaml").read_text())
    template = (CHART / "templates" / "agent.yaml").read_text()
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        block = template.split(f"{probe}:", 1)[1].split("\n")[1]
        assert block.strip() == "grpc: {port: {{ .Values.agent.grpcPort }}}", probe
    assert "containerPort: {{ .Values.agent.grpcPort }}" in template
    assert "--listen=0.0.0.0:{{ .Values.agent.grpcPort }}" in template
    assert isinstance(values["agent"]["grpcPort"], int)
