"""AttentionBack: every bad argument rejected by name before anything is
written (out filled with a sentinel stays untouched), the configuration errors
a user meets first (backend, arch); then the real K2 kernel through the API
and the torch custom op, in the emulator (tiny geometry), against the
reference of record."""

from __future__ import annotations

import inspect

import pytest
import torch

import k2back
from k2back import ops
from k2back.api import AttentionBack
from k2back.codegen.plan import plan
from k2back.config import LAUNCH_ARGS, Config
from k2back.model import geometry
from k2back.reference import attention_back
from k2back.runtime import hip
from k2back.runtime.hip import BackendUnavailable, runtime_status
from k2back.testing import compare, make_inputs

GEOMETRY, TP, TOKENS, RATIO, ARCH = "tiny", 4, 3, 2, "gfx942"
SENTINEL = 7.0


@pytest.fixture(scope="module")
def inputs():
    return make_inputs(GEOMETRY, TP, TOKENS, RATIO, seed=1, arch=ARCH)


def sentinel_out():
    return torch.full((TOKENS, geometry(GEOMETRY).hidden), SENTINEL, dtype=torch.bfloat16)


def layer(**kw):
    return AttentionBack(GEOMETRY, **{"tp": TP, "ratio": RATIO, "arch": ARCH, "backend": "emu",
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
    with pytest.raises(ValueError, match="arch="):
        layer(arch="auto")  # backend="emu": no GPU to read the arch from
    out = sentinel_out()
    with pytest.raises(ValueError, match="arch="):  # backend="auto", CPU tensors
        call(inputs, out, layer(arch="auto", backend="auto"))
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


def test_no_build_while_capturing(monkeypatch):
    """A token count never built in this process, met during graph capture: a
    clear error, nothing built, nothing written."""
    monkeypatch.setattr(hip, "capturing", lambda: True)
    inputs = make_inputs(GEOMETRY, 2, 5, RATIO, seed=2, arch=ARCH)
    out = torch.full((5, geometry(GEOMETRY).hidden), SENTINEL, dtype=torch.bfloat16)
    lay = AttentionBack(GEOMETRY, tp=2, ratio=RATIO, arch=ARCH, backend="emu")
    with pytest.raises(hip.CaptureError, match="capturing"):
        lay(**inputs, out=out)
    assert torch.all(out == SENTINEL)
    assert not any((c.geometry, c.tp, c.tokens) == (GEOMETRY, 2, 5) for c in ops._KERNELS)


def test_one_list_of_launch_arguments(inputs):
    """The layer's call, the op's schema and make_inputs take the arguments
    of LAUNCH_ARGS, in its order."""
    call_args = tuple(inspect.signature(AttentionBack.__call__).parameters)[1:]
    schema_args = tuple(a.name for a in torch.ops.k2back.attention_back.default._schema.arguments)
    assert call_args[:len(LAUNCH_ARGS)] == LAUNCH_ARGS
    assert schema_args[:len(LAUNCH_ARGS)] == LAUNCH_ARGS
    assert tuple(inputs)[:len(LAUNCH_ARGS)] == LAUNCH_ARGS


def test_exported_from_the_package():
    assert k2back.AttentionBack is AttentionBack


# ---- the K2 kernel through the API and the op ---------------------------------------------


# The same bodies run in the emulator always and on an AMD GPU where there is
# one (then on its own arch): the day the suite meets an MI300X it checks the
# real thing.
PLACES = {"emu": ("cpu", ARCH)}
if runtime_status() is None:
    PLACES["hip"] = ("cuda", "auto")


def inputs_on(device: str, tokens: int, seed: int) -> dict:
    """make_inputs as vLLM writes them on the arch the device runs (CPU: ARCH)."""
    arch = ARCH if device == "cpu" else hip.device_arch(torch.device(device)).split(":")[0]
    return make_inputs(GEOMETRY, TP, tokens, RATIO, seed=seed, arch=arch)


def on(device: str, inputs: dict) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def reference_out(inputs, tokens):
    spec = plan(GEOMETRY, TP, tokens, RATIO, ARCH)  # CK is the same on every arch
    return attention_back(**inputs, chunk_keys=spec.attention.chunk_keys)


@pytest.mark.kernel
@pytest.mark.parametrize("backend", PLACES)
def test_one_layer_many_calls(backend):
    """One layer object: token counts 3, 1, 3 (kernel per S built once), fresh
    inputs each call, the scratch carried over (nothing cleared), each correct."""
    device, arch = PLACES[backend]
    layer = AttentionBack(GEOMETRY, tp=TP, ratio=RATIO, arch=arch, backend=backend)
    for seed, tokens in enumerate((3, 1, 3)):
        inputs = inputs_on(device, tokens, seed=10 + seed)
        out = layer(**on(device, inputs))
        compare("out", out.cpu(), reference_out(inputs, tokens))
    assert len(layer._scratch) == 2  # one scratch a kernel, kept across calls


@pytest.mark.kernel
@pytest.mark.parametrize("backend", PLACES)
def test_out_given_and_qk_scale(backend):
    device, arch = PLACES[backend]
    inputs = {**inputs_on(device, 2, seed=4), "qk_scale": 0.02}
    layer = AttentionBack(GEOMETRY, tp=TP, ratio=RATIO, arch=arch, backend=backend)
    out = torch.full((2, 256), 7.0, dtype=torch.bfloat16, device=device)
    assert layer(**on(device, inputs), out=out) is out
    compare("out", out.cpu(), reference_out(inputs, 2))


if "hip" in PLACES:
    @pytest.mark.kernel
    def test_graph_capture_replays_the_layer():
        """Warm up outside capture, capture one call, replay it with new values
        copied into the captured buffers: each replay correct (the epoch
        protocol across replays included)."""
        layer = AttentionBack(GEOMETRY, tp=TP, ratio=RATIO)
        first = inputs_on("cuda", 2, seed=20)
        static = on("cuda", first)
        out = torch.empty(2, 256, dtype=torch.bfloat16, device="cuda")
        layer(**static, out=out)  # builds, loads and allocates outside capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            layer(**static, out=out)
        for seed in (21, 22):  # new queries and sinks (shapes fixed by the geometry)
            fresh = inputs_on("cuda", 2, seed=seed)
            inputs = {**first, "q": fresh["q"], "sink": fresh["sink"]}
            static["q"].copy_(fresh["q"])
            static["sink"].copy_(fresh["sink"])
            graph.replay()
            torch.cuda.synchronize()
            compare("out", out.cpu(), reference_out(inputs, 2))


@pytest.mark.kernel
def test_opcheck():
    inputs = make_inputs(GEOMETRY, TP, 1, RATIO, seed=6, arch=ARCH)
    spec, _ = ops.kernel_for(Config(GEOMETRY, TP, 1, RATIO, ARCH, inputs["swa_fp8"],
                                    inputs["comp_fp8"]))
    kwargs = {"out": torch.empty(1, 256, dtype=torch.bfloat16),
                  "scratch": torch.zeros(spec.scratch_bytes, dtype=torch.uint8),
                  "geometry": GEOMETRY, "tp": TP, "ratio": RATIO, "arch": ARCH}
    # opcheck's own comparisons have no fp8 kernels on the CPU: the weights go
    # in as their bytes (all the kernel reads)
    fp8_as_bytes = {k: v.view(torch.uint8) for k, v in inputs.items()
                    if isinstance(v, torch.Tensor) and v.dtype == torch.float8_e4m3fn}
    torch.library.opcheck(torch.ops.k2back.attention_back.default, (),
                          {**inputs, **fp8_as_bytes, **kwargs})


@pytest.mark.kernel
def test_kernel_for_resolves_auto_once():
    """"auto" and the formats it stands for are one kernel of the process."""
    named = ops.kernel_for(Config(GEOMETRY, 8, 1, 0, ARCH, "e4m3fnuz", "e4m3fn"))
    assert ops.kernel_for(Config(GEOMETRY, 8, 1, 0, ARCH)) is named


@pytest.mark.kernel
def test_target_id_features_reach_the_code_object():
    """arch with target-ID features (a device's gcnArchName): the same plan, a
    code object built for those features, its own cache entry."""
    plain = ops.build(Config(GEOMETRY, 8, 1, 0, "gfx942"))
    pinned = ops.build(Config(GEOMETRY, 8, 1, 0, "gfx942:sramecc+:xnack-"))
    assert plain[0] == pinned[0]  # the plan does not depend on the features
    assert plain[1].metadata.target == "gfx942"
    assert pinned[1].metadata.target == "gfx942:sramecc+:xnack-"
    assert plain[1].key != pinned[1].key
