"""Small hand-written kernels and stand-ins the codegen and runtime tests share
(a package module, so that no test module imports another and subprocesses
need no sys.path): IR samples, LLVM's own metadata reader, the K2-signature
echo kernel and tensors for it, a fake ld.lld; the rendered-IR guard's
configurations and digests (benchmarks/render_guard.py, tests/test_render.py)."""

from __future__ import annotations

import hashlib
import re
import shlex
from pathlib import Path
from types import SimpleNamespace

import torch
import yaml

from k2back.codegen import linker
from k2back.codegen.signature import KERNEL_ARGS
from k2back.codegen.signature import params as signature_params

HEADER = """target triple = "amdgcn-amd-amdhsa"
target datalayout = "e-p:64:64-p1:64:64-p2:32:32-p3:32:32-p4:64:64-p5:32:32-p6:32:32-p7:160:256:256:32-p8:128:128:128:48-p9:192:256:256:32-i64:64-v16:16-v24:32-v32:32-v48:64-v96:128-v192:256-v256:256-v512:512-v1024:1024-v2048:2048-n32:64-S32-A5-G1-ni:7:8:9"
"""
FLAGS = """!llvm.module.flags = !{!0}
!0 = !{i32 1, !"amdhsa_code_object_version", i32 500}
"""


def module(body: str, flags: str = FLAGS) -> str:
    return HEADER + body + "\n" + flags


# out[tid] = x[tid] * a for tid < n, scaled through an internal helper: O3
# inlines it, so a call left in the asm means optimization did not run.
AXPY = module("""
define internal float @scale(float %v, float %a) {
  %m = fmul float %v, %a
  ret float %m
}

define amdgpu_kernel void @axpy(ptr addrspace(1) noalias %out, i32 %n,
                                ptr addrspace(1) noalias readonly %x, i64 %big, float %a) #0 {
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %in = icmp ult i32 %tid, %n
  br i1 %in, label %body, label %done
body:
  %src = getelementptr float, ptr addrspace(1) %x, i32 %tid
  %v = load float, ptr addrspace(1) %src
  %m = call float @scale(float %v, float %a)
  %dst = getelementptr float, ptr addrspace(1) %out, i32 %tid
  store float %m, ptr addrspace(1) %dst
  br label %done
done:
  ret void
}

declare i32 @llvm.amdgcn.workitem.id.x()
attributes #0 = { "amdgpu-flat-work-group-size"="1,256" }
""")

# The gfx950 scaled MFMA does not exist on gfx942: instruction selection aborts.
SCALED_MFMA = module("""
define amdgpu_kernel void @crash(ptr addrspace(1) %out, <8 x i32> %a, <8 x i32> %b) {
  %r = call <4 x float> @llvm.amdgcn.mfma.scale.f32.16x16x128.f8f6f4.v8i32.v8i32(<8 x i32> %a, <8 x i32> %b, <4 x float> zeroinitializer, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0)
  store <4 x float> %r, ptr addrspace(1) %out
  ret void
}
declare <4 x float> @llvm.amdgcn.mfma.scale.f32.16x16x128.f8f6f4.v8i32.v8i32(<8 x i32>, <8 x i32>, <4 x float>, i32, i32, i32, i32, i32, i32)
""")

MIXED_IR = """
target triple = "amdgcn-amd-amdhsa"
define amdgpu_kernel void @mixed(ptr addrspace(1) %out, i32 %a, i64 %b, float %c,
                                 ptr addrspace(1) %p, i32 %d) #0 {
  ; out = [a, b, c's bits, p, d] as i64 words
  %wa = sext i32 %a to i64
  %cbits = bitcast float %c to i32
  %wc = zext i32 %cbits to i64
  %wp = ptrtoint ptr addrspace(1) %p to i64
  %wd = zext i32 %d to i64
  store i64 %wa, ptr addrspace(1) %out, align 8
  %o1 = getelementptr i64, ptr addrspace(1) %out, i64 1
  store i64 %b, ptr addrspace(1) %o1, align 8
  %o2 = getelementptr i64, ptr addrspace(1) %out, i64 2
  store i64 %wc, ptr addrspace(1) %o2, align 8
  %o3 = getelementptr i64, ptr addrspace(1) %out, i64 3
  store i64 %wp, ptr addrspace(1) %o3, align 8
  %o4 = getelementptr i64, ptr addrspace(1) %out, i64 4
  store i64 %wd, ptr addrspace(1) %o4, align 8
  ret void
}
attributes #0 = { "amdgpu-flat-work-group-size"="1,512" }
!llvm.module.flags = !{!0}
!0 = !{i32 1, !"amdhsa_code_object_version", i32 500}
"""


def asm_metadata(asm: str) -> SimpleNamespace:
    """The kernel's metadata as LLVM printed it (YAML), independent of k2back's reader."""
    text = asm.split(".amdgpu_metadata")[1].split("...")[0]
    kernel = yaml.safe_load(text)["amdhsa.kernels"][0]
    args = [SimpleNamespace(name=a.get(".name", ""), offset=a[".offset"], size=a[".size"],
                            value_kind=a[".value_kind"]) for a in kernel[".args"]]
    return SimpleNamespace(name=kernel[".name"], kernarg_size=kernel[".kernarg_segment_size"],
                           args=args)


def echo_ir() -> str:
    """A kernel with the K2 signature writing, as i64 word i of `out`, argument
    i if it is a scalar, or the first dword it points to if it is a pointer
    (so each address is proven to reach its tensor's data)."""
    body = []
    for i, arg in enumerate(KERNEL_ARGS):
        v = f"%{arg.name}"
        if arg.is_pointer:
            body.append(f"%d{i} = load i32, {arg.llvm_type} {v}, align 4")
            body.append(f"%w{i} = zext i32 %d{i} to i64")
        elif arg.llvm_type == "float":
            body.append(f"%b{i} = bitcast float {v} to i32")
            body.append(f"%w{i} = zext i32 %b{i} to i64")
        elif arg.llvm_type == "i32":
            body.append(f"%w{i} = zext i32 {v} to i64")
        else:
            body.append(f"%w{i} = add i64 {v}, 0")
    for i, _ in enumerate(KERNEL_ARGS):  # every load before the first store into out
        body.append(f"%p{i} = getelementptr i64, ptr addrspace(1) %out, i64 {i}")
        body.append(f"store i64 %w{i}, ptr addrspace(1) %p{i}, align 8")
    return "\n".join([
        'target triple = "amdgcn-amd-amdhsa"',
        f"define amdgpu_kernel void @k2_echo({signature_params()}) #0 {{",
        *("  " + line for line in body), "  ret void", "}",
        'attributes #0 = { "amdgpu-flat-work-group-size"="1,512" }',
        "!llvm.module.flags = !{!0}",
        '!0 = !{i32 1, !"amdhsa_code_object_version", i32 500}',
    ])


def small_tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    def rand(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dtype)
    def bytes_(*shape):
        return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    return {
        "q": rand(2, 8, 512, dtype=torch.bfloat16),
        "key_table": torch.randint(0, 1 << 30, (2, 48), generator=g, dtype=torch.int32),
        "key_len": torch.randint(1, 48, (2,), generator=g, dtype=torch.int32),
        "positions": torch.randint(0, 1 << 40, (2,), generator=g, dtype=torch.int64),
        "swa_cache": bytes_(3, 64 * 576), "swa_block": 32,
        "comp_cache": bytes_(5, 2 * 64 * 576)[:, : 64 * 576 + 512], "comp_block": 64,
        "cos_sin": rand(100, 64), "sink": rand(8),
        "wo_a": bytes_(128, 4096).view(torch.float8_e4m3fn), "wo_a_scale": bytes_(4, 128),
        "wo_b": bytes_(256, 128).view(torch.float8_e4m3fn), "wo_b_scale": bytes_(8, 4),
        "out": torch.zeros(2, 256, dtype=torch.bfloat16),
    }


def fake_lld(path, version="LLD 99.0.0 (fake)"):
    """A stand-in ld.lld that answers --version and forwards links to the real one."""
    real = " ".join(map(shlex.quote, linker._ziglang().command))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "{version}"; exit 0; }}\n'
                    f'exec {real} "$@"\n')
    path.chmod(0o755)
    return path


# --- the rendered-IR guard ---------------------------------------------------

RENDERED_IR = Path(__file__).resolve().parents[2] / "tests" / "data" / "rendered_ir.json"
# (geometry, tp, tokens, ratio) on both archs with the default key formats:
# TP 1/4/8, S 1/16/64, ratio 0/2, the real geometry and the tiny one
GUARD_SHAPES = (
    ("v4.1-flash", 1, 1, 2), ("v4.1-flash", 4, 1, 2), ("v4.1-flash", 4, 16, 0),
    ("v4.1-flash", 8, 64, 2), ("v4.1-flash", 8, 16, 2), ("v4.1-flash", 1, 64, 0),
    ("tiny", 1, 16, 2), ("tiny", 4, 1, 0), ("tiny", 4, 64, 2),
    ("tiny", 8, 1, 2), ("tiny", 8, 64, 0), ("tiny", 4, 3, 2),
)
GUARD_CONFIGS = (
    *((g, tp, s, r, arch) for arch in ("gfx942", "gfx950") for g, tp, s, r in GUARD_SHAPES),
    # the key-format branches "auto" does not take
    ("tiny", 4, 3, 2, "gfx942", "e4m3fn", "e4m3fnuz"),
    ("tiny", 4, 3, 2, "gfx950", "e4m3fnuz", "e4m3fn"),
)
_IR_COMMENT = re.compile(r"\s*;.*$")


def guard_name(config) -> str:
    g, tp, s, r, arch, *formats = config
    return f"{g}_tp{tp}_s{s}_r{r}_{arch}" + "".join(f"_{f}" for f in formats)


def guard_ir(config) -> str:
    from k2back.codegen.plan import plan
    from k2back.codegen.render import KernelSource

    return KernelSource(plan(*config)).render()


def strip_ir_comments(ir: str) -> str:
    """The IR without ';' comments and the blank lines they leave (no string
    constant of the K2 kernel holds a ';')."""
    lines = (_IR_COMMENT.sub("", line) for line in ir.splitlines())
    return "\n".join(line for line in lines if line.strip()) + "\n"


def guard_digests(code_only: bool = False) -> dict[str, str]:
    """Configuration name -> sha256 of its IR (without comments: `code_only`)."""
    out = {}
    for config in GUARD_CONFIGS:
        ir = guard_ir(config)
        ir = strip_ir_comments(ir) if code_only else ir
        out[guard_name(config)] = hashlib.sha256(ir.encode()).hexdigest()
    return out
