"""Every instruction form the K2 kernel's code holds has a unit test against an
independent model (issue 9 §6).

The inventory is a static listing: all instructions of the asm text the
emulator runs, over k2back.testing.INVENTORY_CONFIGS (both archs x TP 1/2/4/8 x
ratio 0/1/2 x S 1/16/64 on tiny, and V4.1-Flash TP 4 S 1), each as its mnemonic
and the modifiers that change what it computes (k2back.emu.inventory.form). A
form maps to the unit tests that launched a kernel holding it, a table measured
by running the emulator's unit tests with the recorder of tests/conftest.py:

    pytest -n 4 tests/test_emu_*.py --record-forms=tests/data/form_coverage.json

A form with no entry fails its configuration by name (then: write a unit test
with a model, in test_emu_forms.py say, and re-record). Each configuration's
code is also checked free of hazards on every path (k2back.emu.hazards).
`python benchmarks/inventory.py` prints the inventory with counts."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from k2back.emu import asm as asm_text
from k2back.emu.hazards import find_hazards
from k2back.emu.inventory import forms
from k2back.testing import INVENTORY_CONFIGS, build

TESTS = Path(__file__).parent
COVERAGE = json.loads((TESTS / "data" / "form_coverage.json").read_text())


@pytest.mark.kernel
@pytest.mark.slow
@pytest.mark.parametrize("config", INVENTORY_CONFIGS, ids=lambda c: "-".join(map(str, c)))
def test_every_form_of_the_kernel_has_a_unit_test(config):
    _, kernel = build(*config)
    held = forms(kernel.asm, kernel.name)
    missing = sorted(form for form in held if form not in COVERAGE)
    assert not missing, (f"{len(missing)} instruction form(s) with no unit test against an "
                         f"independent model: " + "; ".join(missing))
    parsed = asm_text.parse_kernel(kernel.asm, kernel.name)
    assert find_hazards(parsed, config[4], parsed.directive("accum_offset")) == []


def _marked_kernel(node: ast.AST) -> bool:
    """A decorator or pytestmark naming pytest.mark.kernel."""
    return any(isinstance(n, ast.Attribute) and n.attr == "kernel"
               and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"
               for n in ast.walk(node))


def test_the_table_names_unit_tests_that_exist():
    """Every test the coverage table names is a test function of an emulator unit
    test module, and not a K2 kernel test (marked `kernel`): those launches are
    what is being covered (the recorder leaves out any test that launches a k2_*
    kernel)."""
    defined, kernel_tests = {}, set()
    for path in TESTS.glob("test_emu_*.py"):
        tree = ast.parse(path.read_text())
        functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
        defined[f"tests/{path.name}"] = {node.name for node in functions}
        module_marked = any(_marked_kernel(node) for node in tree.body
                            if isinstance(node, ast.Assign)
                            and any(getattr(t, "id", None) == "pytestmark" for t in node.targets))
        kernel_tests |= {f"tests/{path.name}::{node.name}" for node in functions
                         if module_marked or any(_marked_kernel(d) for d in node.decorator_list)}
    named = {test for tests in COVERAGE.values() for test in tests}
    unknown = sorted(test for test in named
                     if test.split("::")[1] not in defined.get(test.split("::")[0], ()))
    assert not unknown, f"the coverage table names tests that do not exist: {unknown}"
    assert kernel_tests, "no emulator test is marked kernel: the check below checks nothing"
    covering_k2 = sorted(named & kernel_tests)
    assert not covering_k2, f"K2 kernel tests in the coverage table: {covering_k2}"
    assert all(tests for tests in COVERAGE.values())


def test_forms_keep_what_changes_the_computation():
    parsed = asm_text.parse_instruction(
        "v_max3_f32 v2, v2, |v6|, -v3 op_sel:[0,0,0,0] clamp", 1)
    assert asm_text.parse_instruction("s_add_i32 s0, s1, -16", 1).mnemonic == "s_add_i32"
    from k2back.emu.inventory import form
    assert form(parsed) == "v_max3_f32 clamp op_sel:[0,0,0,0] abs(op2) neg(op3)"
    assert form(asm_text.parse_instruction("s_add_i32 s0, s1, -16", 1)) == "s_add_i32"
    assert form(asm_text.parse_instruction(
        "buffer_load_dwordx4 v[2:5], v1, s[8:11], 0 offen offset:64 sc1", 1)) == \
        "buffer_load_dwordx4 offen offset sc1"
