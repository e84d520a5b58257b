"""The K2 kernel under the emulator's numerics options (issue 9 §3): MFMA
accumulation exact / sequential fp32 / CDNA3-blocked, transcendentals exact or
one ulp off, FNUZ negative underflow to 0x00 or 0x80 (gfx942), each
combination on tiny configurations of the fast suite, against the reference of
record within the calibrated tolerances (k2back.testing.compare): the kernel
must be right whichever the hardware does. Each combination gets one
configuration, spread so the combinations see different ones; the whole grid
(every fast configuration under every combination, with each one's worst
margin) is benchmarks/numerics_margins.py."""

from __future__ import annotations

import itertools

import pytest

from k2back.emu.accumulate import MODES
from k2back.reference import attention_back
from k2back.runtime import launch
from k2back.runtime.emu import EmuBackend
from k2back.testing import build, check, make_inputs, run_kernel

pytestmark = pytest.mark.kernel  # every test here builds or runs the K2 kernel

CONFIGS = [(tp, ratio, tokens) for tp in (1, 2, 4, 8) for ratio in (0, 2) for tokens in (1, 3, 16)]


def combinations():
    for arch in ("gfx942", "gfx950"):
        fnuz = (0x00, 0x80) if arch == "gfx942" else (0x00,)
        for accumulate, seed, negative_zero in itertools.product(MODES, (None, 1), fnuz):
            yield arch, {"mfma_accumulate": accumulate, "transcendental_error_seed": seed,
                         "fnuz_negative_zero": negative_zero}


CASES = [(arch, options, CONFIGS[7 * i % len(CONFIGS)]) for i, (arch, options) in enumerate(combinations())]


def case_id(case) -> str:
    arch, options, (tp, ratio, tokens) = case
    seed = options["transcendental_error_seed"]
    return (f"{arch}-{options['mfma_accumulate']}-{'ulp' if seed is not None else 'exact'}-"
            f"{options['fnuz_negative_zero']:#04x}-tp{tp}-r{ratio}-s{tokens}")


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_kernel_matches_reference_under_numerics_options(case):
    arch, options, (tp, ratio, tokens) = case
    spec, kernel = build("tiny", tp, tokens, ratio, arch)
    inputs = make_inputs("tiny", tp, tokens, ratio, seed=tokens + 10 * tp, arch=arch)
    want = attention_back(**inputs, chunk_keys=spec.attention.chunk_keys, intermediates=True)
    scratch = launch.new_scratch(spec, "cpu")
    out, _ = run_kernel(spec, kernel, inputs, scratch, EmuBackend(**options))
    check(spec, scratch, out, want)
