"""`k2back profile`: how fast the kernel is, against what the hardware allows.

One launch of the configuration in the emulator's timing mode (k2back.emu.timing,
costs from k2back.emu.timing_parts) gives the modeled time and, per CTA, when it
ran each stage and how long it polled flags. Beside it, two bounds:

- roofline: SPEC §6's minimum bytes (`KernelSpec.minimum_bytes`) at the part's
  achievable HBM bandwidth;
- latency floor: the first load from HBM plus three cross-XCD hand-offs (split ->
  combine -> wo_a -> wo_b), the dependency chain no schedule avoids.

`modeled / (roofline + floor)` is the ratio the planner is tuned toward.
Stages are found in the kernel's asm: LLVM prints each IR block's name beside its
label (`; %combine.wait.poll`); code after a stage's first block belongs to it.
A CTA's span of a stage covers all its tasks of that stage. A `timeline` build
(plan(..., timeline=True)) stamps each task itself: `stamped_tasks` reads them
back from the launch's scratch, the same way from the emulator and from a GPU.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

STAGES = ("split", "combine", "wo_a", "wo_b")  # the kernel's stages, in hand-off order
HANDOFFS = len(STAGES) - 1
REGIONS = ("epoch", *STAGES)
_BLOCK = re.compile(r";\s*%((?:" + "|".join(REGIONS) + r")\b[\w.]*)\s*$")
_JOIN = re.compile(r"\.(end|skip)\b")  # a stage's exit blocks: LLVM may place them anywhere
STAGE_COLOURS = {"epoch": "#9e9e9e", "split": "#4c72b0", "combine": "#dd8452",
                 "wo_a": "#55a868", "wo_b": "#c44e52", "entry": "#cccccc"}


def stage_regions(asm: str):
    """`regions(kernel)` for Machine: each instruction's stage (or "epoch" /
    "entry"), from the IR block names LLVM prints beside the block labels (a
    stage's exit blocks, `.end` / `.skip`, are not marks: they can land anywhere)."""
    marks = [(number, found.group(1).split(".")[0])
             for number, line in enumerate(asm.splitlines(), 1)
             if line.startswith((".LBB", "; %bb")) and (found := _BLOCK.search(line))
             and not _JOIN.search(found.group(1))]

    def regions(kernel) -> list[str]:
        out, stage, i = [], "entry", 0
        for ins in kernel.instructions:
            while i < len(marks) and marks[i][0] < ins.line:
                stage = marks[i][1]
                i += 1
            out.append(stage)
        return out
    return regions


@dataclasses.dataclass
class Stage:
    name: str
    tasks: int
    ctas: int
    start_us: float
    end_us: float
    wait_us: float  # mean, over the stage's CTAs that polled, of the time some wave polled a flag
    wait_max_us: float

    @property
    def span_us(self) -> float:
        return self.end_us - self.start_us


def merged(intervals) -> list[tuple[float, float]]:
    """Union of (start, end) intervals, sorted."""
    out = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def cta_events(timeline: dict) -> dict[int, dict]:
    """workgroup -> {"run": [(stage, start, end)] of wave 0, "wait": [(stage, start,
    end)] while some wave polled} in ns."""
    ctas = {}
    for (group, wave), events in timeline.items():
        cta = ctas.setdefault(group, {"run": [], "polls": {}})
        for kind, region, start, end in events:
            if kind == "run" and wave == 0:
                cta["run"].append((region, start, end))
            elif kind == "poll":
                cta["polls"].setdefault(region, []).append((start, end))
    for cta in ctas.values():
        cta["wait"] = [(region, s, e) for region, spans in cta.pop("polls").items()
                       for s, e in merged(spans)]
        cta["run"].sort(key=lambda r: r[1])
    return ctas


def stage_ctas(spec, name: str) -> set[int]:
    """The CTAs that run tasks of stage `name` (spec.task_cta)."""
    return {spec.task_cta(name, t)[0] for t in range(spec.stage_tasks[name][0])}


def stage_table(spec, ctas: dict) -> list[Stage]:
    """Per stage, over the CTAs that run its tasks: first start, last end, flag
    waits (mean over those that polled, and the longest)."""
    rows = []
    for name in STAGES:
        tasks = spec.stage_tasks[name][0]
        workers = stage_ctas(spec, name) & ctas.keys()
        runs = [(s, e) for g in workers for region, s, e in ctas[g]["run"] if region == name]
        waits = [w for g in workers
                 if (w := sum(e - s for region, s, e in ctas[g]["wait"] if region == name))]
        rows.append(Stage(name, tasks, len(workers),
                          min((s for s, _ in runs), default=0.0) / 1e3,
                          max((e for _, e in runs), default=0.0) / 1e3,
                          sum(waits) / len(waits) / 1e3 if waits else 0.0,
                          max(waits, default=0.0) / 1e3))
    return rows


def critical_path(ctas: dict) -> list[tuple[int, str, float, float]]:
    """(cta, stage, start, end) segments of the chain that ends last: the last CTA's
    last stage; before a segment that waited on flags, the producing stage's segment
    (begun before the wait ended) that ended last; and so on back to the first stage."""
    last = max(ctas, key=lambda g: max((e for _, _, e in ctas[g]["run"]), default=0.0))
    path, cta = [], last
    stage_index, before = len(STAGES) - 1, float("inf")
    while stage_index >= 0:
        stage = STAGES[stage_index]
        segments = [(s, e) for region, s, e in ctas[cta]["run"] if region == stage and s < before]
        if not segments:
            stage_index -= 1
            continue
        start, end = max(segments, key=lambda se: se[1])
        path.append((cta, stage, start, end))
        waits = [e for region, s, e in ctas[cta]["wait"] if region == stage and start <= s <= end]
        if not waits or stage_index == 0:
            break
        seen = max(waits)  # the producers' flags had all arrived by then
        producer = STAGES[stage_index - 1]
        ends = [(e, g) for g, c in ctas.items() for region, s, e in c["run"] if region == producer and s < seen]
        if not ends:
            break
        before, cta = max(ends)
        stage_index -= 1
    return path[::-1]


@dataclasses.dataclass(frozen=True)
class StampedTask:
    """One task's stamps of a `timeline` build, in ns of s_memrealtime."""

    cta: int
    stage: str
    task: int
    begin_ns: float
    wait_ns: float | None  # its flag wait ended (None: the task waits on no flag)
    end_ns: float


def waits_on_flags(stage: str, nth: int) -> bool:
    """Whether a CTA's `nth` task of `stage` ends a flag wait (kernel.ll.j2):
    every combine and wo_a task; wo_b's first task on a CTA."""
    return stage in ("combine", "wo_a") or (stage == "wo_b" and nth == 0)


def stamped_tasks(spec, scratch, tick_hz: float) -> list[StampedTask]:
    """The tasks of a launch of a `timeline` build (`spec.timeline`) from its
    scratch's `timeline` region, s_memrealtime ticks of `tick_hz` in ns: for
    each CTA the tasks it ran of each stage (the plan's task tables), in order."""
    import torch

    if not spec.timeline:
        raise ValueError(f"spec: expected a timeline build (plan(..., timeline=True)), got {spec.name}")
    from k2back.codegen.plan import TASK_STAMPS

    rows = spec.view(scratch, "timeline", torch.int64, (spec.blocks, -1)).cpu().tolist()
    ns = 1e9 / tick_hz
    out = []
    for name in STAGES:
        slot0 = spec.stamp_rows[name][0]
        for t in range(spec.stage_tasks[name][0]):
            cta, nth = spec.task_cta(name, t)
            begin, wait, end = rows[cta][slot0 + nth * len(TASK_STAMPS):][:len(TASK_STAMPS)]
            out.append(StampedTask(cta, name, t, begin * ns,
                                   wait * ns if waits_on_flags(name, nth) else None, end * ns))
    return sorted(out, key=lambda s: (s.cta, s.begin_ns))


def bounds(spec, inputs) -> dict[str, float]:
    """roofline_us and floor_us of the configuration on spec.arch's part."""
    from k2back.emu.timing_parts import part
    from k2back.reference import gather_keys

    p = part(spec.arch)
    _, valid = gather_keys(*(inputs[k] for k in ("key_table", "key_len", "swa_cache", "swa_block",
                                                   "comp_cache", "comp_block")),
                           swa_fp8=spec.swa_fp8, comp_fp8=spec.comp_fp8)
    minimum = sum(spec.minimum_bytes(int(valid.sum())).values())
    return {"minimum_bytes": minimum, "roofline_us": minimum / p.hbm_bytes_per_s * 1e6,
            "floor_us": (p.hbm_ns + HANDOFFS * p.handoff_ns) / 1e3}


def emulate(spec, kernel, inputs, part=None, scratch=None):
    """One timed launch in the emulator (on a fresh scratch unless given), charging
    `part`'s costs (default: the arch's table); returns (out, Stats)."""
    import torch

    from k2back.runtime.emu import EmuBackend
    from k2back.testing import run_kernel

    backend = EmuBackend(timing=part or True, regions=stage_regions(kernel.asm))
    scratch = backend.new_scratch(spec, torch.device("cpu")) if scratch is None else scratch
    return run_kernel(spec, kernel, inputs, scratch, backend)


def profile(config, *, seed: int = 0) -> tuple[dict, object]:
    """(profile.json's content, the launch's Stats) of one configuration (a
    k2back.config.Config)."""
    from k2back import ops
    from k2back.testing import make_inputs

    spec, kernel = ops.kernel_for(config)
    inputs = make_inputs(config.geometry, config.tp, config.tokens, config.ratio, seed, arch=spec.arch,
                         swa_fp8=spec.swa_fp8, comp_fp8=spec.comp_fp8)
    stats = emulate(spec, kernel, inputs)[1]
    return summary(spec, stats, bounds(spec, inputs)), stats


def summary(spec, stats, limits: dict) -> dict:
    ctas = cta_events(stats.timeline)
    modeled = stats.modeled_ns / 1e3
    return {
        "config": {"geometry": spec.geometry, "tp": spec.tp, "tokens": spec.tokens,
                   "ratio": spec.ratio, "arch": spec.arch, "kernel": spec.name},
        "modeled_us": modeled,
        "roofline_us": limits["roofline_us"],
        "floor_us": limits["floor_us"],
        "ratio": modeled / (limits["roofline_us"] + limits["floor_us"]),
        "minimum_bytes": limits["minimum_bytes"],
        "stages": [dataclasses.asdict(s) | {"span_us": s.span_us} for s in stage_table(spec, ctas)],
        "critical_path": [{"cta": g, "stage": st, "start_us": s / 1e3, "end_us": e / 1e3}
                          for g, st, s, e in critical_path(ctas)],
    }


def report(result: dict) -> str:
    c = result["config"]
    lines = [(f"{c['kernel']} ({c['geometry']} TP {c['tp']} S {c['tokens']} ratio {c['ratio']} "
             f"{c['arch']}), emulator timing model"),
             f"  modeled   {result['modeled_us']:8.2f} us",
             (f"  roofline  {result['roofline_us']:8.2f} us  ({result['minimum_bytes'] / 1e6:.1f} MB at "
             "the part's achievable HBM bandwidth)"),
             f"  floor     {result['floor_us']:8.2f} us  (first HBM load + {HANDOFFS} hand-offs)",
             f"  ratio     {result['ratio']:8.2f}  modeled / (roofline + floor)",
             (f"  {'stage':<8} {'tasks':>6} {'CTAs':>5} {'start':>8} {'end':>8} {'span':>8} "
             f"{'flag wait':>10} {'max wait':>9}  (us)")]
    for s in result["stages"]:
        lines.append(f"  {s['name']:<8} {s['tasks']:>6} {s['ctas']:>5} {s['start_us']:8.2f} "
                     f"{s['end_us']:8.2f} {s['span_us']:8.2f} {s['wait_us']:10.2f} {s['wait_max_us']:9.2f}")
    path = " -> ".join(f"{p['stage']}@CTA{p['cta']}" for p in result["critical_path"])
    lines.append(f"  critical path: {path}")
    return "\n".join(lines)


def chrome_trace(stats) -> dict:
    """Chrome trace events (Perfetto): a track per CTA (wave 0's stage spans) and the
    spans in which some wave of it polled a flag."""
    events = []
    for group, cta in sorted(cta_events(stats.timeline).items()):
        events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": group,
                       "args": {"name": f"CTA {group}"}})
        for kind, items in (("run", cta["run"]), ("flag wait", cta["wait"])):
            for region, start, end in items:
                events.append({"ph": "X", "pid": 0, "tid": group, "cat": kind,
                               "name": region if kind == "run" else f"wait {region}",
                               "ts": start / 1e3, "dur": (end - start) / 1e3})
    return {"traceEvents": events, "displayTimeUnit": "ns"}


def draw_timeline(result: dict, stats, path: Path) -> None:
    """CTAs x time, coloured by stage, flag waits hatched, the critical path outlined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ctas = cta_events(stats.timeline)
    fig, ax = plt.subplots(figsize=(12, 7), dpi=110)
    for group, cta in ctas.items():
        for region, start, end in cta["run"]:
            ax.broken_barh([(start / 1e3, (end - start) / 1e3)], (group - 0.5, 1.0),
                           facecolors=STAGE_COLOURS.get(region, "#cccccc"), linewidth=0)
        for _, start, end in cta["wait"]:
            ax.broken_barh([(start / 1e3, (end - start) / 1e3)], (group - 0.5, 1.0),
                           facecolors="white", alpha=0.55, linewidth=0)
    for p in result["critical_path"]:
        ax.broken_barh([(p["start_us"], p["end_us"] - p["start_us"])], (p["cta"] - 2, 4),
                       facecolors="none", edgecolors="black", linewidth=1.5)
    c = result["config"]
    ax.set_title(f"{c['geometry']} TP {c['tp']} S {c['tokens']} {c['arch']}: modeled "
                 f"{result['modeled_us']:.1f} us, roofline {result['roofline_us']:.1f} us, "
                 f"floor {result['floor_us']:.1f} us")
    ax.set_xlabel("us since launch (emulator timing model)")
    ax.set_ylabel("CTA")
    ax.set_ylim(-1, max(ctas) + 1)
    handles = [Patch(color=STAGE_COLOURS[s], label=s) for s in REGIONS]
    handles += [Patch(facecolor="#eeeeee", label="polling a flag (faded)"),
                Patch(facecolor="none", edgecolor="black", label="critical path")]
    ax.legend(handles=handles, loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write(result: dict, stats, out: Path) -> list[Path]:
    """profile.json, trace.json, timeline.png under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "profile.json", out / "trace.json", out / "timeline.png"]
    paths[0].write_text(json.dumps(result, indent=1))
    paths[1].write_text(json.dumps(chrome_trace(stats)))
    draw_timeline(result, stats, paths[2])
    return paths
