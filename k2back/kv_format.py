"""The key caches' formats as plain facts, no torch (SPEC §1).

What the planner, the configuration and the command line need to know about
the two key caches without converting a byte: the fp8_ds_mla record layout
(584 B a token) and the names of their fp8 byte formats ("auto": what vLLM
writes on the arch). k2back.formats holds the torch conversions of these
formats and exports these facts too; this module keeps importing
k2back.config and k2back.codegen.plan from importing torch (~1.5-2 s a process).
"""

from __future__ import annotations

from k2back.model import NOPE_DIM, ROPE_DIM

# ---------------------------------------------------------------------------
# The key caches' fp8 (SPEC §1 "Which fp8 the key bytes are")
#
# Two vLLM kernels write the two caches, and on gfx942 they disagree: the C++
# insert writes the window cache as FNUZ e4m3 with codes computed from 224,
# the Triton compressor writes OCP e4m3fn with codes from 448. A FNUZ record
# holds the bytes an OCP writer would write for the same keys (FNUZ byte b is
# worth half OCP byte b, and 224 is half 448) with every code one higher, but
# -0: FNUZ has none and writes 0x00. Read with the other format, every key is
# off by a factor of 2.

KEY_FP8_NAMES = ("e4m3fn", "e4m3fnuz")  # a cache's byte formats (formats.KEY_FP8 by name)
FP8_CHOICES = (*KEY_FP8_NAMES, "auto")  # what swa_fp8 / comp_fp8 accept
# arch -> (window cache, compressed cache): what vLLM writes there ("auto")
VLLM_KEY_FP8 = {
    "gfx942": ("e4m3fnuz", "e4m3fn"),
    "gfx950": ("e4m3fn", "e4m3fn"),
}


def check_fp8(name: str, value) -> str:
    """`value` if it is one of FP8_CHOICES, else ValueError naming `name`."""
    if value not in FP8_CHOICES:
        raise ValueError(f"{name}: expected one of {FP8_CHOICES}, got {value!r}")
    return value


def resolve_key_fp8(arch: str | None, swa_fp8: str = "auto",
                    comp_fp8: str = "auto") -> tuple[str, str]:
    """The byte formats of (swa_cache, comp_cache): each "e4m3fn" or
    "e4m3fnuz" as given, or "auto" = what vLLM writes on `arch` (a plain
    processor name). ValueError naming the argument otherwise."""
    vllm = VLLM_KEY_FP8.get(arch)
    resolved = []
    for name, value, default in (("swa_fp8", swa_fp8, vllm and vllm[0]),
                                 ("comp_fp8", comp_fp8, vllm and vllm[1])):
        check_fp8(name, value)
        if value == "auto" and default is None:
            raise ValueError(f"{name}: 'auto' means what vLLM writes on the arch, which needs "
                             f"arch= one of {sorted(VLLM_KEY_FP8)}, got {arch!r}")
        resolved.append(default if value == "auto" else value)
    return resolved[0], resolved[1]


# ---------------------------------------------------------------------------
# fp8_ds_mla KV pages (vLLM's V4 layout, 584 B a token)

KV_DATA_BYTES = NOPE_DIM + 2 * ROPE_DIM  # 448 e4m3 + 64 bf16 = 576
KV_SCALE_BYTES = 8  # 7 UE8M0 codes + a pad byte
KV_RECORD_BYTES = KV_DATA_BYTES + KV_SCALE_BYTES  # 584
KV_SCALE_GROUP = 64  # nope dims a scale code covers
KV_SCALES = NOPE_DIM // KV_SCALE_GROUP  # 7
PAGE_ALIGN = KV_DATA_BYTES  # vLLM pads a page to a multiple of 576 B
