"""`k2back` (and `python -m k2back`): warm the cache, inspect, verify, diagnose.

Every command takes the same configuration flags; `warmup` builds every
combination of their lists, the others take exactly one configuration.

This module imports no torch (~2 s), and neither do the configuration
(k2back.config, k2back.kv_format), the planner or the build (k2back.codegen.build):
a command that has no use for it (`cache`, `plan`, `dump`, `warmup`, `--version`,
`--help`) starts at once.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import multiprocessing
import os
import sys
import traceback
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from pathlib import Path

from k2back import knobs, model
from k2back.codegen.targets import ARCHS
from k2back.config import RATIOS, Config
from k2back.kv_format import FP8_CHOICES

log = logging.getLogger("k2back")

LOG_LEVELS = ("ERROR", "WARNING", "INFO", "DEBUG")


def int_list(text: str) -> list[int]:
    """`5`, `1-48`, `1,2,4` or a mix (`1-4,8`)."""
    values = []
    for part in text.split(","):
        low, dash, high = part.partition("-")
        try:
            span = range(int(low), int(high if dash else low) + 1)
        except ValueError:
            span = range(0)
        if not span:
            raise argparse.ArgumentTypeError(
                f"expected an integer, a range like 1-48 or a comma list, got {text!r}")
        values += span
    return values


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def name_list(text: str) -> list[str]:
    return [part for part in text.split(",") if part]


def choice_list(choices: tuple[str, ...]):
    """The parser of a comma list of `choices`."""
    def parse(text: str) -> list[str]:
        names = name_list(text)
        if not names or any(n not in choices for n in names):
            raise argparse.ArgumentTypeError(f"expected {', '.join(choices)} or a comma list, "
                                             f"got {text!r}")
        return names
    return parse


fp8_list = choice_list(FP8_CHOICES)


# Config field -> (parser of its flag's text, default, help); the flag is --field-name
CONFIG_FLAGS = {
    "geometry": (name_list, model.DEFAULT_GEOMETRY, f"one of {sorted(model.GEOMETRIES)}"),
    "arch": (name_list, None, "gfx942, gfx950 (with optional target-ID features)"),
    "tp": (int_list, None, f"tensor-parallel degree, of {model.TP_DEGREES}"),
    "ratio": (int_list, None, f"KV compression ratio, of {RATIOS} (0: a window-only layer)"),
    "tokens": (int_list, None, "tokens S of a launch: 5, 1-48 or 1,2,4"),
    "swa_fp8": (fp8_list, "auto", ("byte format of swa_cache: e4m3fn (OCP), e4m3fnuz, or auto "
                                   "(what vLLM writes on the arch: FNUZ on gfx942)")),
    "comp_fp8": (fp8_list, "auto", "byte format of comp_cache, as --swa-fp8 (auto: OCP)"),
}


def flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def add_config_flags(parser: argparse.ArgumentParser, lists: bool) -> None:
    group = parser.add_argument_group(
        "configuration" + (" (comma lists and ranges allowed)" if lists else " (one value each)"))
    for field, (parse, default, doc) in CONFIG_FLAGS.items():
        group.add_argument(flag(field), dest=field, type=parse, required=default is None,
                           default=None if default is None else parse(default), help=doc)


def configs(parser: argparse.ArgumentParser, args) -> list[Config]:
    """Every combination of the flags' lists, each checked as a Config and
    planned (a fraction of a millisecond; it refuses what the target cannot
    hold): a bad value ends the command before anything is built, as argparse
    does (usage, the error, exit 2)."""
    from k2back.codegen.plan import plan

    lists = {field: getattr(args, field) for field in CONFIG_FLAGS}
    todo = []
    for values in itertools.product(*lists.values()):
        try:
            config = Config(**dict(zip(lists, values)))
            plan(config)
        except ValueError as e:
            refuse(parser, args, e)
        todo.append(config)
    return todo


def one_config(parser: argparse.ArgumentParser, args) -> Config:
    for field in CONFIG_FLAGS:
        if len(getattr(args, field)) != 1:
            parser.error(f"{flag(field)}: `{args.command}` takes one configuration, "
                         f"got {getattr(args, field)}")
    return configs(parser, args)[0]


def refuse(parser: argparse.ArgumentParser, args, error: Exception):
    """Exit 2 with `error` as argparse reports a bad value; its traceback with -v."""
    if args.verbose:
        traceback.print_exception(error, file=sys.stderr)
    parser.error(str(error))


def table(rows: list[tuple], header: tuple) -> str:
    """Left-aligned text columns."""
    cells = [tuple(map(str, r)) for r in (header, *rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ---- warmup -------------------------------------------------------------------------------


def build(config: Config) -> tuple[Config, str, str]:
    """(config, built | cached | failed, detail), in a builder thread or process."""
    from k2back.codegen.build import build as build_kernel

    try:
        _, kernel = build_kernel(config)
    except Exception as e:  # noqa: BLE001 -- a failed build is a row of the report, not the end
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return config, "failed", f"{type(e).__name__}: {first_line}"
    return config, "cached" if kernel.cache_hit else "built", kernel.name


def builders(jobs: int, verbosity: int):
    """Where warmup builds: in this process for one job (no interpreter to
    start), else in `jobs` fresh ones (spawned: nothing of this process is forked;
    they import no torch)."""
    if jobs == 1:
        return ThreadPoolExecutor(max_workers=1)
    return ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=configure_logging, initargs=(verbosity,))


def cmd_warmup(parser, args) -> int:
    from tqdm import tqdm

    todo = configs(parser, args)
    with builders(min(args.jobs, len(todo)), args.verbose) as pool:
        futures = [pool.submit(build, c) for c in todo]
        for _ in tqdm(as_completed(futures), total=len(todo), desc="k2back warmup",
                      unit="kernel", disable=args.quiet):
            pass
    results = [f.result() for f in futures]
    print(table([(str(c), status, detail) for c, status, detail in results],
                ("configuration", "status", "kernel / reason")))
    counts = {s: sum(r[1] == s for r in results) for s in ("built", "cached", "failed")}
    print(", ".join(f"{n} {s}" for s, n in counts.items()), f"of {len(results)}")
    return 1 if counts["failed"] else 0


# ---- plan / dump --------------------------------------------------------------------------


def cmd_plan(parser, args) -> int:
    config = one_config(parser, args)
    from k2back.codegen.plan import plan

    print(plan(config).describe())
    return 0


def dump_sections(spec, kernel) -> dict[str, str]:
    """File name -> text: what `dump` writes (IR as .ll, asm as .s)."""
    from k2back.codegen.metadata import resource_report

    return {
        "spec.json": spec.to_json(),
        "plan.txt": spec.describe(),
        "ll": kernel.ir,
        "opt.ll": kernel.opt_ir,
        "s": kernel.asm,
        "resources.txt": resource_report(kernel.metadata),
    }


def cmd_dump(parser, args) -> int:
    config = one_config(parser, args)
    from k2back.codegen.build import build

    spec, kernel = build(config, timeline=args.timeline)
    sections = dump_sections(spec, kernel)
    if args.out is None:
        for name, text in sections.items():
            print(f"; ===== {spec.name}.{name} =====\n{text.rstrip()}\n")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in sections.items():
        (args.out / f"{spec.name}.{name}").write_text(text)
    print(f"wrote {len(sections)} files for {spec.name} to {args.out}")
    return 0


# ---- verify -------------------------------------------------------------------------------

def stats_report(stats) -> str:
    """The emulator's counters: instructions by class, global bytes per buffer, LDS, sync."""
    classes = sorted(stats.instructions.items(), key=lambda kv: -kv[1])
    buffers = sorted(set(stats.bytes_read) | set(stats.bytes_written), key=str)
    return "\n".join([
        (f"emulator: {stats.wave_instructions} wave-instructions, {stats.workgroups} workgroups, "
         f"{stats.waves} waves; LDS {stats.lds_read} B read, {stats.lds_written} B written; "
         f"{stats.barriers} barriers, {stats.total_polls} polls"),
        table(classes, ("class", "wave-instructions")),
        table([(b, stats.bytes_read.get(b, 0), stats.bytes_written.get(b, 0)) for b in buffers],
              ("buffer", "bytes read", "bytes written")),
    ])


def cmd_verify(parser, args) -> int:
    """The configuration's kernel in the emulator on make_inputs(seed) against
    the reference of record (testing.verify); exit 1 on any metric outside
    its tolerance."""
    config = one_config(parser, args)
    from k2back.codegen.metadata import resource_report
    from k2back.testing import CHECKED, reference_of, verify

    def perturbed(spec, inputs):  # a reference that differs from any correct kernel
        want = reference_of(spec, inputs)
        return {**want, "out": want["out"] * 1.25}

    result = verify(config, seed=args.seed, reference=perturbed if args.perturb else reference_of)
    print(f"{config}: {result.spec.name}, seed {args.seed}")
    for name in CHECKED:
        if name in result.failures:
            print(f"  {name}: MISMATCH {result.failures[name]}")
        else:
            print(f"  {name}: ok " + ", ".join(
                f"{k} {v}" if isinstance(v, int) else f"{k} {v:.3g}"
                for k, v in result.metrics[name].items()))
    print(stats_report(result.stats))
    print(resource_report(result.kernel.metadata))
    return 1 if result.failures else 0


def cmd_profile(parser, args) -> int:
    """The launch's time against the HBM roofline and the latency floor, per stage
    (k2back.profile): in the emulator's timing model, from its stage spans or
    (--stamps) from the timeline build's stamps; on a GPU (--backend hip) from the
    stamps. --out writes profile.json, trace.json and timeline.png."""
    config = one_config(parser, args)
    from k2back import profile
    from k2back.runtime.hip import BackendUnavailable

    try:
        result, ctas = profile.profile(config, seed=args.seed, backend=args.backend,
                                       stamps=args.stamps or args.backend == "hip")
    except BackendUnavailable as e:
        parser.error(f"--backend hip: {e}")
    print(profile.report(result))
    for path in profile.write(result, ctas, args.out) if args.out else ():
        print(f"wrote {path}")
    return 0


# ---- doctor / cache -----------------------------------------------------------------------


def cmd_doctor(parser, args) -> int:
    from k2back.doctor import checks

    rows = checks()
    print(table([(c.name, c.status, c.detail) for c in rows], ("check", "status", "detail")))
    return 1 if any(c.status == "FAIL" for c in rows) else 0


def cmd_cache(parser, args) -> int:
    from k2back.runtime import cache

    if args.action == "ls":
        print(table([(e.key[:16], e.name, e.size_bytes) for e in cache.entries()],
                    ("key", "kernel", "bytes")))
    elif args.action == "size":
        print(f"{cache.size_bytes()} bytes in {knobs.cache_dir()}")
    else:
        print(f"removed {cache.clear()} entries from {knobs.cache_dir()}")
    return 0


# ---- selftest -----------------------------------------------------------------------------


def cmd_selftest(parser, args) -> int:
    """Unit kernels and the K2 kernel on the GPU and in the emulator (k2back.selftest)."""
    from k2back import selftest

    if args.emulator_only:
        gpu, reason, arch = None, "--emulator-only", None
    else:
        gpu, reason, arch = selftest.gpu_or_reason()
    archs = (arch,) if gpu is not None else tuple(args.arch or ARCHS)
    return selftest.selftest(archs, gpu, reason)


# ---- the parser ---------------------------------------------------------------------------


COMMANDS = {
    # name: (handler, help, configuration: lists / one value each / none)
    "warmup": (cmd_warmup, "build every combination of the given lists into the cache", True),
    "dump": (cmd_dump, "spec, plan, LLVM IR (rendered, optimized), asm, resources", False),
    "plan": (cmd_plan, "the plan: stages, tasks, CTA offsets, LDS, scratch", False),
    "verify": (cmd_verify, "run in the emulator against the reference of record", False),
    "profile": (cmd_profile, "modeled time vs HBM roofline and latency floor, per stage", False),
    "doctor": (cmd_doctor, "toolchain, ROCm runtime, GPUs, cache", None),
    "cache": (cmd_cache, "list, size or clear the kernel cache", None),
    "selftest": (cmd_selftest, "unit and K2 kernels on the GPU and in the emulator, compared", None),
}


def parser() -> argparse.ArgumentParser:
    from k2back import __version__

    top = argparse.ArgumentParser(prog="k2back", description=__doc__.splitlines()[0])
    top.add_argument("--version", action="version", version=f"k2back {__version__}")
    top.add_argument("-v", "--verbose", action="count", default=0,
                     help="more log output (repeat for more); base level from K2BACK_LOG_LEVEL")
    sub = top.add_subparsers(dest="command", required=True)
    for name, (handler, doc, lists) in COMMANDS.items():
        p = sub.add_parser(name, help=doc, description=doc)
        p.set_defaults(handler=handler, subparser=p)
        if lists is not None:
            add_config_flags(p, lists)
    sub.choices["warmup"].add_argument("--jobs", type=positive_int, default=os.cpu_count() or 1,
                                       help="parallel build processes (default: the cores)")
    sub.choices["warmup"].add_argument("-q", "--quiet", action="store_true",
                                       help="no progress bar")
    sub.choices["dump"].add_argument("--out", type=Path,
                                     help="write one file a section here instead of stdout")
    sub.choices["dump"].add_argument("--timeline", action="store_true",
                                     help="the build that stamps every task (plan(timeline=True))")
    sub.choices["verify"].add_argument("--seed", type=int, default=0, help="make_inputs seed")
    sub.choices["verify"].add_argument("--perturb", action="store_true",
                                       help=argparse.SUPPRESS)  # test-only: must then fail
    sub.choices["profile"].add_argument("--backend", choices=("emu", "hip"), default="emu",
                                        help="emu: the emulator's timing model (default); hip: a GPU launch of the timeline build")
    sub.choices["profile"].add_argument("--stamps", action="store_true",
                                        help="emu: draw from the timeline build's stamps, not the stage spans")
    sub.choices["profile"].add_argument("--out", type=Path,
                                        help="write profile.json, trace.json, timeline.png here")
    sub.choices["profile"].add_argument("--seed", type=int, default=0, help="make_inputs seed")
    sub.choices["cache"].add_argument("action", choices=("ls", "size", "clear"))
    sub.choices["selftest"].add_argument("--arch", type=choice_list(ARCHS), default=None,
                                         help="the emulator half's archs (default: all)")
    sub.choices["selftest"].add_argument("--emulator-only", action="store_true",
                                         help="skip the GPU even if there is one")
    return top


def configure_logging(verbosity: int) -> None:
    base = knobs.log_level()
    index = LOG_LEVELS.index(base) if base in LOG_LEVELS else 1
    level = LOG_LEVELS[min(index + verbosity, len(LOG_LEVELS) - 1)]
    if not log.handlers:  # once a process, however often main() runs
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
    log.setLevel(level)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    configure_logging(args.verbose)
    return args.handler(args.subparser, args)


if __name__ == "__main__":
    sys.exit(main())
