"""How fast the K2 kernel is by the emulator's timing model (k2back.emu.timing),
against the HBM roofline and the latency floor (k2back.profile), three tables:

- main: V4.1-Flash (ratio 2) TP 4 at S 1, 2, 16, 48 and TP 8 at S 1, both archs:
  modeled, roofline, floor (us) and modeled / (roofline + floor);
- unfused: the same work as four launches of the single-stage kernels (each
  awaits flags the previous launch's stage would set: set here, its data is in
  scratch from the previous launch), their modeled times summed, plus what each
  kernel boundary costs: a plain launch (`launch_ns`) and a drain
  (`kernel_drain_ns`), or a node of a replayed HIP graph (`graph_node_ns`, drain
  included); the fused kernel pays one launch or one node;
- sensitivity: each cost-table entry x0.5 and x1.5 (mappings: every entry of
  them) -> modeled time of V4.1-Flash TP 4 S 1, ranked by the larger change.

Each row is a full emulated launch (V4.1-Flash S 1: about a minute; S 48 much
longer). Rows are appended to --json as they finish and a rerun skips them.
Run: .venv/bin/python benchmarks/modeled_time.py [--table main,unfused,sensitivity]
     [--arch gfx950] [--jobs 2] [--json benchmarks/modeled_time.jsonl]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import time
from pathlib import Path
from types import MappingProxyType

ARCHS = ("gfx942", "gfx950")
GEOMETRY, RATIO = "v4.1-flash", 2
MAIN = [(4, 1), (4, 2), (4, 16), (4, 48), (8, 1)]  # (tp, tokens)
UNFUSED = [(4, 1), (8, 1)]
SENSITIVITY_FIELDS = (  # in the order docs/timing-model.md expects them to matter
    "hbm_bytes_per_s", "handoff_ns", "hbm_ns", "clock_ghz", "release_fence_ns", "acquire_fence_ns",
    "mall_hit_ns", "sleep_quantum_cycles", "issue_cycles", "l2_hit_cycles", "vl1_hit_cycles",
    "cu_bytes_per_cycle", "mfma", "valu_slow", "l2_bytes_per_cycle_per_xcd", "branch_taken_cycles",
    "lds_latency_cycles", "sl1_hit_cycles", "sl1_miss_extra_cycles",
)
FACTORS = (0.5, 1.5)
PRODUCER = {"combine": "split", "wo_a": "combine", "wo_b": "wo_a"}


def setup(tp: int, tokens: int, arch: str):
    from k2back import ops
    from k2back.config import Config
    from k2back.testing import make_inputs

    spec, kernel = ops.kernel_for(Config(GEOMETRY, tp, tokens, RATIO, arch))
    inputs = make_inputs(GEOMETRY, tp, tokens, RATIO, 0, arch=spec.arch,
                         swa_fp8=spec.swa_fp8, comp_fp8=spec.comp_fp8)
    return spec, kernel, inputs


def scaled(part, field: str, factor: float):
    """`part` with one entry (every value of a mapping entry) scaled by `factor`."""
    from k2back.emu.timing_parts import Mfma

    value = getattr(part, field)
    if field == "mfma":
        value = MappingProxyType({k: Mfma(v.cycles * factor, v.f6f4_cycles and v.f6f4_cycles * factor)
                                  for k, v in value.items()})
    elif isinstance(value, MappingProxyType):
        value = MappingProxyType({k: v * factor for k, v in value.items()})
    else:
        value = value * factor
    return dataclasses.replace(part, **{field: value})


def row_main(tp: int, tokens: int, arch: str) -> dict:
    from k2back import profile

    spec, kernel, inputs = setup(tp, tokens, arch)
    stats = profile.emulate(spec, kernel, inputs)[1]
    result = profile.summary(spec, stats, profile.bounds(spec, inputs))
    return {k: result[k] for k in ("modeled_us", "roofline_us", "floor_us", "ratio")} | {
        "stages": {s["name"]: round(s["span_us"], 2) for s in result["stages"]}}


def row_unfused(tp: int, tokens: int, arch: str) -> dict:
    import torch

    from k2back import profile
    from k2back.codegen.compiler import compile as compile_source
    from k2back.codegen.render import STAGES, KernelSource
    from k2back.emu.timing_parts import part
    from k2back.runtime.launch import new_scratch

    spec, fused, inputs = setup(tp, tokens, arch)
    p = part(spec.arch)
    out_fused, stats = profile.emulate(spec, fused, inputs)
    scratch = new_scratch(spec, "cpu")
    kernels = {}
    for stage in STAGES:
        epoch = int(spec.view(scratch, "epoch", torch.int32)[0])
        if stage in PRODUCER:  # the previous launch set them (and tagged its words) under its own tag
            spec.view(scratch, f"{PRODUCER[stage]}_flags", torch.int32)[:] = epoch + 1
            spec.ll_retag(scratch, epoch + 1)
        kernel = compile_source(KernelSource(spec, (stage,)))
        out, stage_stats = profile.emulate(spec, kernel, inputs, scratch=scratch)
        kernels[stage] = stage_stats.modeled_ns / 1e3
    launches, boundaries = len(STAGES), len(STAGES) - 1
    fused_us = stats.modeled_ns / 1e3
    total = sum(kernels.values())
    return {"fused_us": fused_us, "stages_us": kernels, "stages_sum_us": total,
            "same_out": bool(torch.equal(out.view(torch.int16), out_fused.view(torch.int16))),
            "fused_launch_us": fused_us + p.launch_ns / 1e3,
            "unfused_launch_us": total + (launches * p.launch_ns + boundaries * p.kernel_drain_ns) / 1e3,
            "fused_graph_us": fused_us + p.graph_node_ns / 1e3,
            "unfused_graph_us": total + launches * p.graph_node_ns / 1e3}


def row_sensitivity(field: str, factor: float, arch: str) -> dict:
    from k2back import profile
    from k2back.emu.timing_parts import part

    spec, kernel, inputs = setup(4, 1, arch)
    p = part(spec.arch) if field is None else scaled(part(spec.arch), field, factor)
    return {"modeled_us": profile.emulate(spec, kernel, inputs, part=p)[1].modeled_ns / 1e3}


ROWS = {"main": row_main, "unfused": row_unfused, "sensitivity": row_sensitivity}


def jobs(tables, archs):
    for arch in archs:
        if "main" in tables:
            yield from (("main", (tp, s, arch)) for tp, s in MAIN if s < 48)
        if "unfused" in tables:
            yield from (("unfused", (tp, s, arch)) for tp, s in UNFUSED)
        if "sensitivity" in tables:
            yield "sensitivity", (None, 1.0, arch)
            yield from (("sensitivity", (f, x, arch)) for f in SENSITIVITY_FIELDS for x in FACTORS)
    if "main" in tables:  # the slowest last
        yield from (("main", (tp, s, arch)) for arch in archs for tp, s in MAIN if s >= 48)


def run(job):
    table, args = job
    start = time.perf_counter()
    result = ROWS[table](*args)
    return {"table": table, "args": list(args), **result, "wall_s": round(time.perf_counter() - start, 1)}


def done_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def print_tables(rows: list[dict]) -> None:
    main = [r for r in rows if r["table"] == "main"]
    if main:
        print(f"{'config':<26} {'modeled':>8} {'roofline':>9} {'floor':>6} {'ratio':>6}  (us)")
        for r in sorted(main, key=lambda r: (r["args"][2], r["args"][0], r["args"][1])):
            tp, s, arch = r["args"]
            print(f"{f'TP {tp} S {s} {arch}':<26} {r['modeled_us']:8.2f} {r['roofline_us']:9.2f} "
                  f"{r['floor_us']:6.2f} {r['ratio']:6.2f}")
    unfused = [r for r in rows if r["table"] == "unfused"]
    if unfused:
        print(f"\n{'config':<20} {'fused':>7} {'4 kernels':>9} {'+launch: fused':>15} {'unfused':>8} "
              f"{'graph: fused':>13} {'unfused':>8} {'same out':>9}  (us)")
        for r in unfused:
            tp, s, arch = r["args"]
            print(f"{f'TP {tp} S {s} {arch}':<20} {r['fused_us']:7.2f} {r['stages_sum_us']:9.2f} "
                  f"{r['fused_launch_us']:15.2f} {r['unfused_launch_us']:8.2f} {r['fused_graph_us']:13.2f} "
                  f"{r['unfused_graph_us']:8.2f} {r['same_out']!s:>9}")
            print("    stage kernels: " + ", ".join(f"{k} {v:.2f}" for k, v in r["stages_us"].items()))
    for arch in ARCHS:
        sens = {(r["args"][0], r["args"][1]): r["modeled_us"] for r in rows
                if r["table"] == "sensitivity" and r["args"][2] == arch}
        base = sens.get((None, 1.0))
        if not base:
            continue
        print(f"\nsensitivity, V4.1-Flash TP 4 S 1 {arch}: modeled {base:.2f} us")
        ranked = sorted(SENSITIVITY_FIELDS, key=lambda f: -max(abs(sens.get((f, x), base) - base) for x in FACTORS))
        print(f"{'entry':<28} {'x0.5':>8} {'x1.5':>8}  (change in modeled us)")
        for f in ranked:
            if all((f, x) in sens for x in FACTORS):
                print(f"{f:<28} {sens[(f, 0.5)] - base:+8.2f} {sens[(f, 1.5)] - base:+8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", default="main,unfused,sensitivity")
    parser.add_argument("--arch", default=",".join(ARCHS))
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--json", type=Path, default=Path("benchmarks/modeled_time.jsonl"))
    parser.add_argument("--print-only", action="store_true", help="print the tables from --json")
    args = parser.parse_args()
    rows = done_rows(args.json)
    if not args.print_only:
        have = {(r["table"], tuple(r["args"])) for r in rows}
        todo = [j for j in jobs(args.table.split(","), args.arch.split(","))
                if (j[0], tuple(j[1])) not in have]
        with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
            for row in pool.imap_unordered(run, todo):
                rows.append(row)
                with args.json.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"{row['table']} {row['args']}: {row['wall_s']} s", flush=True)
    print_tables(rows)


if __name__ == "__main__":
    main()
