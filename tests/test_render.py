"""The rendering step: the IR of a fixed set of configurations against its
record (a refactor keeps it byte-identical; a meant change re-records it with
`python benchmarks/render_guard.py --record`)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import k2back
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
           "k2back.codegen.render", "k2back.codegen.signature", "k2back.model", "k2back.formats"}


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
