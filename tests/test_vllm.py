"""k2back.vllm: the key table from vLLM's decode metadata and the layer swap.

- key_table against a plain Python loop over SPEC §1's rules, on randomized
  vLLM-shaped steps (k2back/testing/vllm_step.py), every ratio, two geometries, and
  into persistent buffers (out=).
- Capture safety: a run on the meta device (no values exist, so any host read
  fails), the aten ops of a CPU run (none that syncs: item, nonzero, boolean
  masks), torch.compile(fullgraph=True) (a graph break fails it).
- Bad metadata refused by name before anything is written.
- The kernel in the emulator fed through the adapter against the reference of
  record fed the same keys in vLLM's ragged order (window, then compressed).
- A slot past a cache reads as a record of zero bytes: no fault, and `out` is
  the attention with that key's logit 0 and value 0.
- DecodeBack: vLLM's tensors as the layer holds them; the README's swap runs.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from k2back import formats as F
from k2back import ops
from k2back import vllm as kv
from k2back.config import Config
from k2back.model import geometry
from k2back.reference import attention_back
from k2back.testing import CHUNK_TOLERANCES, compare, make_inputs
from k2back.testing.vllm_step import compressed_rows, draw_step, window_rows

ARCH = "gfx950"  # both caches OCP by default: the step's caches are written that way


# --- the oracle ------------------------------------------------------------------


def loop_key_table(step, geometry_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """SPEC §1, token by token and entry by entry: compressed slots | 1 << 31
    first (ntopk = min((pos + 1) // ratio, topk), -1 kept where the local row
    is -1), then the window slots, then -1; nothing for a slot -1 token."""
    g = geometry(geometry_name)
    T = step.positions.shape[0]
    table = [[-1] * g.keys for _ in range(T)]
    lengths = [0] * T
    for t in range(T):
        if step.slot_mapping[t] < 0:
            continue
        ntopk = min((int(step.positions[t]) + 1) // step.ratio, g.topk) if step.ratio else 0
        nswa = int(step.swa_lens[t])
        for k in range(ntopk):
            local = int(step.topk_indices[t, k])
            if local >= 0:
                page = int(step.comp_block_table[int(step.token_to_req[t]), local // step.comp_block])
                slot = page * step.comp_block + local % step.comp_block
                table[t][k] = slot - (1 << 31)  # slot | 1 << 31 as an int32
        for i in range(nswa):
            table[t][ntopk + i] = int(step.swa_indices[t, 0, i])
        lengths[t] = ntopk + nswa
    return torch.tensor(table, dtype=torch.int32), torch.tensor(lengths, dtype=torch.int32)


CASES = [(geo, ratio, seed) for geo in ("tiny", "v4.1-flash") for ratio in (0, 1, 2)
         for seed in range(3)]


@pytest.mark.parametrize("geo, ratio, seed", CASES)
def test_key_table_is_spec_rule(geo, ratio, seed):
    step = draw_step(geo, ratio, seed, requests=5)
    want_table, want_len = loop_key_table(step, geo)
    table, length = kv.key_table(**step.metadata(), geometry=geo)
    assert torch.equal(length, want_len)
    assert torch.equal(table, want_table)
    # the step really has the cases: padded rows, holes, saturated top-k, a short window
    live = step.slot_mapping >= 0
    assert (~live).sum() >= 2 and (length[~live] == 0).all()
    assert (step.swa_lens[live] < geometry(geo).window).any()
    if ratio:
        saturated = (step.positions + 1) // ratio >= geometry(geo).topk
        assert (saturated & live).any(), "no token saturates its top-k"
        _, _, present = F.decode_key_table(table)
        index = torch.arange(table.shape[1])
        assert ((index < length[:, None]) & ~present).any(), "no -1 hole inside key_len"


def test_key_table_into_persistent_buffers():
    step = draw_step("tiny", 2, seed=7)
    T, keys = step.positions.shape[0], geometry("tiny").keys
    table = torch.full((T + 3, keys), 123, dtype=torch.int32)  # bigger, reused buffers
    length = torch.full((T + 3,), 123, dtype=torch.int32)
    out = (table[:T], length[:T])
    got = kv.key_table(**step.metadata(), geometry="tiny", out=out)
    assert all(g.data_ptr() == o.data_ptr() for g, o in zip(got, out))
    want_table, want_len = loop_key_table(step, "tiny")
    assert torch.equal(table[:T], want_table) and torch.equal(length[:T], want_len)
    assert (table[T:] == 123).all() and (length[T:] == 123).all(), "wrote past its rows"


# --- capture safety ----------------------------------------------------------------

# aten ops that read a value on the host (a sync on a GPU, an error in capture)
SYNCING = ("_local_scalar_dense", "item", "nonzero", "is_nonzero", "masked_select",
           "unique", "_unique2", "equal", "allclose")


class AtenOps(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func._schema.name.split("::")[-1])
        return func(*args, **(kwargs or {}))


def on(device, step) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v
            for k, v in step.metadata().items()}


@pytest.mark.parametrize("ratio", [0, 2])
def test_key_table_reads_no_value_on_the_host(ratio):
    step = draw_step("tiny", ratio, seed=3)
    T, keys = step.positions.shape[0], geometry("tiny").keys
    # the meta device holds shapes only: .item(), nonzero, a bool() of a value all raise
    out = (torch.empty((T, keys), dtype=torch.int32, device="meta"),
           torch.empty(T, dtype=torch.int32, device="meta"))
    got = kv.key_table(**on("meta", step), geometry="tiny", out=out)
    assert got[0] is out[0] and got[1] is out[1]
    with AtenOps() as ops_seen:
        kv.key_table(**step.metadata(), geometry="tiny")
    assert ops_seen.names and not ops_seen.names & set(SYNCING), sorted(ops_seen.names)


@pytest.mark.parametrize("ratio", [0, 1])
def test_key_table_compiles_to_one_graph(ratio):
    """fullgraph=True: a graph break (a value branched on, a data-dependent
    shape) raises; the one aten graph it lowers to holds no syncing op."""
    from torch._functorch.aot_autograd import aot_module_simplified

    graphs = []

    def audit(gm, example_inputs):
        def forward(graph_module, _):
            graphs.append({str(n.target).split(".")[1] for n in graph_module.graph.nodes
                           if n.op == "call_function" and str(n.target).startswith("aten.")})
            return graph_module
        return aot_module_simplified(gm, example_inputs, fw_compiler=forward)

    torch._dynamo.reset()
    step = draw_step("tiny", ratio, seed=4)
    compiled = torch.compile(kv.key_table, fullgraph=True, backend=audit, dynamic=False)
    T, keys = step.positions.shape[0], geometry("tiny").keys
    out = (torch.empty((T, keys), dtype=torch.int32), torch.empty(T, dtype=torch.int32))
    compiled(**step.metadata(), geometry="tiny", out=out)
    assert len(graphs) == 1 and graphs[0] and not graphs[0] & set(SYNCING), graphs
    want = loop_key_table(step, "tiny")
    assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])


# --- refusals --------------------------------------------------------------------


def _swap(name, make):
    return lambda m: {**m, name: make(m[name])}


REFUSALS = {
    "positions dtype": ("positions", _swap("positions", lambda t: t.int())),
    "slot_mapping shape": ("slot_mapping", _swap("slot_mapping", lambda t: t[:-1])),
    "swa_indices window": ("swa_indices", _swap("swa_indices", lambda t: t[..., :-1])),
    "swa_indices 2-d": ("swa_indices", _swap("swa_indices", lambda t: t[:, 0])),
    "swa_lens dtype": ("swa_lens", _swap("swa_lens", lambda t: t.long())),
    "topk width": ("topk_indices", _swap("topk_indices", lambda t: torch.cat([t, t], 1))),
    "topk device": ("topk_indices", _swap("topk_indices", lambda t: t.to("meta"))),
    "topk missing": ("topk_indices", _swap("topk_indices", lambda t: None)),
    "table missing": ("comp_block_table", _swap("comp_block_table", lambda t: None)),
    "table empty": ("comp_block_table", _swap("comp_block_table", lambda t: t[:, :0])),
    "token_to_req dtype": ("token_to_req", _swap("token_to_req", lambda t: t.long())),
    "comp_block": ("comp_block", _swap("comp_block", lambda b: 0)),
    "ratio": ("ratio", _swap("ratio", lambda r: 4)),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_bad_metadata_refused_by_name(case):
    name, change = REFUSALS[case]
    step = draw_step("tiny", 2, seed=5)
    T, keys = step.positions.shape[0], geometry("tiny").keys
    out = (torch.full((T, keys), 9, dtype=torch.int32), torch.full((T,), 9, dtype=torch.int32))
    with pytest.raises((TypeError, ValueError), match=name):
        kv.key_table(**change(step.metadata()), geometry="tiny", out=out)
    assert (out[0] == 9).all() and (out[1] == 9).all(), "written before the checks"


def test_window_only_layer_takes_no_top_k():
    step = draw_step("tiny", 0, seed=5)
    topk = torch.zeros((step.positions.shape[0], geometry("tiny").topk), dtype=torch.int32)
    with pytest.raises(ValueError, match="topk_indices"):
        kv.key_table(**{**step.metadata(), "topk_indices": topk}, geometry="tiny")


@pytest.mark.parametrize("which", [0, 1])
def test_bad_out_refused_by_name(which):
    step = draw_step("tiny", 1, seed=5)
    T, keys = step.positions.shape[0], geometry("tiny").keys
    out = [torch.empty((T, keys), dtype=torch.int32), torch.empty(T, dtype=torch.int32)]
    out[which] = out[which].long()
    with pytest.raises(TypeError, match=kv.OUTPUTS[which]):
        kv.key_table(**step.metadata(), geometry="tiny", out=tuple(out))


# --- the kernel through the adapter ---------------------------------------------------

GEO, TP = "tiny", 8  # 8 heads, one group: the smallest kernel


def launch_inputs(step, seed: int, geo: str = GEO) -> dict:
    """The step's caches with make_inputs' q, sink, cos/sin and weights."""
    T = step.positions.shape[0]
    x = make_inputs(geo, TP, T, step.ratio, seed, arch=ARCH)
    assert int(step.positions.max()) < x["cos_sin"].shape[0]
    return {**x, "positions": step.positions, "swa_cache": step.swa_cache,
            "swa_block": step.swa_block, "comp_cache": step.comp_cache,
            "comp_block": step.comp_block}


def ragged_table(step, geo: str) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's ragged form as a table: each token's window slots, then its
    compressed slots (no holes), then -1."""
    g = geometry(geo)
    T = step.positions.shape[0]
    table = torch.full((T, g.keys), F.NO_KEY, dtype=torch.int32)
    length = torch.zeros(T, dtype=torch.int32)
    for t in range(T):
        row = [*window_rows(step, t, g.window),
               *(s - (1 << 31) for s in compressed_rows(step, t, g.topk))]
        table[t, :len(row)] = torch.tensor(row, dtype=torch.int32)
        length[t] = len(row)
    return table, length


def keys_in_use(table, length) -> list[list[int]]:
    """Each token's valid entries (index < key_len, not -1), sorted."""
    return [sorted(e for e in row[:n].tolist() if e != F.NO_KEY)
            for row, n in zip(table, length.tolist())]


def decode_back(step, x, **changes) -> kv.DecodeBack:
    """The layer of make_inputs' tensors and the step's caches, on the emulator."""
    return kv.DecodeBack(**{
        "attn_sink": x["sink"], "cos_sin_cache": x["cos_sin"], "wo_a": x["wo_a"],
        "wo_a_scale": x["wo_a_scale"], "wo_b": x["wo_b"], "wo_b_scale": x["wo_b_scale"],
        "tp_rank": 0, "tp_size": TP, "ratio": step.ratio, "swa_cache": step.swa_cache,
        "swa_block": step.swa_block, "comp_cache": step.comp_cache,
        "comp_block": step.comp_block, "geometry": GEO, "arch": ARCH, "backend": "emu",
        **changes})


def run_through_adapter(step, seed: int, geo: str = GEO):
    """DecodeBack on the emulator -> (out, its key table and lengths, the
    launch inputs, the kernel's chunk size); out checked against the
    reference of record fed the adapter's table (the kernel's own order)."""
    x = launch_inputs(step, seed, geo)
    back = decode_back(step, x, geometry=geo)
    out = back(x["q"], step.positions, step.slot_mapping, step.swa_indices, step.swa_lens,
               step.topk_indices, step.comp_block_table, step.token_to_req)
    ck = ops.kernel_for(Config(geo, TP, len(out), step.ratio, ARCH))[0].attention.chunk_keys
    table, length = back.key_table[:len(out)], back.key_len[:len(out)]
    compare("out", out, attention_back(**{**x, "key_table": table, "key_len": length},
                                       chunk_keys=ck))
    assert keys_in_use(table, length) == keys_in_use(*ragged_table(step, geo)), \
        "not the keys vLLM's decoder reads"
    return out, x, ck


@pytest.mark.kernel
@pytest.mark.parametrize("ratio, seed", [(2, 11), (0, 12), (1, 13), (2, 14)])
def test_kernel_through_adapter(ratio, seed):
    """On the tiny geometry the kernel is held to the reference in its own key
    order; vLLM's order differs by its chunking only, and the calibrated
    chunk tolerances (from V4.1-sized outputs) do not bound the bias of a
    2048-element output: that comparison runs on V4.1-Flash below."""
    run_through_adapter(draw_step(GEO, ratio, seed, requests=4, padded=1 + seed % 2), seed)


@pytest.mark.kernel
@pytest.mark.slow
@pytest.mark.parametrize("ratio, seed", [(2, 21), (1, 22)])
def test_kernel_through_adapter_matches_vllm_order_v41_flash(ratio, seed):
    """V4.1-Flash: the kernel through the adapter against the reference fed
    the same keys in vLLM's ragged order (window, then compressed), within
    the tolerances calibrated for a different chunking of the same keys."""
    geo = "v4.1-flash"
    step = draw_step(geo, ratio, seed, requests=3, padded=1, block_sizes=(64,),
                     comp_block_sizes=(32, 64))
    out, x, ck = run_through_adapter(step, seed, geo)
    ragged, length = ragged_table(step, geo)
    want = attention_back(**{**x, "key_table": ragged, "key_len": length}, chunk_keys=ck)
    compare("out", out, want, CHUNK_TOLERANCES)


def past_the_end(table, x, t, keep_one: bool) -> None:
    """Move token t's keys in use (or one of each cache's) to page `pages`
    of their cache: one past its end."""
    slot, compressed, present = F.decode_key_table(table)
    moved = set()
    for k in range(table.shape[1]):
        name = "comp" if compressed[t, k] else "swa"
        if not present[t, k] or (keep_one and name in moved):
            continue
        cache, block = x[f"{name}_cache"], x[f"{name}_block"]
        beyond = cache.shape[0] * block + int(slot[t, k]) % block
        table[t, k] = int(F.key_entry(torch.tensor(beyond), bool(compressed[t, k])))
        moved.add(name)


@pytest.mark.kernel
def test_slot_past_a_cache_reads_zeros():
    """Slots one page past each cache, run with validation bypassed (a GPU
    launch does not check values): no fault, and `out` is the attention with
    those keys as all-zero records (logit 0, value 0). A token whose every key
    lies past the caches gets o = 0, so out = 0."""
    step = draw_step(GEO, 2, seed=31, requests=3, padded=1)
    x = launch_inputs(step, 31)
    table, length = kv.key_table(**step.metadata(), geometry=GEO)
    original = table.clone()
    _, compressed, present = F.decode_key_table(table)
    in_use = present & (torch.arange(table.shape[1]) < length[:, None])
    both = [t for t in range(len(length)) if (in_use[t] & compressed[t]).any()
            and (in_use[t] & ~compressed[t]).any()]
    assert len(both) >= 2, "the step needs two tokens with keys in both caches"
    every, one_each = both[:2]
    past_the_end(table, x, every, keep_one=False)
    past_the_end(table, x, one_each, keep_one=True)

    spec, _ = ops.kernel_for(Config(GEO, TP, len(length), 2, ARCH))
    out = torch.full((len(length), geometry(GEO).hidden), float("nan"), dtype=torch.bfloat16)
    ops.launch({**x, "key_table": table, "key_len": length}, out,
               ops.backend("emu").new_scratch(spec, out.device),
               Config(GEO, TP, len(length), 2, ARCH, x["swa_fp8"], x["comp_fp8"]))
    assert (out[every] == 0).all()
    zero_page = {f"{name}_cache": torch.cat([x[f"{name}_cache"],
                                             torch.zeros_like(x[f"{name}_cache"][:1])])
                 for name in ("swa", "comp")}
    ck = spec.attention.chunk_keys
    compare("out", out, attention_back(**{**x, **zero_page, "key_table": table,
                                          "key_len": length}, chunk_keys=ck))
    before = attention_back(**{**x, "key_table": original, "key_len": length}, chunk_keys=ck)
    assert (before[every] != 0).any(), "zeros would not tell the moved keys apart"


@pytest.mark.kernel
def test_wild_slot_does_not_fault():
    """A slot whose 32-bit byte offset wraps (the largest a table can hold)
    reads inside its cache: the launch completes without a memory fault."""
    step = draw_step(GEO, 0, seed=32, requests=3, padded=1)
    x = launch_inputs(step, 32)
    table, length = kv.key_table(**step.metadata(), geometry=GEO)
    t = int(length.argmax())
    table[t, 0] = F.SLOT_MASK - 1  # a window slot: 2^31 - 2
    spec, _ = ops.kernel_for(Config(GEO, TP, len(length), 0, ARCH))
    out = torch.full((len(length), geometry(GEO).hidden), float("nan"), dtype=torch.bfloat16)
    ops.launch({**x, "key_table": table, "key_len": length}, out,
               ops.backend("emu").new_scratch(spec, out.device),
               Config(GEO, TP, len(length), 0, ARCH, x["swa_fp8"], x["comp_fp8"]))
    others = torch.arange(len(length)) != t
    compare("out", out[others], attention_back(
        **{**x, "key_table": table[others], "key_len": length[others],
           "q": x["q"][others], "positions": x["positions"][others]},
        chunk_keys=spec.attention.chunk_keys))


# --- DecodeBack and the README's swap --------------------------------------------------

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_swap() -> str:
    """The python block of the README's "From vLLM" section."""
    section = README.read_text().split("### From vLLM", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def vllm_layer(step, x, max_tokens: int):
    """What the README's block reads from vLLM, as vLLM holds it: a
    DeepseekV4Attention (3-d cache views, e8m0 scales, the top-k buffer of
    max_tokens rows), the step's metadata by layer prefix, the TP helpers."""
    T = step.positions.shape[0]
    topk = torch.full((max_tokens, step.topk_indices.shape[1]), -1, dtype=torch.int32)
    topk[:T] = step.topk_indices
    to_req = torch.zeros(max_tokens, dtype=torch.int32)
    to_req[:T] = step.token_to_req

    def records(cache, block):  # vLLM's [pages, block, 584] view of a page's records
        return cache[:, :block * F.KV_RECORD_BYTES].view(-1, block, F.KV_RECORD_BYTES)

    e8m0 = lambda codes: codes.view(torch.float8_e8m0fnu)
    layer = SimpleNamespace(
        attn_sink=x["sink"], rotary_emb=SimpleNamespace(cos_sin_cache=x["cos_sin"]),
        wo_a=SimpleNamespace(weight=x["wo_a"], weight_scale_inv=e8m0(x["wo_a_scale"])),
        wo_b=SimpleNamespace(weight=x["wo_b"], weight_scale_inv=e8m0(x["wo_b_scale"])),
        compress_ratio=step.ratio, topk_indices_buffer=topk,
        swa_cache_layer=SimpleNamespace(kv_cache=records(step.swa_cache, step.swa_block),
                                        block_size=step.swa_block, prefix="layers.3.swa_cache"),
        _compressed_kv_cache=lambda: records(step.comp_cache, step.comp_block),
        compressed_cache_prefix="layers.2.attn")
    requests = int(step.token_to_req.max()) + 1
    metadata = {
        "layers.3.swa_cache": SimpleNamespace(
            slot_mapping=step.slot_mapping, decode_swa_indices=step.swa_indices,
            decode_swa_lens=step.swa_lens, token_to_req_indices=to_req, num_decodes=requests),
        "layers.2.attn": SimpleNamespace(block_table=torch.cat(
            [step.comp_block_table, torch.zeros_like(step.comp_block_table[:3])])),
    }
    return {"layer": layer, "attn_metadata": metadata, "q": x["q"], "positions": step.positions,
            "vllm_config": SimpleNamespace(cache_config=SimpleNamespace(block_size=step.comp_block)),
            "get_tensor_model_parallel_rank": lambda: 0,
            "get_tensor_model_parallel_world_size": lambda: TP,
            "tensor_model_parallel_all_reduce": lambda t: t}


@pytest.mark.kernel
def test_readme_swap_runs(monkeypatch):
    """The README's block, unchanged, with the tiny geometry, the gfx950
    emulator and CPU tensors as DecodeBack's defaults."""
    for name, value in (("geometry", GEO), ("arch", ARCH), ("backend", "emu")):
        monkeypatch.setitem(kv.DecodeBack.__init__.__kwdefaults__, name, value)
    step = draw_step(GEO, 2, seed=51, requests=3, padded=1)
    x = launch_inputs(step, 51)
    scope = vllm_layer(step, x, max_tokens=16)
    exec(compile(readme_swap(), str(README), "exec"), scope)  # noqa: S102 -- the README is the test
    table, length = kv.key_table(**step.metadata(), geometry=GEO)
    ck = ops.kernel_for(Config(GEO, TP, len(length), 2, ARCH))[0].attention.chunk_keys
    compare("out", scope["out"], attention_back(**{**x, "key_table": table, "key_len": length},
                                                chunk_keys=ck))




def test_full_model_tensors_sliced_at_the_rank():
    """The model's sink and wo_a / wo_b (e8m0 scales) give the rank's shares
    make_inputs cuts; vLLM's 3-d cache view keeps its page stride."""
    step = draw_step(GEO, 2, seed=41)
    rank = 5
    full = make_inputs(GEO, 1, 2, 2, seed=3, arch=ARCH)
    mine = make_inputs(GEO, TP, 2, 2, seed=3, rank=rank, arch=ARCH)
    block = step.swa_block
    pages = step.swa_cache[:, :block * F.KV_RECORD_BYTES].view(-1, block, F.KV_RECORD_BYTES)
    back = decode_back(step, full, tp_rank=rank, swa_cache=pages,
                       wo_a_scale=full["wo_a_scale"].view(torch.float8_e8m0fnu),
                       wo_b_scale=full["wo_b_scale"].view(torch.float8_e8m0fnu))
    for name, tensor in back.weights.items():
        assert torch.equal(tensor, mine[name]), name
    assert back.caches["swa_cache"].stride() == step.swa_cache.stride()
    assert back.caches["swa_cache"].data_ptr() == step.swa_cache.data_ptr()


def test_fp8_formats_passed_on(monkeypatch):
    seen = {}

    class Recorder:
        def __init__(self, *args, **kwargs):
            seen.update(kwargs)

    monkeypatch.setattr("k2back.api.AttentionBack", Recorder)
    step = draw_step(GEO, 2, seed=42)
    x = launch_inputs(step, 42)
    decode_back(step, x)
    assert (seen["swa_fp8"], seen["comp_fp8"]) == ("auto", "auto")
    decode_back(step, x, swa_fp8="e4m3fnuz", comp_fp8="e4m3fn")
    assert (seen["swa_fp8"], seen["comp_fp8"]) == ("e4m3fnuz", "e4m3fn")
    monkeypatch.undo()
    for name in ("swa_fp8", "comp_fp8"):
        with pytest.raises(ValueError, match=name):
            decode_back(step, x, **{name: "fnuz"})
    with pytest.raises(ValueError, match="tp_rank"):
        decode_back(step, x, tp_rank=TP)
