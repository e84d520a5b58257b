"""The rendering step: the IR of a fixed set of configurations against its
record (a refactor keeps it byte-identical; a meant change re-records it with
`python benchmarks/render_guard.py --record`)."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest

import k2back
from k2back.codegen import render, targets
from k2back.codegen.plan import KernelSpec, plan
from k2back.codegen.testing import RENDERED_IR, guard_digests
from k2back.runtime import cache


def test_rendered_ir_matches_the_record():
    want = json.loads(RENDERED_IR.read_text())["ir"]
    got = guard_digests()
    changed = sorted(name for name in want.keys() | got.keys() if want.get(name) != got.get(name))
    assert not changed, (f"rendered IR differs from {RENDERED_IR.name} for {changed}: if the "
                         "change is meant, say so in the commit and run "
                         "`python benchmarks/render_guard.py --record`")


# --- the cache key covers every module that shapes the build ----------------

SHAPERS = {"k2back.codegen.plan", "k2back.codegen.plan_attention", "k2back.codegen.targets",
           "k2back.codegen.render", "k2back.codegen.signature", "k2back.model", "k2back.kv_format"}


def test_build_modules_hold_what_rendering_and_compiling_import():
    """Independently of the import reader: every k2back module loaded by
    importing the renderer and the compiler (a fresh interpreter) is keyed."""
    code = ("import sys; import k2back.codegen.render, k2back.codegen.compiler, "
            "k2back.runtime.cache; print(' '.join(m for m in sys.modules if m.startswith('k2back')))")
    loaded = set(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                text=True).stdout.split())
    modules = set(cache.build_modules())
    assert SHAPERS <= loaded <= modules


def _touch_a_constant(text: str) -> str:
    """The module with its first integer constant one higher (one added if it
    has none)."""
    m = re.search(r"^([A-Z][A-Z0-9_]* = )(\d+)", text, re.MULTILINE)
    if m:
        return text[:m.start(2)] + str(int(m[2]) + 1) + text[m.end(2):]
    return text + "\nTOUCHED = 1\n"


@pytest.mark.parametrize("module", sorted(cache.build_modules()))
def test_touching_a_constant_of_a_build_module_changes_the_key(module, tmp_path):
    package = tmp_path / "k2back"
    shutil.copytree(Path(k2back.__file__).parent, package,
                    ignore=shutil.ignore_patterns("__pycache__", "emu", "templates"))
    before = cache.sources_hash(package)
    assert before == cache.codegen_hash()
    path = cache.build_modules(package)[module]
    path.write_text(_touch_a_constant(path.read_text()))
    assert cache.sources_hash(package) != before


# --- templates restate nothing the planner knows -----------------------------

# Integer literals a template's Jinja may hold: 0 and 1, and the powers of two
# of IR types and the fixed MFMA/wave shapes (bf16 and f32 bytes, 8/16/32/64-bit
# widths, 16-lane rows, 64-lane waves). Anything else is a planner fact
# (spec field) or a named constant of the arch table (`{% set NAME = ... %}`).
LITERAL_ALLOWLIST = {0, 1, 2, 4, 8, 16, 32, 64}
_JINJA = re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.DOTALL)
_NAMED_CONSTANT = re.compile(r"\{%-?\s*set\s+[A-Z][A-Z0-9_]*\s*=")


def jinja_literals(text: str) -> list[tuple[int, str]]:
    """(literal, expression) of every integer literal in the template's Jinja
    expressions and statements, outside comments, strings and named constants."""
    text = re.sub(r"\{#.*?#\}", "", text, flags=re.DOTALL)
    found = []
    for expression in _JINJA.findall(text):
        if _NAMED_CONSTANT.match(expression):
            continue
        code = re.sub(r"\"[^\"]*\"|'[^']*'", "", expression)
        found += [(int(n), expression) for n in re.findall(r"(?<![\w.])(\d+)(?![\w.])", code)]
    return found


def test_literal_check_flags_a_restated_number():
    assert jinja_literals("{{ HT * 1024 }} {{ x }} {% for j in range(7) %}") == [
        (1024, "{{ HT * 1024 }}"), (7, "{% for j in range(7) %}")]
    assert jinja_literals('{# 1024 #}{{ "x" ~ 7 }} {% set BIAS = 127 %}{{ "7" }}') == [
        (7, '{{ "x" ~ 7 }}')]


@pytest.mark.parametrize("template", sorted(p.name for p in render.TEMPLATES.glob("*.j2")))
def test_templates_hold_no_planner_numbers(template):
    text = (render.TEMPLATES / template).read_text()
    flagged = [(n, e) for n, e in jinja_literals(text) if n not in LITERAL_ALLOWLIST]
    assert not flagged, f"{template}: integer literals the planner should emit: {flagged}"


# --- the spec is the whole input of rendering ---------------------------------

@pytest.mark.parametrize("arch", ("gfx942", "gfx950"))
def test_the_spec_json_alone_determines_the_ir(arch):
    """A spec rebuilt from its JSON renders the same IR and key (the JSON loses
    nothing the templates read), also for target facts no table holds; that
    the templates read the spec's facts, not the table's, is
    test_attention_stages.test_kernel_key_covers_the_arch_facts."""
    target = dataclasses.replace(targets.arch_info(arch), blocks=4, lds_budget=40 * 1024)
    for spec in (plan("tiny", 4, 3, 2, arch), plan("tiny", 1, 3, 2, arch, target=target)):
        again = KernelSpec.from_json(spec.to_json())
        assert render.KernelSource(again).render() == render.KernelSource(spec).render()
        assert render.KernelSource(again).key() == render.KernelSource(spec).key()


# --- the templates' compiled code is kept in the cache dir ---------------------

def fresh_environment(templates: Path = render.TEMPLATES):
    """render.environment() as a new process makes it (the cached one has compiled
    its templates already)."""
    return render.environment.__wrapped__(templates)


def test_a_new_process_renders_from_compiled_templates(tmp_path, monkeypatch):
    monkeypatch.setenv("K2BACK_CACHE_DIR", str(tmp_path))
    spec = plan("tiny", 4, 3, 2, "gfx950")
    want = render.KernelSource(spec).render()
    first = fresh_environment().get_template("kernel.ll.j2").render(**render.arguments(spec, render.STAGES, spec.name))
    kept = list((tmp_path / ".templates").rglob("*.cache"))
    assert len(kept) >= 2  # kernel.ll.j2 and what it includes

    def no_compiling(*args, **kwargs):
        raise AssertionError("a template was compiled although its code is in the cache dir")

    monkeypatch.setattr(jinja2.Environment, "compile", no_compiling)
    again = fresh_environment().get_template("kernel.ll.j2").render(**render.arguments(spec, render.STAGES, spec.name))
    assert first == again == want


def test_an_edited_template_compiles_anew(tmp_path, monkeypatch):
    monkeypatch.setenv("K2BACK_CACHE_DIR", str(tmp_path / "cache"))
    templates = tmp_path / "templates"
    shutil.copytree(render.TEMPLATES, templates)
    spec = plan("tiny", 4, 3, 2, "gfx942")
    arguments = render.arguments(spec, render.STAGES, spec.name)
    before = fresh_environment(templates).get_template("kernel.ll.j2").render(**arguments)
    included = templates / "gemv.ll.j2"  # a template kernel.ll.j2 includes, edited
    included.write_text("; edited\n" + included.read_text())
    after = fresh_environment(templates).get_template("kernel.ll.j2").render(**arguments)
    assert "; edited" not in before and "; edited" in after
