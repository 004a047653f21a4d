"""Settings of the recorder and the outbox drain (the daemon fills them from its flags).

Units are in the names. Both duties read a bounded batch, ship it, and wait
`idle_interval_s` (or less: a `notify()` wakes them) when there is nothing to do; a
failure backs off from `retry_initial_s`, doubling up to `retry_max_s`.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.errors import ConfigError

DEFAULT_INLINE_MAX_BYTES = 256 * 1024  # dataplane.md, Change events


def _positive(owner: str, **values: float) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ConfigError(f"{owner}.{name} must be a positive number, got {value!r}")


@dataclass(frozen=True)
class RecorderSettings:
    batch_size: int = 500
    idle_interval_s: float = 0.5
    retry_initial_s: float = 0.2
    retry_max_s: float = 10.0
    # How long stop() lets the batch in flight finish before cancelling it (a cancelled
    # batch is shipped again after restart: every record is idempotent).
    stop_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        _positive(
            "RecorderSettings",
            batch_size=self.batch_size,
            idle_interval_s=self.idle_interval_s,
            retry_initial_s=self.retry_initial_s,
            retry_max_s=self.retry_max_s,
            stop_timeout_s=self.stop_timeout_s,
        )


@dataclass(frozen=True)
class OutboxSettings:
    # host:port of this agent's API, named in events whose bytes are not inline.
    origin_agent: str
    topic: str = "meridian.changes"
    batch_size: int = 200
    inline_max_bytes: int = DEFAULT_INLINE_MAX_BYTES
    idle_interval_s: float = 0.05
    retry_initial_s: float = 0.2
    retry_max_s: float = 10.0
    stop_timeout_s: float = 5.0
    # How long a batch may wait for its acknowledgement before the drain reports Kafka
    # unavailable (it keeps waiting for that same batch: the producer retries it).
    ack_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not self.origin_agent or ":" not in self.origin_agent:
            raise ConfigError(
                f"OutboxSettings.origin_agent must be this agent's host:port, "
                f"got {self.origin_agent!r}"
            )
        if not self.topic:
            raise ConfigError("OutboxSettings.topic is empty")
        if self.inline_max_bytes < 0:
            raise ConfigError(
                f"OutboxSettings.inline_max_bytes must be >= 0, got {self.inline_max_bytes}"
            )
        _positive(
            "OutboxSettings",
            batch_size=self.batch_size,
            idle_interval_s=self.idle_interval_s,
            retry_initial_s=self.retry_initial_s,
            retry_max_s=self.retry_max_s,
            stop_timeout_s=self.stop_timeout_s,
            ack_timeout_s=self.ack_timeout_s,
        )
