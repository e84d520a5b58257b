"""Efficiency of the K2 kernel where no timer exists: the emulator's counts.

Per configuration: global bytes read from the launch inputs against the SPEC
§6 minimum (each weight byte once, one KV record per valid (token, key), q,
key table), the hand-off traffic through scratch, and wave-instructions per
stage (kernels holding the first 1, 2, 3, 4 stages, differenced: a stage
subset only awaits flags of the stages it holds). Prints a table.

    .venv/bin/python benchmarks/kernel_efficiency.py [--full] [--large] [--formats]

--large measures S = 64 V4.1-Flash (where every chunk's q reread showed) with
the whole kernel only: bytes, no per-stage instruction split.
--formats: the split stage's wave-instructions (and VALU ones) for every pair
of key byte formats (swa_cache, comp_cache) on both archs, against the pair
vLLM writes there ("auto"): what reading a format costs (NaN bytes cleared,
the scale step). The other tables use "auto".
"""

from __future__ import annotations

import argparse
import time

import torch

from k2back import testing
from k2back.codegen.compiler import compile as compile_source
from k2back.codegen.plan import plan
from k2back.codegen.render import STAGES, KernelSource
from k2back.emu import Machine
from k2back.formats import KEY_FP8, resolve_key_fp8
from k2back.reference import gather_keys
from k2back.runtime import launch

CONFIGS = [  # (geometry, tp, tokens, ratio, arch)
    ("tiny", 4, 3, 2, "gfx942"),
    ("tiny", 1, 16, 0, "gfx950"),
]
FULL = [
    ("v4.1-flash", 4, 1, 2, "gfx942"),
    ("v4.1-flash", 4, 2, 2, "gfx950"),
    ("v4.1-flash", 8, 1, 0, "gfx942"),
]
FORMATS = [("tiny", 4, 3, 2), ("v4.1-flash", 4, 1, 2)]  # the second with --full
FORMAT_PAIRS = [(swa, comp) for swa in KEY_FP8 for comp in KEY_FP8]
LARGE = [
    ("v4.1-flash", 4, 64, 2, "gfx942"),
    ("v4.1-flash", 2, 64, 2, "gfx942"),
    ("v4.1-flash", 1, 64, 2, "gfx942"),
    ("v4.1-flash", 4, 64, 2, "gfx950"),
]


def emulate(spec, kernel, inputs: dict):
    """One launch in the emulator with every buffer mapped under its argument name."""
    machine = Machine(spec.arch)
    scratch = launch.new_scratch(spec, "cpu")
    tensors = {**inputs, "out": torch.zeros(spec.tokens, spec.hidden, dtype=torch.bfloat16)}
    segment = launch.kernargs(kernel, spec, tensors, machine.map(scratch, "scratch"),
                              machine.map, inputs["qk_scale"])
    dims = launch.launch_dims(spec)
    return machine.launch(kernel.asm, kernel.name, grid=dims.grid, block=dims.block,
                          kernargs=segment)


def measure(geometry, tp, tokens, ratio, arch, stage_counts=True) -> dict:
    spec = plan(geometry, tp, tokens, ratio, arch)
    inputs = testing.make_inputs(geometry, tp, tokens, ratio, seed=0, arch=arch)
    _, valid = gather_keys(*(inputs[k] for k in ("key_table", "key_len", "swa_cache",
                                                  "swa_block", "comp_cache", "comp_block")),
                           swa_fp8=spec.swa_fp8, comp_fp8=spec.comp_fp8)
    minimum = spec.minimum_bytes(int(valid.sum()))
    row = {"config": f"{geometry} tp{tp} s{tokens} r{ratio} {arch}"}
    previous = 0
    for n in range(1 if stage_counts else len(STAGES), len(STAGES) + 1):
        start = time.perf_counter()
        kernel = compile_source(KernelSource(spec, STAGES[:n]))
        row["compile_s"] = time.perf_counter() - start
        stats = emulate(spec, kernel, inputs)
        row[STAGES[n - 1]] = stats.wave_instructions - previous
        previous = stats.wave_instructions
    read = {k: v for k, v in stats.bytes_read.items() if k not in ("scratch", "out")}
    needed = sum(minimum.values()) - minimum["out"]
    row.update(read_mb=sum(read.values()) / 1e6, min_mb=needed / 1e6,
               ratio=sum(read.values()) / needed,
               scratch_mb=(stats.bytes_read.get("scratch", 0) + stats.bytes_written.get("scratch", 0)) / 1e6,
               mfma=stats.instructions.get("mfma", 0), polls=stats.total_polls)
    return row


def split_cost(geometry, tp, tokens, ratio, arch, swa_fp8, comp_fp8) -> tuple[int, int]:
    """(wave-instructions, VALU ones) of the split stage alone, on caches
    written in the given formats."""
    spec = plan(geometry, tp, tokens, ratio, arch, swa_fp8, comp_fp8)
    inputs = testing.make_inputs(geometry, tp, tokens, ratio, seed=0, arch=arch,
                                 swa_fp8=swa_fp8, comp_fp8=comp_fp8)
    stats = emulate(spec, compile_source(KernelSource(spec, ("split",))), inputs)
    return stats.wave_instructions, stats.instructions.get("valu", 0)


def format_table(configs) -> None:
    print(" | ".join(f"{c:>10}" if c != "config" else f"{c:<28}"
                     for c in ("config", "swa_fp8", "comp_fp8", "split", "valu", "vs auto")))
    for config in configs:
        for arch in ("gfx942", "gfx950"):
            label = "{} tp{} s{} r{} ".format(*config) + arch
            costs = {pair: split_cost(*config, arch, *pair) for pair in FORMAT_PAIRS}
            auto = costs[resolve_key_fp8(arch)][0]
            for (swa, comp), (split, valu) in costs.items():
                mark = " (auto)" if (swa, comp) == resolve_key_fp8(arch) else ""
                print(f"{label:<28} | {swa:>10} | {comp:>10} | {split:>10} | {valu:>10} | "
                      f"{split / auto - 1:>+9.2%}{mark}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also V4.1-Flash (slow: minutes each)")
    parser.add_argument("--large", action="store_true",
                        help="only S = 64 V4.1-Flash, whole kernel (slowest: one launch each)")
    parser.add_argument("--formats", action="store_true",
                        help="only the split stage's cost of every key format pair")
    args = parser.parse_args()
    if args.formats:
        format_table(FORMATS if args.full else FORMATS[:1])
        return
    columns = ["config", "read_mb", "min_mb", "ratio", "scratch_mb", *STAGES, "mfma", "polls",
               "compile_s"]
    print(" | ".join(f"{c:>10}" if c != "config" else f"{c:<28}" for c in columns))
    configs = LARGE if args.large else CONFIGS + (FULL if args.full else [])
    for config in configs:
        row = measure(*config, stage_counts=not args.large)
        cells = [f"{row[c]:<28}" if c == "config" else
                 f"{row.get(c, '-'):>10.3f}" if isinstance(row.get(c), float)
                 else f"{row.get(c, '-'):>10}" for c in columns]
        print(" | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
