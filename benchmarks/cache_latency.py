"""Host-side latency of the launch path: what a serving process pays around
the kernel (compile times are benchmarks/compile_latency.py's).

Rows: a fresh process getting a kernel from the warm disk cache (serving
start-up), the in-process kernel lookup every call makes, argument
validation, the kernarg segment, and the whole `AttentionBack.__call__` with the
backend's launch stubbed out (the host overhead a vLLM layer call adds).

    .venv/bin/python benchmarks/cache_latency.py [--geometry v4.1-flash --tp 4 --ratio 2 --tokens 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import astuple

import torch

from k2back import ops
from k2back.api import AttentionBack
from k2back.config import Config
from k2back.runtime import launch
from k2back.testing import make_inputs
from k2back.validate import validate_launch


def median_us(fn, repeats: int) -> float:
    fn()  # first call outside the timing
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def fresh_process_us(config: Config, repeats: int) -> float:
    """A new interpreter: import k2back.ops, then the kernel from the disk cache."""
    probe = ("import time; from k2back import ops; from k2back.config import Config; "
             f"t = time.perf_counter(); ops.kernel_for(Config(*{astuple(config)!r})); "
             "print(time.perf_counter() - t)")
    runs = [float(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                 check=True).stdout) for _ in range(repeats)]
    return 1e6 * statistics.median(runs)


class StubBackend:
    """The emu backend minus the emulator: scratch allocation, no launch."""

    name = "emu"

    def new_scratch(self, spec, device):
        return launch.new_scratch(spec, device)

    def run(self, kernel, spec, tensors, scratch, qk_scale=None, **options):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--geometry", default="v4.1-flash")
    parser.add_argument("--tp", type=int, default=4)
    parser.add_argument("--ratio", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=1)
    parser.add_argument("--arch", default="gfx942")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    config = Config(args.geometry, args.tp, args.tokens, args.ratio, args.arch).resolved()

    os.environ.setdefault("K2BACK_CACHE_DIR", tempfile.mkdtemp(prefix="k2back-bench-"))
    start = time.perf_counter()
    spec, kernel = ops.kernel_for(config)
    cold = time.perf_counter() - start
    inputs = make_inputs(args.geometry, args.tp, args.tokens, args.ratio, seed=0, arch=args.arch)
    layer = AttentionBack(args.geometry, tp=args.tp, ratio=args.ratio, arch=args.arch,
                          backend="emu")
    rank = layer.rank
    out = torch.empty(args.tokens, spec.hidden, dtype=torch.bfloat16)
    tensors = {**inputs, "out": out}
    address_of = lambda tensor, _: tensor.data_ptr()  # as the hip backend addresses tensors
    stub = StubBackend()
    ops.backend_for = lambda device: stub  # the launch itself is not timed

    rows = [
        (f"build, empty cache ({'cold' if not kernel.cache_hit else 'hit'})", 1e6 * cold),
        ("fresh process: import + kernel from disk cache", fresh_process_us(config, 3)),
        ("kernel lookup, in process", median_us(lambda: ops.kernel_for(config), args.repeats)),
        ("validate_launch, shapes/dtypes/strides", median_us(
            lambda: validate_launch(rank, args.ratio, inputs, check_values=False), args.repeats)),
        ("validate_launch, + CPU value checks", median_us(
            lambda: validate_launch(rank, args.ratio, inputs, check_values=True), args.repeats)),
        ("kernarg segment (arguments + pack)", median_us(
            lambda: launch.kernargs(kernel, spec, tensors, 1 << 40, address_of), args.repeats)),
        ("AttentionBack call, launch stubbed", median_us(
            lambda: layer(**inputs, out=out), args.repeats)),
    ]
    print(f"{spec.name}: host-side latency, median of {args.repeats} (fresh process: of 3)")
    width = max(len(name) for name, _ in rows)
    for name, us in rows:
        print(f"  {name:<{width}}  {us:>12.1f} µs")


if __name__ == "__main__":
    main()
