"""The demo's story, step by step, each with a one-line explanation and a check.

Every check reads what a user would: the `meridian` CLI's JSON (dataset list, object
ls, audit, history), so the demo is also an end-to-end test of the commands."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane.demo.training import checkpoints
from controlplane.demo.world import World

CKPT, CORPUS = "ckpt/demo-run", "corpus/web"


@dataclass(frozen=True)
class Scale:
    width: int  # of the trained network: 1024 ≈ 1.3 M parameters, 18 MB per checkpoint
    steps: int  # checkpoints written before the failover
    shards: int  # corpus shards written in each of two regions
    shard_bytes: int


SCALES = {
    "small": Scale(width=512, steps=3, shards=8, shard_bytes=64 * 1024),
    "full": Scale(width=2048, steps=6, shards=64, shard_bytes=1024 * 1024),
}


@dataclass
class Check:
    step: str
    what: str
    held: bool
    detail: str = ""


@dataclass
class Story:
    world: World
    scale: Scale
    work: Path
    say: Callable[[str], None]
    checks: list[Check] = field(default_factory=list)
    written: dict[str, str] = field(default_factory=dict)  # checkpoint key -> newest version
    trained: int = 0

    # -- helpers ---------------------------------------------------------------------------
    def check(self, step: str, what: str, held: bool, detail: str = "") -> bool:
        self.checks.append(Check(step, what, held, detail))
        self.say(f"   {'✔' if held else '✘'} {what}{f' — {detail}' if detail else ''}")
        return held

    def agent(self, region: str) -> str:
        return self.world.regions[region].agent_listen

    def objects(self, region: str, dataset: str) -> dict[str, dict[str, Any]]:
        rows = self.world.cli_json(
            "object", "ls", "--dataset", dataset, "--agent", self.agent(region)
        )
        return {r["key"]: r for r in rows} if isinstance(rows, list) else {}

    def owner(self) -> tuple[str | None, int | None]:
        rows = self.world.cli_json("dataset", "list", "--glob", CKPT)
        for r in rows if isinstance(rows, list) else []:
            if r["name"] == CKPT:
                return r["owner"], r["epoch"]
        return None, None

    def wait(self, cond: Callable[[], bool], timeout_s: float, step_s: float = 0.25) -> bool:
        deadline = time.monotonic() + timeout_s
        for _ in range(int(timeout_s / step_s) + 1):
            if cond():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(step_s)
        return False

    def put_checkpoint(self, region: str, step: int, files: list[Path]) -> tuple[bool, str]:
        args = ["object", "put", "--dataset", CKPT, "--set", f"step-{step:04d}", "--output", "json"]
        keys = [str(f.relative_to(self.work)) for f in files]
        done = self.world.cli(*args, *keys, "--agent", self.agent(region), cwd=self.work)
        if done.returncode != 0:
            return False, _last_line(done.stderr or done.stdout)
        size = sum(f.stat().st_size for f in files)
        return True, f"{len(files)} files, {size:,} bytes, set step-{step:04d}"

    # -- the steps -------------------------------------------------------------------------
    def checkpoints_step(self) -> None:
        step = "1 checkpoints"
        self.say(
            "1. A training job writes checkpoints to eu-west (critical, EU only); each is "
            "acked once eu-central holds it too, and only changed bytes cross the link."
        )
        series = checkpoints(self.work / "ckpt", steps=self.scale.steps, width=self.scale.width)
        ok_all, rows = True, []
        for n, files in series:
            self.trained = n
            full = sum(f.stat().st_size for f in files)
            ok, why = self.put_checkpoint("eu-west", n, files)
            ok_all &= self.check(step, f"checkpoint step {n} acked", ok, why)
            rows.append((n, full))
        west, central = self.objects("eu-west", CKPT), self.objects("eu-central", CKPT)
        same = bool(west) and all(
            central.get(k, {}).get("version") == v["version"] for k, v in west.items()
        )
        self.check(
            step, "eu-central holds every checkpoint eu-west acked", same, f"{len(west)} objects"
        )
        self.written = {k: v["version"] for k, v in west.items()}
        transfers = self.world.cli_json("audit", "transfers", "--dataset", CKPT)
        sent = (
            sum(int(t["wire_bytes"]) for t in transfers if t.get("outcome") == "completed")
            if isinstance(transfers, list)
            else 0
        )
        full_total = sum(full for _, full in rows)
        self.say(f"   bytes a full copy would send: {full_total:,}; bytes sent: {sent:,}")
        self.check(
            step,
            "after the first checkpoint, less than a full copy crossed the link",
            0 < sent < full_total,
            f"{sent / full_total:.2f} of a full copy" if full_total else "",
        )

    def corpus_step(self) -> None:
        step = "2 corpus"
        self.say(
            "2. Corpus shards are written in eu-west and us-east at once (standard class): "
            "Kafka carries the changes and every region converges."
        )
        keys: list[str] = []
        for region in ("eu-west", "us-east"):
            folder = self.work / "corpus" / region
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(self.scale.shards):
                path = folder / f"shard-{i:04d}.jsonl"
                path.write_bytes(_shard(region, i, self.scale.shard_bytes))
                key = f"{region}/shard-{i:04d}.jsonl"
                done = self.world.cli(
                    "object",
                    "put",
                    "--dataset",
                    CORPUS,
                    str(path),
                    key,
                    "--agent",
                    self.agent(region),
                )
                if done.returncode != 0:
                    self.check(step, f"put {key}", False, done.stderr.strip())
                    return
                keys.append(key)
        started = time.monotonic()
        converged = self.wait(
            lambda: all(set(keys) <= set(self.objects(r, CORPUS)) for r in self.world.regions), 90
        )
        took = time.monotonic() - started
        self.check(
            step, f"all {len(keys)} shards in all three regions", converged, f"in {took:.1f} s"
        )
        status = self.world.cli_json("replication", "status", "--dataset", CORPUS)
        for row in status if isinstance(status, list) else []:
            self.say(
                f"   {row['region']}: completed {row['completed']}, pending {row['pending']}, "
                f"failed {row['failed']}, lag {row['lag_s']}"
            )

    def residency_step(self) -> None:
        step = "3 residency"
        self.say("3. Someone tries to store an EU-only checkpoint in us-east: refused at the door.")
        sample = next(iter(sorted((self.work / "ckpt").rglob("model.safetensors"))))
        done = self.world.cli(
            "object",
            "put",
            "--dataset",
            CKPT,
            str(sample),
            "leak.safetensors",
            "--agent",
            self.agent("us-east"),
        )
        said = (done.stderr or "").strip()
        self.check(
            step,
            "us-east refused the copy",
            done.returncode != 0 and "residen" in said.lower(),
            said,
        )
        self.check(step, "us-east holds no checkpoint", not self.objects("us-east", CKPT))

    def failover_step(self) -> None:
        step = "4 failover"
        self.say(
            "4. eu-west is lost (SIGKILL of its controller, agent and replicator): "
            "eu-central takes the checkpoints over automatically."
        )
        _, epoch_before = self.owner()
        started = time.monotonic()
        self.world.kill_region("eu-west")
        moved = self.wait(lambda: self.owner()[0] == "eu-central", 60)
        took = time.monotonic() - started
        owner, epoch = self.owner()
        self.check(
            step,
            "eu-central owns the checkpoints at a new epoch",
            moved and (epoch or 0) > (epoch_before or 0),
            f"owner {owner}, epoch {epoch_before} → {epoch}, {took:.1f} s after the kill",
        )
        n = self.trained + 1
        files = next(
            checkpoints(self.work / "ckpt-after", steps=1, width=self.scale.width, seed=n)
        )[1]
        ok, why = self.put_checkpoint("eu-central", n, files)
        self.check(step, "writes continue in eu-central", ok, why)

    def return_step(self) -> None:
        step = "5 return"
        self.say(
            "5. eu-west comes back: fenced at its old epoch, it catches up, and a planned "
            "switchover hands the checkpoints back with nothing lost."
        )
        self.world.start_region("eu-west")
        sample = next(iter(sorted((self.work / "ckpt").rglob("model.safetensors"))))
        done = self.world.cli(
            "object",
            "put",
            "--dataset",
            CKPT,
            str(sample),
            "stale.safetensors",
            "--agent",
            self.agent("eu-west"),
        )
        self.check(
            step,
            "eu-west refuses writes while it does not own the dataset",
            done.returncode != 0,
            (done.stderr or "").strip(),
        )
        done = self.world.cli(
            "switchover",
            "--dataset",
            CKPT,
            "--to",
            "eu-west",
            "--yes",
            "--reason",
            "eu-west is back",
            timeout_s=180,
        )
        self.check(
            step, "switchover to eu-west", done.returncode == 0, (done.stderr or "").strip()[-200:]
        )
        owner, epoch = self.owner()
        self.check(step, "eu-west owns the checkpoints again", owner == "eu-west", f"epoch {epoch}")
        central, west = self.objects("eu-central", CKPT), self.objects("eu-west", CKPT)
        lost = [k for k, v in central.items() if west.get(k, {}).get("version") != v["version"]]
        self.check(
            step,
            "nothing acknowledged was lost",
            bool(central) and not lost,
            f"{len(west)} objects in eu-west" + (f"; missing {lost[:3]}" if lost else ""),
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
        self.say(f"   {len(crossed)} cross-border transfers, of {datasets}")
        self.check(step, "no checkpoint crossed a border", not ckpt_out)
        history = self.world.cli_json("history")
        moves = history if isinstance(history, list) else []
        for h in moves:
            self.say(
                f"   {h['started_at']} {h['dataset']}: {h['from']} → {h['to']} "
                f"(epoch {h['epoch']}, {h['reason']})"
            )
        self.check(
            step,
            "the journal has the failover and the switchover",
            {(h["from"], h["to"]) for h in moves}
            >= {("eu-west", "eu-central"), ("eu-central", "eu-west")},
        )


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
