"""From a kernel source to a cached code object (cf. Triton's compiler/compiler.py).

A *source* has `name`, `arch` (optionally a target ID with features, e.g.
`gfx942:sramecc+:xnack-`), `key()` and `render()`; it may say `stage` (the
stage whose output its text is: "ll" or "opt.ll") and `spec_json`.

The build is a table of stages, each consuming an earlier stage's output:

    ll      rendered IR, parsed and verified
    opt.ll  new pass manager, O3
    s       assembly (from a fresh parse: LLVM consumes a module when it emits)
    o       relocatable object (another fresh parse)
    hsaco   `ld.lld -shared`

LLVM stages run in a persistent worker process: an instruction-selection
failure aborts the process that runs it (SPEC §4), which must not be ours.
"""

from __future__ import annotations

import atexit
import dataclasses
import itertools
import json
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import NamedTuple

import k2back
from k2back import knobs
from k2back.codegen import linker, llvm, metadata
from k2back.codegen.llvm import Target, parse_arch
from k2back.codegen.metadata import KernelMetadata
from k2back.runtime import cache

logger = logging.getLogger("k2back")

__all__ = ["STAGES", "CompileError", "CompiledKernel", "IRSource", "compile", "parse_arch"]


class CompileError(RuntimeError):
    def __init__(self, message: str, *, kernel: str, stage: str | None = None,
                 ir_path: Path | None = None):
        super().__init__(message)
        self.kernel, self.stage, self.ir_path = kernel, stage, ir_path


class Stage(NamedTuple):
    source: str  # the stage whose output this one consumes
    run: Callable  # (input, arch, features) -> output
    in_worker: bool = True  # LLVM code: may take its process down


def _link(obj: bytes, arch: str, features: str) -> bytes:
    return linker.link(obj)


SOURCE = "source"  # pseudo-stage: the source's text, the input of the entry stage
STAGES: dict[str, Stage] = {
    "ll": Stage(SOURCE, llvm.verify),
    "opt.ll": Stage("ll", llvm.optimize),
    "s": Stage("opt.ll", llvm.emit_assembly),
    "o": Stage("opt.ll", llvm.emit_object),
    "hsaco": Stage("o", _link, in_worker=False),
}
ENTRY_STAGES = ("ll", "opt.ll")  # the stages whose output is IR text a source can give


def schedule(entry: str) -> list[tuple[str, str, Callable]]:
    """(stage, input stage, function) to run for a source entering at `entry`:
    its text is verified as that stage's output, then every later stage runs."""
    if entry not in ENTRY_STAGES:
        raise ValueError(f"stage: expected one of {ENTRY_STAGES}, got {entry!r}")
    later = list(STAGES)[list(STAGES).index(entry) + 1:]
    return [(entry, SOURCE, llvm.verify), *((s, STAGES[s].source, STAGES[s].run) for s in later)]


@dataclass(frozen=True)
class IRSource:
    """Hand-written or hand-edited IR: tests, overrides of a rendered kernel."""

    text: str
    name: str
    arch: str
    stage: str = "ll"
    spec_json: str | None = None

    def __post_init__(self):
        parse_arch(self.arch)
        if self.stage not in ENTRY_STAGES:
            raise ValueError(f"stage: expected one of {ENTRY_STAGES}, got {self.stage!r}")

    def key(self) -> str:
        return sha256(f"{self.stage}\0{self.text}".encode()).hexdigest()

    def render(self) -> str:
        return self.text


@dataclass(frozen=True)
class CompiledKernel:
    name: str
    arch: str
    features: str
    ir: str  # the source's text as rendered
    opt_ir: str
    asm: str
    hsaco: bytes
    metadata: KernelMetadata
    cache_hit: bool
    key: str
    path: Path | None  # the cache entry
    spec_json: str | None = None
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage, or of the load


# ---------------------------------------------------------------------------
# The worker process


class _StageFailed(Exception):
    def __init__(self, stage: str, detail: str):
        super().__init__(detail)
        self.stage = stage


class Worker:
    """One persistent LLVM process, started on first use, restarted after a crash.

    Started as `python -c` (a spawn without multiprocessing's bootstrap, which
    would re-import the parent's __main__ and with it torch). Its stderr goes to
    a file so that LLVM's last words before an abort reach the CompileError.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._owner: int | None = None  # the pid that started the worker

    def _start(self) -> None:
        if self._process is not None:  # a dead worker, or the worker of the parent we forked from
            self._retire()
        self._conn, child = multiprocessing.Pipe()
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 -- lives as long as the worker
        package_root = str(Path(k2back.__file__).parent.parent)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, (package_root, os.environ.get("PYTHONPATH"))))}
        self._process = subprocess.Popen(
            [sys.executable, "-c", f"from k2back.codegen.llvm import serve; serve({child.fileno()})"],
            pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, stdout=self._stderr,
            stderr=self._stderr, env=env)
        child.close()
        self._owner = os.getpid()

    def run(self, stages: list, outputs: dict, timings: dict, target: Target) -> None:
        """Run `stages` in the worker, adding to `outputs` and `timings` as each
        finishes (so that a failure leaves what was built before it)."""
        with self._lock:
            # a forked child must not talk over its parent's pipe: it gets its own worker
            if (self._owner != os.getpid() or self._process is None
                    or self._process.poll() is not None):
                self._start()
            mark = self._stderr.seek(0, os.SEEK_END)
            self._conn.send((stages, outputs, tuple(target)))
            stage = stages[0][0]
            timeout = knobs.compile_timeout()
            while True:
                if not self._conn.poll(timeout):
                    raise _StageFailed(stage, self._kill(mark, timeout))
                try:
                    kind, *rest = self._conn.recv()
                except (EOFError, ConnectionError):
                    raise _StageFailed(stage, self._death(mark)) from None
                if kind == "begin":
                    stage = rest[0]
                elif kind == "output":
                    outputs[rest[0]], timings[rest[0]] = rest[1], rest[2]
                elif kind == "error":
                    raise _StageFailed(stage, rest[0])
                else:
                    self._relay(mark)
                    return

    def _output(self, mark: int) -> str:
        self._stderr.seek(mark)
        return self._stderr.read().decode(errors="replace").strip()

    def _relay(self, mark: int) -> None:
        """LLVM's diagnostics of a successful build go to our logger."""
        if output := self._output(mark):
            logger.warning("LLVM: %s", output)

    def _death(self, mark: int) -> str:
        code = self._process.wait()
        cause = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        output = self._output(mark)[-4000:]
        self._retire()
        return f"the LLVM worker process died ({cause})" + (f":\n{output}" if output else "")

    def _kill(self, mark: int, timeout: float) -> str:
        self._process.kill()
        self._process.wait()
        output = self._output(mark)[-4000:]
        self._retire()
        return (f"the LLVM worker made no progress for {timeout:g} s (K2BACK_COMPILE_TIMEOUT) "
                "and was killed" + (f":\n{output}" if output else ""))

    def _retire(self) -> None:
        """Drop this process's ends of the worker's pipe and log."""
        self._conn.close()
        self._stderr.close()
        self._process = None

    def close(self) -> None:
        if self._process is not None and self._owner == os.getpid():
            process = self._process
            self._retire()  # the worker sees EOF and returns
            process.wait(timeout=10)


_worker = Worker()
atexit.register(_worker.close)

# ---------------------------------------------------------------------------
# Build


def _toolchain() -> dict[str, str]:
    return {**llvm.versions(), "linker": linker.linker_version()}


def _run_stages(entry: str, outputs: dict, timings: dict, target: Target) -> None:
    for in_worker, group in itertools.groupby(schedule(entry), lambda s: STAGES[s[0]].in_worker):
        group = list(group)
        if in_worker:
            start = time.perf_counter()
            _worker.run(group, outputs, timings, target)
            # what the process boundary costs: pickling, pipe, wake-ups
            timings["worker round trip"] = (time.perf_counter() - start
                                            - sum(timings[stage] for stage, _, _ in group))
            continue
        for stage, source, run in group:
            start = time.perf_counter()
            try:
                outputs[stage] = run(outputs[source], *target)
            except linker.LinkerError as e:
                raise _StageFailed(stage, str(e)) from None
            timings[stage] = time.perf_counter() - start


def _dump_directory(name: str, key: str) -> Path:
    directory = Path(knobs.dump_dir(), f"{name}-{key[:12]}")
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _write_ir(directory: Path, name: str, texts: dict[str, str]) -> Path:
    for suffix, text in texts.items():
        (directory / f"{name}.{suffix}").write_text(text)
    return directory


def _save_for_inspection(name: str, key: str, texts: dict[str, str]) -> Path:
    """Keep the IR of a failed build: in K2BACK_DUMP_DIR if set, else a kept temp dir."""
    directory = (_dump_directory(name, key) if knobs.dump_dir() is not None
                 else Path(tempfile.mkdtemp(prefix=f"k2back-{name}-")))
    return _write_ir(directory, name, texts)


def _failure(source, target: Target, key: str, entry: str, outputs: dict,
             error: _StageFailed) -> CompileError:
    # The source's text is saved under the entry stage's name: it *is* that IR.
    texts = {entry if stage == SOURCE else stage: value for stage, value in outputs.items()
             if isinstance(value, str)}
    # the failed stage's input, or the IR it was made of (the linker takes an object)
    consumed = SOURCE if error.stage == entry else STAGES[error.stage].source
    while not isinstance(outputs.get(consumed), str):
        consumed = STAGES[consumed].source
    suffix = entry if consumed == SOURCE else consumed
    saved = _save_for_inspection(source.name, key, texts) / f"{source.name}.{suffix}"
    return CompileError(f"kernel {source.name!r} ({target.target_id}): stage {error.stage!r} failed: "
                        f"{error}\nits input IR is saved at {saved}",
                        kernel=source.name, stage=error.stage, ir_path=saved)


def _build(source, target: Target, key: str) -> tuple[dict[str, bytes], CompiledKernel]:
    entry = getattr(source, "stage", "ll")
    start = time.perf_counter()
    text = source.render()
    render_time = time.perf_counter() - start
    try:
        llvm.check_code_object_version(text)
    except ValueError as e:
        raise CompileError(f"kernel {source.name!r}: {e}", kernel=source.name, stage=entry) from None
    outputs, timings = {SOURCE: text}, {}
    try:
        _run_stages(entry, outputs, timings, target)
    except _StageFailed as e:
        raise _failure(source, target, key, entry, outputs, e) from None
    start = time.perf_counter()
    meta = metadata.read(outputs["hsaco"], source.name, outputs["s"])
    if meta.target != target.target_id:  # the features must have reached LLVM
        raise CompileError(f"kernel {source.name!r}: built for target {meta.target!r}, "
                           f"asked for {target.target_id!r}", kernel=source.name, stage="hsaco")
    timings = {"render": render_time, **timings, "metadata": time.perf_counter() - start}
    opt_ir = outputs.get("opt.ll", text)
    spec_json = getattr(source, "spec_json", None)
    files = _entry_files(source.name, text, opt_ir, outputs["s"], outputs["hsaco"], meta, spec_json)
    built = CompiledKernel(source.name, target.arch, target.features, text, opt_ir, outputs["s"],
                           outputs["hsaco"], meta, cache_hit=False, key=key, path=None,
                           spec_json=spec_json, timings=timings)
    return files, built


# ---------------------------------------------------------------------------
# Cache entries


def _entry_files(name, ir, opt_ir, asm, hsaco, meta, spec_json) -> dict[str, bytes]:
    files = {f"{name}.ll": ir.encode(), f"{name}.opt.ll": opt_ir.encode(), f"{name}.s": asm.encode(),
             f"{name}.hsaco": hsaco, f"{name}.json": json.dumps(meta.to_json(), indent=1).encode()}
    if spec_json is not None:
        files[f"{name}.spec.json"] = spec_json.encode()
    return files


def _from_entry(name: str, target: Target, key: str, path: Path,
                files: dict[str, bytes]) -> CompiledKernel:
    spec = files.get(f"{name}.spec.json")
    return CompiledKernel(
        name, target.arch, target.features, files[f"{name}.ll"].decode(),
        files[f"{name}.opt.ll"].decode(), files[f"{name}.s"].decode(), files[f"{name}.hsaco"],
        KernelMetadata.from_json(json.loads(files[f"{name}.json"])), cache_hit=True, key=key,
        path=path, spec_json=spec.decode() if spec is not None else None)


def _dump(built: CompiledKernel) -> None:
    directory = _write_ir(_dump_directory(built.name, built.key), built.name,
                          {"ll": built.ir, "opt.ll": built.opt_ir, "s": built.asm})
    logger.info("k2back: dumped %s to %s", built.name, directory)


def build_target(source, arch: str | None = None) -> Target:
    """The source's target, or `arch` for the same processor: a device's target
    ID (gcnArchName, e.g. gfx942:sramecc+:xnack-) changes the build, not the source."""
    target = parse_arch(source.arch)
    if arch is None:
        return target
    chosen = parse_arch(arch)
    if chosen.arch != target.arch:
        raise ValueError(f"arch: expected a target ID of the source's processor {target.arch}, "
                         f"got {arch!r}")
    return chosen


def cache_key(source, arch: str | None = None) -> tuple[str, dict]:
    """(key, factors) of a source's build in this environment."""
    target = build_target(source, arch)
    factors = cache.key_factors(source.key(), target.arch, target.features, _toolchain())
    return cache.digest(factors), factors


def compile(source, arch: str | None = None) -> CompiledKernel:
    """The source's code object: from the disk cache, or built and cached.
    `arch`: build for this target ID of the source's processor (see build_target)."""
    target = build_target(source, arch)
    key, factors = cache_key(source, arch)
    store = cache.Cache()
    # A dump must come from a real build, so it forces one (as does ALWAYS_COMPILE).
    use_hits = not (knobs.always_compile() or knobs.dump_dir() is not None)
    start = time.perf_counter()
    with store.lock(key):
        files = store.load(key) if use_hits else None
        if files is not None:
            hit = _from_entry(source.name, target, key, store.path(key), files)
            return dataclasses.replace(hit, timings={"cache load": time.perf_counter() - start})
        if knobs.assert_no_compile():
            raise CompileError(
                f"K2BACK_ASSERT_NO_COMPILE is set, but kernel {source.name!r} ({target.target_id}) "
                f"is not in the cache {store.root} (key {key}): warm the cache up first",
                kernel=source.name)
        files, built = _build(source, target, key)
        if knobs.dump_dir() is not None:
            _dump(built)
        path = store.store(key, source.name, files, factors)
    logger.info("k2back: built %s (%s) in %.2f s -> %s", source.name, target.target_id,
                time.perf_counter() - start, path)
    return dataclasses.replace(built, path=path)
