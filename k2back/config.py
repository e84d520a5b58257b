"""One launch configuration, validated here and nowhere else.

A `Config` names one kernel: the model geometry, the tensor-parallel degree,
the tokens S of a launch, the KV compression ratio, the target and the byte
formats of the two key caches. Constructing one checks every field; the
planner, the public API, the torch op, the CLI and the tests all take it, so
a bad value is refused with the same words wherever it enters:

    ValueError: tokens: expected an int in 1..64, got 65

`LAUNCH_ARGS` is the launch's argument list (the names of
`reference.attention_back`, in order): the API, the op schema, make_inputs
and validation read it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from k2back import model
from k2back.codegen.llvm import Target, parse_arch
from k2back.kv_format import check_fp8, resolve_key_fp8

RATIOS = (0, 1, 2)  # 0: a window-only layer (no compressed cache)
MAX_TOKENS = 64  # tokens S one kernel handles (decode: 1 + drafts, batched)

# The arguments of one launch (beyond out, the scratch and qk_scale), in order.
LAUNCH_ARGS = ("q", "key_table", "key_len", "positions", "swa_cache", "swa_block", "comp_cache",
               "comp_block", "cos_sin", "sink", "wo_a", "wo_a_scale", "wo_b", "wo_b_scale")


def _expect(name: str, ok: bool, expected: str, given) -> None:
    if not ok:
        raise ValueError(f"{name}: expected {expected}, got {given!r}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Config:
    """One kernel's configuration. `arch` is a target ID (gfx942, or a device's
    gcnArchName such as gfx942:sramecc+:xnack-: its features change the build,
    not the plan); swa_fp8 / comp_fp8 are "e4m3fn", "e4m3fnuz" or "auto" (what
    vLLM writes on the arch, `resolved()` names it)."""

    geometry: str
    tp: int
    tokens: int
    ratio: int
    arch: str
    swa_fp8: str = "auto"
    comp_fp8: str = "auto"

    def __post_init__(self):
        _expect("geometry", isinstance(self.geometry, str), "a geometry name", self.geometry)
        geo = model.geometry(self.geometry)
        _expect("tp", _is_int(self.tp), f"an int of {model.TP_DEGREES}", self.tp)
        geo.rank(self.tp)  # tp must divide the geometry's groups
        _expect("tokens", _is_int(self.tokens) and 1 <= self.tokens <= MAX_TOKENS,
                f"an int in 1..{MAX_TOKENS}", self.tokens)
        _expect("ratio", _is_int(self.ratio) and self.ratio in RATIOS, f"one of {RATIOS}",
                self.ratio)
        _expect("arch", isinstance(self.arch, str), "a target ID such as gfx942", self.arch)
        check_fp8("swa_fp8", self.swa_fp8)
        check_fp8("comp_fp8", self.comp_fp8)
        resolve_key_fp8(self.processor, self.swa_fp8, self.comp_fp8)

    @property
    def target(self) -> Target:
        return parse_arch(self.arch)

    @property
    def processor(self) -> str:
        """The arch without target-ID features (gfx942): what the plan reads."""
        return self.target.arch

    @property
    def rank(self) -> model.RankShape:
        return model.geometry(self.geometry).rank(self.tp)

    def key_formats(self) -> tuple[str, str]:
        """(swa_cache, comp_cache) byte formats, "auto" resolved on the arch."""
        return resolve_key_fp8(self.processor, self.swa_fp8, self.comp_fp8)

    def resolved(self) -> Config:
        """The same kernel with its key formats named: one Config a kernel."""
        swa_fp8, comp_fp8 = self.key_formats()
        return replace(self, swa_fp8=swa_fp8, comp_fp8=comp_fp8)

    def __str__(self) -> str:
        return (f"{self.geometry} tp={self.tp} tokens={self.tokens} ratio={self.ratio} "
                f"arch={self.arch} swa_fp8={self.swa_fp8} comp_fp8={self.comp_fp8}")
