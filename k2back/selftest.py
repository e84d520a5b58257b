"""`k2back selftest`: the emulator against the GPU it models.

On a machine with a gfx942/gfx950 GPU (ROCm up): small unit kernels run on the
GPU and in the emulator and must agree bit for bit (the transcendental one,
whose ISA promise is 1 ulp, within 1 ulp); then the K2 kernel's tiny
configurations run on both and each result must be within the calibrated
tolerances of the reference (k2back.testing.TOLERANCES), with the GPU-emulator
distance printed. Without such a GPU it says why and runs the emulator half:
the unit kernels in the emulator against their models here, the K2 kernels
against the reference. Exit status 1 on any disagreement.

Every transfer to the device goes through `to_device` and every compile through
`unit_kernel` / `k2_kernel`: the seams the GPU-path test (tests/test_selftest.py)
replaces with a recording stand-in."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import torch

LANES = 64
K2_CONFIGS = (("tiny", 1, 1, 0), ("tiny", 2, 16, 2), ("tiny", 4, 3, 1))
FP8 = {"gfx942": ml_dtypes.float8_e4m3fnuz, "gfx950": ml_dtypes.float8_e4m3fn}

_TAIL = """
attributes #0 = { "amdgpu-flat-work-group-size"="1,256" }
!llvm.module.flags = !{!0}
!0 = !{i32 1, !"amdhsa_code_object_version", i32 500}
"""


@dataclasses.dataclass(frozen=True)
class Unit:
    """A unit kernel `@unit(ptr addrspace(1) %in, ptr addrspace(1) %out)` of one
    workgroup of 64 lanes: `inputs(arch)` the u32 words of %in, `model(arch, in)`
    the u32 words %out must hold (`outputs` of them), `ulps` the allowed distance
    (0: bit for bit; NaN matches any NaN where `nan_any`)."""

    name: str
    body: Callable[[str], str]
    inputs: Callable[[str], np.ndarray]
    outputs: int
    model: Callable[[str, np.ndarray], np.ndarray]
    ulps: int = 0
    nan_any: bool = False
    declare: str = ""  # module-level declarations the body uses


def module(arch: str, unit: Unit) -> str:
    from k2back.codegen import llvm

    return f"""target triple = "{llvm.TRIPLE}"
define amdgpu_kernel void @unit(ptr addrspace(1) %in, ptr addrspace(1) %out) #0 {{
entry:
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
{unit.body(arch)}
  ret void
}}
declare i32 @llvm.amdgcn.workitem.id.x()
{unit.declare}
{_TAIL}"""


def _loads(n: int) -> str:
    return "".join(f"""
  %pi{i} = getelementptr i32, ptr addrspace(1) %in, i32 {i * LANES}
  %qi{i} = getelementptr i32, ptr addrspace(1) %pi{i}, i32 %tid
  %x{i} = load i32, ptr addrspace(1) %qi{i}""" for i in range(n))


def _stores(values: list[str]) -> str:
    return "".join(f"""
  %po{i} = getelementptr i32, ptr addrspace(1) %out, i32 {i * LANES}
  %qo{i} = getelementptr i32, ptr addrspace(1) %po{i}, i32 %tid
  store i32 {v}, ptr addrspace(1) %qo{i}""" for i, v in enumerate(values))


def _words(seed: int, n: int) -> np.ndarray:
    g = np.random.default_rng(seed)
    return g.integers(0, 2**32, (n, LANES), dtype=np.uint64).astype(np.uint32)


def _floats(seed: int, n: int) -> np.ndarray:
    g = np.random.default_rng(seed)
    x = (g.standard_normal((n, LANES)) * np.exp2(g.integers(-20, 20, (n, LANES)))).astype(np.float32)
    x[:, :6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40]
    return x.view(np.uint32)


# --- the unit kernels ---------------------------------------------------------------------

def _integer_body(arch):
    return _loads(2) + """
  %a = add i32 %x0, %x1
  %m = mul i32 %x0, %x1
  %w0 = zext i32 %x0 to i64
  %w1 = zext i32 %x1 to i64
  %wp = mul i64 %w0, %w1
  %wh = lshr i64 %wp, 32
  %h = trunc i64 %wh to i32
  %s = and i32 %x1, 31
  %sh = shl i32 %x0, %s
  %ar = ashr i32 %x0, %s
  %bf0 = lshr i32 %x0, 5
  %bf = and i32 %bf0, 1023
  %lt = icmp slt i32 %x0, %x1
  %mx = select i1 %lt, i32 %x1, i32 %x0
  %xo = xor i32 %x0, %x1""" + _stores(["%a", "%m", "%h", "%sh", "%ar", "%bf", "%mx", "%xo"])


def _integer_model(arch, words):
    a, b = words[0].astype(np.uint64), words[1].astype(np.uint64)
    s = (b & 31).astype(np.uint64)
    sa, sb = words[0].view(np.int32), words[1].view(np.int32)
    return np.stack([(a + b) & 0xFFFFFFFF, (a * b) & 0xFFFFFFFF, (a * b) >> 32, (a << s) & 0xFFFFFFFF,
                     (sa.astype(np.int64) >> s.astype(np.int64)).astype(np.uint32),
                     (a >> 5) & 1023, np.maximum(sa, sb).view(np.uint32), a ^ b]).astype(np.uint32)


def _bf16_body(arch):
    return _loads(1) + """
  %f = bitcast i32 %x0 to float
  %b = fptrunc float %f to bfloat
  %bi = bitcast bfloat %b to i16
  %z = zext i16 %bi to i32""" + _stores(["%z"])


def _bf16_model(arch, words):
    return words[:1].view(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)


def _fp8_body(arch):
    lines = _loads(1)
    values = []
    for i in range(4):
        lines += f"""
  %d{i} = call float @llvm.amdgcn.cvt.f32.fp8(i32 %x0, i32 {i})
  %e{i} = bitcast float %d{i} to i32"""
        values.append(f"%e{i}")
    return lines + _stores(values)


def _fp8_inputs(arch):
    return np.arange(256, dtype=np.uint8).view(np.uint32).reshape(1, LANES).copy()


def _fp8_model(arch, words):
    codes = words[0].view(np.uint8).reshape(LANES, 4)
    return codes.view(FP8[arch]).astype(np.float32).view(np.uint32).T.copy()


def _lanes_body(arch):
    # ds_bpermute from lane 63 - l, readlane 13, DPP quad_perm [1,0,3,2] (ctrl 0xB1)
    return _loads(1) + """
  %rev = sub i32 63, %tid
  %addr = shl i32 %rev, 2
  %bp = call i32 @llvm.amdgcn.ds.bpermute(i32 %addr, i32 %x0)
  %rl = call i32 @llvm.amdgcn.readlane.i32(i32 %x0, i32 13)
  %dp = call i32 @llvm.amdgcn.update.dpp.i32(i32 0, i32 %x0, i32 177, i32 15, i32 15, i1 false)""" + \
        _stores(["%bp", "%rl", "%dp"])


def _lanes_model(arch, words):
    x = words[0]
    lane = np.arange(LANES)
    return np.stack([x[63 - lane], np.full(LANES, x[13]), x[lane ^ 1]]).astype(np.uint32)


def _atomics_body(arch):
    return _loads(1) + """
  %bin = and i32 %tid, 7
  %slot = getelementptr i32, ptr addrspace(3) @bins, i32 %bin
  %first = icmp ult i32 %tid, 8
  br i1 %first, label %init, label %go
init:
  store i32 0, ptr addrspace(3) %slot
  br label %go
go:
  fence syncscope("workgroup") release
  call void @llvm.amdgcn.s.barrier()
  fence syncscope("workgroup") acquire
  %old = atomicrmw add ptr addrspace(3) %slot, i32 %x0 syncscope("workgroup") monotonic
  fence syncscope("workgroup") release
  call void @llvm.amdgcn.s.barrier()
  fence syncscope("workgroup") acquire
  %sum = load i32, ptr addrspace(3) %slot""" + _stores(["%sum"])


def _atomics_model(arch, words):
    bins = np.array([int(words[0][b::8].astype(np.uint64).sum()) & 0xFFFFFFFF for b in range(8)], np.uint32)
    return bins[np.arange(LANES) % 8][None, :]


def _fdiv_body(arch):
    return _loads(2) + """
  %n = bitcast i32 %x0 to float
  %d = bitcast i32 %x1 to float
  %q = fdiv float %n, %d
  %qi = bitcast float %q to i32""" + _stores(["%qi"])


def _fdiv_inputs(arch):
    g = np.random.default_rng(5)
    n = (g.uniform(1, 2, (2, LANES)) * np.exp2(g.integers(-60, 60, (2, LANES)))).astype(np.float32)
    n[0, :4], n[1, :4] = [1.0, 0.0, np.inf, 3.0], [3.0, 5.0, 2.0, 0.0]
    return n.view(np.uint32)


def _fdiv_model(arch, words):
    with np.errstate(all="ignore"):
        return (words[0].view(np.float32) / words[1].view(np.float32)).view(np.uint32)[None, :]


def _math_body(arch):
    return _loads(1) + """
  %x = bitcast i32 %x0 to float
  %e = call float @llvm.amdgcn.exp2.f32(float %x)
  %r = call float @llvm.amdgcn.rcp.f32(float %x)
  %ei = bitcast float %e to i32
  %ri = bitcast float %r to i32""" + _stores(["%ei", "%ri"])


def _math_inputs(arch):
    g = np.random.default_rng(6)
    return g.uniform(-20, 20, (1, LANES)).astype(np.float32).view(np.uint32)


def _math_model(arch, words):
    x = words[0].view(np.float32).astype(np.float64)
    return np.stack([np.exp2(x).astype(np.float32), (1 / x).astype(np.float32)]).view(np.uint32)


def _mfma_body(arch):
    """One 16x16 tile: bf16 16x16x16 over 4 k-blocks, fp8 16x16x32 (the arch's
    format) over 2 (SPEC §5 lane layout), both exact on small integers."""
    return _loads(6) + """
  %a0 = insertelement <2 x i32> poison, i32 %x0, i32 0
  %a = insertelement <2 x i32> %a0, i32 %x1, i32 1
  %b0 = insertelement <2 x i32> poison, i32 %x2, i32 0
  %b = insertelement <2 x i32> %b0, i32 %x3, i32 1
  %av = bitcast <2 x i32> %a to <4 x i16>
  %bv = bitcast <2 x i32> %b to <4 x i16>
  %c = call <4 x float> @llvm.amdgcn.mfma.f32.16x16x16bf16.1k(<4 x i16> %av, <4 x i16> %bv, <4 x float> zeroinitializer, i32 0, i32 0, i32 0)
  %f0 = zext i32 %x4 to i64
  %f1 = zext i32 %x5 to i64
  %fa = shl i64 %f1, 32
  %fw = or i64 %fa, %f0
  %g = call <4 x float> @llvm.amdgcn.mfma.f32.16x16x32.fp8.fp8(i64 %fw, i64 %fw, <4 x float> %c, i32 0, i32 0, i32 0)""" + \
        "".join(f"""
  %r{i} = extractelement <4 x float> %g, i32 {i}
  %ri{i} = bitcast float %r{i} to i32""" for i in range(4)) + _stores([f"%ri{i}" for i in range(4)])


def _mfma_values(arch):
    g = np.random.default_rng(7)
    return (g.integers(-4, 5, (16, 16)).astype(np.float32), g.integers(-4, 5, (16, 16)).astype(np.float32),
            g.integers(-3, 4, (16, 32)).astype(np.float32))


def _mfma_inputs(arch):
    a, b, f = _mfma_values(arch)
    lane = np.arange(LANES)
    words = np.zeros((6, LANES), np.uint32)
    for matrix, first in ((a, 0), (b.T, 2)):  # lane l: row/column l % 16, k = 4 (l // 16) + t
        codes = matrix.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)
        k = codes[lane % 16][np.arange(LANES)[:, None], (4 * (lane // 16))[:, None] + np.arange(4)]
        words[first] = k[:, 0] | (k[:, 1] << 16)
        words[first + 1] = k[:, 2] | (k[:, 3] << 16)
    codes = f.astype(FP8[arch]).view(np.uint8)  # A = B^T = f: lane l holds row l % 16, k = 8 (l // 16) + t
    k = codes[lane % 16][np.arange(LANES)[:, None], (8 * (lane // 16))[:, None] + np.arange(8)]
    packed = k.astype(np.uint64) << (8 * np.arange(8, dtype=np.uint64))
    total = np.bitwise_or.reduce(packed, axis=1)
    words[4], words[5] = (total & 0xFFFFFFFF).astype(np.uint32), (total >> 32).astype(np.uint32)
    return words


def _mfma_model(arch, words):
    a, b, f = _mfma_values(arch)
    d = a.astype(np.float64) @ b + f.astype(np.float64) @ f.T
    lane = np.arange(LANES)
    return np.stack([d[4 * (lane // 16) + r, lane % 16] for r in range(4)]).astype(np.float32).view(np.uint32)


UNITS = (
    Unit("integer", _integer_body, lambda arch: _words(1, 2), 8, _integer_model),
    Unit("bf16 rounding", _bf16_body, lambda arch: _floats(2, 1), 1, _bf16_model, nan_any=True),
    Unit("fp8 decode", _fp8_body, _fp8_inputs, 4, _fp8_model, nan_any=True,
         declare="declare float @llvm.amdgcn.cvt.f32.fp8(i32, i32)"),
    Unit("cross-lane", _lanes_body, lambda arch: _words(3, 1), 3, _lanes_model, declare="""
declare i32 @llvm.amdgcn.ds.bpermute(i32, i32)
declare i32 @llvm.amdgcn.readlane.i32(i32, i32)
declare i32 @llvm.amdgcn.update.dpp.i32(i32, i32, i32, i32, i32, i1)"""),
    Unit("LDS atomics", _atomics_body, lambda arch: _words(4, 1), 1, _atomics_model, declare="""
@bins = internal addrspace(3) global [8 x i32] undef
declare void @llvm.amdgcn.s.barrier()"""),
    Unit("fdiv", _fdiv_body, _fdiv_inputs, 1, _fdiv_model, nan_any=True),
    Unit("MFMA bf16 + fp8", _mfma_body, _mfma_inputs, 4, _mfma_model, declare="""
declare <4 x float> @llvm.amdgcn.mfma.f32.16x16x16bf16.1k(<4 x i16>, <4 x i16>, <4 x float>, i32, i32, i32)
declare <4 x float> @llvm.amdgcn.mfma.f32.16x16x32.fp8.fp8(i64, i64, <4 x float>, i32, i32, i32)"""),
    Unit("exp2, rcp", _math_body, _math_inputs, 2, _math_model, ulps=1, declare="""
declare float @llvm.amdgcn.exp2.f32(float)
declare float @llvm.amdgcn.rcp.f32(float)"""),
)


# --- seams ------------------------------------------------------------------------------------

def to_device(tensor: torch.Tensor, device) -> torch.Tensor:
    return tensor.to(device)


@functools.cache
def unit_kernel(unit_name: str, arch: str) -> SimpleNamespace:
    """The unit kernel compiled: asm (for the emulator) and hsaco (for the GPU)."""
    from k2back.codegen import llvm
    from k2back.codegen.linker import linker
    from k2back.emu.testing import metadata

    unit = next(u for u in UNITS if u.name == unit_name)
    ir = llvm.optimize(module(arch, unit), arch)
    asm = llvm.emit_assembly(ir, arch)
    hsaco = linker().link(llvm.emit_object(ir, arch))
    return SimpleNamespace(name="unit", arch=arch, asm=asm, hsaco=hsaco, metadata=metadata(asm, "unit"))


def k2_kernel(config: tuple, arch: str):
    from k2back.testing import build

    return build(*config, arch)


# --- running ----------------------------------------------------------------------------------

def run_unit_emulator(unit: Unit, arch: str, words: np.ndarray) -> np.ndarray:
    from k2back.emu import Machine
    from k2back.runtime.kernargs import LaunchDims, pack_kernargs

    kernel = unit_kernel(unit.name, arch)
    machine = Machine(arch)
    out = np.zeros((unit.outputs, LANES), np.uint32)
    args = {"in": machine.map(words.copy(), "in"), "out": machine.map(out, "out")}
    dims = LaunchDims((1, 1, 1), (LANES, 1, 1))
    machine.launch(kernel.asm, kernel.name, grid=(1, 1, 1), block=(LANES, 1, 1),
                   kernargs=pack_kernargs(kernel.metadata, args, dims))
    return out


class Gpu:
    """The GPU half: unit kernels through hip-python's module API, the K2 kernel
    through the HIP backend."""

    def __init__(self, device):
        from k2back.runtime import hip

        self.device, self.hip = device, hip

    def run_unit(self, unit: Unit, arch: str, words: np.ndarray) -> np.ndarray:
        import ctypes

        from k2back.runtime.kernargs import LaunchDims, pack_kernargs

        hip, bindings = self.hip, self.hip.bindings()
        kernel = unit_kernel(unit.name, arch)
        source = to_device(torch.from_numpy(words.copy()), self.device)
        out = to_device(torch.zeros((unit.outputs, LANES), dtype=torch.int32), self.device)
        dims = LaunchDims((1, 1, 1), (LANES, 1, 1))
        segment = pack_kernargs(kernel.metadata, {"in": source.data_ptr(), "out": out.data_ptr()}, dims)
        with torch.cuda.device(self.device):
            module = hip.hip_check("hipModuleLoadData", bindings.hipModuleLoadData(kernel.hsaco))
            function = hip.hip_check("hipModuleGetFunction", bindings.hipModuleGetFunction(module, b"unit"))
            buffer = ctypes.create_string_buffer(segment, len(segment))
            size = ctypes.c_size_t(len(segment))
            extra = (ctypes.c_void_p * 5)(bindings.HIP_LAUNCH_PARAM_BUFFER_POINTER, ctypes.addressof(buffer),
                                          bindings.HIP_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(size),
                                          bindings.HIP_LAUNCH_PARAM_END)
            stream = torch.cuda.current_stream(self.device).cuda_stream
            hip.hip_check("hipModuleLaunchKernel", bindings.hipModuleLaunchKernel(
                function, 1, 1, 1, LANES, 1, 1, 0, stream, None, ctypes.addressof(extra)))
            torch.cuda.synchronize(self.device)
        return out.cpu().numpy().view(np.uint32)

    def run_k2(self, spec, kernel, inputs: dict):
        from k2back.runtime import launch
        from k2back.runtime.hip import HipBackend

        scratch = to_device(launch.new_scratch(spec, "cpu"), self.device)
        tensors = {k: to_device(v, self.device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        out = to_device(torch.full((spec.tokens, spec.hidden), float("nan"), dtype=torch.bfloat16), self.device)
        HipBackend().run(kernel, spec, {**tensors, "out": out}, scratch, qk_scale=inputs["qk_scale"])
        torch.cuda.synchronize(self.device)
        return out.cpu(), scratch.cpu()


def gpu_or_reason() -> tuple[Gpu | None, str, str | None]:
    """(the GPU half, its arch) or (None, why not, None)."""
    from k2back.codegen.llvm import ARCHS, parse_arch
    from k2back.runtime import hip

    status = hip.runtime_status()
    if status is not None:
        return None, status, None
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return None, "ROCm is installed but torch sees no GPU", None
    device = torch.device("cuda", torch.cuda.current_device())
    arch = parse_arch(hip.device_arch(device)).arch
    if arch not in ARCHS:
        return None, f"the GPU is {arch}; the emulator models {', '.join(ARCHS)}", None
    return Gpu(device), f"GPU {torch.cuda.get_device_name(device)} ({arch})", arch


def ulp_distance(got: np.ndarray, want: np.ndarray, nan_any: bool) -> np.ndarray:
    """Per-word distance in f32 ulps (for integer results: 0 or 'far')."""
    g, w = got.view(np.int32).astype(np.int64), want.view(np.int32).astype(np.int64)
    ordered = lambda x: np.where(x < 0, -(x & 0x7FFFFFFF), x)  # monotone in the float
    distance = np.abs(ordered(g) - ordered(w))
    if nan_any:
        both_nan = np.isnan(got.view(np.float32)) & np.isnan(want.view(np.float32))
        distance = np.where(both_nan, 0, distance)
    return distance


def selftest(archs: tuple[str, ...] | None = None, gpu=None, reason: str = "", print=print) -> int:
    """Run the report; returns the exit status. `gpu`: a Gpu (or stand-in) whose
    arch is archs[0], or None for the emulator half only."""
    from k2back.codegen.llvm import ARCHS
    from k2back.reference import attention_back
    from k2back.runtime import launch
    from k2back.runtime.emu import EmuBackend
    from k2back.testing import launch_results, make_inputs, margin, measure, run_kernel

    archs = archs or ARCHS
    print(f"k2back selftest: {reason}" + ("" if gpu else "; running the emulator half only"))
    failures = 0
    rows = []
    for arch in archs:
        for unit in UNITS:
            words = unit.inputs(arch)
            emulated = run_unit_emulator(unit, arch, words)
            want = unit.model(arch, words).astype(np.uint32)
            worst = int(ulp_distance(emulated, want, unit.nan_any).max())
            verdicts = [f"model {'ok' if worst <= unit.ulps else f'OFF by {worst} ulp'}"]
            bad = worst > unit.ulps
            if gpu is not None:
                on_gpu = gpu.run_unit(unit, arch, words)
                apart = int(ulp_distance(on_gpu, emulated, unit.nan_any).max())
                verdicts.append(f"GPU {'ok' if apart <= unit.ulps else f'DIFFERS by {apart} ulp'}")
                bad |= apart > unit.ulps
            failures += bad
            limit = "bit for bit" if unit.ulps == 0 else f"within {unit.ulps} ulp"
            rows.append((arch, f"unit: {unit.name}", limit, ", ".join(verdicts)))
        for config in K2_CONFIGS:
            spec, kernel = k2_kernel(config, arch)
            inputs = make_inputs(*config, seed=config[2] + 10 * config[1], arch=arch)
            want = attention_back(**inputs, chunk_keys=spec.attention.chunk_keys, intermediates=True)
            scratch = launch.new_scratch(spec, "cpu")
            out, _ = run_kernel(spec, kernel, inputs, scratch, EmuBackend())
            results = {"emulator": launch_results(spec, scratch, out, want)}
            if gpu is not None:
                gpu_out, gpu_scratch = gpu.run_k2(spec, kernel, inputs)
                results["GPU"] = launch_results(spec, gpu_scratch, gpu_out, want)
            verdicts, bad = [], False
            for side, pairs in results.items():
                shares = {name: margin(name, measure(name, *pair))[0] for name, pair in pairs.items()}
                worst_name = max(shares, key=shares.get)
                ok = all(share <= 1 for share in shares.values())
                bad |= not ok
                verdicts.append(f"{side} {'ok' if ok else 'OUT OF TOLERANCE'} "
                                f"(worst {worst_name} at {shares[worst_name]:.2f} of its tolerance)")
            if gpu is not None:
                apart = {name: margin(name, measure(name, results["GPU"][name][0],
                                                    results["emulator"][name][0]))[0]
                         for name in results["GPU"]}
                verdicts.append("GPU vs emulator: " + ", ".join(f"{k} {v:.2f}" for k, v in apart.items()))
            failures += bad
            rows.append((arch, "K2 " + " ".join(map(str, config)), "tolerance", "; ".join(verdicts)))
        if gpu is not None:
            break  # the GPU is one arch: the others have no hardware to compare with
    from k2back.cli import table

    print(table(rows, ("arch", "check", "agreement", "result")))
    print(f"{len(rows) - failures} of {len(rows)} checks passed")
    return 1 if failures else 0
