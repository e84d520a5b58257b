"""Cost tables of the timing model: one `Part` per target (MI300X for gfx942,
MI355X for gfx950), every number with its source. docs/timing-model.md is the
same table with a confidence per number and the numbers the result hangs on.

Units: on-die costs in core clock cycles (they scale with the clock), off-die
ones (Infinity Cache, HBM, fences, hand-offs, launches) in ns, bandwidths in
bytes/cycle (per CU, per XCD) or bytes/s (HBM, whole chip).

Issue model (the scheduler of a CU, [rocprof] pipeline-descriptions "Scheduler"):
every cycle the CU picks one of its 4 SIMDs round-robin and issues at most one
instruction per wave and per category (VALU incl. MFMA, VMEM, SALU/SMEM, LDS,
branch) among that SIMD's waves. So a wave issues at most one instruction per
4 cycles, and a wave64 VALU op runs 64 lanes on a 16-lane SIMD in those 4 cycles.
An MFMA issues like a VALU op and then holds its SIMD's matrix core for
`mfma[mnemonic]` cycles; independent VALU work of other waves may issue
`mfma_coexec_delay` cycles after it.

Sources, all read 2026-12-01 (the tags the comments below use):
[mt4g]     caps-tum/mt4g sample_results, pointer-chase microbenchmarks, p50 values:
           "AMD Instinct MI300X VF.json" (231c5bc, MI300X, 2.1 GHz),
           "AMD Instinct MI300A.json" (5db1901, CDNA3, 2.1 GHz),
           "AMD_Instinct_MI350P.json" (52701e7, CDNA4 PCIe card: 4 XCDs, 1 IOD, 2.2 GHz).
           Bandwidth fields are GiB/s.
[roy]      MrRoy09/AMD-CDNA3-CacheBenchmarking, l2_coherence_tests/cache_latency_test/readme.md
           (MI300X: L1 hit 112, NT/sc1 load = L2 hit 224, load after buffer_inv sc1 212 cycles).
[llvm]     llvm/lib/Target/AMDGPU/SISchedule.td (ROCm/llvm-project 37d9a34):
           SIDPGFX942FullSpeedModel, SIDPGFX950FullSpeedModel; "passes" of 4 cycles.
[waitcnt]  LLVM AMDGPU docs, gfx9_waitcnt.rst (releases.llvm.org 11.0.0, read 2026-12-02):
           the s_waitcnt operand's VM_CNT is bits 15:14 and 3:0, value range 0..63.
[calc]     ROCm/amd_matrix_instruction_calculator matrix_calculator.py (2ef9189, 2025-05-20),
           dict_insts["cdna3"]: 'cycles' and 'coexec_delay' per MFMA.
[rocprof]  ROCm/rocprofiler-compute (95b600e and soc_gfx950.py 06713b3):
           docs/conceptual/pipeline-descriptions.rst ("Scheduler", "Local data share");
           analysis_configs/{gfx942,gfx950}/0200_system-speed-of-light.yaml (peak vL1D
           128 B/clk/CU, L2 128 B/clk/channel, LDS 128 B/clk/CU); soc_gfx94x/950 _l2_banks = 16.
[mi300doc] ROCm docs "AMD Instinct MI300 series microarchitecture"
           (ROCm/legacy-rocm-build docs/conceptual/gpu-arch/mi300.md): 304 CUs = 8 XCDs x 38,
           FLOPS/CLOCK/CU table (BF16 2048, FP8 4096, vector FP32 256), 5.3 TB/s peak.
[mi350doc] ROCm docs "AMD Instinct MI350 Series microarchitecture"
           (ROCm/rocm-docs docs/reference/gpu-arch/mi350.rst): 256 CUs = 8 XCDs x 32, 2 IODs,
           L1 32 KB / 128 B lines, L2 4 MB / 16 channels per XCD, 256 MB Infinity Cache,
           8 TB/s peak HBM3E, LDS 160 KB with doubled read bandwidth, peak table (BF16 2.5 PF,
           OCP-FP8 / MXFP8 5.0 PF, MXFP6/4 10 PF).
[spec]     /work/shared/SPEC.md section 4 (corrected 2026-12-01), which cites Kog AI's
           "Building a single-kernel, latency-optimized LLM inference engine on AMD MI300X
           GPUs" (blog.kog.ai, 2026-05-28) for the hand-off, fence and launch figures; the
           blog's body was not readable here, its dev.to summary (2026-06-17) confirms
           "~4.5 us launch overhead" per kernel.
[isa]      AMD Vega / CDNA ISA, S_SLEEP: "Cause a wave to sleep for (64 * SIMM16[6:0] + 1..64)
           clocks" (quoted in XLA's ROCm sleep kernel; the RDNA4 ISA keeps 64*SIMM16[6:0]).
[drm]      Linux drm/amdgpu soc15.c soc15_get_xclk and the patch "Fix refclk reporting for
           SMU v13.0.6" (MI300: "SMU v13.0.6 SOCs have 100MHz reference clock"): the GPU
           counter HIP reports as the wall clock (s_memrealtime).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from types import MappingProxyType

WAVE_LANES = 64
SIMD_LANES = 16  # [rocprof] "Four 16-wide SIMD processors" a CU


@dataclasses.dataclass(frozen=True)
class Mfma:
    """Cycles one MFMA holds its SIMD's matrix core (passes x 4; also its result
    latency). f8f6f4 forms take `f6f4_cycles` when neither A nor B is an 8-bit
    format (cbsz and blgp >= 2) ([llvm] WriteMFMAScale_*_F8F6F4)."""

    cycles: int
    f6f4_cycles: int | None = None


@dataclasses.dataclass(frozen=True)
class Part:
    name: str
    arch: str
    clock_ghz: float  # peak engine clock; the model assumes kernels run at it
    cus: int
    xcds: int
    cus_per_xcd: int
    simds_per_cu: int
    issue_cycles: Mapping[str, int]  # instruction class (emu DISPATCH) -> cycles a wave's issue takes
    valu_slow: Mapping[str, int]  # VALU mnemonic prefix -> cycles, where not `issue_cycles["valu"]`
    mfma: Mapping[str, Mfma]  # mnemonic -> matrix-core cycles
    mfma_coexec_delay: int  # cycles after an MFMA issue before other VALU work may issue
    matrix_flops_per_cu_cycle: Mapping[str, int]  # published peak, per element type (a check)
    branch_taken_cycles: int
    branch_not_taken_cycles: int
    sleep_quantum_cycles: int  # s_sleep N sleeps quantum * N + up to one more quantum
    lds_latency_cycles: int  # issue to data, no bank conflict
    lds_read_bytes_per_cycle: int  # per SIMD-pair port (2 ports a CU)
    lds_write_bytes_per_cycle: int  # per port, shared by data and a 4-byte address a lane
    sl1_hit_cycles: int
    sl1_miss_extra_cycles: int  # scalar L1 miss served by L2, on top of the hit
    vl1_hit_cycles: int
    l2_hit_cycles: int  # vector load missing L1, hitting its XCD's L2
    mall_hit_ns: float  # Infinity Cache (memory-attached last level) hit
    hbm_ns: float  # miss to HBM
    vl1_line_bytes: int
    l2_line_bytes: int
    sl1_line_bytes: int
    mall_line_bytes: int
    vl1_bytes: int
    l2_bytes_per_xcd: int
    mall_bytes: int
    hbm_bytes_per_s: float  # achievable, all CUs streaming
    hbm_peak_bytes_per_s: float
    cu_bytes_per_cycle: int  # what one CU's vL1D / address path delivers
    wave_vm_outstanding: int  # vector memory instructions a wave may have in flight (vmcnt's range)
    l2_bytes_per_cycle_per_xcd: int  # achievable, the XCD's 16 channels together
    release_fence_ns: float  # agent-scope release (buffer_wbl2 sc1 + wait) over workgroup scope
    acquire_fence_ns: float  # agent-scope acquire (buffer_inv sc1) over workgroup scope
    handoff_ns: float  # release store on one XCD -> seen by a poll on another, one way
    memrealtime_hz: float  # s_memrealtime tick
    launch_ns: float  # plain launch on a stream
    graph_node_ns: float  # a kernel node of a replayed HIP graph (vLLM's FULL capture)

    def ns(self, cycles: float) -> float:
        return cycles / self.clock_ghz

    def cycles(self, ns: float) -> float:
        return ns * self.clock_ghz

    def valu_cycles(self, mnemonic: str) -> int:
        for prefix, cycles in self.valu_slow.items():
            if mnemonic.startswith(prefix):
                return cycles
        return self.issue_cycles["valu"]

    def mfma_cycles(self, mnemonic: str, cbsz: int = 0, blgp: int = 0) -> int:
        """Matrix-core cycles of `mnemonic`; KeyError names a shape the table lacks."""
        cost = self.mfma[mnemonic]
        narrow = cbsz >= F6F4_FIRST_FORMAT and blgp >= F6F4_FIRST_FORMAT
        return cost.f6f4_cycles if narrow and cost.f6f4_cycles else cost.cycles

    def sleep_cycles(self, n: int) -> int:
        """s_sleep n: the ISA's 64*n + (1..64) clocks, taken at its longest."""
        return self.sleep_quantum_cycles * (n + 1)

    def nop_cycles(self, n: int) -> int:
        """s_nop n: n + 1 wait states, each one issue slot of the wave."""
        return self.issue_cycles["nop"] * (n + 1)

    def lds_cycles(self, bytes_per_lane: int, write: bool) -> int:
        """Port cycles of one wave64 LDS access without bank conflicts."""
        if write:
            return -(-WAVE_LANES * (bytes_per_lane + 4) // self.lds_write_bytes_per_cycle)
        return -(-WAVE_LANES * bytes_per_lane // self.lds_read_bytes_per_cycle)

    @property
    def kernel_drain_ns(self) -> float:
        """GPU-side cost at a dependent kernel boundary (end-of-kernel release,
        start-of-kernel acquire), derived from the in-kernel fence costs; the
        graph node cost already contains it."""
        return self.release_fence_ns + self.acquire_fence_ns


F6F4_FIRST_FORMAT = 2  # cbsz/blgp 0 fp8 e4m3, 1 bf8 e5m2, 2-3 fp6, 4 fp4 ([llvm] PredIsF8_MFMA_SCALE)

# Both parts issue like GCN: one instruction per wave per SIMD turn of 4 cycles
# ([rocprof] "Scheduler"); a wave64 VALU op is 64 lanes / 16-lane SIMD = 4 cycles
# ([llvm] "latency values are 1 / (operations / cycle) / 4", Write32Bit = 1 pass).
# What waits (s_waitcnt, s_barrier, memory, sleep) is modelled on top of these.
_ISSUE = MappingProxyType({
    "valu": 4, "mfma": 4, "salu": 4, "smem": 4, "branch": 4, "barrier": 4, "waitcnt": 4,
    "sleep": 4, "nop": 4, "endpgm": 4, "lds": 4, "cache": 4,
    "vmem_load": 4, "vmem_store": 4, "vmem_atomic": 4,
})
# F32 transcendentals are quarter rate: 16 cycles a wave ([llvm] WriteTrans32 "these are
# quarter rate"). Conversions (WriteFloatCvt, incl. the fp8 ones), 32-bit integer
# multiplies (WriteIntMul = 1 on gfx942/950), 64-bit ops (Write64Bit = 1) and packed F32
# (v_pk_fma_f32: 2 FMAs a lane, [mi300doc] vector FP32 256 flops/clk/CU = 4 SIMD x 16 x 2 x 2)
# issue at the full rate.
_TRANSCENDENTAL = MappingProxyType({p: 16 for p in (
    "v_exp_", "v_log_", "v_rcp_", "v_rsq_", "v_sqrt_", "v_sin_", "v_cos_")})


def _mfmas(cycles: dict[str, int | Mfma]) -> Mapping[str, Mfma]:
    return MappingProxyType({k: v if isinstance(v, Mfma) else Mfma(v) for k, v in cycles.items()})


_FP8_PAIRS = ("fp8_fp8", "fp8_bf8", "bf8_fp8", "bf8_bf8")

# [calc] cdna3 'cycles' = [llvm] SIDPGFX942FullSpeedModel passes x 4
_CDNA3_MFMA = {
    "v_mfma_f32_16x16x16_bf16": 16,  # [calc] 16, [llvm] Write4PassMAI
    "v_mfma_f32_32x32x8_bf16": 32,  # [calc] 32, [llvm] Write8PassMAI
    **{f"v_mfma_f32_16x16x32_{p}": 16 for p in _FP8_PAIRS},  # [calc] 16, [llvm] 4 passes
    **{f"v_mfma_f32_32x32x16_{p}": 32 for p in _FP8_PAIRS},  # [calc] 32, [llvm] 8 passes
}

# [llvm] SIDPGFX950FullSpeedModel (the calculator has no CDNA4 table): the CDNA3 shapes keep
# their passes (so 16x16x16 bf16 and 16x16x32 fp8 run at half of gfx950's peak), the
# double-K bf16 shapes run at the full rate, f8f6f4 takes twice as long when A or B is 8-bit.
_CDNA4_MFMA = {
    **_CDNA3_MFMA,
    "v_mfma_f32_16x16x32_bf16": 16,  # Write4PassMAI ("^V_MFMA_.32_16X16X32")
    "v_mfma_f32_32x32x16_bf16": 32,  # Write8PassMAI
    **{m: Mfma(32, f6f4_cycles=16) for m in (  # WriteMFMAScale_16X16X128_F8F6F4: 8 / 4 passes
        "v_mfma_f32_16x16x128_f8f6f4", "v_mfma_scale_f32_16x16x128_f8f6f4")},
    **{m: Mfma(64, f6f4_cycles=32) for m in (  # WriteMFMAScale_32X32X64_F8F6F4: 16 / 8 passes
        "v_mfma_f32_32x32x64_f8f6f4", "v_mfma_scale_f32_32x32x64_f8f6f4")},
}

MI300X = Part(
    name="MI300X", arch="gfx942",
    clock_ghz=2.1,  # [mi300doc] 1307.4 TF = 2048 flops/clk/CU x 304 x 2.1 GHz; [mt4g] clockRate 2100000 kHz
    cus=304, xcds=8, cus_per_xcd=38,  # [mi300doc] 8 XCDs of 38 active CUs
    simds_per_cu=4,  # [rocprof] pipeline-descriptions "Four 16-wide SIMD processors"
    issue_cycles=_ISSUE,  # [rocprof] "Scheduler", [llvm] Write32Bit (see _ISSUE)
    valu_slow=_TRANSCENDENTAL,  # [llvm] WriteTrans32
    mfma=_mfmas(_CDNA3_MFMA),  # [calc] cdna3, [llvm] SIDPGFX942FullSpeedModel
    mfma_coexec_delay=4,  # [calc] cdna3 'coexec_delay' of the XDL ops
    matrix_flops_per_cu_cycle=MappingProxyType({"bf16": 2048, "fp8": 4096}),  # [mi300doc] table
    branch_taken_cycles=32,  # [llvm] SICommonWriteRes WriteBranch = 8 passes (model says "may not be accurate")
    branch_not_taken_cycles=4,  # guess: one issue slot, execution falls through
    sleep_quantum_cycles=64,  # [isa] S_SLEEP
    lds_latency_cycles=52,  # [mt4g] MI300X shared latency p50 52 (mean 51.3)
    lds_read_bytes_per_cycle=64,  # [rocprof] "Local data share": 64 B/cycle each way per port
    lds_write_bytes_per_cycle=64,  # [rocprof] same port; a 4 B/lane store 8 cycles, 16 B/lane 20
    sl1_hit_cycles=48,  # [mt4g] MI300X scalarL1 latency p50
    sl1_miss_extra_cycles=124,  # [mt4g] MI300X scalarL1 missPenalty 123.9
    vl1_hit_cycles=116,  # [mt4g] MI300X l1 latency p50 ([roy] 112)
    l2_hit_cycles=288,  # [mt4g] MI300X l2 latency p50 = 137 ns ([roy] 224 for L1-bypassing sc1/nt loads)
    mall_hit_ns=234.0,  # [mt4g] MI300A (same CDNA3 IODs) l3 latency p50 492 cycles / 2.1 GHz
    hbm_ns=417.0,  # [mt4g] MI300X main latency p50 876 cycles / 2.1 GHz (mean 900)
    vl1_line_bytes=128, l2_line_bytes=128,  # [mt4g] MI300X l1 / l2 lineSize
    sl1_line_bytes=64, mall_line_bytes=64,  # [mt4g] MI300X scalarL1 / l3 lineSize
    vl1_bytes=32 * 1024,  # [mt4g] MI300X l1 size 32768
    l2_bytes_per_xcd=4 * 1024 * 1024,  # [mt4g] l2 size 4194304; [mi300doc] "4 MB L2"
    mall_bytes=256 * 1024 * 1024,  # [mt4g] MI300X l3 size 268435456
    hbm_bytes_per_s=4.0e12,  # [mt4g] MI300X main readBandwidth 3689.7 GiB/s = 3.96e12; [spec] BabelStream 4.0
    hbm_peak_bytes_per_s=5.3e12,  # [mi300doc]
    cu_bytes_per_cycle=128,  # [rocprof] gfx942 vL1D peak 128 B/clk/CU; [mt4g] MI300A 249.8 GiB/s/CU = 127.7 B/clk
    wave_vm_outstanding=63,  # [waitcnt] gfx9 s_waitcnt: VM_CNT bits 15:14 and 3:0, 0..63
    l2_bytes_per_cycle_per_xcd=918,  # [mt4g] MI300X l2 readBandwidth 14365 GiB/s / 8 XCDs / 2.1 GHz (45% of [rocprof] 16 x 128)
    release_fence_ns=160.0,  # [spec] (Kog) +130..190 ns, midpoint
    acquire_fence_ns=130.0,  # [spec] (Kog) +120..145 ns, midpoint
    handoff_ns=650.0,  # [spec] (Kog) cross-XCD flag ping-pong 0.6..0.7 us one way, midpoint
    memrealtime_hz=100e6,  # [drm] SMU v13.0.6 (MI300) 100 MHz reference clock
    launch_ns=4500.0,  # [spec] (Kog) plain launch ~4.5 us
    graph_node_ns=1500.0,  # [spec] (Kog) HIP-graph node ~1.5 us
)

MI355X = Part(
    name="MI355X", arch="gfx950",
    clock_ghz=2.4,  # [mi350doc] 2.5 PF bf16 = 4096 flops/clk/CU x 256 x 2.4 GHz (2.38 from the rounded PF)
    cus=256, xcds=8, cus_per_xcd=32,  # [mi350doc] "eight XCDs", "32 are active"
    simds_per_cu=4,  # [rocprof] (CDNA-CDNA4 pages)
    issue_cycles=_ISSUE,  # as MI300X
    valu_slow=_TRANSCENDENTAL,  # [llvm] SICommonWriteRes WriteTrans32 (gfx950 inherits)
    mfma=_mfmas(_CDNA4_MFMA),  # [llvm] SIDPGFX950FullSpeedModel
    mfma_coexec_delay=4,  # guess: the CDNA3 value (no CDNA4 calculator table)
    matrix_flops_per_cu_cycle=MappingProxyType(  # [mi350doc] PF / (256 CUs x 2.4 GHz); ISSCC: FP8 8192/clk/CU
        {"bf16": 4096, "fp8": 8192, "f6f4": 16384}),
    branch_taken_cycles=32,  # [llvm] as MI300X
    branch_not_taken_cycles=4,  # guess, as MI300X
    sleep_quantum_cycles=64,  # [isa]
    lds_latency_cycles=48,  # [mt4g] MI350P shared latency p50 48 (SPEC's 69 has no source found)
    lds_read_bytes_per_cycle=128,  # [mi350doc] "doubled read bandwidth" over CDNA3's 64
    lds_write_bytes_per_cycle=64,  # guess: writes not said to change
    sl1_hit_cycles=48,  # [mt4g] MI350P scalarL1 latency p50
    sl1_miss_extra_cycles=119,  # [mt4g] MI350P scalarL1 missPenalty 118.9
    vl1_hit_cycles=112,  # [mt4g] MI350P l1 latency p50
    l2_hit_cycles=256,  # [mt4g] MI350P l2 latency p50
    mall_hit_ns=232.0,  # [mt4g] MI350P l3 444 cycles / 2.2 GHz = 202 ns, x1.15 guess for MI355X's 2 IODs
    hbm_ns=387.0,  # [mt4g] MI350P main 740 cycles / 2.2 GHz = 336 ns, x1.15 guess for MI355X's 2 IODs
    vl1_line_bytes=128, l2_line_bytes=128,  # [mi350doc] "128B cache lines"; [mt4g] MI350P lineSize
    sl1_line_bytes=64, mall_line_bytes=64,  # [mt4g] MI350P
    vl1_bytes=32 * 1024,  # [mi350doc] "32KB"
    l2_bytes_per_xcd=4 * 1024 * 1024,  # [mi350doc] "4MB ... 16 parallel channels"
    mall_bytes=256 * 1024 * 1024,  # [mi350doc] "256MB"
    hbm_bytes_per_s=6.0e12,  # guess: MI300X's measured 0.75 of peak x 8 TB/s ([spec] says 6.5..7.2, uncited)
    hbm_peak_bytes_per_s=8.0e12,  # [mi350doc]
    wave_vm_outstanding=63,  # [waitcnt] as MI300X (gfx950 keeps the gfx9 encoding)
    cu_bytes_per_cycle=128,  # [rocprof] gfx950 vL1D peak 128 B/clk/CU ([mt4g] MI350P 214 GiB/s/CU = 105 B/clk at 2.2)
    l2_bytes_per_cycle_per_xcd=1525,  # [mt4g] MI350P l2 readBandwidth 12495 GiB/s / 4 XCDs / 2.2 GHz
    release_fence_ns=160.0,  # guess: MI300X's (no CDNA4 measurement)
    acquire_fence_ns=130.0,  # guess: MI300X's
    handoff_ns=650.0,  # guess: MI300X's (2 directly linked IODs may well be faster)
    memrealtime_hz=100e6,  # guess: MI300's 100 MHz reference clock ([drm]) kept
    launch_ns=4500.0,  # guess: MI300X's (host-side cost)
    graph_node_ns=1500.0,  # guess: MI300X's
)

PARTS: Mapping[str, Part] = MappingProxyType({p.arch: p for p in (MI300X, MI355X)})

_MFMA_SHAPE = re.compile(r"v_mfma(?:_scale)?_f32_(\d+)x(\d+)x(\d+)_?(\w+)$")


def mfma_shape(mnemonic: str) -> tuple[int, int, int, str]:
    """(M, N, K, element type of the peak table) of an MFMA mnemonic."""
    m, n, k, types = _MFMA_SHAPE.match(mnemonic).groups()
    element = "bf16" if types == "bf16" else "fp8"  # fp8/bf8 pairs and f8f6f4 (8-bit operands)
    return int(m), int(n), int(k), element


def part(arch: str) -> Part:
    """The cost table of `arch` (a plain processor name); ValueError naming it otherwise."""
    if arch not in PARTS:
        raise ValueError(f"arch: expected one of {sorted(PARTS)}, got {arch!r}")
    return PARTS[arch]
