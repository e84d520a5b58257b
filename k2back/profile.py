"""`k2back profile`: how fast the kernel is, against what the hardware allows.

One launch of the configuration in the emulator's timing mode (k2back.emu.timing,
costs from k2back.emu.timing_parts) gives the modeled time and, per CTA, when it
ran each stage and how long it polled flags. Beside it, two bounds:

- roofline: SPEC §6's minimum bytes (`KernelSpec.minimum_bytes`) at the part's
  achievable HBM bandwidth;
- latency floor: the first load from HBM plus three cross-XCD hand-offs (split ->
  combine -> wo_a -> wo_b), the dependency chain no schedule avoids.

`modeled / (roofline + floor)` is the ratio the planner is tuned toward.
Two sources of the per-CTA picture (`cta_events`' shape: runs and flag waits):
- the emulator's stage spans: stages are found in the kernel's asm, LLVM prints
  each IR block's name beside its label (`; %combine.wait.poll`); code after a
  stage's first block belongs to it; a CTA's span of a stage covers all its tasks;
- a `timeline` build's stamps (plan(..., timeline=True)): `stamped_tasks` reads
  them back from the launch's scratch, the same way from the emulator (whose
  s_memrealtime reads the modeled clock) and from a GPU (`--backend hip`, ticks
  of the device's wallClockRate), so model and hardware compare line by line.
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
BETWEEN = "between"  # the region of a stage's exit blocks: no stage's work
STAGE_COLOURS = {"epoch": "#9e9e9e", "split": "#4c72b0", "combine": "#dd8452",
                 "wo_a": "#55a868", "wo_b": "#c44e52", "entry": "#cccccc", BETWEEN: "#cccccc"}


def stage_regions(asm: str):
    """`regions(kernel)` for Machine: each instruction's region from the IR name
    LLVM prints beside its block's label: a stage (or "epoch") for a block named
    by it ("split.start", "wo_a.run.0" ...); BETWEEN for a stage's exits
    (`.end` / `.skip`: their code is the way to whatever runs next); None for
    inlined blocks ("rec.swa.i"), which LLVM may lay out anywhere: a wave running
    one stays in the region it last entered (timing.Timing)."""
    labels = [(number, _region_of(line)) for number, line in enumerate(asm.splitlines(), 1)
              if line.startswith((".LBB", "; %bb"))]

    def regions(kernel) -> list[str | None]:
        out, region, i = [], None, 0
        for ins in kernel.instructions:
            while i < len(labels) and labels[i][0] < ins.line:
                region = labels[i][1]
                i += 1
            out.append(region)
        return out
    return regions


def _region_of(label: str) -> str | None:
    found = _BLOCK.search(label)
    if found is None:
        return None
    return BETWEEN if _JOIN.search(found.group(1)) else found.group(1).split(".")[0]


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


def stage_table(spec, ctas: dict) -> list[Stage]:
    """Per stage, over the CTAs that run its tasks: first start, last end, flag
    waits (mean over those that polled, and the longest)."""
    rows = []
    for name in STAGES:
        tasks = spec.stage_tasks[name][0]
        workers = spec.stage_ctas(name) & ctas.keys()
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
    """One task's stamps of a `timeline` build, in ns since the profile's origin."""

    cta: int
    stage: str
    task: int
    begin_ns: float  # the CTA's previous stamp: its previous task's end, or its start
    wait_ns: float | None  # its flag wait ended (None: the task waits on no flag)
    end_ns: float


def waits_on_flags(spec, stage: str, nth: int) -> bool:
    """Whether a CTA's `nth` task of `stage` ends a wait for its inputs (kernel.ll.j2):
    every combine and wo_a task; wo_b's first task on a CTA (its flags hold for the
    CTA's later tasks), or every wo_b task when it reads tagged words (each polls its
    own: gemv_x.load_batch)."""
    return stage in ("combine", "wo_a") or (stage == "wo_b" and (nth == 0 or spec.wo_b.ll))


def cta_tasks(spec) -> dict[int, list[tuple[str, int, int]]]:
    """CTA -> its (stage, task, nth) in the order it runs them."""
    out = {}
    for name in STAGES:
        for t in range(spec.stage_tasks[name][0]):
            cta, nth = spec.task_cta(name, t)
            out.setdefault(cta, []).append((name, t, nth))
    return out


def stamps_written(spec) -> int:
    """Stamps a launch of a timeline build writes: each task's record holds the
    CTA's start and the task's end, and the end of its flag wait if it waits."""
    tasks = [(stage, nth) for runs in cta_tasks(spec).values() for stage, _, nth in runs]
    return 2 * len(tasks) + sum(waits_on_flags(spec, *t) for t in tasks)


def stamped_tasks(spec, scratch, tick_hz: float, origin: int | None = None) -> list[StampedTask]:
    """The tasks of a launch of a `timeline` build (`spec.timeline`) from its
    scratch's `timeline` region: u32 s_memrealtime ticks of `tick_hz`, in ns since
    `origin` (ticks; the emulator's clock starts at 0 at launch) or, without one,
    since the earliest CTA start (a GPU's clock started at boot). Differences are
    taken modulo 2^32: a launch is far shorter than the counter's wrap."""
    import torch

    if not spec.timeline:
        raise ValueError(f"spec: expected a timeline build (plan(..., timeline=True)), got {spec.name}")
    from k2back.codegen.plan import TASK_STAMPS

    rows = (spec.view(scratch, "timeline", torch.int32, (spec.blocks, -1)).cpu().long() & 0xFFFFFFFF).tolist()
    runs = cta_tasks(spec)

    def stamp(cta: int, stage: str, nth: int, kind: str) -> int:
        return rows[cta][spec.stamp_rows[stage][0] + nth * len(TASK_STAMPS) + TASK_STAMPS.index(kind)]

    starts = {cta: stamp(cta, stage, nth, "start")  # in every record: the first task's
              for cta, ((stage, _, nth), *_) in runs.items()}
    if origin is None:
        first = starts[min(starts)]
        origin = min((t - first + 2**31) % 2**32 - 2**31 for t in starts.values()) + first
    ns = 1e9 / tick_hz

    def at(ticks: int) -> float:
        return ((ticks - origin) % 2**32) * ns

    out = []
    for cta, tasks in runs.items():
        begin = at(starts[cta])
        for stage, task, nth in tasks:
            wait, end = (stamp(cta, stage, nth, k) for k in ("wait", "end"))
            out.append(StampedTask(cta, stage, task, begin,
                                   at(wait) if waits_on_flags(spec, stage, nth) else None, at(end)))
            begin = at(end)
    return sorted(out, key=lambda s: (s.cta, s.begin_ns))


def stamped_events(tasks: list[StampedTask]) -> dict[int, dict]:
    """`cta_events`' shape from a timeline build's stamps: per CTA a run a task and
    a flag wait from the task's begin to its wait's end."""
    ctas = {}
    for t in tasks:
        cta = ctas.setdefault(t.cta, {"run": [], "wait": []})
        cta["run"].append((t.stage, t.begin_ns, t.end_ns))
        if t.wait_ns is not None:
            cta["wait"].append((t.stage, t.begin_ns, t.wait_ns))
    return ctas


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


STAMP_BUDGET = 0.01  # a timeline build's stamps: at most this part of the kernel's wave-instructions


@dataclasses.dataclass(frozen=True)
class StampCost:
    """What a `timeline` build's stamps cost: one timed launch of the plain and of
    the stamped kernel. The stamps move the modeled clock a little, so the polls
    (s_sleep loops: of a flag, or of a batch of tagged words, a longer trip) differ
    between the two and are part of the difference: `polled` is the instructions
    the polls added (each loop's change of sleeps times its trip, loops paired in
    asm order: polled_instructions), `overhead` is the difference without them."""
    plain: object  # Stats
    stamped: object
    polled: int

    @property
    def overhead(self) -> float:
        extra = self.stamped.wave_instructions - self.plain.wave_instructions
        return (extra - self.polled) / self.plain.wave_instructions


def poll_trips(asm: str) -> list[int]:
    """Instructions of one trip of each of the kernel's flag-poll loops (a block that
    holds an s_sleep and branches back to its own label)."""
    trips, label, body = [], None, []
    for line in asm.splitlines():
        text = line.split(";")[0].strip()
        if re.fullmatch(r"\.LBB\w+:", text):
            label, body = text[:-1], []
        elif text and not text.startswith("."):
            body.append(text.split()[0])
            if body[-1].startswith("s_cbranch") and text.split()[-1] == label and "s_sleep" in body:
                trips.append(len(body))
    return trips


def polled_instructions(asm: str, name: str, executed) -> list[int]:
    """Instructions the kernel's poll loops ran, each loop (asm order): its s_sleep's
    executions (Stats.executed) times its trip, the instructions from the label a
    branch after the sleep goes back to through that branch."""
    from k2back.emu.asm import parse_kernel

    kernel = parse_kernel(asm, name)
    at = {label: index for label, index in kernel.labels.items()}
    spent = []
    for pc, ins in enumerate(kernel.instructions):
        if ins.mnemonic != "s_sleep":
            continue
        for end in range(pc + 1, len(kernel.instructions)):
            branch = kernel.instructions[end]
            target = at.get(branch.operands[0]) if branch.mnemonic.startswith("s_cbranch") or \
                branch.mnemonic == "s_branch" else None
            if target is not None and target <= pc:
                spent.append(executed[pc] * (end - target + 1))
                break
    return spent


def stamp_cost(config, seed: int = 0) -> StampCost:
    """The stamps' cost (StampCost) of a configuration (a resolved Config)."""
    from k2back import ops
    from k2back.testing import make_inputs

    stats = []
    for timeline in (False, True):
        spec, kernel = ops.build(config, timeline=timeline)
        inputs = make_inputs(config.geometry, config.tp, config.tokens, config.ratio, seed, arch=spec.arch,
                             swa_fp8=spec.swa_fp8, comp_fp8=spec.comp_fp8)
        stats.append((emulate(spec, kernel, inputs)[1], kernel))
    loops = [polled_instructions(kernel.asm, kernel.name, s.executed) for s, kernel in stats]
    assert len(loops[0]) == len(loops[1]), "the stamped build's poll loops are the plain one's"
    return StampCost(stats[0][0], stats[1][0], sum(loops[1]) - sum(loops[0]))


def stamp_clock(backend, spec, device) -> tuple[float, int | None]:
    """(s_memrealtime ticks a second, the launch's origin in ticks or None) on
    `backend`: the emulator's modeled clock starts at 0 at launch at the part's
    rate; a GPU's counter runs at the device's wallClockRate (kHz) since boot."""
    if backend.name == "emu":
        from k2back.emu.timing_parts import part

        return part(spec.arch).memrealtime_hz, 0
    from k2back.runtime.hip import bindings, hip_check

    hip = bindings()
    khz = hip_check("hipDeviceGetAttribute", hip.hipDeviceGetAttribute(
        hip.hipDeviceAttribute_t.hipDeviceAttributeWallClockRate, device.index))
    return khz * 1e3, None


def launch_backend(name: str, asm: str):
    """(backend, device) of a profile launch: the emulator in timing mode (stage
    regions from the asm) on the CPU, or HIP on the current GPU (raises
    BackendUnavailable, naming what is missing, without ROCm or a GPU)."""
    import torch

    if name == "emu":
        from k2back.runtime.emu import EmuBackend

        return EmuBackend(timing=True, regions=stage_regions(asm)), torch.device("cpu")
    from k2back.runtime.hip import HipBackend

    backend = HipBackend()
    return backend, torch.device("cuda", torch.cuda.current_device())


def profile(config, *, seed: int = 0, backend: str = "emu", stamps: bool | None = None) -> tuple[dict, dict]:
    """(profile.json's content, per-CTA events as `cta_events` gives them) of one
    configuration (a k2back.config.Config). `backend` "emu": one launch in the
    emulator's timing model, drawn from its stage spans or, with `stamps`, from
    the timeline build's stamps; "hip": the timeline build's stamps of a launch
    on the GPU (always stamps). Everything but the launch is the same for both."""
    from k2back import ops
    from k2back.testing import make_inputs, run_kernel

    stamps = backend == "hip" if stamps is None else stamps
    if backend == "hip" and not stamps:
        raise ValueError("stamps: a GPU profile is drawn from the timeline build's stamps, got stamps=False")
    spec, kernel = ops.build(config.resolved(), timeline=stamps)
    inputs = make_inputs(config.geometry, config.tp, config.tokens, config.ratio, seed, arch=spec.arch,
                         swa_fp8=spec.swa_fp8, comp_fp8=spec.comp_fp8)
    runner, device = launch_backend(backend, kernel.asm)
    scratch = runner.new_scratch(spec, device)
    stats = run_kernel(spec, kernel, inputs, scratch, runner)[1]
    if stamps:
        ctas = stamped_events(stamped_tasks(spec, scratch, *stamp_clock(runner, spec, device)))
    else:
        ctas = cta_events(stats.timeline)
    source = ("GPU, timeline stamps" if backend == "hip" else
              "emulator timing model, " + ("timeline stamps" if stamps else "stage spans"))
    elapsed = stats.modeled_ns if backend == "emu" else max(e for c in ctas.values() for _, _, e in c["run"])
    return result_of(spec, ctas, elapsed, source, bounds(spec, inputs), measured=backend == "hip"), ctas


def summary(spec, stats, limits: dict) -> dict:
    """profile.json of an emulator launch's Stats, drawn from its stage spans."""
    return result_of(spec, cta_events(stats.timeline), stats.modeled_ns,
                     "emulator timing model, stage spans", limits)


def result_of(spec, ctas: dict, elapsed_ns: float, source: str, limits: dict, measured: bool = False) -> dict:
    """profile.json: the launch's time (`modeled_us`, or `measured_us` on a GPU)
    against the bounds, per stage, the critical path."""
    elapsed = elapsed_ns / 1e3
    return {
        "config": {"geometry": spec.geometry, "tp": spec.tp, "tokens": spec.tokens,
                   "ratio": spec.ratio, "arch": spec.arch, "kernel": spec.name},
        "source": source,
        "measured_us" if measured else "modeled_us": elapsed,
        "roofline_us": limits["roofline_us"],
        "floor_us": limits["floor_us"],
        "ratio": elapsed / (limits["roofline_us"] + limits["floor_us"]),
        "minimum_bytes": limits["minimum_bytes"],
        "stages": [dataclasses.asdict(s) | {"span_us": s.span_us} for s in stage_table(spec, ctas)],
        "critical_path": [{"cta": g, "stage": st, "start_us": s / 1e3, "end_us": e / 1e3}
                          for g, st, s, e in critical_path(ctas)],
    }


def elapsed_key(result: dict) -> str:
    return "measured_us" if "measured_us" in result else "modeled_us"


def report(result: dict) -> str:
    c = result["config"]
    key = elapsed_key(result)
    lines = [(f"{c['kernel']} ({c['geometry']} TP {c['tp']} S {c['tokens']} ratio {c['ratio']} "
             f"{c['arch']}), {result['source']}"),
             f"  {key[:-3]:<9} {result[key]:8.2f} us",
             (f"  roofline  {result['roofline_us']:8.2f} us  ({result['minimum_bytes'] / 1e6:.1f} MB at "
             "the part's achievable HBM bandwidth)"),
             f"  floor     {result['floor_us']:8.2f} us  (first HBM load + {HANDOFFS} hand-offs)",
             f"  ratio     {result['ratio']:8.2f}  {key[:-3]} / (roofline + floor)",
             (f"  {'stage':<8} {'tasks':>6} {'CTAs':>5} {'start':>8} {'end':>8} {'span':>8} "
             f"{'flag wait':>10} {'max wait':>9}  (us)")]
    for s in result["stages"]:
        lines.append(f"  {s['name']:<8} {s['tasks']:>6} {s['ctas']:>5} {s['start_us']:8.2f} "
                     f"{s['end_us']:8.2f} {s['span_us']:8.2f} {s['wait_us']:10.2f} {s['wait_max_us']:9.2f}")
    path = " -> ".join(f"{p['stage']}@CTA{p['cta']}" for p in result["critical_path"])
    lines.append(f"  critical path: {path}")
    return "\n".join(lines)


def chrome_trace(ctas: dict) -> dict:
    """Chrome trace events (Perfetto): a track per CTA, its stage runs and its flag
    waits (`cta_events` / `stamped_events`)."""
    events = []
    for group, cta in sorted(ctas.items()):
        events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": group,
                       "args": {"name": f"CTA {group}"}})
        for kind, items in (("run", cta["run"]), ("flag wait", cta["wait"])):
            for region, start, end in items:
                events.append({"ph": "X", "pid": 0, "tid": group, "cat": kind,
                               "name": region if kind == "run" else f"wait {region}",
                               "ts": start / 1e3, "dur": (end - start) / 1e3})
    return {"traceEvents": events, "displayTimeUnit": "ns"}


def draw_timeline(result: dict, ctas: dict, path: Path) -> None:
    """CTAs x time, coloured by stage, flag waits hatched, the critical path outlined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

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
    key = elapsed_key(result)
    ax.set_title(f"{c['geometry']} TP {c['tp']} S {c['tokens']} {c['arch']}: {key[:-3]} "
                 f"{result[key]:.1f} us, roofline {result['roofline_us']:.1f} us, "
                 f"floor {result['floor_us']:.1f} us")
    ax.set_xlabel(f"us since launch ({result['source']})")
    ax.set_ylabel("CTA")
    ax.set_ylim(-1, max(ctas) + 1)
    handles = [Patch(color=STAGE_COLOURS[s], label=s) for s in REGIONS]
    handles += [Patch(facecolor="#eeeeee", label="polling a flag (faded)"),
                Patch(facecolor="none", edgecolor="black", label="critical path")]
    ax.legend(handles=handles, loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write(result: dict, ctas: dict, out: Path) -> list[Path]:
    """profile.json, trace.json, timeline.png under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "profile.json", out / "trace.json", out / "timeline.png"]
    paths[0].write_text(json.dumps(result, indent=1))
    paths[1].write_text(json.dumps(chrome_trace(ctas)))
    draw_timeline(result, ctas, paths[2])
    return paths
