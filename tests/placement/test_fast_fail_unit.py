"""The fast-fail detector's parts over a fake coordination port and real loopback
sockets: what a probe counts as a refusal, whom an agent watches, that a lone agent
watches nobody, a watched in-process gRPC server stopping is marked down, and a peer
with two watchers only once both have voted."""

from __future__ import annotations

import asyncio
import json
import socket

import grpc
import waiting
from fakes.coordination import MemoryCoordination
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from agents.placement import Member, Members, MembershipWatch
from agents.placement.fastfail import FastFailDetector, Probe, neighbours, probe, watchers_of
from controlplane.coordination.protocols import keys
from controlplane.loopback import free_port


async def test_a_closed_port_is_refused_and_a_listening_one_answers() -> None:
    port = free_port()
    assert await probe(f"127.0.0.1:{port}") is Probe.REFUSED
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen(4)
        assert await probe(f"127.0.0.1:{port}") is Probe.ANSWERED
        assert await probe(f"localhost:{port}") is not Probe.REFUSED  # one address answers


async def test_what_is_not_a_refusal_gives_no_verdict() -> None:
    assert await probe("no-such-host.invalid:80", timeout_s=2) is Probe.UNKNOWN
    assert await probe("not an endpoint") is Probe.UNKNOWN


def test_each_agent_watches_the_next_two_by_id() -> None:
    members = Members("r", {i: Member(i, f"h:{i}") for i in ("a", "b", "c", "d")})
    assert [m.agent_id for m in neighbours(members, "a")] == ["b", "c"]
    assert [m.agent_id for m in neighbours(members, "c")] == ["d", "a"]
    assert [m.agent_id for m in neighbours(members, "d")] == ["a", "b"]
    # Every agent is watched by two peers.
    watchers = [n.agent_id for me in members.all for n in neighbours(members, me)]
    assert sorted(watchers) == ["a", "a", "b", "b", "c", "c", "d", "d"]
    assert [m.agent_id for m in neighbours(members, "z")] == ["a", "b"]  # not registered
    two = Members("r", {i: Member(i, f"h:{i}") for i in ("a", "b")})
    assert [m.agent_id for m in neighbours(two, "b")] == ["a"]
    assert neighbours(Members("r", {"a": Member("a", "h:a")}), "a") == []


def registration(agent_id: str, endpoint: str) -> bytes:
    return json.dumps({"id": agent_id, "endpoint": endpoint}).encode()


async def test_a_lone_agent_watches_nobody() -> None:
    coord = MemoryCoordination()
    lease = await coord.grant(10)
    await coord.put(keys.agent("r", "a"), registration("a", "127.0.0.1:1"), lease=lease.id)
    async with (
        MembershipWatch(coord, "r") as watch,
        FastFailDetector(coord, watch, "a") as detector,
    ):
        assert detector.watched == []


async def serving_server(port: int) -> grpc.aio.Server:
    """An in-process gRPC server on `port` whose health watches answer SERVING."""
    server = grpc.aio.server()
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await checks.set("", health_pb2.HealthCheckResponse.SERVING)
    return server


async def test_a_watched_server_that_stops_is_marked_down_by_its_lease() -> None:
    coord = MemoryCoordination()
    port = free_port()
    server = await serving_server(port)
    try:
        mine, theirs = await coord.grant(10), await coord.grant(10)
        await coord.put(keys.agent("r", "a"), registration("a", "127.0.0.1:1"), lease=mine.id)
        endpoint = f"127.0.0.1:{port}"
        await coord.put(keys.agent("r", "b"), registration("b", endpoint), lease=theirs.id)
        async with (
            MembershipWatch(coord, "r") as watch,
            FastFailDetector(coord, watch, "a", confirm_after_s=0.05) as detector,
        ):
            assert detector.watched == ["b"]
            await waiting.until(
                lambda: detector.seen_serving == ["b"], 5, "the detector's health watch"
            )
            await server.stop(None)
            await waiting.until(lambda: not detector.watched, 5, "b to be marked down")
            assert [(w.agent_id, w.lease) for w in detector.marked_down] == [("b", theirs.id)]
            assert await coord.get(keys.agent("r", "b")) is None
            assert await coord.get(keys.agent("r", "a")) is not None
    finally:
        await server.stop(None)


def test_a_peer_with_two_watchers_needs_both_and_one_with_one_needs_one() -> None:
    members = Members("r", {i: Member(i, f"h:{i}") for i in ("a", "b", "c", "d")})
    assert watchers_of(members, "c") == ["a", "b"]
    assert watchers_of(members, "a") == ["c", "d"]
    two = Members("r", {i: Member(i, f"h:{i}") for i in ("a", "b")})
    assert watchers_of(two, "b") == ["a"]


async def test_a_refusal_only_one_watcher_sees_marks_nobody_down_until_the_other_votes() -> None:
    coord = MemoryCoordination()
    port = free_port()
    server = await serving_server(port)
    registry = CollectorRegistry()

    def outcomes(name: str) -> float:
        found = registry.get_sample_value("meridian_fast_fail_total", {"outcome": name})
        return found or 0.0

    try:
        leases = {name: (await coord.grant(30)).id for name in ("a", "b", "c")}
        endpoints = {"a": "127.0.0.1:1", "b": f"127.0.0.1:{port}", "c": "127.0.0.1:1"}
        for name, lease in leases.items():
            await coord.put(keys.agent("r", name), registration(name, endpoints[name]), lease=lease)
        async with (
            MembershipWatch(coord, "r") as watch,
            FastFailDetector(
                coord,
                watch,
                "a",
                confirm_after_s=0.05,
                agree_wait_s=0.3,
                retry_initial_s=0.05,
                retry_max_s=0.2,
                registry=registry,
            ) as detector,
        ):
            # c watches b too (c's own endpoint never answers, so a never checks it).
            assert watchers_of(watch.current, "b") == ["a", "c"]
            await waiting.until(
                lambda: detector.seen_serving == ["b"], 5, "the detector's health watch"
            )
            await server.stop(None)
            # a's refusal is confirmed and it votes, but c never does: b stays.
            await waiting.until(lambda: outcomes("not_agreed") >= 2, 10, "two unagreed votes")
            assert await coord.get(keys.agent("r", "b")) is not None
            assert detector.marked_down == []
            # A vote from an agent that does not watch b does not count.
            vote = await coord.grant(30)
            await coord.put(keys.down_votes("r", "b", leases["b"]) + "zz", b"", lease=vote.id)
            await waiting.until(lambda: outcomes("not_agreed") >= 4, 10, "two more unagreed")
            assert await coord.get(keys.agent("r", "b")) is not None
            # Then c votes (as the other watcher would), but has claimed the revoke: a,
            # agreeing, leaves it to c and only watches b again.
            votes = keys.down_votes("r", "b", leases["b"])
            claim = votes.rstrip("/") + ".revoke"
            await coord.put(claim, b"c", lease=vote.id)
            await coord.put(votes + "c", b"", lease=vote.id)
            await asyncio.sleep(0.5)  # the window: a must not revoke meanwhile
            assert detector.marked_down == []
            assert await coord.get(keys.agent("r", "b")) is not None
            # c never revoked (it died, say): once its claim is gone, a revokes.
            await coord.delete(claim)
            await waiting.until(lambda: bool(detector.marked_down), 10, "b to be marked down")
            assert [(w.agent_id, w.lease) for w in detector.marked_down] == [("b", leases["b"])]
            assert await coord.get(keys.agent("r", "b")) is None
            assert outcomes("marked_down") == 1
    finally:
        await server.stop(None)
