"""Model geometry as data, and one tensor-parallel rank's share of it.

Every size the planner, the reference and the input generator use comes from
here; other geometries are new table rows, not new code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TP_DEGREES = (1, 2, 4, 8)

# The fp8_ds_mla KV record is fixed by vLLM's cache format (SPEC §1): every
# geometry attends over 448 "nope" dims stored as e4m3 and 64 "rope" dims in bf16.
HEAD_DIM = 512
NOPE_DIM = 448
ROPE_DIM = 64
# Heads of one output group (group g = heads 8g .. 8g+7) and of one MXFP8 block.
HEADS_PER_GROUP = 8
MX_BLOCK = 32


@dataclass(frozen=True)
class Rope:
    """V4.1's YaRN-scaled GPT-J rope of the last ROPE_DIM dims (no mscale)."""

    theta: float = 160000.0
    factor: float = 16.0
    original_max_position: int = 65536
    beta_fast: float = 32.0
    beta_slow: float = 1.0


@dataclass(frozen=True)
class Geometry:
    name: str
    hidden: int
    heads: int
    groups: int
    o_rank: int
    topk: int
    window: int
    rope: Rope = Rope()

    @property
    def keys(self) -> int:
        """Key-table width: top-k compressed rows, then the window."""
        return self.topk + self.window

    @property
    def group_k(self) -> int:
        """wo_a's input width per group: its 8 heads' 512 dims, head-major."""
        return HEADS_PER_GROUP * HEAD_DIM

    @property
    def qk_scale(self) -> float:
        return HEAD_DIM**-0.5

    def __post_init__(self):
        if self.heads != self.groups * HEADS_PER_GROUP:
            raise ValueError(
                f"geometry {self.name!r}: heads must be groups * {HEADS_PER_GROUP}, "
                f"got heads={self.heads}, groups={self.groups}"
            )
        for field in ("hidden", "o_rank"):
            if getattr(self, field) % MX_BLOCK:
                raise ValueError(
                    f"geometry {self.name!r}: {field} must be a multiple of {MX_BLOCK}, "
                    f"got {getattr(self, field)}"
                )

    def rank(self, tp: int) -> RankShape:
        return RankShape(self, tp)


@dataclass(frozen=True)
class RankShape:
    """One tensor-parallel rank's share: H heads, G groups, and the shapes of
    every launch argument that depends on them."""

    geometry: Geometry
    tp: int

    def __post_init__(self):
        g = self.geometry
        if self.tp not in TP_DEGREES:
            raise ValueError(f"tp: expected one of {TP_DEGREES}, got {self.tp!r}")
        if g.groups % self.tp:
            raise ValueError(
                f"tp: {self.tp} does not divide geometry {g.name!r}'s "
                f"{g.groups} groups ({g.heads} heads)"
            )

    @property
    def heads(self) -> int:
        return self.geometry.heads // self.tp

    @property
    def groups(self) -> int:
        return self.geometry.groups // self.tp

    @property
    def keys(self) -> int:
        return self.geometry.keys

    @property
    def q_cols(self) -> int:
        return self.heads * HEAD_DIM

    @property
    def o_rows(self) -> int:
        """wo_a's output rows on this rank = wo_b's input width."""
        return self.groups * self.geometry.o_rank

    @property
    def wo_a_shape(self) -> tuple[int, int]:
        return (self.o_rows, self.geometry.group_k)

    @property
    def wo_b_shape(self) -> tuple[int, int]:
        return (self.geometry.hidden, self.o_rows)

    @staticmethod
    def scale_shape(weight_shape: tuple[int, int]) -> tuple[int, int]:
        """UE8M0 codes of an MXFP8 weight: one per 32x32 block."""
        return tuple(math.ceil(n / MX_BLOCK) for n in weight_shape)

    @property
    def wo_a_scale_shape(self) -> tuple[int, int]:
        return self.scale_shape(self.wo_a_shape)

    @property
    def wo_b_scale_shape(self) -> tuple[int, int]:
        return self.scale_shape(self.wo_b_shape)


GEOMETRIES: dict[str, Geometry] = {
    g.name: g
    for g in (
        Geometry("v4.1-flash", hidden=5120, heads=64, groups=8, o_rank=1024, topk=512, window=128),
        Geometry("v4-pro", hidden=7168, heads=128, groups=16, o_rank=1024, topk=1024, window=128),
        # Fast-test geometries: the real head and group structure (every TP
        # divides them), small hidden / o_rank / key counts.
        Geometry("tiny", hidden=256, heads=64, groups=8, o_rank=128, topk=32, window=16),
        Geometry("tiny-16", hidden=256, heads=16, groups=2, o_rank=128, topk=32, window=16),
    )
}
DEFAULT_GEOMETRY = "v4.1-flash"


def geometry(name: str | Geometry) -> Geometry:
    if isinstance(name, Geometry):
        return name
    try:
        return GEOMETRIES[name]
    except KeyError:
        raise ValueError(
            f"geometry: expected one of {sorted(GEOMETRIES)}, got {name!r}"
        ) from None
