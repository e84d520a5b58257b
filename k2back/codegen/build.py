"""build(config): the K2 kernel of one configuration, planned, rendered and
compiled (from the disk cache when warm), with no torch: `k2back warmup` and
`k2back dump` build in processes that never launch. k2back.ops exports it as
the one way to a kernel and adds the launch (torch) on top.
"""

from __future__ import annotations

from k2back.codegen.compiler import compile as compile_source
from k2back.codegen.plan import plan
from k2back.codegen.render import KernelSource
from k2back.config import Config


def build(config: Config, stages=None, *, timeline: bool = False):
    """(spec, compiled kernel) of one configuration, from the disk cache when
    warm; `stages` a subset of the four (stage-level tests); `timeline` the
    build that stamps each task (k2back.profile.stamped_tasks). The arch's
    target-ID features change the build and its key, not the plan."""
    spec = plan(config, timeline=timeline)
    return spec, compile_source(KernelSource(spec, stages, target_id=config.arch))
