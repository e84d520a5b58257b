"""What the `timeline` build's stamps cost: wave-instructions executed by one
launch of the plain and of the stamped kernel (emulator, timing mode), side by
side, and the modeled time of each (the stamps' s_memrealtime reads and wave
0's stores). Budget: stamps <= 1 % of the kernel's wave-instructions. The
stamps move the modeled clock a little, so the flag polls (s_sleep loops)
differ between the two launches and are part of the difference: the polls
columns show by how much, and "excl. polls" is the difference without them
(each poll costs one trip of its loop, counted in the asm; the loops differ a
little and the count of polls per loop is not kept, so it is an upper bound: the
shortest trip taken off for added polls, the longest added back for fewer).

Run: .venv/bin/python benchmarks/timeline_overhead.py [--config tiny:4:3:2 ...] [--arch gfx950]
(default configs: tiny TP 4 S 3 ratio 2; add v4.1-flash:4:1:2 for the real
model, about a minute a launch).
"""

from __future__ import annotations

import argparse

from k2back.codegen.plan import plan
from k2back.config import Config
from k2back.profile import STAMP_BUDGET, stamp_cost, stamps_written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", nargs="+", default=["tiny:4:3:2"], help="geometry:tp:tokens:ratio")
    p.add_argument("--arch", nargs="+", default=["gfx942", "gfx950"])
    args = p.parse_args(argv)
    print(f"{'configuration':<30} {'wave-instr':>11} {'stamped':>11} {'overhead':>9} {'excl. polls <=':>14} {'stamps':>6} "
          f"{'polls':>6} {'stamped':>7} {'modeled us':>10} {'stamped':>8}")
    for text in args.config:
        geometry, tp, tokens, ratio = text.split(":")
        for arch in args.arch:
            config = Config(geometry, int(tp), int(tokens), int(ratio), arch).resolved()
            cost = stamp_cost(config)
            plain, stamped = cost.plain, cost.stamped
            extra = stamped.wave_instructions - plain.wave_instructions
            print(f"{geometry + ' TP' + tp + ' S' + tokens + ' r' + ratio + ' ' + arch:<30} "
                  f"{plain.wave_instructions:>11,} {stamped.wave_instructions:>11,} "
                  f"{extra / plain.wave_instructions:>8.2%} {cost.overhead:>13.2%} "
                  f"{stamps_written(plan(config, timeline=True)):>6} "
                  f"{plain.total_polls:>6} "
                  f"{stamped.total_polls:>7} {plain.modeled_ns / 1e3:>10.2f} "
                  f"{stamped.modeled_ns / 1e3:>8.2f}", flush=True)
    print(f"budget: stamps <= {STAMP_BUDGET:.0%} of the kernel's wave-instructions (excl. polls)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
