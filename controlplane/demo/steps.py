"""The demo's story, step by step, each with a one-line explanation and a check.

Every check reads what a user would: the `meridian` CLI's JSON (dataset list, object
ls, audit, history), so the demo is also an end-to-end test of the commands. Waits
(an owner to change, regions to converge) poll in-process through `Probe`, and the
corpus is written in-process in two regions at once."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from controlplane.demo.probe import Probe, PutItem
from controlplane.demo.training import checkpoints
from controlplane.demo.world import World
from controlplane.errors import StackError

CKPT, CORPUS = "ckpt/demo-run", "corpus/web"
HOME, TAKEOVER = "eu-west", "eu-central"
LATEST = "latest"  # the marker a training job writes after each checkpoint
# The checkpoints' copies (examples/policies/training.yaml): home and replicas.
CKPT_REGIONS = ("eu-west", "eu-central", "eu-north")
CORPUS_REGIONS = ("eu-west", "eu-central", "us-east")


@dataclass(frozen=True)
class Scale:
    width: int  # of the trained network: 2048 ≈ 5.2 M parameters, 73 MB per checkpoint
    steps: int  # checkpoints written before the failover
    shards: int  # corpus shards written in each of two regions
    shard_bytes: int


SCALES = {
    "small": Scale(width=384, steps=3, shards=8, shard_bytes=64 * 1024),
    "full": Scale(width=1536, steps=5, shards=48, shard_bytes=1024 * 1024),
}


@dataclass
class Check:
    step: str
    what: str
    held: bool
    detail: str = ""

    def as_json(self) -> dict[str, object]:
        return {"step": self.step, "check": self.what, "held": self.held, "detail": self.detail}


@dataclass
class Story:
    world: World
    scale: Scale
    work: Path
    say: Callable[[str], None]
    probe: Probe
    checks: list[Check] = field(default_factory=list)
    acked: dict[str, str] = field(default_factory=dict)  # checkpoint key -> acked version
    held_back: list[Path] = field(default_factory=list)  # the checkpoint written after failover
    step_versions: set[str] = field(default_factory=set)  # of the last checkpoint put
    trained: int = 0

    # -- helpers ---------------------------------------------------------------------------
    def check(self, step: str, what: str, held: bool, detail: str = "") -> bool:
        self.checks.append(Check(step, what, held, detail))
        self.say(f"   {'✔' if held else '✘'} {what}{f' — {detail}' if detail else ''}")
        return held

    def agent(self, region: str) -> str:
        return self.world.regions[region].agent_listen

    def objects(self, region: str, dataset: str) -> dict[str, dict[str, Any]]:
        """What `meridian object ls` shows in the region (key → row)."""
        rows = self.world.cli_json(
            "object", "ls", "--dataset", dataset, "--agent", self.agent(region)
        )
        return {r["key"]: r for r in rows} if isinstance(rows, list) else {}

    def owner(self) -> tuple[str | None, int | None]:
        """The checkpoints' owner and epoch as `meridian dataset list` shows them."""
        rows = self.world.cli_json("dataset", "list", "--glob", CKPT)
        for r in rows if isinstance(rows, list) else []:
            if r["name"] == CKPT:
                return r["owner"], r["epoch"]
        return None, None

    def wait(self, cond: Callable[[], bool], timeout_s: float, step_s: float = 0.2) -> bool:
        deadline = time.monotonic() + timeout_s
        for _ in range(int(timeout_s / step_s) + 1):
            if cond():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(step_s)
        return False

    def holds_all(self, region: str, wanted: dict[str, str]) -> bool:
        """The region's agent holds every key of `wanted` at that version."""
        held = self.probe.listing(self.agent(region), CKPT)
        return held is not None and all(held.get(k) == v for k, v in wanted.items())

    def put_checkpoint(self, region: str, step: int, files: list[Path]) -> tuple[bool, str]:
        """Write one training step's files as one version set with `meridian object put
        --set` (acked once a quorum holds the whole set): the same keys at every step,
        so each is a new version of the last step's file and a replica holding that one
        receives a delta. Remembers the acked versions. Returns (acked, what was said)."""
        set_id = f"step-{step:04d}"
        done = self.world.cli(
            "object", "put", "--dataset", CKPT, "--set", set_id, *(f.name for f in files),
            "--agent", self.agent(region), "--output", "json", cwd=files[0].parent,
        )  # fmt: skip
        if done.returncode != 0:
            return False, _last_line(done.stderr or done.stdout)
        rows = _rows(done.stdout)
        self.step_versions = {str(row["version"]) for row in rows}
        for row in rows:
            self.acked[str(row["key"])] = str(row["version"])
        size = sum(f.stat().st_size for f in files)
        committed = rows[0].get("set", set_id) if rows else set_id
        if len(rows) != len(files):
            return False, f"set {committed}: {len(rows)} of {len(files)} files acked"
        # Then a `latest` marker naming the step, as training frameworks write one: a
        # small object of its own, acked like any critical write (its pushes are what
        # the dashboard's critical push panel shows; a set's members go another way).
        # Written once every other region that answers shows the set: its ack is a
        # quorum's, the third region may still be taking the members, and a marker
        # pushed meanwhile, small, would land there first and name a set a reader
        # there cannot read yet. (One that does not answer catches up, both at once.)
        for other in CKPT_REGIONS:
            if other != region and not self.wait(partial(self._shows, other, set_id), 60):
                return False, f"set {committed} acked, but {other} does not show it"
        marker, why = self.probe.put(self.agent(region), CKPT, LATEST, f"{step}\n".encode())
        if marker is None:
            return False, f"set {committed} acked, but not the {LATEST} marker: {why}"
        self.acked[LATEST] = marker
        return True, f"set {committed}: {len(files)} files, {size:,} bytes, then {LATEST}"

    def _shows(self, region: str, set_id: str) -> bool:
        """The region shows `set_id` as its latest set, or its agent does not answer."""
        return self.probe.shows_set(self.agent(region), CKPT, set_id) is not False

    def sent_bytes(self, versions: set[str], timeout_s: float = 30) -> tuple[int, int]:
        """(wire bytes, transfers) of the completed pushes of `versions`, once the
        catalog has a record of each push to each replica (records ship asynchronously)."""
        want = len(versions) * (len(CKPT_REGIONS) - 1)
        found: list[dict[str, Any]] = []

        def recorded() -> bool:
            found[:] = [
                r
                for r in self.probe.transfers(self.world.catalog, CKPT)
                if r.get("version") in versions and r.get("outcome") == "completed"
            ]
            return len(found) >= want

        self.wait(recorded, timeout_s, step_s=1)
        return sum(int(r["wire_bytes"]) for r in found), len(found)

    # -- the steps -------------------------------------------------------------------------
    def checkpoints_step(self) -> None:
        step = "1 checkpoints"
        replicas = [r for r in CKPT_REGIONS if r != HOME]
        first_ratio = 0.0
        self.say(
            f"1. A training job writes checkpoints to {HOME} (critical, EU only), one version "
            f"set per step, acked once a quorum of {', '.join(CKPT_REGIONS)} holds the set."
        )
        series = list(
            checkpoints(self.work / "ckpt", steps=self.scale.steps + 1, width=self.scale.width)
        )
        *before, (_, self.held_back) = series
        total_full = total_sent = later_full = later_sent = 0
        versions: set[str] = set()
        all_acked = True
        for n, files in before:
            self.trained = n
            ok, why = self.put_checkpoint(HOME, n, files)
            all_acked &= self.check(step, f"checkpoint step {n} acked", ok, why)
            if not ok:
                continue
            full = sum(f.stat().st_size for f in files) * len(replicas)
            sent, pushes = self.sent_bytes(self.step_versions)
            versions |= self.step_versions
            total_full, total_sent = total_full + full, total_sent + sent
            if n > 1:
                later_full, later_sent = later_full + full, later_sent + sent
            else:
                first_ratio = sent / full if full else 0.0
            self.say(
                f"   step {n}: a full copy to {len(replicas)} replicas is {full:,} bytes; "
                f"sent {sent:,} bytes in {pushes} pushes ({sent / full:.2f} of full)"
            )
        acked = dict(self.acked)
        replicated = all(self.wait(partial(self.holds_all, r, acked), 30) for r in replicas)
        central = self.objects(TAKEOVER, CKPT)
        self.check(
            step,
            f"{' and '.join(replicas)} hold every checkpoint version {HOME} acked",
            all_acked
            and replicated
            and bool(acked)
            and all(central.get(k, {}).get("version") == v for k, v in acked.items()),
            f"{len(acked)} objects",
        )
        rows = self.world.cli_json("audit", "transfers", "--dataset", CKPT)
        audited = sum(
            int(r["wire_bytes"])
            for r in (rows if isinstance(rows, list) else [])
            if r.get("outcome") == "completed" and r.get("version") in versions
        )
        self.check(
            step,
            "meridian audit transfers shows the bytes sent, at most a full copy",
            0 < total_sent == audited <= total_full,
            f"{total_sent:,} of {total_full:,} bytes",
        )
        # Transfers are zstd-compressed, so "less than the file size" would hold for full
        # copies too; the first step's pushes are full copies compressed the same way, so
        # deltas must beat that ratio clearly.
        later_ratio = later_sent / later_full if later_full else 1.0
        self.check(
            step,
            "after the first step, pushes are deltas: clearly less than step 1's full copies",
            later_sent > 0 and later_ratio < 0.9 * first_ratio,
            f"{later_sent:,} of {later_full:,} bytes ({later_ratio:.2f} of full; "
            f"step 1 sent {first_ratio:.2f})",
        )

    def corpus_step(self) -> None:
        step = "2 corpus"
        writers = ("eu-west", "us-east")
        self.say(
            f"2. Corpus shards are written in {' and '.join(writers)} at once (standard "
            "class): Kafka carries the changes and every region converges."
        )
        items: list[PutItem] = []
        for region in writers:
            folder = self.work / "corpus" / region
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(self.scale.shards):
                path = folder / f"shard-{i:04d}.jsonl"
                path.write_bytes(_shard(region, i, self.scale.shard_bytes))
                items.append(
                    PutItem(self.agent(region), CORPUS, f"{region}/shard-{i:04d}.jsonl", path)
                )
        started = time.monotonic()
        errors = self.probe.put_many(items)
        if not self.check(step, f"{len(items)} shards acked", not errors, "; ".join(errors[:2])):
            return
        keys = {i.key for i in items}

        def converged() -> bool:
            return all(
                keys <= set(self.probe.listing(self.agent(r), CORPUS) or {}) for r in CORPUS_REGIONS
            )

        self.wait(converged, 120, step_s=0.5)
        took = time.monotonic() - started
        # One `object ls` shows, per shard, the regions the catalog knows hold it (its
        # records arrive a moment after the copies themselves).
        rows: dict[str, dict[str, Any]] = {}

        def listed() -> bool:
            rows.update(self.objects("eu-central", CORPUS))
            return all(set(CORPUS_REGIONS) <= set(rows.get(k, {}).get("regions", [])) for k in keys)

        self.check(
            step,
            f"all {len(keys)} shards in {', '.join(CORPUS_REGIONS)} (meridian object ls)",
            self.wait(listed, 30, step_s=1),
            f"converged {took:.1f} s after the first put",
        )
        status = self.world.cli_json("replication", "status", "--dataset", CORPUS)
        for row in status if isinstance(status, list) else []:
            self.say(
                f"   {row['region']}: completed {row['completed']}, pending {row['pending']}, "
                f"failed {row['failed']}, lag {row['lag_s']} s"
            )

    def residency_step(self) -> None:
        step = "3 residency"
        self.say("3. Someone tries to store an EU-only checkpoint in us-east: refused at the door.")
        sample = self.held_back[0]
        done = self.world.cli(
            "object", "put", "--dataset", CKPT, str(sample), "leak.safetensors",
            "--agent", self.agent("us-east"),
        )  # fmt: skip
        said = _last_line(done.stderr or "")
        self.check(
            step,
            "us-east refused the copy (residency)",
            done.returncode != 0 and "may only be held in EU" in said,
            said,
        )
        self.check(step, "us-east holds no checkpoint", not self.objects("us-east", CKPT))

    def failover_step(self) -> None:
        step = "4 failover"
        self.say(
            f"4. {HOME} is lost (SIGKILL of its controller, agent and replicator): "
            f"{TAKEOVER} takes the checkpoints over automatically."
        )
        _, epoch_before = self.probe.owner(CKPT)
        self.old_epoch = epoch_before  # step 5 writes at it: it must be fenced
        started = time.monotonic()
        self.world.kill_region(HOME)
        moved = self.wait(lambda: self.probe.owner(CKPT)[0] == TAKEOVER, 60)
        took = time.monotonic() - started
        owner, epoch = self.owner()
        self.check(
            step,
            f"{TAKEOVER} owns the checkpoints at a new epoch",
            moved and owner == TAKEOVER and (epoch or 0) > (epoch_before or 0),
            f"owner {owner}, epoch {epoch_before} → {epoch}, {took:.1f} s after the kill",
        )
        n = self.trained + 1
        ok, why = self.put_checkpoint(TAKEOVER, n, self.held_back)
        self.check(step, f"writes continue in {TAKEOVER} (step {n}, quorum 2 of 3)", ok, why)

    def return_step(self) -> None:
        step = "5 return"
        self.say(
            f"5. {HOME} comes back: fenced at its old epoch, it catches up, and a planned "
            "switchover hands the checkpoints back with nothing lost."
        )
        self.world.start_region(HOME)
        done = self.world.cli(
            "object", "put", "--dataset", CKPT, str(self.held_back[0]), "stale.safetensors",
            "--agent", self.agent(HOME),
        )  # fmt: skip
        why = _last_line(done.stderr or "")
        self.check(
            step,
            f"{HOME} refuses writes while it does not own the dataset",
            done.returncode != 0 and f"owned by {TAKEOVER}" in why,
            why,
        )
        # A writer still holding the epoch it had before the failover is fenced even at
        # the new owner's agent: the epoch, not the address, decides.
        old = getattr(self, "old_epoch", None)
        if old is None:
            self.check(step, "a write at the old epoch is fenced", False, "no epoch before")
        else:
            done = self.world.cli(
                "object", "put", "--dataset", CKPT, str(self.held_back[0]),
                "stale.safetensors", "--epoch", str(old), "--agent", self.agent(TAKEOVER),
            )  # fmt: skip
            why = _last_line(done.stderr or "")
            self.check(
                step,
                f"a write at the old epoch {old} is fenced at {TAKEOVER}'s agent",
                done.returncode != 0 and f"carried epoch {old}" in why,
                why,
            )
        acked = dict(self.acked)
        started = time.monotonic()
        caught_up = self.wait(lambda: self.holds_all(HOME, acked), 90, step_s=0.5)
        self.check(
            step,
            f"{HOME} caught up with every acked version",
            caught_up,
            f"{len(acked)} objects in {time.monotonic() - started:.1f} s",
        )
        done = self.world.cli(
            "switchover", "--dataset", CKPT, "--to", HOME, "--yes",
            "--reason", f"{HOME} is back", timeout_s=180,
        )  # fmt: skip
        self.check(
            step,
            f"switchover to {HOME} (waits until it caught up)",
            done.returncode == 0,
            "" if done.returncode == 0 else _last_line(done.stderr),
        )
        owner, epoch = self.owner()
        self.check(step, f"{HOME} owns the checkpoints again", owner == HOME, f"epoch {epoch}")
        west = self.objects(HOME, CKPT)
        lost = [k for k, v in acked.items() if west.get(k, {}).get("version") != v]
        self.check(
            step,
            "nothing acknowledged was lost",
            bool(acked) and not lost,
            f"{len(acked)} acked objects in {HOME}" + (f"; missing {lost[:3]}" if lost else ""),
        )

    def audit_step(self) -> None:
        step = "6 audit"
        self.say(
            "6. What an auditor sees: residency, cross-border transfers, the failover journal."
        )
        done = self.world.cli("audit", "residency", "--output", "json")
        self.check(
            step,
            "audit residency is clean",
            done.returncode == 0 and done.stdout.strip() == "[]",
            f"exit {done.returncode}",
        )
        rows = self.world.cli_json("audit", "transfers", "--cross-border")
        crossed = rows if isinstance(rows, list) else []
        ckpt_out = [r for r in crossed if r["dataset"] == CKPT and r.get("outcome") == "completed"]
        datasets = ", ".join(sorted({r["dataset"] for r in crossed})) or "nothing"
        self.say(f"   audit transfers --cross-border: {len(crossed)} transfers, of {datasets}")
        self.check(step, "no checkpoint crossed a border", not ckpt_out)
        history = self.world.cli_json("history")
        moves = history if isinstance(history, list) else []
        for h in moves:
            self.say(
                f"   history: {h['started_at']} {h['dataset']}: {h['from']} → {h['to']} "
                f"(epoch {h['epoch']}, {h['reason']})"
            )
        self.check(
            step,
            "the journal has the failover and the switchover",
            {(h["from"], h["to"]) for h in moves} >= {(HOME, TAKEOVER), (TAKEOVER, HOME)},
        )

    def steps(self) -> list[Callable[[], None]]:
        return [
            self.checkpoints_step,
            self.corpus_step,
            self.residency_step,
            self.failover_step,
            self.return_step,
            self.audit_step,
        ]

    def run_step(self, step: Callable[[], None]) -> None:
        """Run one step; a step that cannot go on is one failed check, and the story
        goes on (later steps say what they can)."""
        name = step.__name__.removesuffix("_step")
        started = time.monotonic()
        try:
            step()
        except (StackError, OSError, ValueError, KeyError, subprocess.TimeoutExpired) as exc:
            # A CLI call that timed out on a loaded machine is one failed check too.
            self.check(name, "the step ran to its end", False, str(exc))
        self.say(f"   ({time.monotonic() - started:.0f} s)")


def _rows(stdout: str) -> list[dict[str, Any]]:
    import json

    try:
        doc = json.loads(stdout)
    except ValueError:
        return []
    rows = doc if isinstance(doc, list) else [doc]
    return [r for r in rows if isinstance(r, dict) and "key" in r]


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def _shard(region: str, i: int, size: int) -> bytes:
    """A corpus shard: JSON lines of text, distinct per region and index."""
    line = f'{{"region": "{region}", "shard": {i}, "text": "'.encode()
    body = bytearray()
    n = 0
    while len(body) < size:
        body += line + f"document {n} of shard {i}".encode() + b'"}\n'
        n += 1
    return bytes(body[:size])
