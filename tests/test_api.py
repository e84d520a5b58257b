"""AttentionBack: every bad argument rejected by name before anything is
written (out filled with a sentinel stays untouched), and the configuration
errors a user meets first (backend, arch)."""

from __future__ import annotations

import pytest
import torch

import k2back
from k2back.api import AttentionBack
from k2back.model import geometry
from k2back.runtime.hip import BackendUnavailable, runtime_status
from k2back.testing import make_inputs

GEOMETRY, TP, TOKENS, RATIO = "tiny", 4, 3, 2
SENTINEL = 7.0


@pytest.fixture(scope="module")
def inputs():
    return make_inputs(GEOMETRY, TP, TOKENS, RATIO, seed=1)


def sentinel_out():
    return torch.full((TOKENS, geometry(GEOMETRY).hidden), SENTINEL, dtype=torch.bfloat16)


def layer(**kw):
    return AttentionBack(GEOMETRY, **{"tp": TP, "ratio": RATIO, "arch": "gfx942", "backend": "emu",
                                      **kw})


def non_contiguous(t: torch.Tensor) -> torch.Tensor:
    """Same shape, dtype and values, every stride doubled (a strided view)."""
    wide = torch.zeros((*t.shape[:-1], 2 * t.shape[-1]), dtype=t.dtype)
    wide[..., ::2] = t
    return wide[..., ::2]


def wrong_shape(t: torch.Tensor) -> torch.Tensor:
    return torch.zeros((*t.shape[:-1], t.shape[-1] + 1), dtype=t.dtype)


def wrong_dtype(t: torch.Tensor) -> torch.Tensor:
    other = torch.float32 if t.dtype != torch.float32 else torch.float64
    return torch.zeros(t.shape, dtype=other)


TENSORS = ("q", "key_table", "key_len", "positions", "swa_cache", "comp_cache", "cos_sin", "sink",
           "wo_a", "wo_a_scale", "wo_b", "wo_b_scale")
BREAKERS = {
    "dtype": wrong_dtype,
    "shape": wrong_shape,
    "device": lambda t: torch.empty(t.shape, dtype=t.dtype, device="meta"),
}


def call(inputs, out, lay=None, **changes):
    return (lay or layer())(**{**inputs, **changes}, out=out)


def assert_rejected(inputs, name, lay=None, **changes):
    out = sentinel_out()
    with pytest.raises((ValueError, TypeError)) as e:
        call(inputs, out, lay, **changes)
    assert name in str(e.value), f"{name!r} not named in: {e.value}"
    assert torch.all(out == SENTINEL), "out was written before the arguments were checked"


@pytest.mark.parametrize("what", BREAKERS)
@pytest.mark.parametrize("name", TENSORS)
def test_each_tensor_argument_is_checked(inputs, name, what):
    assert_rejected(inputs, name, **{name: BREAKERS[what](inputs[name])})


@pytest.mark.parametrize("name", ("q", "key_table", "cos_sin", "wo_a", "wo_b"))
def test_strides_the_kernel_needs(inputs, name):
    assert_rejected(inputs, name, **{name: non_contiguous(inputs[name])})


def test_cache_page_stride(inputs):
    pages = inputs["swa_cache"]
    # rows 576 B shorter than the records need: a page stride the kernel cannot address
    short = pages[:, : pages.shape[1] - 576]
    assert_rejected(inputs, "swa_cache", swa_cache=short)


def test_tokens_beyond_max_tokens(inputs):
    assert_rejected(inputs, "q", lay=layer(max_tokens=TOKENS - 1))  # S = q.shape[0]


def test_key_len_beyond_the_table(inputs):
    key_len = inputs["key_len"].clone()
    key_len[1] = geometry(GEOMETRY).keys + 1
    assert_rejected(inputs, "key_len", key_len=key_len)


def test_comp_cache_required_when_compressed(inputs):
    assert_rejected(inputs, "comp_cache", comp_cache=None)


@pytest.mark.parametrize("bad", [
    torch.zeros(TOKENS, 256, dtype=torch.float32),
    torch.zeros(TOKENS + 1, 256, dtype=torch.bfloat16),
])
def test_out_is_checked(inputs, bad):
    with pytest.raises((ValueError, TypeError), match="out"):
        call(inputs, bad)


@pytest.mark.parametrize("qk_scale", [0.0, -1.0, float("nan"), "0.1"])
def test_qk_scale_is_checked(inputs, qk_scale):
    assert_rejected(inputs, "qk_scale", qk_scale=qk_scale)


def test_arch_auto_on_cpu_asks_for_an_arch(inputs):
    out = sentinel_out()
    with pytest.raises(ValueError, match="arch"):
        call(inputs, out, layer(arch="auto"))
    assert torch.all(out == SENTINEL)


@pytest.mark.parametrize("kw, word", [
    ({"backend": "cuda"}, "backend"),
    ({"arch": "gfx90a"}, "arch"),
    ({"ratio": 3}, "ratio"),
])
def test_configuration_errors(kw, word):
    with pytest.raises(ValueError, match=word):
        layer(**kw)


def test_hip_backend_without_rocm():
    if runtime_status() is None:  # a ROCm machine: the backend comes up
        assert layer(backend="hip").backend == "hip"
        return
    with pytest.raises(BackendUnavailable, match="backend='emu'"):
        layer(backend="hip")


def test_exported_from_the_package():
    assert k2back.AttentionBack is AttentionBack
