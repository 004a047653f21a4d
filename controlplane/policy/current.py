"""The applied policy as every process sees it: `/meridian/policy/current`, watched.

`policy apply` publishes the compiled policy to etcd (`CompiledPolicy.to_json`):
the topology (regions with their jurisdictions, links with RTT and bandwidth),
every policy's rules, the placement of every dataset known at apply time, the
digest and the catalog revision. Agents, the replicator and the controllers
decide from it alone (dataplane.md, "Policy in etcd"), so a catalog outage
changes no decision.

`PolicyView` is the one way to read it. It reads the key once, then watches it
from the revision of that read, and on every new revision replaces its whole
snapshot (an immutable `CompiledPolicy`) in one assignment: a reader holds either
the old snapshot or the new one, never a mix. A deleted or unreadable key is the
"no policy" state: `current` is None and `require()` raises `NoPolicyError`
(retriable), so callers fail closed instead of deciding on nothing. When etcd is
unreachable the view keeps the last snapshot it read (it is still the last applied
policy) and re-reads and re-watches with backoff; nothing here ends the process.

The value (JSON, `schema` 1; `to_json` writes it, `from_json` checks every field):

    {"schema": 1, "digest": "<sha256 of the policy document>", "revision": <catalog
     policy revision>, "applied_at": "<RFC 3339, UTC>",
     "policy": <PolicySet.document(): "topology", "regions" {name: {"jurisdiction"}},
                "links" {"a<->b": {"rtt", "bandwidth"}}, "policies" {name: spec},
                "datasets" {declared name: labels}>,
     "placements": {dataset: Placement.as_json() without "dataset": "policy",
                    "class", "home", "replicas", "residency", "rpo_s", "ack",
                    "failover_mode", "failover_order", "transfer_compression",
                    "transfer_bandwidth_bps", "deletes", "labels"}}

`placements` holds every dataset placed at apply time (the declared ones and those
the catalog already knew); `policy` is enough to place any other.

Typed questions callers ask, all on a snapshot (take one with `require()` and ask
it several questions, so they are answered by one revision):

* `placement(dataset, labels)`: the published placement of a known dataset, or
  the one the published rules give a dataset first seen after the apply;
* `critical_homed_in(region)`: the critical datasets a region's controller claims;
* `jurisdiction(region)`, `regions`;
* `rtt_s(a, b)` and `nearest(region, candidates)` (link RTT, nearest first).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any

from controlplane.coordination.protocols import keys
from controlplane.domain.errors import PlacementError
from controlplane.domain.placement import Placement
from controlplane.errors import InvalidInputError, MeridianError, NotFoundError, UnavailableError
from controlplane.lifecycle import Lifecycle, cancel_and_wait
from controlplane.logs import get_logger
from controlplane.policy.units import parse_bandwidth_bps, parse_duration_s
from controlplane.ports.coordination import Coordination, EventType, Get

if TYPE_CHECKING:
    from controlplane.policy.compiler import PolicySet

log = get_logger("meridian.policy.current")

SCHEMA = 1
POLICY_KEY = keys.POLICY_CURRENT
# etcd refuses requests over 1.5 MiB by default; refuse to publish what it would refuse.
MAX_VALUE_BYTES = 1_400_000


class NoPolicyError(UnavailableError):
    """No usable policy is published: none was applied, or the published one is unreadable.

    Retriable: it goes away once `meridian policy apply` publishes one."""


@dataclass(frozen=True, slots=True)
class Link:
    """WAN facts of one link, as the topology declares them (None when not given)."""

    regions: frozenset[str]
    rtt_s: float | None
    bandwidth_bytes_per_s: float | None


@dataclass(frozen=True)
class CompiledPolicy:
    """One applied revision of the policy, immutable (see the module docstring)."""

    digest: str
    revision: int  # the catalog's policy revision
    applied_at: datetime
    regions: Mapping[str, str]  # region -> jurisdiction
    links: Mapping[frozenset[str], Link]
    placements: Mapping[str, Placement]
    rules: Mapping[str, Any]  # `PolicySet.document()`: places datasets first seen later
    # The catalog's line of revisions (`RevisionOutcome.lineage`): revisions of one
    # lineage are ordered, so an older one published late is not taken for news.
    lineage: str = ""
    etcd_revision: int = field(default=0, compare=False)  # of the key it was read from

    # -- building and encoding ---------------------------------------------------------
    @classmethod
    def build(
        cls,
        policy: PolicySet,
        placements: Mapping[str, Placement],
        *,
        digest: str,
        revision: int,
        applied_at: datetime,
        lineage: str = "",
    ) -> CompiledPolicy:
        """What `policy apply` publishes: `placements` are those it computed (declared
        datasets and those the catalog already knew)."""
        rules = policy.document()
        return cls(
            digest=digest,
            revision=revision,
            applied_at=applied_at,
            regions=dict(policy.regions),
            links=_links(rules.get("links", {}), where="policy.links"),
            placements=dict(placements),
            rules=rules,
            lineage=lineage,
        )

    def supersedes(self, other: CompiledPolicy) -> bool:
        """Whether this revision may replace `other`: always across lineages (another
        catalog), and within one only when it is not older."""
        return self.lineage != other.lineage or self.revision >= other.revision

    def to_json(self) -> bytes:
        doc = {
            "schema": SCHEMA,
            "digest": self.digest,
            "revision": self.revision,
            "lineage": self.lineage,
            "applied_at": self.applied_at.isoformat().replace("+00:00", "Z"),
            "policy": self.rules,
            "placements": {name: _placement_json(p) for name, p in sorted(self.placements.items())},
        }
        raw = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        if len(raw) > MAX_VALUE_BYTES:
            raise InvalidInputError(
                f"the compiled policy is {len(raw)} bytes, more than etcd accepts in one "
                f"value ({MAX_VALUE_BYTES}); it places {len(self.placements)} datasets"
            )
        return raw

    @classmethod
    def from_json(cls, raw: bytes, *, etcd_revision: int = 0) -> CompiledPolicy:
        """Decode a published value; `InvalidInputError` names the field that is wrong."""
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidInputError(f"{POLICY_KEY} is not JSON: {exc}") from exc
        top = _obj(doc, "the value")
        if top.get("schema") != SCHEMA:
            raise InvalidInputError(
                f"{POLICY_KEY}: schema {top.get('schema')!r} is not {SCHEMA} (published by an "
                "older `policy apply`, or a newer one: re-apply with this version)"
            )
        applied_text = _str(top, "applied_at")
        try:
            applied_at = datetime.fromisoformat(applied_text.replace("Z", "+00:00"))
        except ValueError as exc:
            raise InvalidInputError(
                f"{POLICY_KEY}: applied_at {applied_text!r} is not an RFC 3339 time"
            ) from exc
        rules = _obj(top.get("policy"), "policy")
        regions = {
            name: _str(_obj(r, f"policy.regions.{name}"), "jurisdiction", f"policy.regions.{name}")
            for name, r in _obj(rules.get("regions"), "policy.regions").items()
        }
        placements = {
            name: _placement(name, _obj(p, f"placements.{name}"))
            for name, p in _obj(top.get("placements"), "placements").items()
        }
        return cls(
            digest=_str(top, "digest"),
            revision=_int(top, "revision"),
            applied_at=applied_at,
            regions=regions,
            links=_links(rules.get("links", {}), where="policy.links"),
            placements=placements,
            rules=rules,
            lineage=_lineage(top),
            etcd_revision=etcd_revision,
        )

    # -- questions -----------------------------------------------------------------------
    def jurisdiction(self, region: str) -> str:
        """The region's jurisdiction; `NotFoundError` for a region the topology lacks."""
        try:
            return self.regions[region]
        except KeyError:
            known = ", ".join(sorted(self.regions))
            raise NotFoundError(
                f"region {region!r} is not in the applied topology (it has: {known})"
            ) from None

    def placement(self, dataset: str, labels: Mapping[str, str] | None = None) -> Placement | None:
        """Where `dataset` lives, or None when no policy selects it.

        A dataset known at apply time has its published placement (its labels were
        known then); one first seen later is placed by the published rules with
        `labels` (the labels it was registered with)."""
        known = self.placements.get(dataset)
        if known is not None:
            return known
        if not self.rules.get("policies"):
            return None
        from controlplane.policy.planner import place

        found = place(
            self._rules_set.topology, list(self._rules_set.policies), {dataset: labels or {}}
        )
        return found.get(dataset)

    def critical_homed_in(self, region: str) -> list[Placement]:
        """The known critical datasets whose home is `region`, by name."""
        return [
            p
            for _, p in sorted(self.placements.items())
            if p.dataset_class == "critical" and p.home == region
        ]

    def rtt_s(self, a: str, b: str) -> float | None:
        """The declared RTT between two regions (0 for a region to itself), else None."""
        if a == b:
            return 0.0
        link = self.links.get(frozenset((a, b)))
        return None if link is None else link.rtt_s

    def nearest(self, region: str, candidates: Iterable[str]) -> list[str]:
        """`candidates` ordered by RTT from `region`, unknown RTTs last, then by name."""
        return sorted(
            candidates,
            key=lambda c: (math.inf if (r := self.rtt_s(region, c)) is None else r, c),
        )

    @cached_property
    def _rules_set(self) -> PolicySet:
        from controlplane.policy.compiler import PolicySet

        try:
            return PolicySet.from_document(self.rules)
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInputError(
                f"{POLICY_KEY}: the published rules cannot be rebuilt ({exc})"
            ) from exc


# -- decoding helpers -------------------------------------------------------------------------
def _obj(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidInputError(f"{POLICY_KEY}: {where} is not an object")
    return value


def _str(doc: Mapping[str, Any], name: str, where: str = "") -> str:
    value = doc.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{POLICY_KEY}: {where + '.' if where else ''}{name} is missing")
    return value


def _int(doc: Mapping[str, Any], name: str) -> int:
    value = doc.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidInputError(f"{POLICY_KEY}: {name} is not a non-negative integer")
    return value


def _links(raw: object, *, where: str) -> dict[frozenset[str], Link]:
    out: dict[frozenset[str], Link] = {}
    for pair, facts in _obj(raw, where).items():
        ends = frozenset(pair.split("<->"))
        if len(ends) != 2:
            raise InvalidInputError(f"{POLICY_KEY}: {where} has a malformed link {pair!r}")
        link = _obj(facts, f"{where}.{pair}")
        try:
            rtt = parse_duration_s(link["rtt"]) if link.get("rtt") else None
            bw = parse_bandwidth_bps(link["bandwidth"]) if link.get("bandwidth") else None
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"{POLICY_KEY}: {where}.{pair}: {exc}") from exc
        out[ends] = Link(ends, rtt, bw)
    return out


def _placement_json(p: Placement) -> dict[str, Any]:
    # The domain type's own form, without the name (it is the key).
    return {k: v for k, v in p.as_json().items() if k != "dataset"}


def _placement(name: str, doc: Mapping[str, Any]) -> Placement:
    try:
        return Placement.from_json({**doc, "dataset": name})
    except PlacementError as exc:
        raise InvalidInputError(f"{POLICY_KEY}: placements.{name}: {exc}") from exc


# -- the watched view ---------------------------------------------------------------------------


class PolicyView(Lifecycle):
    """A watched, atomically replaced view of `/meridian/policy/current`.

    `start()` reads the key once (raising `UnavailableError` if etcd cannot be
    reached, so a daemon fails at start with one sentence) and then follows it in
    a task of its own. Read `current` (or `require()`) at each decision, and
    `wait_for` a change instead of polling.
    """

    def __init__(
        self,
        coord: Coordination,
        *,
        retry_initial_s: float = 0.1,
        retry_max_s: float = 2.0,
    ) -> None:
        self._coord = coord
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self._current: CompiledPolicy | None = None
        self._problem = "no policy has been applied (run `meridian policy apply`)"
        self._revision = 0  # etcd revision the snapshot (or its absence) was read at
        self._key_revision = 0  # mod revision of the policy key last read (0: none)
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    # -- reading ---------------------------------------------------------------------
    @property
    def current(self) -> CompiledPolicy | None:
        """The snapshot, or None when no usable policy is published."""
        return self._current

    @property
    def revision(self) -> int:
        """The etcd revision the view is up to date with."""
        return self._revision

    def decided(self) -> tuple[CompiledPolicy | None, int]:
        """The snapshot with the mod revision of the policy key as the view last read it
        (0: no key), whether it took that value or kept the one it held. A transaction
        comparing the key's mod revision with it fails once an apply lands that the view
        has not read yet, so a decision taken on the snapshot cannot outlive it."""
        return self._current, self._key_revision

    def require(self) -> CompiledPolicy:
        """The snapshot; `NoPolicyError` (retriable) when there is none: fail closed."""
        snapshot = self._current
        if snapshot is None:
            raise NoPolicyError(self._problem)
        return snapshot

    async def wait_for(
        self, predicate: Callable[[CompiledPolicy | None], bool], timeout_s: float
    ) -> CompiledPolicy | None:
        """Wait until `predicate(current)` holds; `OperationTimeoutError` after `timeout_s`."""
        from controlplane.errors import OperationTimeoutError

        try:
            async with asyncio.timeout(timeout_s), self._changed:
                await self._changed.wait_for(lambda: predicate(self._current))
        except TimeoutError as exc:
            raise OperationTimeoutError(
                f"the applied policy did not reach the awaited state within {timeout_s:g} s"
            ) from exc
        return self._current

    async def published_revision(self) -> int | None:
        """The revision of the policy etcd holds now, read directly (not the watched
        snapshot, which may lag); 0 when none is published, None when etcd does not
        answer or what it holds cannot be read."""
        try:
            res = await self._coord.txn([], [Get(POLICY_KEY)])
        except MeridianError:
            return None
        [found] = res.reads
        if not found:
            return 0
        try:
            return CompiledPolicy.from_json(found[0].value).revision
        except InvalidInputError:
            return None

    # -- lifecycle -------------------------------------------------------------------
    async def _do_start(self) -> None:
        await self._read()
        self._task = asyncio.create_task(self._follow(), name="policy-view")

    async def _do_stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    # -- following ---------------------------------------------------------------------
    async def _read(self) -> None:
        res = await self._coord.txn([], [Get(POLICY_KEY)])
        [found] = res.reads
        kv = found[0] if found else None
        await self._replace(kv.value if kv else None, kv.mod_revision if kv else 0)
        self._revision = res.revision

    async def _follow(self) -> None:
        delay = self._retry_initial_s
        while True:
            try:
                async for ev in self._coord.watch(POLICY_KEY, start_revision=self._revision + 1):
                    value = ev.kv.value if ev.type is EventType.PUT else None
                    await self._replace(value, ev.revision)
                    self._revision = ev.revision
                    delay = self._retry_initial_s
                # A watch only ends when its stream does: re-read, then watch again.
                await self._read()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - etcd down, history compacted: keep it
                log.warning(
                    "policy_watch_retry",
                    error=f"{type(exc).__name__}: {exc}",
                    retry_in_s=round(delay, 3),
                    keeps_revision=self._current.revision if self._current else None,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._retry_max_s)
                with contextlib.suppress(Exception):
                    # Re-read so that history compacted meanwhile is not needed.
                    await self._read()

    async def _replace(self, value: bytes | None, etcd_revision: int) -> None:
        before = self._current
        self._key_revision = etcd_revision if value is not None else 0
        if value is None:
            snapshot = None
            self._problem = "no policy has been applied (run `meridian policy apply`)"
        else:
            try:
                snapshot = CompiledPolicy.from_json(value, etcd_revision=etcd_revision)
            except MeridianError as exc:
                # Fail closed: deciding on the previous policy would hide the breakage.
                snapshot = None
                self._problem = f"the published policy cannot be read: {exc}"
                log.error("policy_unreadable", etcd_revision=etcd_revision, error=str(exc))
        if before is not None and snapshot is not None and before.etcd_revision == etcd_revision:
            return  # the same revision read again (after a reconnect): nothing changed
        if before is not None and snapshot is not None and not snapshot.supersedes(before):
            # Two applies raced and the older one's write landed last: keep the newer.
            log.warning(
                "policy_older_ignored",
                revision=snapshot.revision,
                held=before.revision,
                etcd_revision=etcd_revision,
            )
            return
        if before is None and snapshot is None:
            return
        self._current = snapshot
        log.info(
            "policy_current",
            revision=snapshot.revision if snapshot else None,
            digest=snapshot.digest[:12] if snapshot else None,
            etcd_revision=etcd_revision,
            datasets=len(snapshot.placements) if snapshot else 0,
        )
        async with self._changed:
            self._changed.notify_all()


def _lineage(top: Mapping[str, Any]) -> str:
    # Absent in values published before lineages existed: those order as their own line.
    value = top.get("lineage", "")
    if not isinstance(value, str):
        raise InvalidInputError(f"{POLICY_KEY}: lineage must be a string, got {value!r}")
    return value
