"""The rendering step: the IR of a fixed set of configurations against its
record (a refactor keeps it byte-identical; a meant change re-records it with
`python benchmarks/render_guard.py --record`)."""

from __future__ import annotations

import json

from k2back.codegen.testing import RENDERED_IR, guard_digests


def test_rendered_ir_matches_the_record():
    want = json.loads(RENDERED_IR.read_text())["ir"]
    got = guard_digests()
    changed = sorted(name for name in want.keys() | got.keys() if want.get(name) != got.get(name))
    assert not changed, (f"rendered IR differs from {RENDERED_IR.name} for {changed}: if the "
                         "change is meant, say so in the commit and run "
                         "`python benchmarks/render_guard.py --record`")
