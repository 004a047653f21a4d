"""The private stack's ports and its Kafka's per-region listeners (no engine started)."""

from __future__ import annotations

from pathlib import Path

from chaos.stack import PORT_OFFSET, private_settings, region_wan_port, regional_properties
from controlplane.settings import load_settings


def test_private_ports_are_the_stack_ports_plus_the_offset(tmp_path: Path) -> None:
    base = load_settings(check_endpoints=False, home=tmp_path, stack_etcd_port=9379)
    private = private_settings(base)
    assert private.stack_etcd_port == 9379 + PORT_OFFSET
    assert private.stack_kafka_port == base.stack_kafka_port + PORT_OFFSET
    assert private.home == tmp_path / "chaos"


def test_each_region_has_a_listener_advertised_at_its_own_proxy(tmp_path: Path) -> None:
    s = load_settings(check_endpoints=False, home=tmp_path, stack_kafka_port=29742)
    props = dict(
        line.split("=", 1) for line in regional_properties(s, tmp_path).splitlines() if "=" in line
    )
    listeners = props["listeners"].split(",")
    advertised = props["advertised.listeners"].split(",")
    for i in range(4):
        assert f"WAN{i}://127.0.0.1:{29742 + 3 + i}" in listeners
        assert f"WAN{i}://127.0.0.1:{region_wan_port(s, i)}" in advertised
        assert f"WAN{i}:PLAINTEXT" in props["listener.security.protocol.map"]
    assert len({region_wan_port(s, i) for i in range(4)}) == 4
