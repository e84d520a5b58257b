"""The key caches' byte formats (issue 8; SPEC §1 "Which fp8 the key bytes
are", §4): the kernel, run in the emulator, against the reference of record
for every pair of formats on both archs; a kernel told the wrong format
fails by far; the bytes and codes at the edges of both formats (NaN, -0,
subnormals, ±max, codes 0 and 255, NaN rope values) decode as vLLM's decoder
reads them, where the kernel deliberately differs as documented
(formats.py, ARCHITECTURE.md "Key formats")."""

from __future__ import annotations

import math

import pytest
import torch

from k2back.codegen.plan import plan
from k2back.codegen.render import KernelSource
from k2back.codegen.targets import ARCHS
from k2back.config import Config
from k2back.formats import KEY_FP8, KV_DATA_BYTES, KV_SCALES, VLLM_KEY_FP8
from k2back.model import NOPE_DIM
from k2back.reference import attention_back
from k2back.testing import (
    METRICS,
    TOLERANCES,
    compare,
    live_chunks,
    make_inputs,
    run_kernel,
    run_stage,
    split_regions,
    verify,
)

PAIRS = [(swa, comp) for swa in KEY_FP8 for comp in KEY_FP8]


def _matrix() -> list:
    """Both archs x every format pair x ratio 0, 1, 2 x S 1 and 3 (TP 4, the
    tiny geometry). A window-only layer has no compressed cache: one pair a
    window format (test_window_only_kernels_ignore_comp_fp8). S 3, ratio 2 in
    the fast suite, the rest marked slow (they still run in CI)."""
    cases = []
    for arch in sorted(ARCHS):
        for ratio in (0, 1, 2):
            pairs = PAIRS if ratio else [(swa, swa) for swa in KEY_FP8]
            for swa, comp in pairs:
                for tokens in (1, 3):
                    marks = () if (ratio, tokens) == (2, 3) else (pytest.mark.slow,)
                    cases.append(pytest.param(arch, swa, comp, ratio, tokens, marks=marks,
                                              id=f"{arch}-{swa}-{comp}-r{ratio}-s{tokens}"))
    return cases


def inputs_for(arch, swa, comp, ratio, tokens, seed, **kw):
    return make_inputs("tiny", 4, tokens, ratio, seed, arch=arch, swa_fp8=swa, comp_fp8=comp, **kw)


@pytest.mark.kernel
@pytest.mark.parametrize("arch, swa, comp, ratio, tokens", _matrix())
def test_format_matrix(arch, swa, comp, ratio, tokens):
    """The whole kernel of the format pair, on caches written in it: out, XO
    and X8B within the calibrated tolerances of the reference of record."""
    inputs = inputs_for(arch, swa, comp, ratio, tokens, seed=31 + tokens + 7 * ratio)
    verify(Config("tiny", 4, tokens, ratio, arch, swa, comp), inputs).assert_ok()


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("swa", KEY_FP8)
def test_window_only_kernels_ignore_comp_fp8(arch, swa):
    """Ratio 0: no compressed keys, so the comp format changes the kernel's
    name and nothing else."""
    ir = {}
    for comp in KEY_FP8:
        spec = plan("tiny", 4, 3, 0, arch, swa, comp)
        ir[comp] = KernelSource(spec).render().replace(spec.name, "K")
    assert ir["e4m3fn"] == ir["e4m3fnuz"]


def test_defaults_are_what_vllm_writes():
    assert {arch: (plan("tiny", 4, 1, 2, arch).swa_fp8, plan("tiny", 4, 1, 2, arch).comp_fp8)
            for arch in ARCHS} == VLLM_KEY_FP8


# --- the wrong format ------------------------------------------------------------------------

WRONG = {"e4m3fn": "e4m3fnuz", "e4m3fnuz": "e4m3fn"}


@pytest.mark.kernel
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_a_kernel_told_the_wrong_window_format_fails_by_far(arch):
    """The bug of issue 8: realistic FNUZ window bytes (what vLLM writes on
    gfx942) read by a kernel told OCP, and the mirror on gfx950. out's
    relative L2 error against the reference of record must exceed its
    tolerance many times over (the margin is printed: pytest -s), while the
    kernel told the right format passes on the same bytes."""
    swa, comp = VLLM_KEY_FP8["gfx942"]  # a FNUZ window, an OCP compressed cache
    inputs = inputs_for(arch, swa, comp, 2, 3, seed=40)
    want = attention_back(**inputs, chunk_keys=plan("tiny", 4, 3, 2, arch).attention.chunk_keys)
    right = kernel_out(arch, swa, comp, inputs)
    wrong = kernel_out(arch, WRONG[swa], comp, inputs)
    compare("out", right, want)
    rel_l2 = METRICS["out"](wrong, want)["rel_l2"]
    margin = rel_l2 / TOLERANCES["out"].rel_l2
    print(f"\n{arch}: window FNUZ bytes read as OCP: out rel_l2 {rel_l2:.3g}, "
          f"{margin:.0f}x the tolerance {TOLERANCES['out'].rel_l2:.3g}")
    assert margin > 20


def kernel_out(arch, swa, comp, inputs):
    """out of the whole kernel of `arch` told the given formats."""
    from k2back.codegen.compiler import compile as compile_source
    from k2back.runtime import launch

    spec = plan("tiny", 4, inputs["q"].shape[0], 2, arch, swa, comp)
    kernel = compile_source(KernelSource(spec))
    out, _ = run_kernel(spec, kernel, inputs, launch.new_scratch(spec, "cpu"))
    return out


# --- edge bytes and codes --------------------------------------------------------------------

# Nope bytes at the edges of each format: NaN (counts as 0), -0 / 0, the
# smallest and largest subnormals, the largest normals, and FNUZ's ±240 (no
# writer produces them: max 224).
EDGE_BYTES = {
    "e4m3fn": (0x7F, 0xFF, 0x80, 0x00, 0x01, 0x07, 0x81, 0x87, 0x7E, 0xFE),
    "e4m3fnuz": (0x80, 0x00, 0x01, 0x07, 0x81, 0x87, 0x7E, 0xFE, 0x7F, 0xFF),
}
EDGE_CODES = (0, 1, 2, 255)  # code-255 blocks get the bytes a writer leaves there (below)


def with_edges(inputs: dict, seed: int, marker: bool = False) -> dict:
    """Every valid record's bytes edited: 6 % of its nope bytes set to an edge
    byte of its cache's format, 3 % of its rope halves to a bf16 NaN, 5 % of
    its blocks to an edge code. A code-255 block holds what the writers leave
    under it (SPEC §1, from their sources: x · 2^-inf = 0, NaN bytes where the
    clamp let a NaN through), and with `marker` the ∓max byte they write for
    the ±inf that raised the code (vLLM's decoder then reads ∓inf)."""
    gen = torch.Generator().manual_seed(seed)
    edited = dict(inputs)
    for cache in ("swa", "comp"):
        pages = inputs[f"{cache}_cache"]
        if pages is None:
            continue
        fp8, block = inputs[f"{cache}_fp8"], inputs[f"{cache}_block"]
        pages = pages.clone()
        records = pages[:, :block * KV_DATA_BYTES].view(-1, block, KV_DATA_BYTES)
        codes = pages[:, block * KV_DATA_BYTES:block * (KV_DATA_BYTES + 8)].view(-1, block, 8)
        nope = records[..., :NOPE_DIM]
        edge = torch.tensor(EDGE_BYTES[fp8], dtype=torch.uint8)
        hit = torch.rand(nope.shape, generator=gen) < 0.06
        nope[hit] = edge[torch.randint(0, len(edge), nope.shape, generator=gen)][hit]
        rope = records[..., NOPE_DIM:].view(torch.int16)
        rope[torch.rand(rope.shape, generator=gen) < 0.03] = 0x7FC1
        new_code = torch.tensor(EDGE_CODES, dtype=torch.uint8)[
            torch.randint(0, len(EDGE_CODES), codes.shape, generator=gen)]
        picked = torch.rand(codes.shape, generator=gen) < 0.05
        picked[..., KV_SCALES:] = False
        codes[picked] = new_code[picked]
        blocks = nope.view(*nope.shape[:-1], KV_SCALES, 64)
        top = picked[..., :KV_SCALES] & (codes[..., :KV_SCALES] == 255)
        nan = {"e4m3fn": 0x7F, "e4m3fnuz": 0x80}[fp8]
        kept = torch.where(blocks == nan, nan, 0).to(torch.uint8)
        if marker:
            kept[..., 5] = 0xFE  # the ±inf element, written as -max
        blocks[top] = kept[top]
        edited[f"{cache}_cache"] = pages
    return edited


def as_the_kernel_reads(inputs: dict, arch: str) -> dict:
    """The bytes the kernel deliberately reads otherwise than vLLM's decoder
    (ARCHITECTURE.md "Key formats"), rewritten to what it reads: FNUZ bytes on
    gfx950's OCP converter, ±240 (0x7F / 0xFF) read as 0 and code 0 as code 1
    (its scaled convert stops at 2^-127). No writer produces either. Every
    other edge byte and code must come out as the reference reads it."""
    if arch != "gfx950":
        return inputs
    read = dict(inputs)
    for cache in ("swa", "comp"):
        if inputs[f"{cache}_cache"] is None or inputs[f"{cache}_fp8"] != "e4m3fnuz":
            continue
        pages, block = inputs[f"{cache}_cache"].clone(), inputs[f"{cache}_block"]
        nope = pages[:, :block * KV_DATA_BYTES].view(-1, block, KV_DATA_BYTES)[..., :NOPE_DIM]
        nope[(nope & 0x7F) == 0x7F] = 0
        codes = pages[:, block * KV_DATA_BYTES:block * (KV_DATA_BYTES + 8)].view(-1, block, 8)
        codes[..., :KV_SCALES][codes[..., :KV_SCALES] == 0] = 1
        read[f"{cache}_cache"] = pages
    return read


def split_against_reference(arch, swa, comp, inputs, read=None):
    """The split stage (where the key bytes are read) against the reference's
    chunk stats and partials; returns both sides' chunk max."""
    spec = plan("tiny", 4, inputs["q"].shape[0], 2, arch, swa, comp)
    want = attention_back(**(read or inputs), chunk_keys=spec.attention.chunk_keys,
                          intermediates=True)
    scratch = torch.zeros(spec.scratch_bytes, dtype=torch.uint8)
    run_stage("split", spec, inputs, scratch, spec.attention.split_tasks)
    live = live_chunks(spec, inputs["key_len"])
    stats, part = split_regions(spec, scratch)
    got = {"chunk_max": torch.where(live[..., None], stats[..., 0], -math.inf),
           "chunk_sum": torch.where(live[..., None], stats[..., 1], 0.0),
           "chunk_partial": torch.where(live[..., None, None], part,
                                        torch.zeros((), dtype=torch.bfloat16))}
    return got, want


@pytest.mark.kernel
@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("swa, comp", PAIRS)
def test_edge_bytes_and_codes(arch, swa, comp):
    inputs = with_edges(inputs_for(arch, swa, comp, 2, 3, seed=50), seed=50)
    got, want = split_against_reference(arch, swa, comp, inputs, as_the_kernel_reads(inputs, arch))
    assert all(torch.isfinite(want[n]).any() for n in got)
    for name in got:
        compare(name, got[name], want[name])


@pytest.mark.kernel
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_edge_bytes_through_the_whole_kernel(arch):
    swa, comp = VLLM_KEY_FP8[arch]
    inputs = as_the_kernel_reads(with_edges(inputs_for(arch, swa, comp, 2, 3, seed=51), 51), arch)
    verify(Config("tiny", 4, 3, 2, arch, swa, comp), inputs).assert_ok()


@pytest.mark.kernel
@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("swa, comp", [VLLM_KEY_FP8["gfx942"], ("e4m3fn", "e4m3fn")])
def test_code_255_blocks_with_the_writers_marker(arch, swa, comp):
    """A code-255 block as a writer leaves it for a ±inf key value: vLLM's
    decoder reads its -max byte as -inf (2^128 = inf in fp32), the kernel as
    -max · 2^127 = -inf too; so the scores meet the same ±inf and the chunk
    stats are non-finite for the same (token, chunk, head), finite and within
    tolerance elsewhere."""
    inputs = with_edges(inputs_for(arch, swa, comp, 2, 3, seed=52), 52, marker=True)
    got, want = split_against_reference(arch, swa, comp, inputs, as_the_kernel_reads(inputs, arch))
    nonfinite = ~torch.isfinite(want["chunk_sum"])
    assert nonfinite.any() and (~nonfinite).any()
    assert torch.equal(~torch.isfinite(got["chunk_sum"]), nonfinite)
    finite = ~nonfinite
    compare("chunk_sum", got["chunk_sum"][finite], want["chunk_sum"][finite])
    compare("chunk_max", got["chunk_max"][finite], want["chunk_max"][finite])
