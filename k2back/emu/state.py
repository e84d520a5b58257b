"""Architectural state of one wave and of one workgroup."""

from __future__ import annotations

import collections
import functools

import numpy as np

LANES = 64
M32 = 0xFFFFFFFF
M64 = 0xFFFFFFFFFFFFFFFF
ALL_LANES = np.ones(LANES, dtype=bool)
ALL_LANES.flags.writeable = False

# SGPR-file slots of the named scalar registers (their gfx9 operand encodings).
VCC, M0 = 106, 124
SGPR_SLOTS = 128


def mask_to_int(mask: np.ndarray) -> int:
    return int(np.packbits(mask, bitorder="little").view("<u8")[0])


@functools.lru_cache(maxsize=4096)
def int_to_mask(value: int) -> np.ndarray:
    """The lane mask of a 64-bit exec/vcc value (cached: kernels reuse a few masks;
    the array is read-only so that sharing it is safe)."""
    raw = np.array([value & M64], dtype="<u8").view(np.uint8)
    mask = np.unpackbits(raw, bitorder="little").view(bool)
    mask.flags.writeable = False
    return mask


class Wave:
    """One wave64: scalar file as Python ints, the unified VGPR/AGPR file as numpy rows.

    `r[i]` is v_i and `r[accum_offset + i]` is a_i (gfx90a+ unified register file).
    The exec mask is kept both as an int (scalar ops) and as a lane mask (vector ops).
    """

    __slots__ = (
        "done",
        "exec",
        "f",
        "full",
        "group",
        "i",
        "index",
        "last_load",
        "lds",
        "lds_unperformed",
        "mask",
        "pc",
        "pending",
        "polled_lines",
        "polls",
        "r",
        "s",
        "scc",
        "sleep_rounds",
        "smem",
        "unperformed",
        "vm",
        "waiting",
    )

    def __init__(self, group, index: int, vector_registers: int):
        self.s = [0] * SGPR_SLOTS
        self.r = np.zeros((vector_registers, LANES), dtype=np.uint32)
        self.f = self.r.view(np.float32)  # the same registers seen as f32 / i32 lanes
        self.i = self.r.view(np.int32)
        self.scc = 0
        self.pc = 0
        self.group = group
        self.index = index
        self.done = False
        self.waiting = False  # at a barrier
        self.polls = 0  # s_sleep executions
        self.sleep_rounds = 0
        # outstanding memory instructions by counter (inflight.Op), oldest first
        self.vm = collections.deque()  # vmcnt
        self.lds = collections.deque()  # lgkmcnt, LDS (in order)
        self.smem = collections.deque()  # lgkmcnt, SMEM (out of order)
        self.pending = 0  # scoreboard: registers an outstanding load still writes (bit mask)
        self.unperformed = 0  # stores / write-backs in `vm` not performed yet
        self.lds_unperformed = 0
        self.last_load = None  # (lane addresses, bytes a lane) of the last vector load
        self.polled_lines = ()  # the lines it sleeps on (coherence.StrictMemory.poll)
        self.set_exec(M64)

    def set_exec(self, value: int) -> None:
        self.exec = value & M64
        self.full = self.exec == M64
        self.mask = ALL_LANES if self.full else int_to_mask(self.exec)

    @property
    def name(self) -> str:
        return f"workgroup {self.group.index} wave {self.index}"


class Workgroup:
    __slots__ = ("arrived", "cu", "id", "index", "lds", "waves")

    def __init__(self, index: int, group_id: tuple[int, int, int], lds_bytes: int, cu=None):
        self.index = index
        self.cu = cu  # its compute unit's caches (coherence.Cu)
        self.id = group_id
        self.lds = np.zeros(max(lds_bytes, 4), dtype=np.uint8)
        self.waves: list[Wave] = []
        self.arrived = 0
