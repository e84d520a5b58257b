"""Wave objects outlive their launch (state.Grid.release keeps them, the next
launch starts them again): a launch must start every wave as a new one, whatever
the launch before left in it (scalar file, scc, exec, registers, counters)."""

import numpy as np
import pytest

from k2back.emu import Machine, state
from k2back.emu.testing import ARCHS, handwritten

GRID, BLOCK = (6,), (512,)  # 48 waves

# Leaves its marks in every wave: SGPRs past the initial ones, scc, exec, a VGPR.
DIRTY = """
\ts_mov_b32 s20, 0x5a5a5a5a
\ts_mov_b32 s21, 0x77
\ts_cmp_eq_u32 s21, 0x77
\tv_mov_b32 v5, 0x1234
\ts_mov_b64 exec, 0xff
"""

# Each wave stores, at its own 64 lanes of `out` (s[0:1] points at its address):
# s20, scc, v5, and whether exec is full.
READ = """
\ts_cselect_b32 s22, 1, 0
\ts_load_dwordx2 s[0:1], s[0:1], 0x0
\ts_add_u32 s23, exec_lo, 1
\ts_addc_u32 s23, exec_hi, 0
\ts_cselect_b32 s23, 1, 0
\tv_lshrrev_b32 v6, 6, v0
\ts_lshl_b32 s24, s2, 3
\tv_add_u32_e32 v6, s24, v6
\tv_lshlrev_b32 v6, 10, v6
\tv_and_b32 v7, 63, v0
\tv_lshl_add_u32 v3, v7, 2, v6
\tv_mov_b32 v1, s20
\tv_mov_b32 v2, s22
\tv_mov_b32 v4, s23
\ts_waitcnt lgkmcnt(0)
\tglobal_store_dword v3, v1, s[0:1]
\tglobal_store_dword v3, v2, s[0:1] offset:256
\tglobal_store_dword v3, v5, s[0:1] offset:512
\tglobal_store_dword v3, v4, s[0:1] offset:768
\ts_waitcnt vmcnt(0)
"""


def launch(arch: str, body: str) -> np.ndarray:
    machine = Machine(arch)
    out = np.full(GRID[0] * 8 * 256, 0xDEAD, np.uint32)
    kernargs = machine.map(out).to_bytes(8, "little")
    machine.launch(handwritten(arch, body), "hand", grid=GRID, block=BLOCK, kernargs=kernargs)
    return out.reshape(-1, 4, 64)  # [wave, (s20, scc, v5, exec carried out of 64 bits), lane]


@pytest.mark.parametrize("arch", ARCHS)
def test_a_wave_starts_anew_after_another_launch(arch):
    fresh = launch(arch, READ)  # every wave as the launch set it up
    np.testing.assert_array_equal(fresh[:, :3], 0)
    np.testing.assert_array_equal(fresh[:, 3], 1)  # exec all ones: + 1 carries out
    launch(arch, DIRTY)
    assert len(state._SPARE) >= GRID[0] * 8  # the dirty launch's waves are the next one's
    np.testing.assert_array_equal(launch(arch, READ), fresh)
