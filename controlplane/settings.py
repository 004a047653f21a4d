"""Settings: the one place where `MERIDIAN_*` environment variables are read.

Units are in the names (`lease_ttl_s`, `kafka_request_timeout_ms`). Flags of the
CLI override the environment by passing keyword arguments to `load_settings`.
"""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from controlplane.errors import ConfigError

# A size in MERIDIAN_REGION_CACHE: bytes, or with a binary unit.
_SIZE = re.compile(r"^(\d+)(B|KiB|MiB|GiB|TiB)?$")
_SIZE_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}

HOME_DIR_NAME = ".meridian"


def find_home(start: Path | None = None) -> Path:
    """The nearest `.meridian` folder at or above the working directory (as git finds .git),
    so `meridian stack status` works from any subfolder; `./.meridian` if there is none."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / HOME_DIR_NAME).is_dir():
            return folder / HOME_DIR_NAME
    return Path(HOME_DIR_NAME)


EXAMPLE_ENDPOINT = {
    "MERIDIAN_ETCD": "127.0.0.1:2379",
    "MERIDIAN_KAFKA": "127.0.0.1:9092",
    "MERIDIAN_TOXIPROXY": "127.0.0.1:8474",
}


def parse_endpoints(raw: str, *, setting: str) -> list[tuple[str, int]]:
    """Parse `host:port[,host:port...]` into pairs, or raise one clear ConfigError."""
    example = EXAMPLE_ENDPOINT.get(setting, "127.0.0.1:2379")
    endpoints: list[tuple[str, int]] = []
    for part in raw.split(","):
        item = part.strip().removeprefix("http://")
        if "://" in item:
            raise ConfigError(
                f"{setting} holds {part.strip()!r}: only plain host:port endpoints are "
                f"supported (no TLS yet); give e.g. {example}"
            )
        if item.startswith("["):
            raise ConfigError(
                f"{setting} holds {part.strip()!r}: IPv6 endpoints are not supported yet; "
                f"give a host name or an IPv4 address, e.g. {example}"
            )
        host, sep, port_text = item.rpartition(":")
        if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ConfigError(
                f"{setting} holds {part.strip()!r}, which is not host:port; "
                f"give comma-separated endpoints such as {example}"
            )
        endpoints.append((host, int(port_text)))
    return endpoints


class Settings(BaseSettings):
    """Every knob of Meridian, read from `MERIDIAN_<NAME>` (case-insensitive)."""

    model_config = SettingsConfigDict(env_prefix="MERIDIAN_", extra="ignore", frozen=True)
    # The settings given as flags (load_settings' overrides): errors name those flags.
    _flags: frozenset[str] = PrivateAttr(default_factory=frozenset)

    home: Path = Field(
        default_factory=find_home, description="folder for engines and the stack's run data"
    )
    catalog: str = Field(
        "sqlite:///.meridian/catalog.db", description="SQLAlchemy URL of the catalog"
    )
    etcd: str = Field("127.0.0.1:2379", description="comma-separated etcd endpoints")
    kafka: str = Field("127.0.0.1:9092", description="comma-separated Kafka bootstrap servers")
    toxiproxy: str = Field("127.0.0.1:8474", description="Toxiproxy API endpoint")
    agent: str | None = Field(None, description="host:port of the agent `meridian object` talks to")
    kafka_advertised_host: str = Field(
        "127.0.0.1", description="host the local broker advertises to clients"
    )
    kafka_advertised_port: int | None = Field(
        None, description="port the local broker advertises (a Toxiproxy listener in chaos tests)"
    )
    kafka_request_timeout_ms: int = Field(30_000, gt=0)
    etcd_timeout_s: float = Field(5.0, gt=0)
    lease_ttl_s: int = Field(5, ge=1, le=3600)
    # Derived ports: etcd member i uses port + 10*i and its peer port + 1 (up to 5 members);
    # Kafka uses port + 1 (controller), + 2 (WAN listener) and + 10002 (its Toxiproxy proxy).
    stack_etcd_port: int = Field(2379, gt=0, le=65535 - 41)
    stack_kafka_port: int = Field(9092, gt=0, le=65535 - 10002)
    stack_toxiproxy_port: int = Field(8474, gt=0, lt=65536)
    # Below the ephemeral range (32768+): an outgoing connection can never hold it.
    stack_postgres_port: int = Field(15432, gt=0, lt=65536)
    stack_start_timeout_s: float = Field(120.0, gt=0)
    log_level: str = Field("info", description="debug, info, warning or error")
    # The data plane's knobs (spec/dataplane.md), read here like every other setting.
    max_clock_skew_ms: int = Field(
        1000, ge=0, description="a received version further ahead of our clock is not applied"
    )
    # A test knob (the chaos suite's clock-skew scenario): this process's HLC reads its
    # physical clock shifted by this many ms, so one region's clock can run ahead or
    # behind without touching the machine's clock.
    clock_offset_ms: int = Field(0, description="shift of the HLC's physical clock, ms")
    tombstone_retention_s: int = Field(
        7 * 24 * 3600, gt=0, description="how long a delete is kept so no older put resurrects"
    )
    tombstone_expiry_interval_s: float = Field(
        3600.0, gt=0, description="how often an agent forgets tombstones past the retention"
    )
    # The agent's store commits concurrent single writes in groups (one folder fsync
    # each and one SQLite transaction for the group); off: one by one (benchmarks).
    store_group_commit: bool = Field(True, description="the agent's store commits in groups")
    inline_max_bytes: int = Field(
        256 * 1024, ge=0, le=1024 * 1024, description="objects up to this ride in change events"
    )
    bundle_max_bytes: int = Field(
        1024 * 1024, ge=0, description="smaller objects to one region travel in one stream"
    )
    # How this process reaches other regions' agents when not at the endpoint they
    # registered: `region=host:port,...`. The demo and the chaos suite route each
    # link through a Toxiproxy proxy of its own this way (a WAN in miniature).
    agent_routes: str = Field(
        "", description="region=host:port,... overriding other regions' agent endpoints"
    )

    # The agent's event loop (agents/daemon/runtime.py): uvloop, measured faster, or
    # asyncio's own, for a platform without uvloop or to rule the loop out.
    agent_loop: Literal["uvloop", "asyncio"] = Field(
        "uvloop", description="the agent's event loop: uvloop or asyncio"
    )

    # Copies of each object inside a region of several agents (issue 16):
    # `region=r,...`; a region not named keeps 2 (1 while it has one agent).
    region_copies: str = Field(
        "", description="region=r,... copies of each object among a region's agents"
    )
    # How often an agent checks that what it holds sits on the right agents of its
    # region, besides on every membership change.
    rebalance_interval_s: float = Field(30.0, gt=0)
    # On SIGTERM an agent of a region of several hands what it holds to the others
    # first, for at most this long (then it stops; the copies left move on its loss).
    drain_timeout_s: float = Field(30.0, ge=0)
    # Departure records (agents/placement/departures.py): each agent keeps a durable
    # roster entry, and a complete listing (a critical takeover's proof) is refused
    # while an agent of the region departed without handing over. Off by default until
    # the whole suite (chaos scenarios that replace a lone agent's disk, above all) has
    # run with it on: a lone agent replaced by a new store leaves an entry that only
    # `etcdctl del` clears, and its region's proofs are refused until then.
    departure_records: bool = Field(False)
    # An agent whose listening port refuses connections (twice, a moment apart) is
    # marked down by a peer at once, its registration's lease revoked, instead of after
    # the lease lapses (agents/placement/fastfail.py; Ceph's
    # osd_fast_fail_on_connection_refused). Off: only the lease decides.
    fast_fail_on_refused: bool = Field(True)
    # The read-through cache (issue 16, agents/cache/): `region=SIZE,...` bounds each
    # agent's cache in that region (a region not named has none); how many shards
    # ahead a sequential reader is prefetched (0: off); how long entries are trusted
    # without revalidation after the change log was last read (they are checked at a
    # holder, one Stat, while it cannot be read).
    region_cache: str = Field("", description="region=SIZE,... read-through cache bounds")
    cache_prefetch: int = Field(8, ge=0, le=256)
    cache_fresh_s: float = Field(10.0, gt=0)

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        if value.lower() not in {"debug", "info", "warning", "error"}:
            raise ValueError("must be one of debug, info, warning, error")
        return value.lower()

    def source_of(self, name: str) -> str:
        """Where a setting's value came from, as an error should name it: the flag that
        gave it (`--etcd`), else its environment variable (`MERIDIAN_ETCD`)."""
        if name in self._flags:
            return f"--{name.replace('_', '-')}"
        return f"MERIDIAN_{name.upper()}"

    @cached_property
    def etcd_endpoints(self) -> list[tuple[str, int]]:
        return parse_endpoints(self.etcd, setting=self.source_of("etcd"))

    @cached_property
    def kafka_bootstrap(self) -> list[tuple[str, int]]:
        return parse_endpoints(self.kafka, setting=self.source_of("kafka"))

    @cached_property
    def toxiproxy_endpoint(self) -> tuple[str, int]:
        return parse_endpoints(self.toxiproxy, setting=self.source_of("toxiproxy"))[0]

    @cached_property
    def agent_route_map(self) -> dict[str, str]:
        """`agent_routes` parsed: region -> host:port (checked like every endpoint)."""
        routes: dict[str, str] = {}
        for item in (part.strip() for part in self.agent_routes.split(",")):
            if not item:
                continue
            region, sep, endpoint = item.partition("=")
            if not sep or not region.strip():
                raise ConfigError(f"MERIDIAN_AGENT_ROUTES: {item!r} is not region=host:port")
            host, port = parse_endpoints(endpoint.strip(), setting="MERIDIAN_AGENT_ROUTES")[0]
            routes[region.strip()] = f"{host}:{port}"
        return routes

    @cached_property
    def region_copy_map(self) -> dict[str, int]:
        """`region_copies` parsed: region -> r (at least 1)."""
        found: dict[str, int] = {}
        for item in (part.strip() for part in self.region_copies.split(",")):
            if not item:
                continue
            region, sep, count = item.partition("=")
            if not sep or not region.strip() or not count.strip().isdigit() or int(count) < 1:
                raise ConfigError(f"MERIDIAN_REGION_COPIES: {item!r} is not region=N (N >= 1)")
            found[region.strip()] = int(count)
        return found

    @cached_property
    def region_cache_map(self) -> dict[str, int]:
        """`region_cache` parsed: region -> the bound of each agent's cache, in bytes."""
        found: dict[str, int] = {}
        for item in (part.strip() for part in self.region_cache.split(",")):
            if not item:
                continue
            region, sep, size = item.partition("=")
            sized = _SIZE.match(size.strip())
            if not sep or not region.strip() or sized is None or int(sized.group(1)) < 1:
                raise ConfigError(
                    f"MERIDIAN_REGION_CACHE: {item!r} is not region=SIZE (a whole number of "
                    "bytes, at least 1, optionally with KiB, MiB, GiB or TiB, e.g. 256MiB)"
                )
            found[region.strip()] = int(sized.group(1)) * _SIZE_UNITS[sized.group(2) or "B"]
        return found

    def cache_limit_of(self, region: str) -> int | None:
        """The cache bound of `region`'s agents (None: no cache there)."""
        return self.region_cache_map.get(region)

    def copies_of(self, region: str) -> int | None:
        """The configured copy count of `region`'s objects (None: the default)."""
        return self.region_copy_map.get(region)

    def agent_address(self, region: str, registered: str) -> str:
        """Where to call an agent of `region` that registered `registered`."""
        return self.agent_route_map.get(region, registered)

    @property
    def stack_dir(self) -> Path:
        return self.home / "stack"

    @property
    def cache_dir(self) -> Path:
        return self.home / "cache"


def load_settings(*, check_endpoints: bool = True, **overrides: object) -> Settings:
    """Read settings from the environment, apply non-None overrides, validate endpoints.

    `check_endpoints=False` is for commands that never connect as clients (`stack`): a
    stray MERIDIAN_KAFKA must not stop you from stopping your own stack."""
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        settings = Settings(**given)  # type: ignore[arg-type]
    except ValidationError as exc:
        first = exc.errors()[0]
        name = ".".join(str(p) for p in first["loc"])
        where = f"--{name.replace('_', '-')}" if name in given else f"MERIDIAN_{name.upper()}"
        raise ConfigError(f"setting {name} ({where}) is invalid: {first['msg']}") from exc
    settings._flags = frozenset(given)
    if check_endpoints:
        # Touch the parsed forms so a malformed endpoint fails here, at start, once.
        _ = settings.etcd_endpoints, settings.kafka_bootstrap, settings.toxiproxy_endpoint
        _ = settings.agent_route_map
    return settings
