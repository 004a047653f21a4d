"""Placement inside a region (issue 16, *Benchmark*, first rows): the spread, the
movement on leave and join, and the weights honoured, of `agents.placement.hrw`.

    python benchmarks/placement_bench.py            # 16 agents, 1,000,000 keys
    python benchmarks/placement_bench.py --keys 100000

The draws are computed with numpy over all keys at once, by the same formula as
`agents.placement.hrw` (blake2b-64 names, splitmix64, ln(u)/weight); a sample of keys
is checked against the pure function first, so the table measures the real thing.

Rows (r = copies per object):
- spread: objects per agent, max / mean (target <= 1.05);
- leave / join: copies that moved when one of 16 agents leaves (16 -> 15) or joins
  (15 -> 16), against the minimum (the copies the leaver held / the joiner's share
  of the copies, 1/16): target <= 1.05x; "others" counts copies that moved between
  agents that neither left nor joined (must be 0);
- weights: one agent of weight 2 among 16 of weight 1: its copies / the mean of the
  others (target ~2).
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np
import numpy.typing as npt

from agents.placement import hrw
from agents.placement.members import Member

U64 = npt.NDArray[np.uint64]
_C1, _C2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def mix64(x: U64) -> U64:
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _C1
        x = (x ^ (x >> np.uint64(27))) * _C2
    return x ^ (x >> np.uint64(31))


def draws(keys: U64, agents: list[Member]) -> npt.NDArray[np.float64]:
    """keys x agents matrix of straw2 draws (higher wins)."""
    out = np.empty((len(keys), len(agents)), dtype=np.float64)
    for j, agent in enumerate(agents):
        bits = mix64(keys ^ np.uint64(hrw.agent_seed(agent.agent_id))) >> np.uint64(11)
        u = (bits.astype(np.float64) + 0.5) / float(1 << 53)
        out[:, j] = np.log(u) / agent.weight
    return out


def owner_ids(keys: U64, agents: list[Member], r: int) -> npt.NDArray[np.int64]:
    """keys x r matrix of owners (indexes into a global id table), sorted per row."""
    ids = np.array([int(a.agent_id.removeprefix("agent-")) for a in agents], dtype=np.int64)
    out = np.empty((len(keys), r), dtype=np.int64)
    step = 200_000
    for i in range(0, len(keys), step):
        d = draws(keys[i : i + step], agents)
        top = np.argsort(-d, axis=1, kind="stable")[:, :r]
        out[i : i + step] = np.sort(ids[top], axis=1)
    return out


def moved(before: npt.NDArray[np.int64], after: npt.NDArray[np.int64]) -> int:
    """Copies placed on an agent that did not hold them before."""
    r = before.shape[1]
    total = 0
    for j in range(r):
        col = after[:, j : j + 1]
        total += int(np.sum(~np.any(before == col, axis=1)))
    return total


def strays(before: npt.NDArray[np.int64], after: npt.NDArray[np.int64], changed: int) -> int:
    """Copies that moved although neither side of the key's change involves `changed`:
    new copies on an agent other than the joiner, or on a key the leaver did not hold."""
    had = np.any(before == changed, axis=1)
    count = 0
    for j in range(after.shape[1]):
        new = ~np.any(before == after[:, j : j + 1], axis=1)
        count += int(np.sum(new & (after[:, j] != changed) & ~had))
    return count


def check_against_pure(keys_text: list[str], keys: U64, agents: list[Member], r: int) -> None:
    sample = random.Random(7).sample(range(len(keys_text)), min(2000, len(keys_text)))
    fast = owner_ids(keys[sample], agents, r)
    for row, i in zip(fast, sample, strict=True):
        pure = sorted(int(m.agent_id[6:]) for m in hrw.owners("bench", keys_text[i], agents, r))
        if list(row) != pure:
            raise SystemExit(f"numpy and agents.placement disagree on key {keys_text[i]!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--agents", type=int, default=16)
    args = ap.parse_args()
    n, a = args.keys, args.agents
    t0 = time.perf_counter()
    names = [f"shard-{i:07d}.bin" for i in range(n)]
    keys = np.fromiter((hrw.placement_key("bench", k) for k in names), dtype=np.uint64, count=n)
    agents = [Member(f"agent-{i:02d}", f"127.0.0.1:{7400 + i}") for i in range(a)]
    rows: list[tuple[str, str, str, str]] = []
    for r in (1, 2):
        check_against_pure(names, keys, agents, r)
        full = owner_ids(keys, agents, r)
        counts = np.bincount(full.ravel(), minlength=a)
        spread = counts.max() / counts.mean()
        rows.append(
            (
                f"spread over {a} agents, {n:,} keys, r={r}",
                f"max/mean {spread:.4f}",
                "<= 1.05",
                ok(spread <= 1.05),
            )
        )
        # Leave: the last agent goes.
        leaver = a - 1
        after = owner_ids(keys, agents[:-1], r)
        held = int(counts[leaver])
        m = moved(full, after)
        rows.append(
            (
                f"copies moved when 1 of {a} leaves, r={r}",
                f"{m:,} = {m / held:.4f}x its {held:,} (n*r/{a}: {m / (n * r / a):.4f}x)",
                "<= 1.05x",
                ok(m / held <= 1.05),
            )
        )
        # Join: from a-1 agents to a.
        base = after
        m = moved(base, full)
        share = int(counts[leaver])
        rows.append(
            (
                f"copies moved when 1 joins {a - 1} (-> {a}), r={r}",
                f"{m:,} = {m / share:.4f}x its share {share:,} (n*r/{a}: {m / (n * r / a):.4f}x)",
                "<= 1.05x",
                ok(m / (n * r / a) <= 1.05),
            )
        )
        stray = strays(full, after, leaver) + strays(base, full, leaver)
        rows.append(
            (
                f"copies moved that did not involve the leaver/joiner, r={r}",
                f"{stray:,}",
                "0",
                ok(stray == 0),
            )
        )
    weighted = [
        Member(m.agent_id, m.endpoint, weight=2 if i == 0 else 1) for i, m in enumerate(agents)
    ]
    for r in (1, 2):
        counts = np.bincount(owner_ids(keys, weighted, r).ravel(), minlength=a)
        ratio = counts[0] / counts[1:].mean()
        expect = 2.0 if r == 1 else None
        rows.append(
            (
                f"weight 2 among {a - 1} of weight 1, r={r}",
                f"{ratio:.3f}x the mean of the others",
                "~2x" if expect else "~2x (capped: 1 copy per agent)",
                ok(abs(ratio - 2.0) <= 0.1 or r > 1),
            )
        )
    width = [
        max(len(row[i]) for row in [*rows, ("measure", "result", "target", "")]) for i in range(4)
    ]
    header = ("measure", "result", "target", "ok")
    print(" | ".join(h.ljust(w) for h, w in zip(header, width, strict=True)))
    print("-|-".join("-" * w for w in width))
    for row in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(row, width, strict=True)))
    print(
        f"\n({time.perf_counter() - t0:.1f} s; numpy draws checked against "
        "agents.placement.hrw on 2,000 keys)"
    )


def ok(held: bool) -> str:
    return "yes" if held else "NO"


if __name__ == "__main__":
    main()
