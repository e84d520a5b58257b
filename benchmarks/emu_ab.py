"""Emulator speed, this tree against a base revision, in one process: the base's
k2back/emu (git archive REV) is imported as a package of its own, and the two
run the same launches alternately, so that a shared, busy machine slows both
alike. Prints, per case and arch, the best process time of each over the runs,
their ratio, wave-instructions a second, and the yardstick sum(range(10**7)) in
wall and in process time (on a busy machine the wall figure grows, the process
one much less: normalise by the process one there). K2 tiny (TP 1, 16 tokens,
as /work/wt/k2check.py) checks the two agree on the output hash and counters.

    .venv/bin/python benchmarks/emu_ab.py [--base REV] [--runs N] [k2_tiny] [idle_grid]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import io
import pathlib
import subprocess
import sys
import tarfile
import tempfile
import time

import emu_speed
import torch

from k2back.emu import Machine, hazards
from k2back.emu.testing import run

ROOT = pathlib.Path(__file__).resolve().parent.parent


def base_emulator(rev: str, into: pathlib.Path):
    """k2back/emu of `rev` as package `base_emu` (its absolute self-imports renamed)."""
    archive = subprocess.run(["git", "archive", rev, "k2back/emu"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    package = into / "base_emu"
    (into / "k2back" / "emu").rename(package)
    for path in package.glob("*.py"):
        path.write_text(path.read_text().replace("from k2back.emu", "from base_emu"))
    spec = importlib.util.spec_from_file_location("base_emu", package / "__init__.py",
                                                  submodule_search_locations=[str(package)])
    module = sys.modules["base_emu"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def yardstick() -> tuple[float, float]:
    """sum(range(10**7)): best of three, wall and process seconds."""
    wall = cpu = float("inf")
    for _ in range(3):
        t, c = time.perf_counter(), time.process_time()
        sum(range(10**7))
        wall, cpu = min(wall, time.perf_counter() - t), min(cpu, time.process_time() - c)
    return wall, cpu


def k2_tiny(arch: str, machine) -> tuple[float, tuple]:
    """One K2 tiny launch on `machine` (a Machine class): (process seconds, result key)."""
    from k2back import testing
    from k2back.codegen.compiler import compile as compile_source
    from k2back.codegen.plan import plan
    from k2back.codegen.render import KernelSource
    from k2back.runtime import emu, launch

    spec = plan("tiny", 1, 16, 2, arch)
    kernel = compile_source(KernelSource(spec))  # cached after the first
    inputs = testing.make_inputs("tiny", 1, 16, 2, seed=0, arch=arch)
    qk_scale = inputs.pop("qk_scale")
    out = torch.empty((spec.tokens, spec.hidden), dtype=torch.bfloat16)
    scratch = launch.new_scratch(spec, "cpu")
    emu.Machine, kept = machine, emu.Machine
    try:
        start = time.process_time()
        s = emu.EmuBackend().run(kernel, spec, {**inputs, "out": out}, scratch, qk_scale=qk_scale)
        seconds = time.process_time() - start
    finally:
        emu.Machine = kept
    digest = hashlib.sha256(out.view(torch.int16).numpy().tobytes()).hexdigest()[:16]
    return seconds, (digest, s.stale_bytes, s.written_back, s.total_polls, s.wave_instructions)


def idle_grid(arch: str, machine) -> tuple[float, tuple]:
    _, ir, name, args, grid, block = next(c for c in emu_speed.cases(arch) if c[0] == "idle_grid")
    start = time.process_time()
    s = run(ir, arch, name, args, grid=grid, block=block, machine=machine(arch))
    return time.process_time() - start, (s.wave_instructions,)


CASES = {"k2_tiny": k2_tiny, "idle_grid": idle_grid}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="main")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("cases", nargs="*", default=list(CASES))
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = base_emulator(options.base, pathlib.Path(tmp))
        sides = {"base": (base.Machine, base.hazards), "this": (Machine, hazards)}
        for case in options.cases:
            for arch in emu_speed.ARCHS:
                best, keys = {}, {}
                for machine, _ in sides.values():
                    CASES[case](arch, machine)  # compile, warm caches
                for _ in range(options.runs):
                    for side, (machine, analysis) in sides.items():
                        analysis._PROGRAMS.clear()  # a new process analyses a kernel's hazards once
                        seconds, keys[side] = CASES[case](arch, machine)
                        best[side] = min(best.get(side, float("inf")), seconds)
                if keys["base"] != keys["this"]:
                    raise SystemExit(f"{case} {arch}: results differ: {keys}")
                wall, cpu = yardstick()
                wi = keys["this"][-1]
                print(f"{case:<10} {arch:<7} base {best['base']:.4f} s  this {best['this']:.4f} s  "
                      f"x{best['base'] / best['this']:.2f}  this {wi / best['this']:>11,.0f} wave-instr/s  "
                      f"base {wi / best['base']:>11,.0f}  yardstick {wall:.3f} s (process {cpu:.3f} s)",
                      flush=True)


if __name__ == "__main__":
    main()
