"""The GEMV stages' gfx942 path: fp8 MFMA (FNUZ) on the weight bytes as loaded,
block scales applied in fp32 after each step (k2back/templates/gemv_fp8.ll.j2).

- The code object multiplies with v_mfma_f32_16x16x32_fp8_fp8 and converts no
  fp8 element (no v_cvt_pk_f32_fp8, no bf16 MFMA).
- Numbers: every finite e4m3fn byte (subnormals, ±448, 0x80) in the weights,
  block codes drawn independently per 32x32 block over a wide range (a B column
  scaled with its neighbour block's code, or an MFMA mixing two blocks, is off by
  powers of two), token counts around the 8-token x tiles; X8B and out against
  the reference of record. Both archs (the templates share the loop structure).
"""

from __future__ import annotations

import pytest
import torch

from k2back.codegen.plan import plan
from k2back.model import HEAD_DIM, NOPE_DIM
from k2back.reference import attention_back
from k2back.runtime import launch
from k2back.runtime.emu import EmuBackend
from k2back.testing import GEMV_STAGES as GEMV
from k2back.testing import asm_lines, build, check, gemv_launch, make_inputs

pytestmark = pytest.mark.kernel  # every test here builds or runs the K2 kernel

NAN_BYTES = (0x7F, 0xFF)  # e4m3fn's NaNs: weights never hold them


def wide_weights(inputs: dict, seed: int) -> dict:
    """wo_a / wo_b with uniformly random finite e4m3fn bytes and UE8M0 codes in
    110..140, each 32x32 block its own."""
    gen = torch.Generator().manual_seed(seed)
    finite = torch.tensor([b for b in range(256) if b not in NAN_BYTES], dtype=torch.uint8)
    changed = {}
    for name in ("wo_a", "wo_b"):
        shape = inputs[name].shape
        pick = torch.randint(len(finite), shape, generator=gen)
        changed[name] = finite[pick].view(inputs[name].dtype)
        codes = inputs[f"{name}_scale"]
        changed[f"{name}_scale"] = torch.randint(110, 141, codes.shape, generator=gen,
                                                 dtype=torch.int32).to(codes.dtype)
    return changed


def test_fp8_mfma_converts_no_element():
    _spec, kernel = build("v4.1-flash", 4, 1, 2, "gfx942", GEMV)
    ops = {ln.split()[0] for ln in asm_lines(kernel)}
    assert "v_mfma_f32_16x16x32_fp8_fp8" in ops
    assert not {op for op in ops if op.startswith(("v_cvt_pk_f32_fp8", "v_cvt_f32_fp8"))}
    assert not {op for op in ops if op.startswith("v_mfma") and "bf16" in op}


@pytest.mark.parametrize("arch, tokens", [("gfx942", 1), ("gfx942", 8), ("gfx942", 9),
                                          ("gfx942", 24), ("gfx950", 9)])
def test_gemv_wide_bytes_and_block_codes(arch, tokens):
    spec, kernel = build("tiny", 2, tokens, 2, arch, GEMV)
    inputs = make_inputs("tiny", 2, tokens, 2, seed=20 + tokens, arch=arch)
    inputs.update(wide_weights(inputs, seed=tokens))
    want = attention_back(**inputs, chunk_keys=spec.attention.chunk_keys, intermediates=True)
    scratch = launch.new_scratch(spec, "cpu")
    out, _ = gemv_launch(spec, kernel, inputs, want, scratch, epoch=0)
    check(spec, scratch, out, want, ("x8b", "out"))
    if arch == "gfx942":
        # wo_b reads X8B without clearing 0x80 bytes: wo_a must never store one
        assert not (spec.payload(scratch, "x8b") == 0x80).any()


def tiny_rows(inputs: dict, every: int = 4) -> dict:
    """wo_a rows r % every == 1 keep one weight of +-2^-9 (units of their block
    scale): their Z values sit far below their 32-row block's amax, so MXFP8
    rounds them to zero, half of them negative."""
    weights = inputs["wo_a"].view(torch.uint8).clone()
    rows = torch.arange(1, weights.shape[0], every)
    weights[rows] = 0
    weights[rows, 5] = torch.where(rows % 8 == 1, 0x01, 0x81).to(torch.uint8)
    return {"wo_a": weights.view(inputs["wo_a"].dtype)}


@pytest.mark.parametrize("negative_zero", [0x00, 0x80])
def test_gemv_z_rounding_to_negative_zero(negative_zero):
    """Whether gfx942's FNUZ encoder writes 0x00 or 0x80 (FNUZ NaN) for a negative
    value that rounds to zero is unverified: under both, X8B holds no 0x80 (wo_a
    clears it before storing) and out is right."""
    spec, kernel = build("tiny", 2, 3, 2, "gfx942", GEMV)
    inputs = make_inputs("tiny", 2, 3, 2, seed=4, arch="gfx942")
    inputs.update(tiny_rows(inputs))
    want = attention_back(**inputs, chunk_keys=spec.attention.chunk_keys, intermediates=True)
    assert (want["x8b"].view(torch.uint8) == 0x80).sum() > 50  # the reference's OCP -0: many
    scratch = launch.new_scratch(spec, "cpu")
    out, _ = gemv_launch(spec, kernel, inputs, want, scratch, epoch=0,
                         backend=EmuBackend(fnuz_negative_zero=negative_zero))
    check(spec, scratch, out, want, ("x8b", "out"))
    assert not (spec.payload(scratch, "x8b") == 0x80).any()


@pytest.mark.parametrize("negative_zero", [0x00, 0x80])
def test_combine_writes_no_fnuz_nan_byte(negative_zero):
    """The GEMVs read XO's bytes as loaded: the combine stage (arch.fp8x4_encode)
    must clear the 0x80 an FNUZ encoder may write for a negative value rounding to
    zero. Partials of dim 5 of every 32 made negative and 2^-24 of their size: far
    below their block's amax, every such XO byte of the nope dims (the rope dims'
    are rotated back, mixing pairs) rounds to zero."""
    from k2back.testing import live_chunks, reference_of, split_regions, stage_kernel

    spec = plan("tiny", 2, 3, 2, "gfx942")
    inputs = make_inputs("tiny", 2, 3, 2, seed=6, arch="gfx942")
    want = reference_of(spec, inputs)
    scratch = launch.new_scratch(spec, "cpu")
    live = live_chunks(spec, inputs["key_len"])
    stats, part = split_regions(spec, scratch)
    tiny = want["chunk_partial"].clone()
    tiny[..., 5::32] = -(tiny[..., 5::32].abs() + 1) * 2.0**-24
    stats[live] = torch.stack([want["chunk_max"], want["chunk_sum"]], -1)[live]
    part[live] = tiny[live]
    EmuBackend(fnuz_negative_zero=negative_zero).run(
        stage_kernel("combine", spec), spec, dict(inputs, out=torch.zeros(spec.tokens, 1, dtype=torch.bfloat16)),
        scratch, inputs["qk_scale"], grid=(spec.attention.combine_tasks, 1, 1))
    xo = spec.view(scratch, "xo", torch.uint8, (spec.tokens, spec.heads, HEAD_DIM))
    assert (xo[..., :NOPE_DIM][..., 5::32] == 0).all()
    assert not (xo == 0x80).any()
