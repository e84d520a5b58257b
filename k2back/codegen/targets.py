"""What code generation believes about each target: the one table of arch facts.

llvm.py takes the processor names from here, the planners and the templates
(via `KernelSpec.target`) everything else. The emulator keeps its own
tables on purpose: it models the hardware independently of these beliefs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArchInfo:
    name: str
    blocks: int  # CUs: the persistent grid, one CTA a CU
    lds_budget: int  # LDS bytes a CTA may use
    mfma_k: int  # bf16 MFMA contraction elements a lane supplies (16x16x16: 4, 16x16x32: 8)
    fp8_fnuz: bool  # hardware fp8 is FNUZ e4m3 (gfx942), else OCP e4m3fn
    scaled_mfma: bool  # v_mfma_scale_f32_16x16x128_f8f6f4: OCP fp8 with E8M0 block scales
    scaled_convert: bool  # v_cvt_scalef32_pk_bf16_fp8: two OCP fp8 times 2^(exponent of an f32)
    permlane_swap: bool  # v_permlane16/32_swap_b32: a VALU op exchanges rows / halves of two VGPRs

    @property
    def ocp_per_hw(self) -> int:
        """An OCP e4m3fn byte's value over the hardware converter's value of it
        (FNUZ byte b = OCP byte b / 2, normal and subnormal alike)."""
        return 2 if self.fp8_fnuz else 1

    @property
    def hw_fp8_max(self) -> float:
        """Saturation bound of the hardware encoder that yields OCP bytes <= 448."""
        return 448.0 / self.ocp_per_hw


ARCHS: dict[str, ArchInfo] = {
    a.name: a
    for a in (
        ArchInfo("gfx942", blocks=304, lds_budget=64 * 1024, mfma_k=4, fp8_fnuz=True,
                 scaled_mfma=False, scaled_convert=False, permlane_swap=False),
        ArchInfo("gfx950", blocks=256, lds_budget=160 * 1024, mfma_k=8, fp8_fnuz=False,
                 scaled_mfma=True, scaled_convert=True, permlane_swap=True),
    )
}


def arch_info(arch: str) -> ArchInfo:
    """The facts of `arch` (a plain processor name); ValueError naming it otherwise."""
    if arch not in ARCHS:
        raise ValueError(f"arch: expected one of {sorted(ARCHS)}, got {arch!r}")
    return ARCHS[arch]
