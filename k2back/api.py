"""The public entry point: one `AttentionBack` per attention layer and rank.

    layer = k2back.AttentionBack("v4.1-flash", tp=4, ratio=2)      # on a ROCm GPU
    out = layer(q, key_table, key_len, positions, swa_cache, swa_block, comp_cache,
                comp_block, cos_sin, sink, wo_a, wo_a_scale, wo_b, wo_b_scale)

It picks the kernel for the call's token count S (built on first use, from
the disk cache after), owns the hand-off scratch of each kernel (zeroed once,
then carried from launch to launch by the epoch protocol), and validates every
argument before anything is written. The caches' fp8 key bytes are read in
`swa_fp8` / `comp_fp8` ("auto": what vLLM writes on the device's arch, a FNUZ
window cache on gfx942).
"""

from __future__ import annotations

import torch

from k2back import model, ops
from k2back.codegen.llvm import ARCHS, parse_arch
from k2back.codegen.plan import MAX_TOKENS, RATIOS
from k2back.formats import check_fp8, resolve_key_fp8
from k2back.runtime import hip
from k2back.validate import validate_launch

BACKEND_CHOICES = ("auto", *ops.BACKENDS)


class AttentionBack:
    def __init__(self, geometry: str = model.DEFAULT_GEOMETRY, *, tp: int, ratio: int,
                 arch: str = "auto", max_tokens: int = 64, backend: str = "auto",
                 swa_fp8: str = "auto", comp_fp8: str = "auto"):
        self.geometry = model.geometry(geometry)
        self.rank = self.geometry.rank(tp)
        if backend not in BACKEND_CHOICES:
            raise ValueError(f"backend: expected one of {BACKEND_CHOICES}, got {backend!r}")
        if backend == "hip":
            hip.require_runtime()
        if ratio not in RATIOS:
            raise ValueError(f"ratio: expected one of {RATIOS}, got {ratio!r}")
        if not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_TOKENS:
            raise ValueError(f"max_tokens: expected an int in 1..{MAX_TOKENS}, got {max_tokens!r}")
        self.swa_fp8, self.comp_fp8 = check_fp8("swa_fp8", swa_fp8), check_fp8("comp_fp8", comp_fp8)
        if arch != "auto":  # a clear error now rather than at the first call
            resolve_key_fp8(parse_arch(arch).arch, swa_fp8, comp_fp8)
        elif backend == "emu":
            raise ValueError(f"arch='auto' reads a GPU's gcnArchName; the emu backend has none: "
                             f"pass arch= one of {ARCHS}")
        self.ratio = ratio
        self.arch = arch
        self.max_tokens = max_tokens
        self.backend = backend
        self._scratch: dict[tuple, torch.Tensor] = {}  # (kernel name, device) -> scratch

    def __repr__(self) -> str:
        return (f"AttentionBack({self.geometry.name!r}, tp={self.rank.tp}, ratio={self.ratio}, "
                f"arch={self.arch!r}, max_tokens={self.max_tokens}, backend={self.backend!r}, "
                f"swa_fp8={self.swa_fp8!r}, comp_fp8={self.comp_fp8!r})")

    def _backend(self, device: torch.device):
        chosen = ops.backend_for(device)
        if self.backend not in ("auto", chosen.name):
            raise ValueError(f"backend {self.backend!r}: tensors on {device} run on the "
                             f"{chosen.name!r} backend")
        return chosen

    def _arch(self, device: torch.device) -> str:
        if self.arch != "auto":
            return self.arch
        if device.type != "cuda":
            raise ValueError(f"arch='auto' reads a GPU's gcnArchName, but the tensors are on "
                             f"{device}: pass arch= one of {ARCHS} for the emulator")
        return hip.device_arch(device)

    def key_formats(self, arch: str) -> tuple[str, str]:
        """The byte formats (swa_cache, comp_cache) this layer reads on
        `arch` (a target ID): "auto" is what vLLM writes there."""
        return resolve_key_fp8(parse_arch(arch).arch, self.swa_fp8, self.comp_fp8)

    def _scratch_for(self, backend, spec, device: torch.device) -> torch.Tensor:
        key = (spec.name, device)
        if key not in self._scratch:
            self._scratch[key] = backend.new_scratch(spec, device)
        return self._scratch[key]

    def __call__(self, q, key_table, key_len, positions, swa_cache, swa_block, comp_cache,
                 comp_block, cos_sin, sink, wo_a, wo_a_scale, wo_b, wo_b_scale, out=None,
                 qk_scale=None, swa_fp8=None, comp_fp8=None):
        """`out` = the layer's back half (allocated when not given). swa_fp8 /
        comp_fp8, when given, say which fp8 the caches hold (make_inputs
        returns them): a mismatch with the layer's formats is an error, as the
        kernel would read every key a factor of 2 off."""
        tensors = {"q": q, "key_table": key_table, "key_len": key_len, "positions": positions,
                   "swa_cache": swa_cache, "swa_block": swa_block, "comp_cache": comp_cache,
                   "comp_block": comp_block, "cos_sin": cos_sin, "sink": sink, "wo_a": wo_a,
                   "wo_a_scale": wo_a_scale, "wo_b": wo_b, "wo_b_scale": wo_b_scale}
        validate_launch(self.rank, self.ratio, {**tensors, "qk_scale": qk_scale},
                        max_tokens=self.max_tokens, out=out)
        device = q.device
        backend, arch = self._backend(device), self._arch(device)
        formats = self.key_formats(arch)
        for name, given, reads in zip(("swa_fp8", "comp_fp8"), (swa_fp8, comp_fp8), formats):
            if given is not None and given != reads:
                raise ValueError(f"{name}: the layer reads {reads} bytes on {arch}, the call "
                                 f"says the cache holds {given!r}: build the layer with "
                                 f"{name}={given!r}")
        spec, _ = ops.kernel_for(self.geometry.name, self.rank.tp, q.shape[0], self.ratio, arch,
                                 *formats)
        scratch = self._scratch_for(backend, spec, device)
        if out is None:
            out = torch.empty((q.shape[0], self.geometry.hidden), dtype=torch.bfloat16,
                              device=device)
        torch.ops.k2back.attention_back(**tensors, out=out, scratch=scratch,
                                        geometry=self.geometry.name, tp=self.rank.tp,
                                        ratio=self.ratio, arch=arch, swa_fp8=formats[0],
                                        comp_fp8=formats[1], qk_scale=qk_scale)
        return out
