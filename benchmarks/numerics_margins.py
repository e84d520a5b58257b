"""The K2 kernel's tiny configurations under every numerics combination of the
emulator (`Machine(mfma_accumulate=..., transcendental_error_seed=...,
fnuz_negative_zero=...)`): how much of its calibrated tolerance each
combination's worst result used (1.0 = the edge; `k2back.testing.margin`).

Configurations: the kernel suite's fast set (both archs x TP 1/2/4/8 x ratio 0/2
x S 1/3/16, the same seeds). Combinations: MFMA accumulation exact / sequential /
blocked x transcendentals exact / one ulp off (seed 1) x, on gfx942 only, FNUZ
negative zero 0x00 / 0x80 (gfx950 encodes OCP: the option does not apply).
Run: .venv/bin/python benchmarks/numerics_margins.py [--jobs N] [--json PATH.jsonl]
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import time
from pathlib import Path

from k2back.emu.accumulate import MODES

ARCHS = ("gfx942", "gfx950")
CONFIGS = [(arch, tp, ratio, tokens) for arch in ARCHS for tp in (1, 2, 4, 8)
           for ratio in (0, 2) for tokens in (1, 3, 16)]


def combinations(arch: str):
    fnuz = (0x00, 0x80) if arch == "gfx942" else (0x00,)
    for accumulate, seed, negative_zero in itertools.product(MODES, (None, 1), fnuz):
        yield {"mfma_accumulate": accumulate, "transcendental_error_seed": seed,
               "fnuz_negative_zero": negative_zero}


def label(options: dict) -> str:
    seed = options["transcendental_error_seed"]
    return (f"{options['mfma_accumulate']}, transcendentals {'exact' if seed is None else '1 ulp off'}, "
            f"FNUZ -0 -> {options['fnuz_negative_zero']:#04x}")


def one_launch(job):
    """Margins of (xo, x8b, out) of one configuration under one combination."""

    (arch, tp, ratio, tokens), options = job
    try:
        return _one_launch(job, arch, tp, ratio, tokens, options)
    except Exception as error:  # noqa: BLE001 -- a launch that fails is a row, not the end of the run
        return job, {"error": f"{type(error).__name__}: {str(error).splitlines()[0]}"}, 0.0


def _one_launch(job, arch, tp, ratio, tokens, options):
    from k2back.reference import attention_back
    from k2back.runtime import launch
    from k2back.runtime.emu import EmuBackend
    from k2back.testing import (
        build,
        launch_results,
        make_inputs,
        margin,
        measure,
        run_kernel,
        single_thread,
    )

    with single_thread():
        spec, kernel = build("tiny", tp, tokens, ratio, arch)
        inputs = make_inputs("tiny", tp, tokens, ratio, seed=tokens + 10 * tp, arch=arch)
        want = attention_back(**inputs, chunk_keys=spec.attention.chunk_keys, intermediates=True)
        scratch = launch.new_scratch(spec, "cpu")
        start = time.perf_counter()
        out, _ = run_kernel(spec, kernel, inputs, scratch, EmuBackend(**options))
        seconds = time.perf_counter() - start
        margins = {}
        for name, (got, expected) in launch_results(spec, scratch, out, want).items():
            metrics = measure(name, got, expected)
            margins[name] = (*margin(name, metrics), metrics.get("nonfinite", 0.0))
    return job, margins, seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", help="JSON lines of every launch's margins, appended as they come "
                                           "(a rerun skips the launches already there)")
    args = parser.parse_args()
    jobs = [(config, options) for config in CONFIGS for options in combinations(config[0])]
    results = []
    if args.json and Path(args.json).exists():
        for line in Path(args.json).read_text().splitlines():
            r = json.loads(line)
            results.append(((tuple(r["config"]), r["options"]), r["margins"], r["seconds"]))
    done = {json.dumps([list(c), o], sort_keys=True) for (c, o), _, _ in results}
    todo = [j for j in jobs if json.dumps([list(j[0]), j[1]], sort_keys=True) not in done]
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for (config, options), margins, seconds in pool.imap_unordered(one_launch, todo, chunksize=1):
            results.append(((config, options), margins, seconds))
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps({"config": config, "options": options, "margins": margins,
                                        "seconds": seconds}) + "\n")
    rows = {}
    for (config, options), margins, seconds in results:
        key = (config[0], label(options))
        if "error" in margins:
            margins = {"launch": (float("inf"), margins["error"], 0.0)}
        worst = max(((share, f"{name} {metric}", config) for name, (share, metric, _) in margins.items()))
        failed = any(share > 1 or nonfinite > 0 for share, _, nonfinite in margins.values())
        row = rows.setdefault(key, {"launches": 0, "failed": 0, "worst": (0.0, "", None), "seconds": 0.0})
        row["launches"] += 1
        row["failed"] += failed
        row["worst"] = max(row["worst"], worst, key=lambda w: w[0])
        row["seconds"] += seconds
    print(f"{'arch':<7} {'combination':<60} {'launches':>8} {'failed':>6} {'worst margin':>12}  where")
    for (arch, name), row in sorted(rows.items()):
        share, where, config = row["worst"]
        print(f"{arch:<7} {name:<60} {row['launches']:>8} {row['failed']:>6} {share:>12.3f}  "
              f"{where} (TP {config[1]}, ratio {config[2]}, S {config[3]})")


if __name__ == "__main__":
    main()
