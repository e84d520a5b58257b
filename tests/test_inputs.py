"""make_inputs: vLLM's formats, the edge cases it promises, rank slicing;
compare: what it accepts and what it rejects."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from k2back import formats as F
from k2back.config import LAUNCH_ARGS
from k2back.model import geometry
from k2back.reference import attention_back, gather_keys
from k2back.testing import (
    BOUNDARY,
    compare,
    make_inputs,
    rank_slice,
    rope_table,
    yarn_inv_freq,
)

ARCH = "gfx942"  # the richer case: the two caches in different formats


@pytest.mark.parametrize("geo,tp", [("tiny", 1), ("tiny", 8), ("tiny-16", 2)])
@pytest.mark.parametrize("ratio", [0, 1, 2])
def test_shapes_dtypes_and_tables(geo, tp, ratio):
    g, tokens = geometry(geo), 6
    r = g.rank(tp)
    x = make_inputs(geo, tp, tokens, ratio, seed=tp + ratio, arch=ARCH)
    assert set(x) == {*LAUNCH_ARGS, "qk_scale", "swa_fp8", "comp_fp8"}
    assert (x["swa_fp8"], x["comp_fp8"]) == ("e4m3fnuz", "e4m3fn")  # vLLM on gfx942
    assert x["q"].dtype == torch.bfloat16 and x["q"].shape == (tokens, r.heads, 512)
    assert x["wo_a"].dtype == torch.float8_e4m3fn and x["wo_a"].shape == r.wo_a_shape
    assert x["wo_a_scale"].shape == r.wo_a_scale_shape and x["wo_b"].shape == r.wo_b_shape
    assert x["wo_b_scale"].shape == r.wo_b_scale_shape and x["sink"].shape == (r.heads,)
    assert x["key_table"].dtype == torch.int32 and x["key_table"].shape == (tokens, g.keys)
    assert x["positions"].dtype == torch.int64 and x["key_len"].dtype == torch.int32
    assert x["cos_sin"].dtype == torch.float32 and x["cos_sin"].shape[1] == 64
    assert int(x["positions"].max()) < x["cos_sin"].shape[0] and 0 in x["positions"].tolist()
    assert (x["comp_cache"] is None) == (ratio == 0)
    _, comp, present = F.decode_key_table(x["key_table"])
    for t, n in enumerate(x["key_len"].tolist()):
        row_comp, row_present = comp[t].tolist(), present[t].tolist()
        assert not any(row_present[n:])  # −1 after key_len
        in_use = [c for c, p in zip(row_comp[:n], row_present[:n]) if p]
        assert in_use == sorted(in_use, reverse=True)  # compressed rows first
        assert sum(in_use) <= g.topk and len(in_use) - sum(in_use) <= g.window
        assert ratio or not any(in_use)
    pos = x["positions"].tolist()
    assert min(x["key_len"].tolist()) <= g.window // 4 + 1  # a short table is among them
    for name in ("swa", "comp"):
        cache, block = x[f"{name}_cache"], x[f"{name}_block"]
        if cache is None:
            continue
        assert block in (32, 64) and cache.dtype == torch.uint8 and cache.stride(1) == 1
        assert cache.stride(0) % 576 == 0 and cache.stride(0) >= block * 584
    keys, valid = gather_keys(x["key_table"], x["key_len"], x["swa_cache"], x["swa_block"],
                              x["comp_cache"], x["comp_block"], swa_fp8=x["swa_fp8"],
                              comp_fp8=x["comp_fp8"])
    rms = keys[valid].pow(2).mean().sqrt()
    assert 0.3 < rms < 5 and torch.isfinite(keys).all(), rms  # normalized KV magnitudes
    assert len(set(pos)) > 1


def test_records_are_scattered_over_pages_and_keep_negative_zero():
    """Records on shuffled pages; OCP records hold -0 (0x80) where a quiet
    channel rounds a negative value to 0, FNUZ ones never (0x80 is its NaN)."""
    x = make_inputs("tiny", 1, 8, 1, seed=3, arch=ARCH)
    slot, comp, present = F.decode_key_table(x["key_table"])
    pages = slot[present & ~comp] // x["swa_block"]
    assert len(set(pages.tolist())) > 4 and not torch.equal(pages.sort().values, pages)
    for name, mask in (("swa", present & ~comp), ("comp", present & comp)):
        nope = F.read_kv(x[f"{name}_cache"], x[f"{name}_block"], slot[mask])[0][:, :448]
        minus_zero = int((nope == F.OCP_NEGATIVE_ZERO).sum())
        assert minus_zero > 100 if x[f"{name}_fp8"] == "e4m3fn" else minus_zero == 0, name


def test_window_keys_are_the_tokens_own_recent_positions():
    """Window entry j of a token at position p holds the key written for
    position p − w + 1 + j: consecutive window entries walk consecutive slots
    within a page (slot % block increases by one)."""
    x = make_inputs("tiny-16", 1, 4, 0, seed=5, arch=ARCH, hole_fraction=0.0, max_pos=300)
    slot, _, _ = F.decode_key_table(x["key_table"])
    g = geometry("tiny-16")
    for t, p in enumerate(x["positions"].tolist()):
        n = int(x["key_len"][t])
        assert n == min(g.window, p + 1)
        rows = (slot[t, :n] % x["swa_block"]).tolist()
        first = max(0, p - g.window + 1)
        assert rows == [j % x["swa_block"] for j in range(first, p + 1)]


def test_yarn_frequencies():
    rope = geometry("v4.1-flash").rope
    f = yarn_inv_freq(rope).numpy()
    base = rope.theta ** -(np.arange(0, 64, 2) / 64)
    assert f[0] == 1.0 and math.isclose(f[-1], base[-1] / rope.factor, rel_tol=1e-12)
    # dims rotating more than β_fast times over the original context keep θ's
    # frequency; fewer than β_slow times are interpolated by the factor
    turns = rope.original_max_position * base / (2 * math.pi)
    assert np.allclose(f[turns > rope.beta_fast], base[turns > rope.beta_fast])
    assert np.allclose(f[turns < rope.beta_slow], base[turns < rope.beta_slow] / rope.factor)
    table = rope_table(rope, 3000).double().numpy()
    p = np.array([0, 1, 2999])
    want = np.concatenate([np.cos(p[:, None] * f), np.sin(p[:, None] * f)], axis=1)
    assert np.allclose(table[p], want, atol=1e-7)


def test_seeds_are_deterministic():
    a, b, c = (make_inputs("tiny", 2, 3, 2, s, arch=ARCH) for s in (1, 1, 2))
    assert all(torch.equal(a[k], b[k]) for k in a if isinstance(a[k], torch.Tensor))
    assert not torch.equal(a["q"], c["q"])


@pytest.mark.parametrize("tp", [2, 8])
def test_ranks_are_shards_of_one_model(tp):
    full = make_inputs("tiny", 1, 3, 1, seed=9, arch=ARCH)
    ranks = [rank_slice(full, tp, r) for r in range(tp)]
    assert torch.equal(torch.cat([r["q"] for r in ranks], 1), full["q"])
    assert torch.equal(torch.cat([r["sink"] for r in ranks]), full["sink"])
    for name, dim in (("wo_a", 0), ("wo_a_scale", 0), ("wo_b", 1), ("wo_b_scale", 1)):
        got = torch.cat([r[name].view(torch.uint8) for r in ranks], dim)
        assert torch.equal(got, full[name].view(torch.uint8)), name
    last = make_inputs("tiny", tp, 3, 1, seed=9, rank=tp - 1, arch=ARCH)
    assert torch.equal(last["q"], ranks[-1]["q"])
    with pytest.raises(ValueError, match="rank"):
        rank_slice(full, tp, tp)


def test_overrides():
    x = make_inputs("tiny-16", 1, 3, 1, 0, arch=ARCH, key_len=0, sink=math.inf, positions=0,
                    swa_block=64)
    assert x["key_len"].dtype == torch.int32 and (x["key_len"] == 0).all()
    assert (x["sink"] == math.inf).all() and (x["positions"] == 0).all() and x["swa_block"] == 64
    stale = make_inputs("tiny-16", 1, 3, 1, 0, arch=ARCH, stale_tail=True)
    _, _, present = F.decode_key_table(stale["key_table"])
    past = torch.arange(present.shape[1]) >= stale["key_len"][:, None]
    assert (present & past).any()  # entries a kernel must ignore
    with pytest.raises(TypeError, match="unknown overrides"):
        make_inputs("tiny-16", 1, 3, 1, 0, arch=ARCH, kv_len=3)
    with pytest.raises(ValueError, match="ratio"):
        make_inputs("tiny-16", 1, 3, 3, 0, arch=ARCH)


@pytest.mark.parametrize("arch, swa, comp, want", [
    ("gfx942", "auto", "auto", ("e4m3fnuz", "e4m3fn")),
    ("gfx950", "auto", "auto", ("e4m3fn", "e4m3fn")),
    ("gfx950", "e4m3fnuz", "auto", ("e4m3fnuz", "e4m3fn")),
    (None, "e4m3fn", "e4m3fnuz", ("e4m3fn", "e4m3fnuz")),
])
def test_key_formats(arch, swa, comp, want):
    x = make_inputs("tiny-16", 1, 2, 1, 0, arch=arch, swa_fp8=swa, comp_fp8=comp)
    assert (x["swa_fp8"], x["comp_fp8"]) == want


@pytest.mark.parametrize("kw, name", [({"swa_fp8": "auto"}, "swa_fp8"),
                                      ({"swa_fp8": "e4m3fn", "comp_fp8": "fnuz"}, "comp_fp8"),
                                      ({"arch": "gfx90a", "swa_fp8": "e4m3fn"}, "comp_fp8")])
def test_key_formats_are_checked(kw, name):
    with pytest.raises(ValueError, match=f"^{name}: "):
        make_inputs("tiny-16", 1, 2, 1, 0, **kw)


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_pages_full_of_negative_zero(arch):
    """Every nope value -0: OCP writes 0x80, FNUZ 0x00; amax 0 meets the
    1e-4 floor: code ceil(log2(1e-4 / max)) + 127 (105 from 448, 106 from 224)."""
    def nope_to_minus_zero(k):
        return torch.cat([torch.full_like(k[:, :448], -0.0), k[:, 448:]], dim=1)

    x = make_inputs("tiny-16", 1, 3, 2, 0, arch=arch, key_transform=nope_to_minus_zero)
    slot, comp, present = F.decode_key_table(x["key_table"])
    for name, mask in (("swa", present & ~comp), ("comp", present & comp)):
        data, codes = F.read_kv(x[f"{name}_cache"], x[f"{name}_block"], slot[mask])
        fnuz = x[f"{name}_fp8"] == "e4m3fnuz"
        assert (data[:, :448] == (0 if fnuz else F.OCP_NEGATIVE_ZERO)).all()
        assert (codes == (106 if fnuz else 105)).all()


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_pages_hold_the_writers_edge_blocks(arch):
    """Blocks of all zeros and blocks whose amax sits exactly on a binade
    boundary of the code rule (1.75 · 2^j): their largest value writes as
    the format's max (0x7E / 0xFE), the code as j + 119 (OCP) or j + 120 (FNUZ)."""
    x = make_inputs("tiny", 1, 8, 2, 1, arch=arch)
    slot, comp, present = F.decode_key_table(x["key_table"])
    for name, mask in (("swa", present & ~comp), ("comp", present & comp)):
        data, codes = F.read_kv(x[f"{name}_cache"], x[f"{name}_block"], slot[mask])
        blocks = data[:, :448].reshape(-1, 7, 64)
        keys = F.kv_dequantize(data, codes, x[f"{name}_fp8"])[:, :448].reshape(-1, 7, 64)
        amax = keys.abs().amax(-1)
        assert (amax == 0).sum() > 5, name  # all-zero blocks
        j = torch.log2(amax / BOUNDARY)
        # the largest value written as ±max (0x7E / 0xFE: 224 FNUZ, 448 OCP)
        top = (blocks.int() & 0x7F).amax(-1) == 0x7E
        on_boundary = (j == j.round()) & (amax > 0) & top
        assert on_boundary.sum() > 5, name
        offset = 120 if x[f"{name}_fp8"] == "e4m3fnuz" else 119
        assert torch.equal(codes[on_boundary].int(), j[on_boundary].int() + offset)


# --- compare --------------------------------------------------------------------


@pytest.fixture(scope="module")
def result():
    return attention_back(**make_inputs("tiny-16", 2, 4, 1, 30, arch=ARCH), chunk_keys=16,
                          intermediates=True)


def pair(r, name):
    return r[name], r[name + "_codes"]


def test_compare_accepts_the_reference_itself(result):
    for name in ("out", "o", "z"):
        assert compare(name, result[name], result[name].clone())["rel_l2"] == 0
    assert compare("xo", pair(result, "xo"), pair(result, "xo"))["code_flips"] == 0


@pytest.mark.parametrize("wrong,what", [
    (lambda r: r["out"] * 1.05, "bias"),                           # a 5 % scale error
    (lambda r: r["out"].flip(0), "rel_l2"),                        # tokens swapped
    (lambda r: torch.where(torch.arange(r["out"].shape[1]) == 7, float("nan"),
                           r["out"].float()).to(torch.bfloat16), "finite on one side"),
])
def test_compare_rejects_wrong_out(result, wrong, what):
    with pytest.raises(AssertionError, match=what) as e:
        compare("out", wrong(result), result["out"])
    assert str(e.value).startswith("out outside tolerance")


def test_compare_rejects_swapped_heads(result):
    o = result["o"].clone()
    o[:, [0, 1]] = o[:, [1, 0]]
    with pytest.raises(AssertionError, match="rel_l2"):
        compare("o", o, result["o"])


def test_compare_fp8_as_values(result):
    data, codes = pair(result, "xo")
    with pytest.raises(AssertionError, match="max_code_diff"):
        compare("xo", (data, codes + 2), (data, codes))  # every block 4× too large
    stepped = data.clone()
    stepped[:, ::5] ^= 2  # a mantissa bit: two or more steps off in a fifth of the bytes
    with pytest.raises(AssertionError, match="beyond_step"):
        compare("xo", (stepped, codes), (data, codes))
    with pytest.raises(TypeError, match="pairs"):
        compare("xo", data, data)


def test_compare_shapes_and_names(result):
    with pytest.raises(AssertionError, match="shape"):
        compare("out", result["out"][:-1], result["out"])
    with pytest.raises(KeyError, match="no tolerance"):
        compare("scores", result["scores"], result["scores"])


def test_compare_catches_truncation_to_bf16(result):
    """gfx942 has no bf16 convert: a kernel rounding by truncation must fail."""
    y = result["y"] * (1 + 2.0**-12)  # fp32 values that are not already bf16
    nearest = y.to(torch.bfloat16)
    truncated = (y.view(torch.int32) & ~0xFFFF).view(torch.float32)
    compare("y", nearest.float() * (1 + 2.0**-20), nearest)
    with pytest.raises(AssertionError, match="bias"):
        compare("y", truncated, nearest)


def test_one_flip_is_allowed_in_a_tiny_population():
    codes = torch.tensor([[120, 121, 122, 123]], dtype=torch.uint8)
    one = codes.clone()
    one[0, 1] += 1
    compare("x8b_codes", one, codes)  # 1 of 4 blocks: a legitimate flip
    two = one.clone()
    two[0, 2] += 1
    with pytest.raises(AssertionError, match="code_flips"):
        compare("x8b_codes", two, codes)
