"""The rendered-IR guard: the K2 kernel's LLVM IR for a fixed set of
configurations (k2back.codegen.testing.GUARD_CONFIGS), so that a refactor of
the planner or the templates shows it changed nothing, byte for byte, or only
comments.

    python benchmarks/render_guard.py             # check against tests/data/rendered_ir.json
    python benchmarks/render_guard.py --code      # ... the IR without ';' comments
    python benchmarks/render_guard.py --record    # a change to the IR is meant: record it
    python benchmarks/render_guard.py --dump DIR  # write each IR to DIR/<config>.ll (to diff)

Prints one row a configuration: its hash and whether it matches the record.
tests/test_render.py checks the same table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from k2back.codegen.testing import (
    GUARD_CONFIGS,
    RENDERED_IR,
    guard_digests,
    guard_ir,
    guard_name,
    strip_ir_comments,
)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--record", action="store_true", help=f"write the table to {RENDERED_IR}")
    p.add_argument("--dump", type=Path, help="write each configuration's IR here")
    p.add_argument("--code", action="store_true", help="the IR without ';' comments")
    args = p.parse_args(argv)
    if args.dump:
        args.dump.mkdir(parents=True, exist_ok=True)
        for config in GUARD_CONFIGS:
            ir = guard_ir(config)
            (args.dump / f"{guard_name(config)}.ll").write_text(
                strip_ir_comments(ir) if args.code else ir)
    now = guard_digests(args.code)
    key = "code" if args.code else "ir"
    recorded = json.loads(RENDERED_IR.read_text()) if RENDERED_IR.exists() else {}
    if args.record:
        recorded[key] = now
        RENDERED_IR.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
        print(f"recorded {len(now)} configurations ({key}) in {RENDERED_IR}")
        return 0
    want = recorded.get(key, {})
    print(f"{'configuration':<46} {'sha256 (' + key + ')':<18} status")
    changed = 0
    for name, h in now.items():
        status = "same" if want.get(name) == h else ("CHANGED" if name in want else "new")
        changed += status != "same"
        print(f"{name:<46} {h[:16]:<18} {status}")
    print(f"{len(now) - changed} of {len(now)} byte-identical to the record ({key})")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
