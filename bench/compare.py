"""One duetime bench, two trees, rounds interleaved: the before/after of a change (or of a goal
against the release that set it) as ratios taken within each round, on a machine whose speed
drifts between days and between minutes.

    .venv/bin/python -m bench.compare --base /tmp/base --rounds 5 -- bench.throughput --runs 20000

Each round runs the command once in the base tree, then once in this tree (then the other way
round, so neither side always goes first), each with its own `.venv/bin/python` and
`--repeat 1` added, and reads the `name  median X` lines the duetime benches print
(`bench.stats.print_rounds`). It prints, per measure, both medians and the median of the
per-round ratios new/base, with the load average at each round's start. The base tree needs
its own venv (`git worktree add --detach /tmp/base <commit>`, then `python3 -m venv .venv &&
.venv/bin/pip install -e '.[test]'` in it); copy this tree's `bench/` into it first when the
bench itself changed since (both sides then run the same bench code).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

from bench.stats import ratios

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"^\s+(\S+)\s+median\s+(-?[\d.]+)", re.M)


def measures(output: str) -> dict[str, float]:
    """The `name median X` lines of one bench run (one round: the median is the value)."""
    return {name: float(value) for name, value in LINE.findall(output)}


def order(rnd: int) -> tuple[str, str]:
    """Which side goes first in round `rnd` (0-based): base first in even rounds."""
    return ("base", "new") if rnd % 2 == 0 else ("new", "base")


def table(rounds: list[dict[str, dict[str, float]]]) -> list[tuple[str, float, float, float | None]]:
    """(measure, base median, new median, median of the per-round new/base ratios) for each
    measure both sides printed in every round."""
    names = [n for n in rounds[0]["base"] if all(n in r["base"] and n in r["new"] for r in rounds)]
    out = []
    for n in names:
        base = [r["base"][n] for r in rounds]
        new = [r["new"][n] for r in rounds]
        rs = ratios(new, base)
        out.append((n, statistics.median(base), statistics.median(new),
                    statistics.median(rs) if rs else None))
    return out


def load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def run(tree: Path, command: list[str]) -> dict[str, float]:
    """The command once in `tree` (its own venv), its measures."""
    proc = subprocess.run([str(tree / ".venv" / "bin" / "python"), "-m", *command, "--repeat", "1"],
                          cwd=tree, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        sys.exit(f"{tree}: {' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    found = measures(proc.stdout)
    if not found:
        sys.exit(f"{tree}: {' '.join(command)} printed no `name median X` line:\n{proc.stdout[-2000:]}")
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True, help="the other tree (with its own .venv)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- bench.<module> [its options]")
    args = ap.parse_args()
    command = [c for c in args.command if c != "--"]
    if not command:
        ap.error("give the bench after --, e.g. -- bench.throughput --runs 20000")
    trees = {"base": args.base.resolve(), "new": ROOT}
    rounds = []
    for rnd in range(args.rounds):
        got: dict[str, dict[str, float]] = {}
        for side in order(rnd):
            la = load()
            got[side] = run(trees[side], command)
            print(f"round {rnd + 1} {side:<4} load {la:4.2f}  "
                  + "  ".join(f"{k}={v:g}" for k, v in got[side].items()), flush=True)
        rounds.append(got)
    print(f"\n{' '.join(command)}: {args.rounds} rounds, base {trees['base']} / new {trees['new']}")
    print(f"  {'measure':<26} {'base':>10} {'new':>10} {'new/base':>9}  (medians; ratio: of the rounds')")
    for name, b, n, r in table(rounds):
        print(f"  {name:<26} {b:10.2f} {n:10.2f} {r:9.3f}" if r is not None
              else f"  {name:<26} {b:10.2f} {n:10.2f} {'-':>9}")


if __name__ == "__main__":
    main()
