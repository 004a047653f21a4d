"""Sums a py-spy profile of collapsed stacks (`critical_bench.py --profile DIR` writes
one per agent, `py-spy record -f raw`): where the samples went.

    python benchmarks/stack_summary.py FILE [--top N] [--under FRAME] [--lines]

Prints the frames by inclusive share (a frame counted once per sample however deep it
recurs), then by own share (the innermost frame); `--under FRAME` (a substring of a
frame, e.g. "_WorkItem.run" or "Runner.run") shares out the samples passing through it
by the frame just inside it, so a thread's or a loop's time splits by what it ran.
Frames are functions (py-spy names each with the line it was at: `--lines` keeps them
apart). Samples that reach no Python frame of ours (gRPC's Cython, the loop's C) show as the
innermost Python frame that called them.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

# Site, standard-library and this repository's paths are shortened to the module's own.
_ROOT = re.escape(str(Path(__file__).resolve().parents[1]))
_PATHS = re.compile(r"\((?:/[^()]*?/(?:site-packages|python3\.\d+)/|" + _ROOT + "/)")
_LINE = re.compile(r":\d+\)$")


def read(path: Path, *, lines: bool = False) -> list[tuple[list[str], int]]:
    """The (frames, outermost first; samples) of each line of a collapsed-stack file;
    a frame is its function's, unless `lines` (then also the line it was at)."""
    stacks = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack:
            continue
        if not count.isdigit():
            raise SystemExit(f"{path}:{n}: not a collapsed stack (FRAME;FRAME;... COUNT)")
        frames = [_PATHS.sub("(", f) for f in stack.split(";")]
        if not lines:
            frames = [_LINE.sub(")", f) for f in frames]
        stacks.append((frames, int(count)))
    return stacks


def summary(stacks: list[tuple[list[str], int]], top: int, under: str | None) -> list[str]:
    total = sum(n for _, n in stacks) or 1
    lines = [f"{total} samples"]

    def share(counter: Counter[str], title: str) -> None:
        lines.append(f"-- {title}")
        lines.extend(f"{100 * n / total:5.1f} %  {frame}" for frame, n in counter.most_common(top))

    if under:
        inside: Counter[str] = Counter()
        for frames, n in stacks:
            at = [i for i, f in enumerate(frames) if under in f]
            if at:
                inside[frames[at[-1] + 1] if at[-1] + 1 < len(frames) else "(itself)"] += n
        share(inside, f"under {under!r}, by the frame just inside it")
        return lines
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for frames, n in stacks:
        for frame in set(frames):
            inclusive[frame] += n
        own[frames[-1]] += n
    share(inclusive, "inclusive")
    share(own, "own")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--under", help="share out the samples inside this frame")
    parser.add_argument("--lines", action="store_true", help="a frame per line, not function")
    args = parser.parse_args()
    try:
        stacks = read(args.file, lines=args.lines)
    except OSError as exc:
        print(f"{args.file}: {exc.strerror}", file=sys.stderr)
        return 1
    print("\n".join(summary(stacks, args.top, args.under)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
