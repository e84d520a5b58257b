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

from dataclasses import replace

import torch

from k2back import model, ops
from k2back.codegen.llvm import ARCHS
from k2back.config import LAUNCH_ARGS, MAX_TOKENS, Config
from k2back.runtime import hip
from k2back.validate import validate_launch

BACKEND_CHOICES = ("auto", *ops.BACKENDS)


class AttentionBack:
    def __init__(self, geometry: str = model.DEFAULT_GEOMETRY, *, tp: int, ratio: int,
                 arch: str = "auto", max_tokens: int = MAX_TOKENS, backend: str = "auto",
                 swa_fp8: str = "auto", comp_fp8: str = "auto"):
        if backend not in BACKEND_CHOICES:
            raise ValueError(f"backend: expected one of {BACKEND_CHOICES}, got {backend!r}")
        if backend == "hip":
            hip.require_runtime()
        if arch == "auto" and backend == "emu":
            raise ValueError(f"arch='auto' reads a GPU's gcnArchName; the emu backend has none: "
                             f"pass arch= one of {ARCHS}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not (
                1 <= max_tokens <= MAX_TOKENS):
            raise ValueError(f"max_tokens: expected an int in 1..{MAX_TOKENS}, got {max_tokens!r}")
        # the layer's largest kernel, checked now on every arch it may meet (a
        # clear error here rather than at the first call); a call sets tokens and arch
        for checked in ARCHS if arch == "auto" else (arch,):
            self._layer = Config(geometry, tp, max_tokens, ratio, checked, swa_fp8, comp_fp8)
        self.geometry = model.geometry(geometry)
        self.rank = self.geometry.rank(tp)
        self.ratio = ratio
        self.arch = arch
        self.max_tokens = max_tokens
        self.backend = backend
        self.swa_fp8, self.comp_fp8 = swa_fp8, comp_fp8
        self._configs: dict[tuple, Config] = {}  # (tokens, device) -> a launch's Config
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

    def config(self, tokens: int, device: torch.device) -> Config:
        """The configuration of a launch of `tokens` tokens on `device`, its key
        formats resolved (checked once a layer, tokens and device)."""
        key = (tokens, device)
        if key not in self._configs:
            if self.arch != "auto":
                arch = self.arch
            elif device.type != "cuda":
                raise ValueError(f"arch='auto' reads a GPU's gcnArchName, but the tensors are "
                                 f"on {device}: pass arch= one of {ARCHS} for the emulator")
            else:
                arch = hip.device_arch(device)
            self._configs[key] = replace(self._layer, tokens=tokens, arch=arch).resolved()
        return self._configs[key]

    def key_formats(self, arch: str) -> tuple[str, str]:
        """The byte formats (swa_cache, comp_cache) this layer reads on
        `arch` (a target ID): "auto" is what vLLM writes there."""
        return replace(self._layer, arch=arch).key_formats()

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
        given = locals()
        tensors = {name: given[name] for name in LAUNCH_ARGS}
        validate_launch(self.rank, self.ratio, {**tensors, "qk_scale": qk_scale},
                        max_tokens=self.max_tokens, out=out)
        device = q.device
        backend = self._backend(device)
        config = self.config(q.shape[0], device)
        for name, given_format in (("swa_fp8", swa_fp8), ("comp_fp8", comp_fp8)):
            reads = getattr(config, name)
            if given_format is not None and given_format != reads:
                raise ValueError(f"{name}: the layer reads {reads} bytes on {config.arch}, the "
                                 f"call says the cache holds {given_format!r}: build the layer "
                                 f"with {name}={given_format!r}")
        spec, _ = ops.kernel_for(config)
        scratch = self._scratch_for(backend, spec, device)
        if out is None:
            out = torch.empty((q.shape[0], self.geometry.hidden), dtype=torch.bfloat16,
                              device=device)
        torch.ops.k2back.attention_back(**tensors, out=out, scratch=scratch,
                                        geometry=config.geometry, tp=config.tp,
                                        ratio=config.ratio, arch=config.arch,
                                        swa_fp8=config.swa_fp8, comp_fp8=config.comp_fp8,
                                        qk_scale=qk_scale)
        return out
