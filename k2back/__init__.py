"""k2back: a JIT code generator for the fused DeepSeek-V4.1 attention back half
(sparse flash-decoding .. wo_b) on AMD Instinct GPUs (gfx942, gfx950)."""

from __future__ import annotations

import logging

from k2back import knobs

__version__ = "0.1.0"

logger = logging.getLogger("k2back")
logger.setLevel(knobs.log_level())


def __getattr__(name: str):  # k2back.AttentionBack on first use: `import k2back` stays light
    if name == "AttentionBack":
        from k2back.api import AttentionBack
        return AttentionBack
    raise AttributeError(f"module 'k2back' has no attribute {name!r}")
