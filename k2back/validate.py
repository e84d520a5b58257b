"""Argument checks shared by every entry point, before anything is written.

Each failure names the argument, what was expected and what was given:
TypeError for a wrong kind or dtype, ValueError for shapes, devices, strides
and values. Shape, dtype, device and stride checks read only metadata. Value
checks (key_len <= KEYS, positions < cos_sin rows, slots inside their cache,
no compressed entries on a window-only layer) read the tensors: free on the
CPU (the emulator), a host sync on a GPU — there they run only when asked
(`check_values=True`), never during graph capture.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from k2back import formats as F
from k2back.config import LAUNCH_ARGS
from k2back.model import HEAD_DIM, ROPE_DIM, RankShape
from k2back.runtime.launch import byte_extent

# The kernel addresses a cache through a buffer resource with 32-bit offsets:
# a larger extent would wrap around, not fault.
MAX_BUFFER_BYTES = 1 << 32


@dataclass(frozen=True)
class TensorRule:
    """dtypes allowed; shape as dims ("S" tokens, "H" heads, "KEYS" table
    width, None any size, ints themselves) or a callable(rank) -> shape."""

    dtypes: tuple[torch.dtype, ...]
    shape: tuple | Callable[[RankShape], tuple]
    contiguous: bool = True


def _rank_shape(attr: str) -> Callable[[RankShape], tuple]:
    return lambda rank: getattr(rank, attr)


RULES: dict[str, TensorRule] = {
    "q": TensorRule((torch.bfloat16,), ("S", "H", HEAD_DIM)),
    "key_table": TensorRule((torch.int32,), ("S", "KEYS")),
    "key_len": TensorRule((torch.int32,), ("S",)),
    "positions": TensorRule((torch.int64,), ("S",)),
    # pages: only the byte rows' stride matters (checked in _check_cache)
    "swa_cache": TensorRule((torch.uint8,), (None, None), contiguous=False),
    "comp_cache": TensorRule((torch.uint8,), (None, None), contiguous=False),
    "cos_sin": TensorRule((torch.float32,), (None, ROPE_DIM)),
    "sink": TensorRule((torch.float32,), ("H",)),
    "wo_a": TensorRule((torch.float8_e4m3fn,), _rank_shape("wo_a_shape")),
    "wo_a_scale": TensorRule((torch.uint8,), _rank_shape("wo_a_scale_shape")),
    "wo_b": TensorRule((torch.float8_e4m3fn,), _rank_shape("wo_b_shape")),
    "wo_b_scale": TensorRule((torch.uint8,), _rank_shape("wo_b_scale_shape")),
}
BLOCK_ARGS = {"swa_block": "swa_cache", "comp_block": "comp_cache"}
assert set(LAUNCH_ARGS) == {*RULES, *BLOCK_ARGS}, "a rule for every launch argument"


def fail(kind, name: str, expected: str, given) -> None:
    """Raise `kind` naming the argument, what was expected and what was given (the
    one message shape of every input check; vllm.py uses it too)."""
    raise kind(f"{name}: expected {expected}, got {given}")


def _resolve(rule: TensorRule, rank: RankShape, tokens: int) -> tuple:
    dims = {"S": tokens, "H": rank.heads, "KEYS": rank.keys}
    shape = rule.shape(rank) if callable(rule.shape) else rule.shape
    return tuple(dims.get(d, d) if isinstance(d, str) else d for d in shape)


def check_tensor(name: str, t, rule: TensorRule, rank: RankShape, tokens: int, device) -> None:
    if not isinstance(t, torch.Tensor):
        fail(TypeError, name, "a torch.Tensor", type(t).__name__)
    if t.dtype not in rule.dtypes:
        fail(TypeError, name, f"dtype {' or '.join(map(str, rule.dtypes))}", t.dtype)
    want = _resolve(rule, rank, tokens)
    if t.dim() != len(want) or any(w is not None and w != g for w, g in zip(want, t.shape)):
        shown = tuple("*" if w is None else w for w in want)
        fail(ValueError, name, f"shape {shown}", tuple(t.shape))
    if t.device != device:
        fail(ValueError, name, f"device {device} (q's device)", t.device)
    if rule.contiguous and not t.is_contiguous():
        fail(ValueError, name, "a contiguous tensor", f"strides {t.stride()}")


def check_block(name: str, block) -> None:
    if isinstance(block, bool) or not isinstance(block, int):
        fail(TypeError, name, "an int (records a page holds)", type(block).__name__)
    if block <= 0:
        fail(ValueError, name, "a positive int", block)


def _check_cache(name: str, cache: torch.Tensor, block: int) -> None:
    """uint8 [pages, page_bytes] rows: bytes contiguous, the row stride (the
    kernel's page stride) a multiple of 576 that holds `block` records."""
    need = block * F.KV_RECORD_BYTES
    if cache.stride(1) != 1 or cache.shape[0] < 1:
        fail(ValueError, name, "pages of contiguous bytes (stride(1) == 1, >= 1 page)",
              f"shape {tuple(cache.shape)}, strides {cache.stride()}")
    if cache.shape[1] < need or cache.shape[1] > cache.stride(0):
        fail(ValueError, name, f"page_bytes between {need} ({block} records × "
              f"{F.KV_RECORD_BYTES} B) and the row stride {cache.stride(0)}", cache.shape[1])
    if cache.stride(0) % F.PAGE_ALIGN:
        fail(ValueError, name, f"a row stride that is a multiple of {F.PAGE_ALIGN} B",
              cache.stride(0))
    if byte_extent(cache) > MAX_BUFFER_BYTES:
        fail(ValueError, name, f"at most {MAX_BUFFER_BYTES} bytes from the first page to the "
              "end of the last (32-bit buffer offsets)", f"{byte_extent(cache)} bytes")


def _check_values(args: dict, rank: RankShape, ratio: int) -> None:
    key_len = args["key_len"]
    if key_len.numel() and not (0 <= int(key_len.min()) and int(key_len.max()) <= rank.keys):
        fail(ValueError, "key_len", f"values in 0..{rank.keys} (KEYS)",
              f"range {int(key_len.min())}..{int(key_len.max())}")
    rows, pos = args["cos_sin"].shape[0], args["positions"]
    if pos.numel() and not (0 <= int(pos.min()) and int(pos.max()) < rows):
        fail(ValueError, "positions", f"values in 0..{rows - 1} (cos_sin rows)",
              f"range {int(pos.min())}..{int(pos.max())}")
    slot, compressed, present = F.decode_key_table(args["key_table"])
    index = torch.arange(rank.keys, device=slot.device)
    in_use = present & (index < key_len[:, None].long())
    if ratio == 0 and (in_use & compressed).any():
        fail(ValueError, "key_table", "no compressed entries (bit 31) on a window-only "
              "layer (ratio 0)", "compressed entries within key_len")
    for block_name, cache_name in BLOCK_ARGS.items():
        cache, block = args[cache_name], args[block_name]
        mine = in_use & (compressed == (cache_name == "comp_cache"))
        if cache is None or not mine.any():
            continue
        capacity = cache.shape[0] * block
        if int(slot[mine].max()) >= capacity:
            fail(ValueError, "key_table", f"{cache_name} slots below {capacity} "
                  f"({cache.shape[0]} pages × {block})", f"slot {int(slot[mine].max())}")


def validate_launch(rank: RankShape, ratio: int, args: dict, *, max_tokens: int | None = None,
                    out: torch.Tensor | None = None, check_values: bool | None = None) -> None:
    """Check one launch's arguments (keyed by attention_back's names; `qk_scale`
    optional) for `rank` and `ratio` (0 = window-only: comp_cache None).
    check_values: None = only when q is on the CPU (see the module doc)."""
    missing = [n for n in LAUNCH_ARGS if n not in args]
    if missing:
        fail(TypeError, "args", f"every launch argument {LAUNCH_ARGS}", f"none for {missing}")
    q = args["q"]
    if not isinstance(q, torch.Tensor) or q.dim() < 1:
        fail(TypeError, "q", "a bf16 tensor [S, H, 512]", type(q).__name__)
    tokens, device = q.shape[0], q.device
    if tokens < 1 or (max_tokens is not None and tokens > max_tokens):
        fail(ValueError, "q", f"1..{max_tokens or 'any'} tokens (S = q.shape[0])", tokens)
    if (args["comp_cache"] is None) != (ratio == 0):
        fail(ValueError, "comp_cache", "None exactly when ratio == 0 (window-only layer); "
              f"ratio is {ratio}", "None" if args["comp_cache"] is None else "a tensor")
    for name, rule in RULES.items():
        if args[name] is not None or name != "comp_cache":
            check_tensor(name, args[name], rule, rank, tokens, device)
    for block_name, cache_name in BLOCK_ARGS.items():
        if args[cache_name] is not None:
            check_block(block_name, args[block_name])
            _check_cache(cache_name, args[cache_name], args[block_name])
    if args["cos_sin"].shape[0] < 1:
        fail(ValueError, "cos_sin", "at least one row", 0)
    qk_scale = args.get("qk_scale")
    if qk_scale is not None:
        if isinstance(qk_scale, bool) or not isinstance(qk_scale, (int, float)):
            fail(TypeError, "qk_scale", "a float or None", type(qk_scale).__name__)
        if not 0 < qk_scale < float("inf"):
            fail(ValueError, "qk_scale", "a positive finite float", qk_scale)
    if out is not None:
        check_tensor("out", out, TensorRule((torch.bfloat16,), ("S", rank.geometry.hidden)),
                      rank, tokens, device)
    if check_values or (check_values is None and device.type == "cpu"):
        _check_values(args, rank, ratio)
