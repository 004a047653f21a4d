"""Settings: one prefix, units in names, one clear error for a malformed value."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from controlplane.errors import ConfigError
from controlplane.settings import find_home, load_settings, parse_endpoints


def test_environment_with_prefix_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MERIDIAN_ETCD", "10.0.0.1:2379, 10.0.0.2:2379")
    monkeypatch.setenv("MERIDIAN_LEASE_TTL_S", "7")
    monkeypatch.setenv("ETCD", "ignored:1")
    settings = load_settings()
    assert settings.etcd_endpoints == [("10.0.0.1", 2379), ("10.0.0.2", 2379)]
    assert settings.lease_ttl_s == 7


def test_flags_override_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MERIDIAN_KAFKA", "a:1")
    assert load_settings(kafka="b:2", etcd=None).kafka_bootstrap == [("b", 2)]


def test_defaults_point_at_the_local_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MERIDIAN_ETCD", "MERIDIAN_KAFKA", "MERIDIAN_CATALOG"):
        monkeypatch.delenv(name, raising=False)
    settings = load_settings()
    assert settings.etcd_endpoints == [("127.0.0.1", 2379)]
    assert settings.catalog.startswith("sqlite:///")


@pytest.mark.parametrize("raw", ["localhost", "host:", ":2379", "host:99999", "a:1,b"])
def test_malformed_endpoint_is_one_clear_error(raw: str) -> None:
    with pytest.raises(ConfigError, match=r"MERIDIAN_ETCD holds .* not host:port"):
        parse_endpoints(raw, setting="MERIDIAN_ETCD")


def test_malformed_endpoint_from_environment_fails_at_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MERIDIAN_KAFKA", "broker-without-port")
    with pytest.raises(ConfigError, match="MERIDIAN_KAFKA"):
        load_settings()


def test_wrong_type_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MERIDIAN_LEASE_TTL_S", "five")
    with pytest.raises(ConfigError, match=r"lease_ttl_s \(MERIDIAN_LEASE_TTL_S\) is invalid"):
        load_settings()


def test_out_of_range_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MERIDIAN_LEASE_TTL_S", "0")
    with pytest.raises(ConfigError, match="LEASE_TTL_S"):
        load_settings()


def test_home_is_found_from_a_subfolder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".meridian").mkdir()
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    monkeypatch.delenv("MERIDIAN_HOME", raising=False)
    monkeypatch.chdir(deep)
    assert load_settings().home == tmp_path.resolve() / ".meridian"
    assert find_home(tmp_path / "a") == tmp_path.resolve() / ".meridian"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [("https://h:2379", "no TLS yet"), ("[::1]:2379", "IPv6 endpoints are not supported")],
)
def test_endpoints_that_could_not_work_are_refused(raw: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        parse_endpoints(raw, setting="MERIDIAN_ETCD")


def test_each_setting_suggests_its_own_example() -> None:
    with pytest.raises(ConfigError, match=r"such as 127\.0\.0\.1:9092"):
        parse_endpoints("x", setting="MERIDIAN_KAFKA")


@pytest.mark.parametrize(
    ("name", "value"),
    [("MERIDIAN_STACK_ETCD_PORT", "65535"), ("MERIDIAN_STACK_KAFKA_PORT", "60000")],
)
def test_stack_ports_whose_derived_ports_overflow_are_refused(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=name):
        load_settings()


def test_stack_commands_ignore_client_endpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MERIDIAN_KAFKA", "x")
    assert load_settings(check_endpoints=False).kafka == "x"


def test_data_plane_settings_have_the_spec_defaults_and_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = load_settings()
    assert (settings.max_clock_skew_ms, settings.tombstone_retention_s) == (1000, 7 * 86400)
    assert (settings.inline_max_bytes, settings.bundle_max_bytes) == (256 * 1024, 1 << 20)
    monkeypatch.setenv("MERIDIAN_INLINE_MAX_BYTES", str(2 << 20))  # over one message's 1 MiB
    with pytest.raises(ConfigError, match="MERIDIAN_INLINE_MAX_BYTES"):
        load_settings()


def test_agent_routes_override_registered_endpoints_and_bad_ones_are_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MERIDIAN_AGENT_ROUTES", "us-east=127.0.0.1:7001, eu-central=localhost:7002")
    settings = load_settings()
    assert settings.agent_address("us-east", "10.0.0.5:50051") == "127.0.0.1:7001"
    assert settings.agent_address("eu-west", "10.0.0.6:50051") == "10.0.0.6:50051"
    monkeypatch.setenv("MERIDIAN_AGENT_ROUTES", "us-east127.0.0.1:7001")
    with pytest.raises(
        ConfigError, match=re.escape("MERIDIAN_AGENT_ROUTES: 'us-east127.0.0.1:7001'")
    ):
        load_settings()


def test_a_bad_endpoint_is_blamed_on_where_it_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MERIDIAN_ETCD", "from the env")
    with pytest.raises(ConfigError, match=r"^--etcd holds 'from a flag', which is not host:port"):
        load_settings(etcd="from a flag")
    with pytest.raises(ConfigError, match=r"^MERIDIAN_ETCD holds 'from the env', which is not"):
        load_settings()
    monkeypatch.delenv("MERIDIAN_ETCD")
    with pytest.raises(ConfigError, match=r"^--kafka holds 'k', which is not host:port"):
        load_settings(kafka="k")
