"""validate_launch: every argument's wrong kind, dtype, shape, device, stride or
value is rejected with its name, what was expected and what was given."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from k2back import validate
from k2back.model import geometry
from k2back.testing import make_inputs
from k2back.validate import BLOCK_ARGS, RULES, validate_launch

GEO, TP, TOKENS = "tiny-16", 2, 3
ARCH = "gfx942"  # the caches as vLLM writes them there (validation reads no byte)
RANK = geometry(GEO).rank(TP)


@functools.cache
def _inputs(ratio: int) -> dict:
    return make_inputs(GEO, TP, TOKENS, ratio, seed=0, arch=ARCH)


def inputs(ratio=1) -> dict:
    """Fresh copies (tests edit them in place) of one generated launch."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in _inputs(ratio).items()}


def rejects(kind, name, args, ratio=1, **kw):
    with pytest.raises(kind) as e:
        validate_launch(RANK, ratio, args, **kw)
    assert str(e.value).startswith(f"{name}: expected"), str(e.value)
    return str(e.value)


@pytest.mark.parametrize("geo,tp", [("tiny", 1), ("tiny", 8), ("tiny-16", 2)])
@pytest.mark.parametrize("ratio", [0, 1, 2])
def test_generated_inputs_pass(geo, tp, ratio):
    x = make_inputs(geo, tp, 5, ratio, seed=1, arch=ARCH)
    out = torch.empty(5, geometry(geo).hidden, dtype=torch.bfloat16)
    validate_launch(geometry(geo).rank(tp), ratio, x, max_tokens=8, out=out)


def other_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float16 if t.dtype != torch.float16 else torch.float32


@pytest.mark.parametrize("name", list(RULES))
def test_wrong_dtype_is_named(name):
    x = inputs()
    msg = rejects(TypeError, name, {**x, name: x[name].view(torch.uint8).to(other_dtype(x[name]))})
    assert "float16" in msg or "float32" in msg  # what was given


@pytest.mark.parametrize("name", list(RULES))
def test_wrong_shape_is_named(name):
    x = inputs()
    t = x[name]
    wrong = t[..., :-1] if name not in ("swa_cache", "comp_cache") else t[:, None]
    rejects(ValueError, name, {**x, name: wrong.contiguous()})


@pytest.mark.parametrize("name", ["key_len", "positions", "key_table", "sink", "wo_b"])
def test_token_and_head_counts_must_agree(name):
    """S is q's token count and H its head count: the others must follow."""
    x = inputs()
    rejects(ValueError, name, {**x, name: torch.cat([x[name], x[name][:1]])})


def test_heads_of_another_tp_are_rejected():
    x = make_inputs(GEO, 1, TOKENS, 1, seed=0, arch=ARCH)
    assert "(3, 8, 512)" in rejects(ValueError, "q", x)


@pytest.mark.parametrize("name", list(RULES))
def test_not_a_tensor_is_named(name):
    rejects(TypeError, name, {**inputs(), name: [1, 2, 3]})


@pytest.mark.parametrize("name", [n for n in RULES if n != "q"])
def test_one_device(name):
    x = inputs()
    rejects(ValueError, name, {**x, name: x[name].to("meta")})


@pytest.mark.parametrize("name", ["q", "key_table", "wo_a", "cos_sin"])
def test_contiguity(name):
    x = inputs()
    t = x[name]
    strided = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)[..., ::2]
    strided.copy_(t)
    assert "strides" in rejects(ValueError, name, {**x, name: strided})


@pytest.mark.parametrize("block", ["swa_block", "comp_block"])
@pytest.mark.parametrize("bad,kind", [(0, ValueError), (-32, ValueError), (32.0, TypeError),
                                      (True, TypeError), (None, TypeError)])
def test_block_sizes(block, bad, kind):
    rejects(kind, block, {**inputs(), block: bad})


@pytest.mark.parametrize("name", list(BLOCK_ARGS.values()))
def test_cache_strides(name):
    x = inputs()
    cache, block = x[name], x[name.replace("cache", "block")]
    pages = cache.shape[0]
    # a row stride that is not a multiple of 576
    odd = torch.zeros(pages, cache.shape[1] + 8, dtype=torch.uint8)[:, : cache.shape[1]]
    assert "multiple of 576" in rejects(ValueError, name, {**x, name: odd})
    # pages too small for the block's records
    small = torch.zeros(pages, 576 * (block * 584 // 576), dtype=torch.uint8)
    assert str(block * 584) in rejects(ValueError, name, {**x, name: small})
    # bytes of a page not contiguous
    rejects(ValueError, name, {**x, name: cache.t().contiguous().t()})


@pytest.mark.parametrize("name", list(BLOCK_ARGS.values()))
def test_cache_beyond_32_bit_offsets(name, monkeypatch):
    x = inputs()
    extent = x[name].numel()
    validate_launch(RANK, 1, x)  # fits
    # a 4 GiB cache cannot be allocated here: shrink the limit below this one
    monkeypatch.setattr(validate, "MAX_BUFFER_BYTES", extent - 1)
    assert "32-bit buffer offsets" in rejects(ValueError, name, x)


def test_comp_cache_present_iff_ratio():
    rejects(ValueError, "comp_cache", {**inputs(ratio=1), "comp_cache": None}, ratio=1)
    window_only = inputs(ratio=0)
    rejects(ValueError, "comp_cache", {**window_only, "comp_cache": inputs()["comp_cache"]}, ratio=0)
    validate_launch(RANK, 0, {**window_only, "comp_block": None})


def test_token_count_bounds():
    rejects(ValueError, "q", inputs(), max_tokens=TOKENS - 1)
    x = inputs()
    rejects(ValueError, "q", {**x, "q": x["q"][:0]})


def test_missing_argument():
    x = inputs()
    del x["sink"]
    assert "sink" in rejects(TypeError, "args", x)


@pytest.mark.parametrize("bad,kind", [(-1.0, ValueError), (math.inf, ValueError), ("0.1", TypeError)])
def test_qk_scale(bad, kind):
    rejects(kind, "qk_scale", {**inputs(), "qk_scale": bad})


def test_out():
    x = inputs()
    hidden = geometry(GEO).hidden
    rejects(ValueError, "out", x, out=torch.empty(TOKENS, hidden + 1, dtype=torch.bfloat16))
    rejects(TypeError, "out", x, out=torch.empty(TOKENS, hidden))


# --- values (read on the CPU, on request on a GPU) ------------------------------


def test_key_len_above_keys():
    x = inputs()
    x["key_len"][1] = RANK.keys + 1
    assert str(RANK.keys) in rejects(ValueError, "key_len", x)
    validate_launch(RANK, 1, x, check_values=False)  # metadata only: passes


def test_negative_key_len():
    rejects(ValueError, "key_len", {**inputs(), "key_len": torch.full((TOKENS,), -1, dtype=torch.int32)})


def test_position_past_cos_sin():
    x = inputs()
    x["positions"][0] = x["cos_sin"].shape[0]
    rejects(ValueError, "positions", x)


def test_slot_past_cache():
    x = inputs()
    pages = x["swa_cache"].shape[0]
    x["key_table"][0, : x["key_len"][0]] = pages * x["swa_block"]
    assert "swa_cache" in rejects(ValueError, "key_table", x)


def test_compressed_entries_on_window_only_layer():
    x = inputs(ratio=0)
    x["key_table"][0, 0] = -(2**31) + 1  # compressed slot 1
    x["key_len"][0] = max(int(x["key_len"][0]), 1)
    rejects(ValueError, "key_table", x, ratio=0)
