"""The K2 kernel end to end: the code object our pipeline builds, run in the
emulator on make_inputs' launch arguments, against the reference of record
(k2back.reference) within the calibrated tolerances (k2back.testing.compare).

- The whole kernel: out and the intermediates XO and X8B, fast suite on the
  tiny geometry (both archs x TP 1/2/4/8 x ratio 0/2 x S 1/3/16, edge cases),
  slow suite on V4.1-Flash; three launches on one scratch buffer (epoch).
- GEMV half alone: scratch's XO filled from the reference, the combine flags
  set with the launch's tag, a kernel rendered with only wo_a and wo_b.
- Hand-off mutants: the kernel with each fence of its hand-offs weakened, or the
  flag stored before its data's s_waitcnt, fails in the emulator's strict memory
  model (as it may fail on the GPU).
- Requirements read from the code object: no scratch or spills, LDS budget,
  512 threads, 16-B weight loads issued before the first flag poll, MFMA.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re

import pytest
import torch

from k2back.codegen.compiler import IRSource
from k2back.codegen.compiler import compile as compile_source
from k2back.codegen.plan import plan
from k2back.codegen.render import KernelSource
from k2back.codegen.targets import ARCHS
from k2back.config import Config
from k2back.formats import VLLM_KEY_FP8
from k2back.reference import attention_back
from k2back.runtime import hip, launch
from k2back.runtime.hip import runtime_status
from k2back.testing import (
    GEMV_STAGES,
    asm_lines,
    asm_lines_of,
    build,
    check,
    gemv_launch,
    make_inputs,
    reference_of,
    run_kernel,
    verify,
)

pytestmark = pytest.mark.kernel  # every test here builds or runs the K2 kernel

GEMV = GEMV_STAGES



@functools.cache
def reference(geometry: str, tp: int, tokens: int, ratio: int, seed: int, chunk_keys: int,
              arch: str):
    inputs = make_inputs(geometry, tp, tokens, ratio, seed, arch=arch)
    return inputs, attention_back(**inputs, chunk_keys=chunk_keys, intermediates=True)


# --------------------------------------------------------------------------- whole kernel


def launch_and_check(geometry, tp, tokens, ratio, arch, inputs, **options):
    """verify() of the kernel reading the inputs' key formats; `options` as verify's."""
    config = Config(geometry, tp, tokens, ratio, arch, inputs["swa_fp8"], inputs["comp_fp8"])
    return verify(config, inputs, **options).assert_ok().stats


FAST = [(arch, tp, ratio, tokens) for arch in sorted(ARCHS) for tp in (1, 2, 4, 8)
        for ratio in (0, 2) for tokens in (1, 3, 16)]


@pytest.mark.parametrize("arch, tp, ratio, tokens", FAST)
def test_kernel_matches_reference(arch, tp, ratio, tokens):
    inputs = make_inputs("tiny", tp, tokens, ratio, seed=tokens + 10 * tp, arch=arch)
    launch_and_check("tiny", tp, tokens, ratio, arch, inputs)


# The same body on an AMD GPU where there is one, for its own arch (the emulator
# runs both archs always): the day the suite meets an MI300X it checks the real thing.
if runtime_status() is None:
    GPU_ARCH = hip.device_arch(torch.device("cuda")).split(":")[0]

    @pytest.mark.parametrize("arch, tp, ratio, tokens", [c for c in FAST if c[0] == GPU_ARCH])
    def test_kernel_on_the_gpu(arch, tp, ratio, tokens):
        inputs = make_inputs("tiny", tp, tokens, ratio, seed=tokens + 10 * tp, arch=arch)
        launch_and_check("tiny", tp, tokens, ratio, arch, inputs, backend=hip.HipBackend())


def _minus_one_entries(inputs):
    table = inputs["key_table"].clone()
    table[:, 1::5] = -1  # holes inside key_len: a top-k short of rows
    return {"key_table": table}


def _negative_zero_bytes(inputs):
    """Every key byte reading 0 becomes 0x80 (OCP −0, same value; NaN to FNUZ)."""
    return {c: torch.where(inputs[c] == 0, 0x80, inputs[c]).to(torch.uint8)
            for c in ("swa_cache", "comp_cache")}


EDGES = {
    "key_len 0 and 1": {"key_len": torch.tensor([0, 1, 40], dtype=torch.int32)},
    "key_len 0, sink -inf": {"key_len": 0, "sink": -math.inf},
    "sink -inf": {"sink": -math.inf},
    "sink +inf": {"sink": math.inf},
    "position 0": {"positions": 0},
    "-1 entries": _minus_one_entries,
    "-0 key bytes": _negative_zero_bytes,
}


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("edge", EDGES)
def test_kernel_edge_cases(arch, edge):
    change = EDGES[edge]
    inputs = make_inputs("tiny", 4, 3, 2, seed=7, arch=arch,
                         **({} if callable(change) else change))
    if callable(change):
        inputs.update(change(inputs))
    launch_and_check("tiny", 4, 3, 2, arch, inputs)


@pytest.mark.slow
@pytest.mark.parametrize("arch, tp, tokens, ratio", [
    ("gfx942", 4, 2, 2), ("gfx950", 4, 2, 2), ("gfx942", 8, 1, 0),
    # 3 and 4 wo_b tasks a CTA, their weights all in flight at once
    ("gfx942", 4, 16, 2), ("gfx950", 4, 16, 2),
    # three MFMA token tiles
    ("gfx942", 4, 48, 2), ("gfx950", 4, 48, 2),
])
def test_kernel_v41_flash(arch, tp, tokens, ratio):
    """V4.1-Flash with the defaults: the caches as vLLM writes them on the arch
    (gfx942: a FNUZ window cache, an OCP compressed one)."""
    inputs = make_inputs("v4.1-flash", tp, tokens, ratio, seed=3, arch=arch)
    spec, _ = build("v4.1-flash", tp, tokens, ratio, arch)
    assert spec.wo_b.batch  # as the cases promise
    assert (spec.swa_fp8, spec.comp_fp8) == VLLM_KEY_FP8[arch]
    launch_and_check("v4.1-flash", tp, tokens, ratio, arch, inputs)


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_kernel_v4_pro(arch):
    """V4-Pro (128 heads, hidden 7168) at TP 8, one token, the caches as vLLM writes them."""
    inputs = make_inputs("v4-pro", 8, 1, 2, seed=4, arch=arch)
    launch_and_check("v4-pro", 8, 1, 2, arch, inputs)


@pytest.mark.slow
@pytest.mark.parametrize("arch, tp, tokens, ratio", [("gfx950", 2, 64, 1), ("gfx942", 1, 64, 2),
                                                     ("gfx942", 8, 33, 1)])
def test_kernel_many_tokens_and_ratio_1(arch, tp, tokens, ratio):
    """The token limit (4 MFMA token tiles), a partial last tile, ratio 1."""
    inputs = make_inputs("tiny", tp, tokens, ratio, seed=5, arch=arch)
    launch_and_check("tiny", tp, tokens, ratio, arch, inputs)


def launch_in_order(spec, kernel, inputs, order):
    """One launch with the workgroups started in `order`, checked against the
    reference; returns the emulator's stats."""
    scratch = launch.new_scratch(spec, "cpu")
    out, stats = run_kernel(spec, kernel, inputs, scratch, order=order)
    check(spec, scratch, out, reference_of(spec, inputs))
    return stats


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_consumers_scheduled_first(arch):
    """Workgroups started and scheduled in reverse order: the GEMV CTAs (high
    numbers) poll long before any split task ran; the hand-offs still hold."""
    spec, kernel = build("tiny", 4, 3, 2, arch)
    stats = launch_in_order(spec, kernel, make_inputs("tiny", 4, 3, 2, seed=11, arch=arch),
                            "reverse")
    assert stats.total_polls > 0  # someone did wait


@pytest.mark.parametrize("arch, tp, order", [("gfx942", 4, "forward"), ("gfx950", 4, "reverse"),
                                            ("gfx950", 1, "forward")])
def test_kernel_split_tasks_of_several_chunks(arch, tp, order):
    """A grid of 4 CTAs: the plan gives a split task both chunks of its token
    (q read once), combine awaits the token's one split flag."""
    spec = plan("tiny", tp, 3, 2, arch, target=dataclasses.replace(ARCHS[arch], blocks=4))
    assert (spec.blocks, spec.attention.chunks_per_task, spec.attention.split_tasks) == (4, 2, 3)
    kernel = compile_source(KernelSource(spec))
    launch_in_order(spec, kernel, make_inputs("tiny", tp, 3, 2, seed=21 + tp, arch=arch), order)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_consecutive_launches_share_scratch(arch):
    """The epoch protocol: three launches on one scratch buffer, nothing
    cleared in between, each on new inputs: a flag left by an earlier launch
    taken for a fresh one would hand stale XO / X8B on and fail the check."""
    spec, _ = build("tiny", 4, 3, 2, arch)
    scratch = launch.new_scratch(spec, "cpu")
    for launch_index in range(3):
        inputs = make_inputs("tiny", 4, 3, 2, seed=100 + launch_index, arch=arch)
        launch_and_check("tiny", 4, 3, 2, arch, inputs, scratch=scratch)
        assert spec.view(scratch, "epoch", torch.int32)[0] == launch_index + 1


# --------------------------------------------------------------------------- hand-off mutants
#
# Each hand-off (handoff.ll.j2) is: data stores; publish = agent-scope release
# fence (buffer_wbl2 sc1 + s_waitcnt vmcnt(0)), barrier, flag store; await = poll,
# barrier, agent-scope acquire fence (s_waitcnt + buffer_inv sc1). Weakening any of
# it must make the kernel fail under the strict memory model, on both archs.

AGENT_RELEASE = '  fence syncscope("agent") release\n'
AGENT_ACQUIRE = 'fence syncscope("agent") acquire'
# a publish: the release fence and the barrier, then thread 0's flag store up to <out>.done
PUBLISH = re.compile(r'(  fence syncscope\("agent"\) release\n(?:  ;[^\n]*\n)?(?:  [^\n]*\n){3})'
                     r'(  %(\S+)\.first = icmp eq i32 %tid, 0\n.*?\n\3\.done:\n)', re.DOTALL)


def _without_buffer_inv(asm: str) -> str:
    return "\n".join(ln for ln in asm.splitlines() if ln.strip() != "buffer_inv sc1")


IR_MUTANTS = {
    "release fence at workgroup scope": lambda ir: ir.replace(AGENT_RELEASE, AGENT_RELEASE.replace("agent", "workgroup")),
    "acquire fence at workgroup scope": lambda ir: ir.replace(AGENT_ACQUIRE, AGENT_ACQUIRE.replace("agent", "workgroup")),
    "release fence deleted": lambda ir: ir.replace(AGENT_RELEASE, ""),
    # thread 0 stores the flag, then the release fence and the barrier run
    "flag stored before its data's s_waitcnt": lambda ir: PUBLISH.sub(lambda m: m[2] + m[1], ir),
}
MUTANTS = [*IR_MUTANTS, "acquire-side buffer_inv removed"]


def mutant(spec, kernel, name):
    """The kernel with the hand-off edit `name` applied (to the IR, recompiled, or
    to the asm the emulator runs); checks the edit changed the code."""
    if name in IR_MUTANTS:
        ir = IR_MUTANTS[name](kernel.ir)
        assert ir != kernel.ir, name
        edited = compile_source(IRSource(ir, kernel.name, spec.arch))
    else:
        edited = dataclasses.replace(kernel, asm=_without_buffer_inv(kernel.asm))
    assert edited.asm != kernel.asm, name
    return edited


def flags_before_release(asm: str) -> int:
    """Flag stores (global stores with sc1) issued after a barrier and before the
    buffer_wbl2 of the release that follows it: none in a correct publish."""
    count, window = 0, 0
    for ln in asm_lines_of(asm):
        if ln == "s_barrier":
            window = 0
        elif re.match(r"global_store_dword .* sc1$", ln):
            window += 1
        elif ln == "buffer_wbl2 sc1":
            count, window = count + window, 0
    return count


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("name", MUTANTS)
def test_weakened_handoff_fails(arch, name):
    spec, kernel = build("tiny", 4, 3, 2, arch)
    edited = mutant(spec, kernel, name)
    if name.startswith("flag stored"):  # in the asm the flag store now precedes the wait
        assert flags_before_release(kernel.asm) == 0 < flags_before_release(edited.asm)
    inputs = make_inputs("tiny", 4, 3, 2, seed=7, arch=arch)
    with pytest.raises(AssertionError, match="outside tolerance"):
        launch_and_check("tiny", 4, 3, 2, arch, inputs, kernel=edited)


# --------------------------------------------------------------------------- tagged-word mutants
#
# X8B reaches wo_b as tagged words (plan.LL_WORD; handoff.ll_put / ll_get): a word is
# this launch's when its high half holds the launch's tag, epoch + 1. A reader
# trusting some of a line's words, or a tag that does not move with the epoch, must
# fail under the strict model: its stores tear into 8-byte pieces that perform
# apart, and a second launch on the same scratch finds the first one's words.

# the tag a tagged word is stored with and compared to (and nothing else)
LL_TAG = re.compile(r"(%\S+\.t = zext i32 |%\S+\.ok = icmp eq i32 %\S+\.t, )%tag\b")
# the tag check of word q of a lane's 16 bytes of activations (gemv_x.load_batch)
LL_CHECK = re.compile(r"(%x\d+\.r\.\d+\.(\d) = select i1 %\S+, i1 )%\S+\.ok(, i1 true)")


def _edited(spec, kernel, ir):
    assert ir != kernel.ir
    edited = compile_source(IRSource(ir, kernel.name, spec.arch))
    assert edited.asm != kernel.asm
    return edited


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_tagged_words_need_the_epoch(arch):
    """Words tagged 1 in every launch (the tag without the epoch): the second launch
    on the same scratch, its consumers scheduled first, takes the first launch's X8B.
    The kernel as built passes the same two launches."""
    spec, kernel = build("tiny", 4, 3, 2, arch)
    assert spec.wo_b.ll
    edited = _edited(spec, kernel, LL_TAG.sub(lambda m: m[1] + "1", kernel.ir))
    for candidate, fails in ((kernel, False), (edited, True)):
        scratch = launch.new_scratch(spec, "cpu")
        for launch_index in range(2):
            inputs = make_inputs("tiny", 4, 3, 2, seed=200 + launch_index, arch=arch)
            if fails and launch_index:
                with pytest.raises(AssertionError, match="outside tolerance"):
                    launch_and_check("tiny", 4, 3, 2, arch, inputs, kernel=candidate, scratch=scratch,
                                     order="reverse")
            else:
                launch_and_check("tiny", 4, 3, 2, arch, inputs, kernel=candidate, scratch=scratch,
                                 order="reverse")


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_tagged_words_all_checked(arch):
    """A reader trusting the tags of words 1 and 2 of each lane's four (16 B of
    activations in 32 B of words), not those of words 0 and 3: the producer's
    dwordx2 stores tear apart (a lane's words 1 and 2 are the pieces that perform
    first), so it reads stale X8B."""
    spec, kernel = build("tiny", 4, 3, 2, arch)
    ir = LL_CHECK.sub(lambda m: m[1] + "true" + m[3] if m[2] in "03" else m[0], kernel.ir)
    edited = _edited(spec, kernel, ir)
    inputs = make_inputs("tiny", 4, 3, 2, seed=7, arch=arch)
    with pytest.raises(AssertionError, match="outside tolerance"):
        launch_and_check("tiny", 4, 3, 2, arch, inputs, kernel=edited, order="reverse")


# --------------------------------------------------------------------------- GEMV half


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("tp", (1, 2, 4, 8))
@pytest.mark.parametrize("tokens", (1, 3, 17))
def test_gemv_stages(arch, tp, tokens):
    spec, kernel = build("tiny", tp, tokens, 2, arch, GEMV)
    inputs, want = reference("tiny", tp, tokens, 2, 0, spec.attention.chunk_keys, arch)
    scratch = launch.new_scratch(spec, "cpu")
    out, _ = gemv_launch(spec, kernel, inputs, want, scratch, epoch=41)
    check(spec, scratch, out, want, ("x8b", "out"))
    # the epoch moved on once every CTA marked it
    assert spec.view(scratch, "epoch", torch.int32)[0] == 42
    assert (spec.view(scratch, "epoch_marks", torch.int32) == 42).all()
    assert (spec.view(scratch, "wo_a_flags", torch.int32) == 42).all()


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_gemv_negative_zero_bytes(arch):
    """OCP −0 (0x80) is NaN to gfx942's FNUZ converter: weight bytes set to 0x80
    at random (value 0 for the reference too) must read as 0, or out is NaN. So
    must every 0 byte of XO written as 0x80 (same value) where the converter is
    OCP's; on FNUZ hardware the combine never writes one (gemv_launch stands in
    for it: test_gemv_gfx942.py::test_combine_writes_no_fnuz_nan_byte)."""
    spec, kernel = build("tiny", 2, 3, 2, arch, GEMV)
    inputs = make_inputs("tiny", 2, 3, 2, seed=4, arch=arch)
    gen = torch.Generator().manual_seed(4)
    for name in ("wo_a", "wo_b"):
        raw = inputs[name].view(torch.uint8).clone()
        raw[torch.rand(raw.shape, generator=gen) < 0.05] = 0x80
        inputs[name] = raw.view(inputs[name].dtype)
    want = attention_back(**inputs, chunk_keys=spec.attention.chunk_keys, intermediates=True)
    want_xo = want["xo"]
    scratch = launch.new_scratch(spec, "cpu")
    out, _ = gemv_launch(spec, kernel, inputs, {**want, "xo": torch.where(want_xo == 0, 0x80, want_xo)},
                         scratch, epoch=0)
    check(spec, scratch, out, want, ("x8b", "out"))


def test_gemv_waits_for_its_flags():
    """A flag left by the previous launch (tag − 1) is not this launch's: the
    GEMVs must not start on it (the emulator reports the deadlock)."""
    spec, kernel = build("tiny", 8, 1, 2, "gfx942", GEMV)
    inputs, _ = reference("tiny", 8, 1, 2, 0, spec.attention.chunk_keys, "gfx942")
    scratch = launch.new_scratch(spec, "cpu")
    spec.view(scratch, "epoch", torch.int32)[0] = 5
    spec.view(scratch, "combine_flags", torch.int32)[:] = 5  # stale
    with pytest.raises(Exception, match="(?i)deadlock|progress"):
        run_kernel(spec, kernel, inputs, scratch)


# --------------------------------------------------------------------------- requirements


def first(lines, pattern) -> int:
    return next(i for i, ln in enumerate(lines) if re.search(pattern, ln))


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("geometry, tp, tokens", [("tiny", 1, 64), ("v4.1-flash", 4, 2),
                                                  ("v4.1-flash", 1, 16), ("v4-pro", 1, 64)])
def test_gemv_code_object(arch, geometry, tp, tokens):
    """No scratch or spills, LDS within budget, 512 threads; each GEMV's weights
    with 16-B streaming loads and their codes with scalar loads, all issued
    before the stage's first flag poll."""
    for stages in (GEMV, ("wo_b",)):
        spec, kernel = build(geometry, tp, tokens, 2, arch, stages)
        meta = kernel.metadata
        assert meta.private_segment_size == 0 and meta.vgpr_spill_count == 0
        assert meta.sgpr_spill_count == 0
        assert meta.group_segment_size == spec.lds_bytes <= spec.target.lds_budget
        assert meta.max_flat_workgroup_size == 512
        lines = asm_lines(kernel)
        st = getattr(spec, stages[0])
        weight_loads = [i for i, ln in enumerate(lines) if re.match(r"buffer_load_dwordx4 .* nt", ln)]
        poll = first(lines, r"s_sleep")
        batch = st.per_cta if st.batch else 1
        assert sum(i < poll for i in weight_loads) == batch * st.row_tiles * st.k_steps
        # their block codes: scalar loads at a register offset (kernargs: immediate)
        assert first(lines, r"^s_load_dword\w* s[\[\d:\]]+, s\[\d+:\d+\], s\d+") < poll
        assert any(ln.startswith("v_mfma_") for ln in lines)


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("stage", ["wo_a", "wo_b"])
def test_gemv_weights_stream_in_rounds(arch, stage):
    """wo_a's and wo_b's weight loads go out in weight_rounds rounds, each after a
    wait for the data of the one before (fewer bytes queued ahead of the split's KV
    gathers, and of the combine's partials), all before the first flag poll."""
    spec, kernel = build("v4.1-flash", 4, 1, 2, arch, (stage,))
    st = getattr(spec, stage)
    assert st.weight_rounds == 4
    lines = asm_lines(kernel)
    loads = [i for i, ln in enumerate(lines) if re.match(r"buffer_load_dwordx4 .* nt", ln)]
    assert len(loads) == st.row_tiles * st.k_steps and loads[-1] < first(lines, r"s_sleep")
    waits = [i for i in range(loads[0], loads[-1]) if lines[i].startswith("s_waitcnt vmcnt")]
    assert len(waits) >= st.weight_rounds - 1


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("geometry, tp, tokens, ratio", [("tiny", 1, 16, 2), ("tiny", 8, 1, 0),
                                                         ("v4.1-flash", 4, 2, 2),
                                                         ("v4.1-flash", 4, 64, 2)])
def test_kernel_code_object(arch, geometry, tp, tokens, ratio):
    """The whole kernel: no scratch or spills, LDS within budget, 512 threads,
    16-B loads; MFMA in every stage that multiplies (split: QK and PV, wo_a, wo_b)."""
    spec, kernel = build(geometry, tp, tokens, ratio, arch)
    meta = kernel.metadata
    assert meta.private_segment_size == 0 and meta.vgpr_spill_count == 0
    assert meta.sgpr_spill_count == 0
    assert meta.group_segment_size == spec.lds_bytes <= spec.target.lds_budget
    assert meta.max_flat_workgroup_size == spec.threads == 512
    assert any(ln.startswith("buffer_load_dwordx4") for ln in asm_lines(kernel))
    for stage in ("split", "wo_a", "wo_b"):
        _, alone = build(geometry, tp, tokens, ratio, arch, (stage,))
        assert any(ln.startswith("v_mfma_") for ln in asm_lines(alone)), stage
