"""The instruction inventory of the K2 kernel (issue 9 §6): every instruction
form (k2back.emu.inventory.form) in the asm of k2back.testing.INVENTORY_CONFIGS,
with its static count per arch, and the unit tests that cover it
(tests/data/form_coverage.json; tests/test_emu_inventory.py fails on a form
without one). Static: all code the emulator can execute, not one launch's path.

Run: .venv/bin/python benchmarks/inventory.py [--markdown]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from k2back.emu.inventory import forms
from k2back.testing import INVENTORY_CONFIGS, build

COVERAGE = Path(__file__).parent.parent / "tests" / "data" / "form_coverage.json"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="a Markdown table")
    args = parser.parse_args()
    per_arch = {"gfx942": Counter(), "gfx950": Counter()}
    for config in INVENTORY_CONFIGS:
        _, kernel = build(*config)
        per_arch[config[4]].update(forms(kernel.asm, kernel.name))
    coverage = json.loads(COVERAGE.read_text())
    every = sorted(set(per_arch["gfx942"]) | set(per_arch["gfx950"]))
    total = sum(sum(c.values()) for c in per_arch.values())
    print(f"{len(every)} forms, {total} instructions over {len(INVENTORY_CONFIGS)} kernels")
    if args.markdown:
        print("| form | gfx942 | gfx950 | unit test |\n|---|---:|---:|---|")
    for form in every:
        test = coverage.get(form, ["NONE"])[0].split("::")[-1]
        counts = per_arch["gfx942"][form], per_arch["gfx950"][form]
        if args.markdown:
            print(f"| `{form}` | {counts[0]} | {counts[1]} | {test} |")
        else:
            print(f"{counts[0]:8d} {counts[1]:8d}  {form:<60s} {test}")


if __name__ == "__main__":
    main()
