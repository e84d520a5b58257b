"""KernelSource(spec): the K2 kernel as LLVM IR text, rendered from the Jinja2
templates in k2back/templates (kernel.ll.j2 includes the stage templates)."""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import jinja2

from k2back import knobs, logger
from k2back.codegen import signature
from k2back.codegen.plan import KernelSpec

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
STAGES = ("split", "combine", "wo_a", "wo_b")  # execution order on a CTA
ATTENTION_STAGES = ("split", "combine")  # split.ll.j2 / combine.ll.j2 (attention helper)


# The options that change how a template's text compiles (its code, not its output's
# inputs); they name the directory of the compiled templates.
SYNTAX = {"trim_blocks": True, "lstrip_blocks": True, "keep_trailing_newline": True}


class CompiledTemplates(jinja2.FileSystemBytecodeCache):
    """The templates' compiled code in the code-object cache dir, so that a
    process renders without compiling them (~0.5 s a process, every template
    the kernel includes). Jinja keys a file by template name and checks it
    against the sha1 of the template's text: an edited template compiles anew.
    The directory names what else goes into the code: jinja2's version and
    SYNTAX (the Python version is in jinja's header of every file). It is
    looked up at each use: the cache dir is a knob (K2BACK_CACHE_DIR)."""

    def __init__(self):  # not jinja's: its default directory is a temp dir of its own
        self.pattern = "__jinja2_%s.cache"

    @property
    def directory(self) -> str:
        options = ",".join(f"{k}={v}" for k, v in sorted(SYNTAX.items()))
        tag = hashlib.sha256(f"{jinja2.__version__}\0{options}".encode()).hexdigest()[:16]
        return str(knobs.cache_dir() / ".templates" / tag)

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            os.makedirs(self.directory, exist_ok=True)
            super().dump_bytecode(bucket)  # a temp file renamed into place
        except OSError as e:  # an accelerator only: the next process compiles again
            logger.debug("k2back: compiled template not kept: %s", e)


@functools.cache
def environment(templates: Path = TEMPLATES) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates),
        undefined=jinja2.StrictUndefined,
        bytecode_cache=CompiledTemplates(),
        **SYNTAX,
    )


def _template_digest() -> str:
    h = hashlib.sha256()
    for path in sorted(TEMPLATES.glob("*.j2")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


class KernelSource:
    """The K2 kernel of `spec`; `stages` renders a subset (in STAGES order) for
    stage-level tests: the kernel then only awaits flags earlier stages would
    have set (a test sets them). `target_id`: the target ID to build for (the
    spec's arch with target-ID features, e.g. gfx942:sramecc+:xnack-); the
    arch's facts are the spec's (`spec.target`)."""

    def __init__(self, spec: KernelSpec, stages=None, target_id: str | None = None):
        stages = STAGES if stages is None else tuple(stages)
        unknown = [s for s in stages if s not in STAGES]
        if unknown or not stages:
            raise ValueError(f"stages: expected a non-empty subset of {STAGES}, got {stages!r}")
        self.spec = spec
        self.stages = tuple(s for s in STAGES if s in stages)
        full = self.stages == STAGES
        self.name = spec.name if full else f"{spec.name}__{'_'.join(self.stages)}"
        self.arch = spec.arch if target_id is None else target_id
        self.spec_json = spec.to_json()

    def key(self) -> str:
        # the templates read the spec only (the code that renders them is a
        # factor of the cache key: cache.codegen_hash)
        h = hashlib.sha256(f"{self.spec.to_json()}\0{self.stages}\0".encode())
        h.update(_template_digest().encode())
        return h.hexdigest()

    def render(self) -> str:
        return environment().get_template("kernel.ll.j2").render(
            **arguments(self.spec, self.stages, self.name))


def arguments(spec: KernelSpec, stages: tuple[str, ...], name: str) -> dict:
    """What kernel.ll.j2 renders from."""
    return {"spec": spec, "stages": stages, "attention_stages": ATTENTION_STAGES, "name": name,
            "params": signature.params(), "forward": signature.forward()}
