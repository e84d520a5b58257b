"""The `timeline` build (plan(..., timeline=True)): its layout in the plan, and
the stamped kernel run in the emulator's timing mode, where s_memrealtime reads
the wave's modeled clock: the stamps read back by k2back.profile.stamped_tasks
must be ordered as each CTA ran its tasks, lie inside the modeled launch, and
the profile drawn from them must agree with the one drawn from the spans the
emulator itself attributes to each stage of the same launch (a reader that
misreads the records must not); the stamped kernel must still compute the
reference's numbers."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from k2back import ops, profile
from k2back.codegen import plan as plan_module
from k2back.codegen.compiler import compile as compile_source
from k2back.codegen.plan import TASK_STAMPS, plan
from k2back.codegen.render import KernelSource
from k2back.codegen.targets import ARCHS
from k2back.config import Config
from k2back.emu.timing_parts import part
from k2back.profile import (
    STAGES,
    cta_events,
    emulate,
    stage_table,
    stamped_events,
    stamped_tasks,
    waits_on_flags,
)
from k2back.runtime.launch import new_scratch
from k2back.testing import compare, launch_results, make_inputs, reference_of

CONFIG = ("tiny", 4, 3, 2)
# A task begins at the CTA's previous stamp (the previous task's end, or its start in
# the epoch's thread-0 block, in each of its records); the emulator's span of a stage begins at the stage's
# first block: between them run the task loop's control, the GEMV slot predicates and,
# for a CTA's first stage, the end of the epoch protocol; a task's end is stamped
# before its last barrier. A stamp ticks at 100 MHz. Seen: at most 141 ns (gfx950)
# and 176 ns (gfx942) per CTA and stage.
SPAN_TOLERANCE_NS = 250.0
GEMV_STAGES = ("wo_a", "wo_b")


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_timeline_is_a_build_option_with_its_own_name_key_and_region(arch):
    plain, stamped = plan(*CONFIG, arch), plan(*CONFIG, arch, timeline=True)
    assert stamped.name == plain.name + "_timeline" and stamped.key() != plain.key()
    assert "timeline" not in [r.name for r in plain.scratch]
    assert stamped.scratch[:-1] == plain.scratch
    region = stamped.region("timeline")
    assert region.offset >= plain.scratch_bytes and region.offset + region.bytes <= stamped.scratch_bytes
    assert region.bytes == stamped.blocks * stamped.stamp_row_bytes
    # every stamp of every task of every CTA has its own slot in the row
    seen = set()
    for stage in STAGES:
        tasks, first, spread = stamped.stage_tasks[stage]
        for t, kind in itertools.product(range(tasks), TASK_STAMPS):
            cta, nth = (first + t % spread) % stamped.blocks, t // spread
            at = stamped.stamp_at(stage, kind) + nth * stamped.stamp_record_bytes
            assert 0 <= at < stamped.stamp_row_bytes and at % plan_module.STAMP_BYTES == 0
            seen.add(cta * stamped.stamp_row_bytes + at)
    assert len(seen) == sum(stamped.stage_tasks[s][0] for s in STAGES) * len(TASK_STAMPS)


def test_reading_stamps_of_a_plain_build_names_the_problem():
    spec = plan(*CONFIG, "gfx950")
    with pytest.raises(ValueError, match="timeline build"):
        stamped_tasks(spec, new_scratch(spec, "cpu"), 100e6)


def test_stamps_are_read_modulo_the_counter_wrap():
    spec = plan(*CONFIG, "gfx950", timeline=True)
    scratch = new_scratch(spec, "cpu")
    rows = spec.view(scratch, "timeline", torch.int32, (spec.blocks, -1))
    base = 2**32 - 150  # a GPU counter about to wrap: stamps after it read small
    for cta, tasks in profile.cta_tasks(spec).items():
        ticks = [base + 10 * cta + 20 * i for i in range(1 + 2 * len(tasks))]
        row = [0] * rows.shape[1]
        for i, (stage, _, nth) in enumerate(tasks):
            slot = spec.stamp_rows[stage][0] + nth * len(TASK_STAMPS)
            for kind, tick in zip(("start", "wait", "end"), (ticks[0], ticks[1 + 2 * i], ticks[2 + 2 * i])):
                row[slot + TASK_STAMPS.index(kind)] = tick
        rows[cta] = torch.tensor([(t + 2**31) % 2**32 - 2**31 for t in row], dtype=torch.int32)
    tasks = stamped_tasks(spec, scratch, 100e6)
    first = min(tasks, key=lambda t: (t.cta, t.begin_ns))
    assert first.cta == 0 and first.begin_ns == 0.0
    assert max(t.end_ns for t in tasks) < 1e4  # no task is read as lasting 43 s


def check_against_spans(spec, scratch, stats):
    """The profile drawn from the stamps agrees with the one drawn from the emulator's
    stage spans of the same launch; AssertionError says where not."""
    tick_hz = part(spec.arch).memrealtime_hz
    tasks = stamped_tasks(spec, scratch, tick_hz, 0)
    written = spec.view(scratch, "timeline", torch.int32).count_nonzero().item()
    assert written == profile.stamps_written(spec)  # every stamp, and nothing else in the region
    assert len(tasks) == sum(spec.stage_tasks[s][0] for s in STAGES)
    spans, ctas = cta_events(stats.timeline), stamped_events(tasks)
    for cta, ran in ctas.items():  # in the order the CTA ran them
        stamps = [s for stage, b, e in ran["run"] for s in (b, e)]
        assert stamps == sorted(stamps), f"CTA {cta}: stamps out of order"
        assert 0 < stamps[0] and stamps[-1] <= stats.modeled_ns, f"CTA {cta}: stamps outside the launch"
        for stage in {r[0] for r in ran["run"]}:
            mine = [(b, e) for st, b, e in ran["run"] if st == stage]
            theirs = [(b, e) for st, b, e in spans[cta]["run"] if st == stage]
            assert min(mine)[0] == pytest.approx(min(theirs)[0], abs=SPAN_TOLERANCE_NS), (cta, stage)
            assert max(e for _, e in mine) == pytest.approx(max(e for _, e in theirs), abs=SPAN_TOLERANCE_NS)
    for mine, theirs in zip(stage_table(spec, ctas), stage_table(spec, spans)):
        assert (mine.name, mine.tasks, mine.ctas) == (theirs.name, theirs.tasks, theirs.ctas)
        assert mine.start_us == pytest.approx(theirs.start_us, abs=SPAN_TOLERANCE_NS / 1e3), mine.name
        assert mine.end_us == pytest.approx(theirs.end_us, abs=SPAN_TOLERANCE_NS / 1e3), mine.name
    wave0 = {cta: [(region, s, e) for kind, region, s, e in events if kind == "poll"]
             for (cta, wave), events in stats.timeline.items() if wave == 0}
    for t in tasks:
        nth = spec.task_cta(t.stage, t.task)[1]
        assert (t.wait_ns is not None) == waits_on_flags(spec, t.stage, nth)
        if t.wait_ns is None:
            continue
        assert t.begin_ns <= t.wait_ns <= t.end_ns, t
        # the wait ends after the last s_sleep between polls of it, within one more flag
        # load (at worst a cross-XCD hand-off): the CTA's (any wave's), or a GEMV task's
        # wave 0's (its waves await flags of their own: the record holds wave 0's wait)
        polls = wave0.get(t.cta, []) if t.stage in GEMV_STAGES else spans[t.cta]["wait"]
        slept = [e for region, s, e in polls
                 if region == t.stage and t.begin_ns - 1e9 / tick_hz <= e <= t.end_ns]
        if slept:
            assert max(slept) - 1e9 / tick_hz <= t.wait_ns <= max(slept) + part(spec.arch).handoff_ns


@pytest.mark.kernel
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_stamped_kernel_in_timing_mode(arch, monkeypatch):
    config = Config(*CONFIG, arch).resolved()
    spec, kernel = ops.build(config, timeline=True)
    inputs = make_inputs(*CONFIG, seed=3, arch=spec.arch, swa_fp8=spec.swa_fp8, comp_fp8=spec.comp_fp8)
    scratch = new_scratch(spec, "cpu")
    out, stats = emulate(spec, kernel, inputs, scratch=scratch)
    for name, pair in launch_results(spec, scratch, out, reference_of(spec, inputs)).items():
        compare(name, *pair)
    check_against_spans(spec, scratch, stats)
    # a reader that takes a record's end for its wait (and the wait for the end) fails
    monkeypatch.setattr(plan_module, "TASK_STAMPS", TASK_STAMPS[::-1])
    with pytest.raises(AssertionError):
        check_against_spans(spec, scratch, stats)


def check_stamp_budget(config):
    """The stamps cost at most STAMP_BUDGET of the kernel's wave-instructions (the
    polls they move aside: benchmarks/timeline_overhead.py), and something: a stamped
    build that stamped nothing would pass a bound alone."""
    cost = profile.stamp_cost(config.resolved())
    assert 0 < cost.overhead <= profile.STAMP_BUDGET, f"{cost.overhead:.2%}"


@pytest.mark.kernel
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_stamps_cost_at_most_their_budget(arch):
    check_stamp_budget(Config(*CONFIG, arch))


@pytest.mark.kernel
@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_stamps_cost_at_most_their_budget_on_the_real_model(arch):
    """V4.1-Flash TP 4 S 1: 224 GEMV tasks of 8 waves that each await their own flags
    (a stamp a wave costs 1,792 wave-instructions; 0.3 % of the gfx950 kernel), about 35 s
    an arch. Main a2cbb8f (every wave's wait end in LDS, the record their max): gfx942
    1.29 %, gfx950 2.31 %."""
    check_stamp_budget(Config("v4.1-flash", 4, 1, 2, arch))


@pytest.mark.kernel
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_stamped_kernel_of_several_tasks_a_cta(arch):
    """A grid of 4 CTAs: each runs several tasks of a stage (the split and combine
    loops, two wo_a and two wo_b slots, wo_b's second without a wait); each task's
    record is its own and holds the CTA's start. Every CTA runs a first wo_a task
    here, so LLVM merges that task's block (weight loads and, on gfx942, the wait
    for them before the 0x80 clear: 1.2 us) into the one before it: the spans must
    still give that time to wo_a (gemv.task_slots' block), as the stamps do."""
    spec = plan(*CONFIG, arch, target=dataclasses.replace(ARCHS[arch], blocks=4), timeline=True)
    assert (spec.wo_a.per_cta, spec.wo_b.per_cta) == (2, 2)
    assert max(len(tasks) for tasks in profile.cta_tasks(spec).values()) == 7
    inputs = make_inputs(*CONFIG, seed=5, arch=spec.arch, swa_fp8=spec.swa_fp8, comp_fp8=spec.comp_fp8)
    scratch = new_scratch(spec, "cpu")
    out, stats = emulate(spec, compile_source(KernelSource(spec)), inputs, scratch=scratch)
    for name, pair in launch_results(spec, scratch, out, reference_of(spec, inputs)).items():
        compare(name, *pair)
    check_against_spans(spec, scratch, stats)
    rows = spec.view(scratch, "timeline", torch.int32, (spec.blocks, -1))
    for cta, tasks in profile.cta_tasks(spec).items():
        starts = {rows[cta, spec.stamp_rows[stage][0] + nth * len(TASK_STAMPS)].item() for stage, _, nth in tasks}
        assert len(starts) == 1, f"CTA {cta}: records of different starts {starts}"
