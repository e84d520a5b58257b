"""The `timeline` build (plan(..., timeline=True)): its layout in the plan, and
the stamped kernel run in the emulator's timing mode, where s_memrealtime reads
the wave's modeled clock: the stamps read back by k2back.profile.stamped_tasks
must be ordered as each CTA ran its tasks, lie inside the modeled launch, agree
with the spans the emulator itself attributes to each stage, and the stamped
kernel must still compute the reference's numbers."""

from __future__ import annotations

import itertools

import pytest

from k2back import ops
from k2back.codegen.plan import TASK_STAMPS, plan
from k2back.config import Config
from k2back.emu.timing_parts import part
from k2back.profile import STAGES, cta_events, emulate, stamped_tasks, waits_on_flags
from k2back.runtime.launch import new_scratch
from k2back.testing import compare, launch_results, make_inputs, reference_of

CONFIG = ("tiny", 4, 3, 2)
# The emulator puts a stage's loop control around the stamped task bodies (task
# loop head and latch, the GEMV slots' predicates): a few dozen instructions.
SPAN_TOLERANCE_NS = 200.0


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_timeline_is_a_build_option_with_its_own_name_key_and_region(arch):
    plain, stamped = plan(*CONFIG, arch), plan(*CONFIG, arch, timeline=True)
    assert stamped.name == plain.name + "_timeline" and stamped.key() != plain.key()
    assert "timeline" not in [r.name for r in plain.scratch]
    assert stamped.scratch[:-1] == plain.scratch
    region = stamped.region("timeline")
    assert region.offset >= plain.scratch_bytes and region.offset + region.bytes <= stamped.scratch_bytes
    assert region.bytes == stamped.blocks * stamped.stamp_row_bytes
    # every stamp of every task of every CTA has its own slot in the CTA's row
    seen = set()
    for stage in STAGES:
        tasks, first, spread = stamped.stage_tasks[stage]
        for t, kind in itertools.product(range(tasks), TASK_STAMPS):
            cta, nth = (first + t % spread) % stamped.blocks, t // spread
            at = cta * stamped.stamp_row_bytes + stamped.stamp_at(stage, kind) + nth * stamped.stamp_record_bytes
            assert 0 <= at - cta * stamped.stamp_row_bytes < stamped.stamp_row_bytes
            seen.add(at)
    assert len(seen) == sum(stamped.stage_tasks[s][0] for s in STAGES) * len(TASK_STAMPS)


def test_reading_stamps_of_a_plain_build_names_the_problem():
    spec = plan(*CONFIG, "gfx950")
    with pytest.raises(ValueError, match="timeline build"):
        stamped_tasks(spec, new_scratch(spec, "cpu"), 100e6)


@pytest.mark.kernel
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_stamped_kernel_in_timing_mode(arch):
    config = Config(*CONFIG, arch).resolved()
    spec, kernel = ops.build(config, timeline=True)
    inputs = make_inputs(*CONFIG, seed=3, arch=spec.arch, swa_fp8=spec.swa_fp8, comp_fp8=spec.comp_fp8)
    scratch = new_scratch(spec, "cpu")
    out, stats = emulate(spec, kernel, inputs, scratch=scratch)
    for name, pair in launch_results(spec, scratch, out, reference_of(spec, inputs)).items():
        compare(name, *pair)

    tick_ns = 1e9 / part(spec.arch).memrealtime_hz
    tasks = stamped_tasks(spec, scratch, part(spec.arch).memrealtime_hz)
    assert len(tasks) == sum(spec.stage_tasks[s][0] for s in STAGES)
    ctas = cta_events(stats.timeline)
    by_cta = {}
    for t in tasks:
        by_cta.setdefault(t.cta, []).append(t)
    for cta, ran in by_cta.items():
        # in the order the CTA runs them: stage after stage, its kth task after its (k-1)th
        ran = sorted(ran, key=lambda t: (STAGES.index(t.stage), t.task))
        stamps = [s for t in ran for s in (t.begin_ns, t.wait_ns, t.end_ns) if s is not None]
        assert stamps == sorted(stamps), f"CTA {cta}: stamps out of order"
        assert 0 < stamps[0] and stamps[-1] <= stats.modeled_ns
        for stage in {t.stage for t in ran}:
            mine = [t for t in ran if t.stage == stage]
            spans = [(s, e) for region, s, e in ctas[cta]["run"] if region == stage]
            assert min(t.begin_ns for t in mine) == pytest.approx(min(s for s, _ in spans),
                                                                  abs=SPAN_TOLERANCE_NS)
            assert max(t.end_ns for t in mine) == pytest.approx(max(e for _, e in spans),
                                                                abs=SPAN_TOLERANCE_NS)
        for t in ran:
            nth = [u.task for u in ran if u.stage == t.stage].index(t.task)
            assert (t.wait_ns is not None) == waits_on_flags(t.stage, nth)
            if t.wait_ns is None:
                continue
            # the wait ends after the CTA's last s_sleep between polls of it, within one
            # more flag load (at worst a cross-XCD hand-off), the barrier and the acquire
            slept = [e for region, s, e in ctas[cta]["wait"]
                     if region == t.stage and t.begin_ns - tick_ns <= e <= t.end_ns]
            if slept:
                assert max(slept) - tick_ns <= t.wait_ns <= max(slept) + part(spec.arch).handoff_ns
