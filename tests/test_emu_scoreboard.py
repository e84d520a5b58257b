"""The scoreboard: a register a memory instruction writes is not ready until the
s_waitcnt that covers it (vmcnt in order; LDS in order; SMEM only at
lgkmcnt(0)), and using it earlier is an error naming register, load and user.

Hand-written asm (k2back.emu.testing.handwritten): s[0:1] is the kernarg pointer
(one pointer, `out`), v0 the work-item id. Each case is run with the wait that
covers the load, and without it."""

import numpy as np
import pytest

from k2back.emu import ScoreboardError
from k2back.emu.testing import ARCHS, run_handwritten

OUT = """\ts_load_dwordx2 s[2:3], s[0:1], 0x0
\tv_lshlrev_b32_e32 v1, 2, v0
\ts_waitcnt lgkmcnt(0)"""


def run(arch, body, out=None, lds_bytes=0):
    out = np.arange(72, dtype=np.uint32) + 100 if out is None else out  # lanes 0..63 read past 64
    run_handwritten(arch, f"{OUT}\n{body}", out, lds_bytes=lds_bytes)
    return out


# Two loads in flight, then a wait that covers only the older one: v2 is ready,
# v3 is not (vmcnt counts in issue order).
TWO_LOADS = r"""
	global_load_dword v2, v1, s[2:3]
	global_load_dword v3, v1, s[2:3] offset:4
	s_waitcnt vmcnt({wait})
	v_add_u32_e32 v4, v2, v{reg}
	global_store_dword v1, v4, s[2:3]
	s_waitcnt vmcnt(0)"""


@pytest.mark.parametrize("arch", ARCHS)
def test_vector_load_used_before_its_vmcnt(arch):
    out = run(arch, TWO_LOADS.format(wait=0, reg=3))
    want = np.arange(65, dtype=np.uint32) + 100
    np.testing.assert_array_equal(out[:64], want[:64] + want[1:])
    run(arch, TWO_LOADS.format(wait=1, reg=2))  # v2 is covered by vmcnt(1)
    with pytest.raises(ScoreboardError) as caught:
        run(arch, TWO_LOADS.format(wait=1, reg=3))
    message = str(caught.value)
    assert "v3" in message and "v_add_u32_e32 v4, v2, v3 reads v3" in message
    assert "global_load_dword v3, v1, s[2:3] offset:4" in message and "vmcnt(0)" in message
    assert "workgroup 0 wave 0" in message and "line 11:" in message  # the load's line


# SMEM returns out of order: lgkmcnt(1) covers neither of two scalar loads.
TWO_SCALAR = r"""
	s_load_dword s4, s[2:3], 0x0
	s_load_dword s5, s[2:3], 0x4
	s_waitcnt lgkmcnt({wait})
	v_mov_b32_e32 v2, s4
	global_store_dword v1, v2, s[2:3]
	s_waitcnt vmcnt(0)"""


@pytest.mark.parametrize("arch", ARCHS)
def test_scalar_loads_are_covered_only_by_lgkmcnt_0(arch):
    out = run(arch, TWO_SCALAR.format(wait=0))
    assert (out[:64] == 100).all()
    with pytest.raises(ScoreboardError, match=r"s4 .*s_load_dword s4, s\[2:3\], 0x0.*lgkmcnt\(0\)"):
        run(arch, TWO_SCALAR.format(wait=1))


# LDS returns in order: lgkmcnt(1) covers the older of two LDS reads.
TWO_LDS = r"""
	ds_write_b32 v1, v0
	ds_read_b32 v2, v1
	ds_read_b32 v3, v1
	s_waitcnt lgkmcnt({wait})
	v_add_u32_e32 v4, 1, v{reg}
	global_store_dword v1, v4, s[2:3]
	s_waitcnt vmcnt(0)"""


@pytest.mark.parametrize("arch", ARCHS)
def test_lds_reads_retire_in_order(arch):
    out = run(arch, TWO_LDS.format(wait=1, reg=2), lds_bytes=256)
    np.testing.assert_array_equal(out[:64], np.arange(64) + 1)
    with pytest.raises(ScoreboardError, match=r"v3 .*ds_read_b32 v3, v1.*lgkmcnt\(0\)"):
        run(arch, TWO_LDS.format(wait=1, reg=3), lds_bytes=256)


# Overwriting a register a load still writes loses the write to the load's
# return (WAW); a later load of the same in-order counter may take it over, and
# a store's sources are read when it issues (gfx9), so they may change at once.
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case, ok", [
    ("\tv_mov_b32_e32 v2, 7", False),
    ("\tglobal_load_dword v2, v1, s[2:3] offset:8", True),
    ("\tds_read_b32 v2, v1", False),
])
def test_writing_a_register_a_load_still_writes(arch, case, ok):
    body = f"""
\tglobal_load_dword v2, v1, s[2:3]
{case}
\ts_waitcnt vmcnt(0) lgkmcnt(0)
\tglobal_store_dword v1, v2, s[2:3]
\tv_mov_b32_e32 v2, 5
\ts_waitcnt vmcnt(0)"""
    if ok:
        out = run(arch, body, lds_bytes=256)
        np.testing.assert_array_equal(out[:64], np.arange(2, 66) + 100)  # the second load won
        return
    with pytest.raises(ScoreboardError, match=r"v2 .*overwrites v2, which line \d+: global_load_dword v2"):
        run(arch, body, lds_bytes=256)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("waves", [1, 2, 8])
def test_a_batched_lds_read_is_on_the_scoreboard(arch, waves):
    """The waves of a workgroup run a ds_read once (state.Batch): the next batched
    instruction reading its destination before the lgkmcnt is still an error."""
    body = """
\tv_lshlrev_b32_e32 v1, 2, v0
\tds_read_b32 v2, v1
\tv_add_u32_e32 v3, v2, v2
\ts_waitcnt lgkmcnt(0)"""
    with pytest.raises(ScoreboardError, match=r"v2 .*ds_read_b32 v2, v1.*lgkmcnt\(0\)"):
        run_handwritten(arch, body, np.zeros(64, np.uint32), lds_bytes=4 * 64 * waves, block=(64 * waves,))
