"""The emulator backend: the launch the HIP backend makes — same kernarg bytes,
same scratch layout, same grid — run instruction by instruction in
`k2back.emu.Machine` on CPU tensors, which receive the results in place."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from k2back.emu import Machine
from k2back.runtime import launch


class EmuBackend:
    """`machine_options`: keywords of `k2back.emu.Machine` (store visibility, the
    numerics options, ...) for every launch of this backend."""

    name = "emu"

    def __init__(self, **machine_options):
        self.machine_options = machine_options

    def new_scratch(self, spec, device: torch.device) -> torch.Tensor:
        return launch.new_scratch(spec, device)

    def run(self, kernel, spec, tensors: Mapping[str, object], scratch: torch.Tensor,
            qk_scale: float | None = None, *, grid: tuple[int, int, int] | None = None,
            order="forward", **machine_options):
        """Launch once; returns the emulator's counters. The scratch keeps its
        epoch state across calls: it is mapped, never cleared. `grid` replaces
        the plan's (a stage-level kernel of the same signature), `order` is the
        workgroups' start order (Machine.launch), `machine_options` add to the
        backend's for this launch."""
        machine = Machine(kernel.arch, **{**self.machine_options, **machine_options})

        def address_of(tensor: torch.Tensor, name: str) -> int:
            # the whole storage, so strided views (padded pages) map as they lie in memory
            storage = torch.empty(0, dtype=torch.uint8).set_(tensor.untyped_storage())
            return machine.map(storage, name) + tensor.storage_offset() * tensor.element_size()

        dims = launch.launch_dims(spec, grid)
        segment = launch.kernargs(kernel, spec, tensors, address_of(scratch, "scratch"),
                                  address_of, qk_scale, dims)
        return machine.launch(kernel.asm, kernel.name, grid=dims.grid, block=dims.block,
                              kernargs=segment, dynamic_lds=dims.dynamic_lds, order=order)
