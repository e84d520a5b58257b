"""The launch's opening (Machine(opening=True), the default): before the scheduler
starts, every wave runs its private instructions — SALU, forward branches, VALU
whose only SGPR writes are compare masks, s_nop, s_endpgm with nothing
outstanding — as arrays over all waves; a wave that ends there never becomes a
Wave, any other stops at its first instruction that is not private and the
scheduler resumes it there. It must be invisible: every launch here runs with the
opening and without it (`opening=False`) and must leave the same bytes, the same
Stats (all but `batched`, `batches` and `rounds`) and raise the same error text
naming the same wave. Where the kernel computes something, its output is also
checked against an independent numpy model of the same computation, so a kernel
that lost its point (a mis-generated prefix) fails too.

Kernels: the idle persistent grid (wave-id compares, a few waves go on to
memory), random LLVM IR prefixes (seeded: SALU and VALU arithmetic, 64-bit ops,
if/else on lane and workgroup values, whole workgroups and waves ending early,
loops) over partial, 1-wave, 16-wave and 3-D workgroups, a hand-written prefix
running every SALU op of salu.SOP, kernels whose first instruction is a load,
launches that fault, deadlock, hit a hazard or the scoreboard after a private
prefix, the clock, a trace and timing mode (no opening there), and the K2 kernel."""

from __future__ import annotations

import dataclasses
import itertools
import random
import re

import numpy as np
import pytest

from k2back.emu import EmulatorError, Machine, hazards, salu
from k2back.emu import asm as asm_text
from k2back.emu.opening import Rows
from k2back.emu.testing import ARCHS, IDLE_GRID, assemble, handwritten, module, run

# the counters the opening may change: how instructions were grouped into executions
GROUPING = ("batched", "batches", "rounds")
# what never stops a wave's opening (the rest: memory, LDS, sync, clock, pc)
PRIVATE_PREFIXES = ("v_", "s_cbranch", "s_branch", "s_nop", "s_endpgm")
NOT_PRIVATE = ("s_load", "s_buffer", "s_memtime", "s_memrealtime", "s_dcache", "s_waitcnt", "s_barrier",
               "s_sleep", "s_getpc", "s_setpc", "s_swappc", "v_readfirstlane", "v_readlane",
               "v_writelane", "v_cmpx", "v_add_co", "v_sub_co", "v_addc", "v_subb", "v_mad_u64",
               "v_mad_i64", "v_div_scale", "v_mfma")


@dataclasses.dataclass
class Outcome:
    """What a launch left: the arrays' bytes and Stats (but GROUPING), or the error."""

    outputs: dict
    counters: dict | None = None
    error: tuple | None = None  # (type name, text)


def counters(stats) -> dict:
    return {k: v for k, v in vars(stats).items() if k not in GROUPING}


def launch(source: str, arch: str, name: str, arrays: dict, *, opening: bool, grid=(1,),
           block=(64,), order="forward", scalars=None, **options) -> Outcome:
    """Run `name` (LLVM IR, or the asm of testing.handwritten when name is "hand")
    on copies of `arrays` on a new Machine(arch, opening=opening, **options)."""
    machine = Machine(arch, opening=opening, **options)
    copies = {k: v.copy() for k, v in arrays.items()}
    try:
        if name == "hand":
            kernargs = machine.map(copies["out"], name="out").to_bytes(8, "little")
            stats = machine.launch(source, "hand", grid=grid, block=block, kernargs=kernargs, order=order)
        else:
            stats = run(source, arch, name, {**copies, **(scalars or {})}, grid=grid, block=block,
                        machine=machine, order=order)
    except EmulatorError as error:
        return Outcome(copies, None, (type(error).__name__, str(error)))
    return Outcome(copies, counters(stats))


def where_spinning(error: tuple | None):
    """`error` but, for the instruction limit, where a running wave was when it
    tripped: the limit is tested at the end of a round, and a wave's quanta start
    after its opening (the instructions it ran there are counted, not charged to
    its first quantum), so a spinning wave may be a few instructions further on."""
    if error is None or "wave-instructions;" not in error[1]:
        return error
    return error[0], re.sub(r"running, last at line \d+: [^\n]*", "running", error[1])


def same_with_and_without(source, arch, name, arrays, **launch_options) -> Outcome:
    """The launch with the opening and without: identical; returns it (opening on)."""
    on = launch(source, arch, name, arrays, opening=True, **launch_options)
    off = launch(source, arch, name, arrays, opening=False, **launch_options)
    assert where_spinning(on.error) == where_spinning(off.error)
    assert on.outputs.keys() == off.outputs.keys()
    for key in on.outputs:
        a, b = on.outputs[key], off.outputs[key]
        assert np.array_equal(a, b), f"{key} differs"
    if on.counters is not None:
        for key in on.counters:  # one by one: the failure names the counter
            assert on.counters[key] == off.counters[key], f"Stats.{key} differs"
    return on


def private_prefix(asm: str, name: str) -> int:
    """Instructions before the first one that is (clearly) not private, in asm order."""
    kernel = asm_text.parse_kernel(asm, name)
    for count, ins in enumerate(kernel.instructions):
        m = ins.mnemonic
        if m.startswith(NOT_PRIVATE) or not (m.startswith(PRIVATE_PREFIXES) or m.startswith("s_")):
            return count
    return len(kernel.instructions)


def random_order(groups: int, seed: int) -> list[int]:
    order = list(range(groups))
    random.Random(seed).shuffle(order)
    return order


def test_the_opening_is_on_unless_turned_off():
    assert Machine("gfx942").opening is True
    assert Machine("gfx950", opening=False).opening is False


# ---------------------------------------------------------------- (1) the idle persistent grid

# The persistent grid's idle shape: every workgroup of 8 waves; a lane (tid 0) or
# a wave (its id compared with the workgroup's) goes on to mark memory, the other
# waves end. `idle_wave` compares the wave id as a lane value (v_cmp, saveexec),
# `idle_uniform` as the kernels do, through readfirstlane (a scalar branch after it).
IDLE = module(IDLE_GRID + """
define amdgpu_kernel void @idle_wave(ptr addrspace(1) %marks, ptr addrspace(1) %data) #0 {
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %wg = call i32 @llvm.amdgcn.workgroup.id.x()
  %wave = lshr i32 %tid, 6
  %lane = and i32 %tid, 63
  %h = mul i32 %wg, 5
  %pick = and i32 %h, 7
  %mine = icmp eq i32 %wave, %pick
  br i1 %mine, label %mark, label %done
mark:
  %p = getelementptr i32, ptr addrspace(1) %marks, i32 %wg
  %w1 = add i32 %wave, 1
  %first = icmp eq i32 %lane, 0
  br i1 %first, label %flag, label %rows
flag:
  store atomic i32 %w1, ptr addrspace(1) %p syncscope("agent") monotonic, align 4
  br label %rows
rows:
  %row = mul i32 %wg, 64
  %at = add i32 %row, %lane
  %pd = getelementptr i32, ptr addrspace(1) %data, i32 %at
  %x = mul i32 %at, 2654435761
  %y = xor i32 %x, %tid
  store i32 %y, ptr addrspace(1) %pd
  br label %done
done:
  ret void
}

define amdgpu_kernel void @idle_uniform(ptr addrspace(1) %marks, ptr addrspace(1) %data) #0 {
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %wg = call i32 @llvm.amdgcn.workgroup.id.x()
  %wave.v = lshr i32 %tid, 6
  %wave = call i32 @llvm.amdgcn.readfirstlane.i32(i32 %wave.v)
  %lane = and i32 %tid, 63
  %h = mul i32 %wg, 3
  %pick = and i32 %h, 7
  %mine = icmp ult i32 %wave, %pick
  br i1 %mine, label %done, label %work
work:
  %odd = and i32 %wave, 1
  %isodd = icmp ne i32 %odd, 0
  br i1 %isodd, label %done, label %mark
mark:
  %slot = mul i32 %wg, 8
  %at = add i32 %slot, %wave
  %p = getelementptr i32, ptr addrspace(1) %marks, i32 %at
  %first = icmp eq i32 %lane, 0
  br i1 %first, label %flag, label %done
flag:
  %w1 = add i32 %wave, 1
  store atomic i32 %w1, ptr addrspace(1) %p syncscope("agent") monotonic, align 4
  br label %done
done:
  ret void
}
declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.workgroup.id.x()
declare i32 @llvm.amdgcn.readfirstlane.i32(i32)
""")

CTAS = {"gfx942": 304, "gfx950": 256}  # benchmarks/emu_speed.py: the persistent grid


def idle_expected(name: str, groups: int) -> dict:
    wg = np.arange(groups, dtype=np.uint32)
    if name == "idle":
        return {"marks": np.ones(groups, np.int32)}
    lane = np.arange(64, dtype=np.uint32)
    if name == "idle_wave":  # the wave picked, (5 * wg) & 7, writes the workgroup's row
        pick = (wg * U32(5)) & U32(7)
        at = wg[:, None] * U32(64) + lane
        data = (at * U32(2654435761)) ^ (pick[:, None] * U32(64) + lane)
        return {"marks": pick.astype(np.int32) + 1, "data": data.reshape(-1).view(np.int32)}
    wave = np.arange(8)
    marked = (wave[None, :] >= ((wg[:, None] * 3) & 7)) & (wave[None, :] % 2 == 0)
    return {"marks": np.where(marked, wave[None, :] + 1, 0).reshape(-1).astype(np.int32),
            "data": np.zeros(groups * 64, np.int32)}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", ["idle", "idle_wave", "idle_uniform"])
@pytest.mark.parametrize("order", ["forward", "reverse", "random"])
@pytest.mark.parametrize("memory", ["strict", "ideal"])
def test_the_idle_persistent_grid(arch, name, order, memory):
    groups = CTAS[arch]
    arrays = {"marks": np.zeros(groups * (8 if name == "idle_uniform" else 1), np.int32)}
    if name != "idle":
        arrays["data"] = np.zeros(groups * 64, np.int32)
    if order == "random":
        order = random_order(groups, groups)
    got = same_with_and_without(IDLE, arch, name, arrays, grid=(groups,), block=(512,),
                                order=order, memory=memory)
    for key, want in idle_expected(name, groups).items():
        np.testing.assert_array_equal(got.outputs[key], want)
    assert got.counters["waves"] == 8 * groups and got.counters["workgroups"] == groups
    if name != "idle_uniform":  # LLVM's code: a compare, saveexec, a branch before any load
        assert private_prefix(assemble(IDLE, arch), name) >= 3


@pytest.mark.parametrize("arch", ARCHS)
def test_a_vector_instruction_that_writes_sgprs_wave_by_wave_stops_the_opening(arch, monkeypatch):
    """v_readfirstlane without the opening's form of it (opening.Rows.write_rows)
    writes its SGPR wave by wave, over the waves of its batch: the opening's rows
    have none to give (Rows.waves raises), so their classes stop before it,
    untouched, and the scheduler runs it; the launch is as without the opening."""
    monkeypatch.delattr(Rows, "write_rows")
    groups = 40
    arrays = {"marks": np.zeros(groups * 8, np.int32), "data": np.zeros(groups * 64, np.int32)}
    got = same_with_and_without(IDLE, arch, "idle_uniform", arrays, grid=(groups,), block=(512,))
    for key, want in idle_expected("idle_uniform", groups).items():
        np.testing.assert_array_equal(got.outputs[key], want)


# ---------------------------------------------------------------- (2) random private prefixes

EDGES = (0, 1, 2, 31, 32, 33, 63, 64, 0x7FFF, 0x8000, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000,
         0xFFFFFFFE, 0xFFFFFFFF)
COMPARES = {"eq": np.equal, "ne": np.not_equal, "ult": np.less, "ugt": np.greater,
            "ule": np.less_equal, "uge": np.greater_equal}
SIGNED_COMPARES = {"slt": np.less, "sgt": np.greater, "sle": np.less_equal, "sge": np.greater_equal}
U32, U64, M32 = np.uint32, np.uint64, 0xFFFFFFFF
BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "and": np.bitwise_and,
          "or": np.bitwise_or, "xor": np.bitwise_xor}
SHIFTS = {"shl": lambda a, b, bits: a << b, "lshr": lambda a, b, bits: a >> b,
          "ashr": lambda a, b, bits: (a.view(f"i{bits // 8}") >> b.astype(f"i{bits // 8}")).view(a.dtype)}


def compare(pred: str, a, b):
    if pred in SIGNED_COMPARES:
        return SIGNED_COMPARES[pred](a.view(np.int32), b.view(np.int32))
    return COMPARES[pred](a, b)


def ir_constant(value: int, bits: int = 32) -> str:
    return str(value - (1 << bits) if value >> (bits - 1) else value)


class Prefix:
    """Kernel `prefix(ptr out)`: its waves compute random values from their
    workgroup and work-item ids — uniform ones (SALU, 64-bit pairs, scalar
    branches), lane ones (VALU, compares, cndmask, exec-masked if/else) — while
    some workgroups return early (a uniform test) and some waves end (a test of
    the wave id); the others store every value: out[thread * width + j] (some
    lanes not: a lane test). `expected(out)` is the same in numpy over the
    launch's threads; `ir` the module."""

    def __init__(self, seed: int, grid, block, *, loops: bool = False, statements: int = 16,
                 loaded: bool = False, fault: bool = False):
        self.g = random.Random(seed)
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.block = tuple(block) + (1,) * (3 - len(block))
        self.threads, self.groups = int(np.prod(self.block)), int(np.prod(self.grid))
        self.count = self.groups * self.threads
        self.lines, self.values, self.n, self.label = [], {}, 0, "entry"
        self.loops, self.loaded = loops, loaded
        self.fault = fault  # one storing wave's stores go far past `out`: (workgroup, wave)
        self.live = np.ones(self.count, bool)  # threads of workgroups that have not returned
        thread, group = np.arange(self.count) % self.threads, np.arange(self.count) // self.threads
        pool = ([], [])  # uniform values, lane values
        for kind, linear, dims in (("workgroup", group, self.grid), ("workitem", thread, self.block)):
            ids = []
            for axis, stride in zip("xyz", (1, dims[0], dims[0] * dims[1])):
                if dims["xyz".index(axis)] > 1 or axis == "x":
                    ids.append((stride, self.emit(f"call i32 @llvm.amdgcn.{kind}.id.{axis}()",
                                                  linear // stride % dims["xyz".index(axis)], kind == "workgroup", pool)))
            total = ids[0][1]
            for stride, name in ids[1:]:
                scaled = self.emit(f"mul i32 {name}, {stride}", self.values[name] * U32(stride), kind == "workgroup")
                total = self.emit(f"add i32 {total}, {scaled}", self.values[total] + self.values[scaled],
                                  kind == "workgroup")
            if kind == "workgroup":
                self.wg = total
            else:
                self.tid = total
        if loaded:  # a kernel argument every value depends on: the kernel starts with its s_load
            self.values["%k"] = np.full(self.count, 0x5EED0000 + seed % 1000, U32)
            pool[0][:] = [self.emit(f"xor i32 {name}, %k", self.values[name] ^ self.values["%k"], True)
                          for name in pool[0]]
        self.wave = self.emit(f"lshr i32 {self.tid}, 6", self.values[self.tid] >> U32(6), False, pool)
        self.results = []
        for index in range(statements):
            if loops and index == statements // 2:  # at least one loop
                self.results.append(self.loop(pool))
                continue
            made = self.statement(pool, 0, exits=index < statements - 2, late=index > statements * 2 // 3)
            if made is not None:
                self.results.append(made)
        self.finish()

    # ------------------------------------------------------------ emission
    def emit(self, expr: str, value, uniform: bool, pool=None) -> str:
        self.n += 1
        name = f"%v{self.n}"
        self.lines.append(f"  {name} = {expr}")
        value = np.asarray(value)
        self.values[name] = np.broadcast_to(value.astype(U64 if value.dtype == U64 else U32), (self.count,))
        if pool is not None:
            pool[0 if uniform else 1].append(name)
        return name

    def start(self, label: str) -> None:
        self.lines.append(f"{label}:")
        self.label = label

    def operand(self, names: list, constants: float = 0.2) -> str:
        if not names or self.g.random() < constants:
            value = self.g.choice(EDGES) if self.g.random() < 0.5 else self.g.getrandbits(32)
            name = f"const{value}"
            self.values[name] = np.full(self.count, value, U32)
            return name
        return self.g.choice(names[-5:] if self.g.random() < 0.6 else names)

    def text(self, name: str) -> str:
        return ir_constant(int(name[5:])) if name.startswith("const") else name

    def operands(self, pool, uniform: bool) -> tuple[str, str]:
        """Two operands: both uniform (a SALU op), or at least one lane value."""
        a = self.operand(pool[0] if uniform else pool[1], 0.05)
        b = self.operand(pool[0] if uniform or self.g.random() < 0.4 else pool[1])
        return a, b

    # ------------------------------------------------------------ statements
    def statement(self, pool, depth: int, exits: bool, late: bool = False):
        roll = self.g.random()
        if roll < 0.15 and depth < 2:
            return self.branch(pool, depth)
        if roll < 0.21 and self.loops and depth == 0:
            return self.loop(pool)
        if roll < 0.25 and exits and depth == 0:
            return self.exit(pool)
        if roll < 0.28 and late:  # (late: the opening stops there)
            return self.first_lane(pool)
        return self.op(pool, self.g.random() < 0.55)

    def first_lane(self, pool) -> str:
        """A lane value of the wave's first lane (every lane active here): a
        uniform value from a VALU instruction that is not private."""
        a = self.operand(pool[1], 0)
        first = np.arange(self.count) // self.threads * self.threads + np.arange(self.count) % self.threads // 64 * 64
        return self.emit(f"call i32 @llvm.amdgcn.readfirstlane.i32(i32 {a})", self.values[a][first], True, pool)

    def op(self, pool, uniform: bool) -> str:
        a, b = self.operands(pool, uniform)
        x, y = self.values[a], self.values[b]
        a, b = self.text(a), self.text(b)
        kind = self.g.random()
        if kind < 0.4:
            op = self.g.choice(list(BINARY))
            return self.emit(f"{op} i32 {a}, {b}", BINARY[op](x, y), uniform, pool)
        if kind < 0.55:
            op = self.g.choice(list(SHIFTS))
            k = self.emit(f"and i32 {b}, 31", y & U32(31), uniform)
            return self.emit(f"{op} i32 {a}, {k}", SHIFTS[op](x, y & U32(31), 32), uniform, pool)
        if kind < 0.75:  # compare + select
            c, d = self.operands(pool, uniform)
            pred = self.g.choice([*COMPARES, *SIGNED_COMPARES])
            test = compare(pred, x, y)
            cond = self.emit(f"icmp {pred} i32 {a}, {b}", test, uniform)
            return self.emit(f"select i1 {cond}, i32 {self.text(c)}, i32 {self.text(d)}",
                             np.where(test, self.values[c], self.values[d]), uniform, pool)
        # 64-bit: extend both, one op, the low or the high half back
        wide = []
        for name, value in ((a, x), (b, y)):
            if self.g.random() < 0.5:
                wide.append((self.emit(f"zext i32 {name} to i64", value.astype(U64), uniform), value.astype(U64)))
            else:
                signed = value.view(np.int32).astype(np.int64).view(U64)
                wide.append((self.emit(f"sext i32 {name} to i64", signed, uniform), signed))
        (pa, wa), (pb, wb) = wide
        if self.g.random() < 0.35:
            op = self.g.choice(list(SHIFTS))
            k = self.emit(f"and i64 {pb}, 63", wb & U64(63), uniform)
            r = SHIFTS[op](wa, wb & U64(63), 64)
        else:
            op, k = self.g.choice(list(BINARY)), pb
            r = BINARY[op](wa, wb)
        r64 = self.emit(f"{op} i64 {pa}, {k}", r, uniform)
        if self.g.random() < 0.5:
            return self.emit(f"trunc i64 {r64} to i32", r.astype(U32), uniform, pool)
        hi = self.emit(f"lshr i64 {r64}, 32", r >> U64(32), uniform)
        return self.emit(f"trunc i64 {hi} to i32", (r >> U64(32)).astype(U32), uniform, pool)

    def condition(self, pool, uniform: bool) -> tuple[str, np.ndarray]:
        a = self.operand(pool[0] if uniform else pool[1], 0)
        b = self.operand(pool[0] if uniform else pool[1], 0.6)
        if self.g.random() < 0.5:  # a few low bits: both sides taken somewhere
            b = self.emit(f"and i32 {self.text(b)}, 3", self.values[b] & U32(3), uniform)
            a = self.emit(f"and i32 {self.text(a)}, 3", self.values[a] & U32(3), uniform)
        pred = self.g.choice([*COMPARES, *SIGNED_COMPARES])
        test = compare(pred, self.values[a], self.values[b])
        return self.emit(f"icmp {pred} i32 {self.text(a)}, {self.text(b)}", test, uniform), test

    def side(self, pool, depth: int, label: str) -> tuple[str, str]:
        """A branch's 2-4 statements (values scoped to it) xor-ed into one value,
        and the label it ends in."""
        self.start(label)
        inner = (list(pool[0]), list(pool[1]))
        made = [self.statement(inner, depth + 1, False) for _ in range(self.g.randint(2, 4))]
        folded = made[0]
        for m in made[1:]:
            folded = self.emit(f"xor i32 {folded}, {m}", self.values[folded] ^ self.values[m],
                               folded in inner[0] and m in inner[0], inner)
        return folded, self.label

    def branch(self, pool, depth: int) -> str:
        uniform = self.g.random() < 0.5
        cond, test = self.condition(pool, uniform)
        k = self.n
        self.lines.append(f"  br i1 {cond}, label %then{k}, label %else{k}")
        then, then_end = self.side(pool, depth, f"then{k}")
        self.lines.append(f"  br label %join{k}")
        other, other_end = self.side(pool, depth, f"else{k}")
        self.lines.append(f"  br label %join{k}")
        self.start(f"join{k}")
        return self.emit(f"phi i32 [ {then}, %{then_end} ], [ {other}, %{other_end} ]",
                         np.where(test, self.values[then], self.values[other]), uniform, pool)

    def loop(self, pool) -> str:
        """acc = (acc * m ^ acc >> s) + i for i < 1..4 trips (uniform or per lane)."""
        uniform = self.g.random() < 0.5
        start, count = self.operands(pool, uniform)
        trips = (self.values[count] & U32(3)) + U32(1)
        trip = self.emit(f"and i32 {self.text(count)}, 3", trips - U32(1), uniform)
        trip = self.emit(f"add i32 {trip}, 1", trips, uniform)
        k, before = self.n, self.label
        m, s = self.g.choice((3, 5, 0x9E3779B1)), self.g.randint(1, 13)
        self.lines.append(f"  br label %loop{k}")
        self.start(f"loop{k}")
        self.lines += [f"  %i{k} = phi i32 [ 0, %{before} ], [ %i{k}.next, %loop{k} ]",
                       f"  %acc{k} = phi i32 [ {self.text(start)}, %{before} ], [ %acc{k}.next, %loop{k} ]",
                       f"  %acc{k}.m = mul i32 %acc{k}, {ir_constant(m)}",
                       f"  %acc{k}.s = lshr i32 %acc{k}, {s}",
                       f"  %acc{k}.x = xor i32 %acc{k}.m, %acc{k}.s",
                       f"  %acc{k}.next = add i32 %acc{k}.x, %i{k}",
                       f"  %i{k}.next = add i32 %i{k}, 1",
                       f"  %more{k} = icmp ult i32 %i{k}.next, {trip}",
                       f"  br i1 %more{k}, label %loop{k}, label %after{k}"]
        self.start(f"after{k}")
        acc = self.values[start].copy()
        for i in range(4):
            acc = np.where(U32(i) < trips, ((acc * U32(m)) ^ (acc >> U32(s))) + U32(i), acc)
        return self.emit(f"add i32 %acc{k}.next, 0", acc, uniform, pool)

    def exit(self, pool) -> None:
        """About one workgroup in eight returns here: (wg * m + a value) & 7 == r,
        a uniform test (their waves end in the opening)."""
        value = self.operand(pool[0], 0)
        m = self.g.choice((1, 3, 5))
        scaled = self.emit(f"mul i32 {self.wg}, {m}", self.values[self.wg] * U32(m), True)
        mixed = self.emit(f"add i32 {scaled}, {self.text(value)}", self.values[scaled] + self.values[value], True)
        low = self.emit(f"and i32 {mixed}, 7", self.values[mixed] & U32(7), True)
        lows = self.values[low][self.live]  # the test of a live workgroup's: some go on
        r = int(self.g.choice(lows)) if len(set(lows.tolist())) > 1 else (int(lows[0]) + 1) % 8
        cond = self.emit(f"icmp eq i32 {low}, {r}", self.values[low] == r, True)
        k = self.n
        self.lines.append(f"  br i1 {cond}, label %exit, label %on{k}")
        self.live &= self.values[cond] == 0
        self.start(f"on{k}")

    def finish(self) -> None:
        """Waves of a wave-id test (and of every result's hash, so that all are
        computed before the branch) store every result; a lane test drops lanes."""
        h = self.results[0]
        for r in self.results[1:]:
            h = self.emit(f"xor i32 {h}, {r}", self.values[h] ^ self.values[r], False)
        fingerprint = self.g.getrandbits(32)
        hashed = self.emit(f"icmp ne i32 {h}, {ir_constant(fingerprint)}", self.values[h] != fingerprint, False)
        a, b = self.g.choice((3, 5, 7)), self.g.choice((1, 2, 3))
        spread = self.emit(f"mul i32 {self.wg}, {b}", self.values[self.wg] * U32(b), True)
        mixed = self.emit(f"mul i32 {self.wave}, {a}", self.values[self.wave] * U32(a), False)
        mixed = self.emit(f"add i32 {mixed}, {spread}", self.values[mixed] + self.values[spread], False)
        pick = self.emit(f"and i32 {mixed}, 3", self.values[mixed] & U32(3), False)
        go = self.emit(f"icmp ne i32 {pick}, 0", self.values[pick] != 0, False)
        go = self.emit(f"and i1 {go}, {hashed}", self.values[go] & self.values[hashed], False)
        if self.g.random() < 0.4:
            lane = self.emit(f"urem i32 {self.tid}, 5", self.values[self.tid] % U32(5), False)
            keep = self.emit(f"icmp ne i32 {lane}, 3", self.values[lane] != 3, False)
            go = self.emit(f"and i1 {go}, {keep}", self.values[go] & self.values[keep], False)
        self.lines.append(f"  br i1 {go}, label %store, label %exit")
        self.start("store")
        self.stored = self.live & self.values[go].astype(bool)
        row = self.emit(f"mul i32 {self.wg}, {self.threads}", self.values[self.wg] * U32(self.threads), True)
        thread = self.emit(f"add i32 {row}, {self.tid}", self.values[row] + self.values[self.tid], False)
        base = self.emit(f"mul i32 {thread}, {len(self.results)}", self.values[thread] * U32(len(self.results)), False)
        if self.fault:
            thread = self.g.choice(np.flatnonzero(self.stored).tolist())
            group, wave = int(self.values[self.wg][thread]), int(self.values[self.wave][thread])
            self.fault = group, wave
            hit = (self.values[self.wg] == group) & (self.values[self.wave] == wave)
            here = self.emit(f"icmp eq i32 {self.wg}, {group}", self.values[self.wg] == group, True)
            there = self.emit(f"icmp eq i32 {self.wave}, {wave}", self.values[self.wave] == wave, False)
            both = self.emit(f"and i1 {here}, {there}", hit, False)
            far = self.emit(f"select i1 {both}, i32 {1 << 28}, i32 0", np.where(hit, U32(1 << 28), U32(0)), False)
            base = self.emit(f"add i32 {base}, {far}", self.values[base] + self.values[far], False)
        for j, r in enumerate(self.results):
            at = self.emit(f"add i32 {base}, {j}", self.values[base] + U32(j), False)
            self.lines += [f"  %p{j} = getelementptr i32, ptr addrspace(1) %out, i32 {at}",
                           f"  store i32 {r}, ptr addrspace(1) %p{j}"]
        self.lines.append("  br label %exit")

    @property
    def ir(self) -> str:
        args = "ptr addrspace(1) %out" + (", i32 %k" if self.loaded else "")
        declares = "".join(f"declare i32 @llvm.amdgcn.{kind}.id.{axis}()\n"
                           for kind in ("workgroup", "workitem") for axis in "xyz")
        declares += "declare i32 @llvm.amdgcn.readfirstlane.i32(i32)\n"
        return module(f"define amdgpu_kernel void @prefix({args}) #1 {{\nentry:\n"
                      + "\n".join(self.lines) + "\nexit:\n  ret void\n}\n" + declares
                      + 'attributes #1 = { "amdgpu-flat-work-group-size"="1,1024" }\n')

    SENTINEL = 0xA5A5A5A5

    def arrays(self) -> dict:
        return {"out": np.full(self.count * len(self.results), self.SENTINEL, U32)}

    def expected(self) -> np.ndarray:
        table = np.stack([self.values[r] for r in self.results], axis=1).astype(U32)
        return np.where(self.stored[:, None], table, U32(self.SENTINEL)).reshape(-1)


# (grid, block): partial last waves (200, 96 = 3-D 8x4x3, 1 thread), one-wave and
# sixteen-wave workgroups, 3-D grids (workgroup ids y and z)
GEOMETRIES = [((6,), (200,)), ((4, 3, 2), (8, 4, 3)), ((11,), (64,)), ((3,), (1024,)),
              ((5, 2), (1,)), ((2, 2, 3), (16, 16, 2)), ((7,), (320,)), ((3, 5), (130,))]


# what LLVM emits for such IR that the emulator does not model (yet): a kernel
# holding one is generated again from the next variant of its seed
UNMODELLED = ("v_bitop3", "v_mad_legacy")


def prefix_case(seed: int, arch: str, **options) -> tuple[Prefix, str]:
    """The seed's kernel (its geometry from GEOMETRIES) and its asm for `arch`:
    the first variant with at least 12 private instructions before its first
    other one (an early 64-bit VALU carry can end it) and none of UNMODELLED."""
    grid, block = GEOMETRIES[seed % len(GEOMETRIES)]
    for variant in range(40):
        case = Prefix(seed * 1000 + variant, grid, block, **options)
        asm = assemble(case.ir, arch)
        if not any(m in asm for m in UNMODELLED) and (case.loaded or private_prefix(asm, "prefix") >= 12):
            return case, asm
    raise AssertionError(f"seed {seed}: no variant without {UNMODELLED} and a private prefix")


def check_prefix(case: Prefix, arch: str, seed: int, scalars=None):
    g = random.Random(seed)
    order = g.choice(["forward", "reverse", random_order(case.groups, seed)])
    memory = g.choice(["strict", "ideal"])
    got = same_with_and_without(case.ir, arch, "prefix", case.arrays(), grid=case.grid, block=case.block,
                                order=order, memory=memory, scalars=scalars)
    assert got.error is None, got.error
    np.testing.assert_array_equal(got.outputs["out"], case.expected())
    waves = -(-case.threads // 64)
    assert got.counters["waves"] == case.groups * waves and got.counters["workgroups"] == case.groups
    return got


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("seed", range(16))
def test_a_random_private_prefix(arch, seed):
    case, asm = prefix_case(seed, arch)
    assert private_prefix(asm, "prefix") >= 12  # LLVM kept the work before the first load
    got = check_prefix(case, arch, seed)
    assert 0 < case.stored.sum() < case.count or seed % len(GEOMETRIES) == 4  # some waves end, some store
    assert got.counters["bytes_written"]["out"] == 4 * len(case.results) * case.stored.sum()


def test_random_prefixes_cover_the_private_forms():
    """Over the seeds, LLVM's code for the prefixes holds what the opening runs:
    scalar branches, exec-masked if/else, compares to SGPR masks and SCC, selects
    both ways, 64-bit SALU and VALU arithmetic."""
    seen = set()
    for seed, arch in itertools.product(range(16), ARCHS):
        _, asm = prefix_case(seed, arch)
        kernel = asm_text.parse_kernel(asm, "prefix")
        seen |= {ins.mnemonic for ins in kernel.instructions[:private_prefix(asm, "prefix")]}
    wanted = {"s_cbranch_scc0", "s_cbranch_scc1", "s_cbranch_execz", "s_and_saveexec_b64",
              "s_cselect_b32", "s_cmp_lg_u32", "s_lshl_b64", "s_mul_i32", "s_mul_hi_u32",
              "s_add_u32", "s_addc_u32", "s_xor_b32", "s_ashr_i32", "v_cndmask_b32_e64",
              "v_add_u32_e32", "v_mul_lo_u32", "v_lshlrev_b32_e32", "v_xor_b32_e32"}
    assert wanted <= seen, sorted(wanted - seen)
    assert any(m.startswith("v_cmp_") for m in seen) and any(m.startswith("s_cmp_") for m in seen)


# ---------------------------------------------------------------- (3) a load first, (4) loops


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("seed", [3, 6])
def test_a_kernel_whose_first_instruction_is_a_load(arch, seed):
    """K2-like: a kernel argument the prefix uses: s_load first, nothing private
    before it (the opening has nothing to run; the launch is as it was)."""
    case, asm = prefix_case(seed, arch, loaded=True)
    assert asm_text.parse_kernel(asm, "prefix").instructions[0].mnemonic.startswith("s_load")
    check_prefix(case, arch, seed, scalars={"k": int(case.values["%k"][0])})


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("seed", [20, 21, 22, 23])
def test_a_prefix_with_loops(arch, seed):
    """Uniform and per-lane loops (a backward branch: the opening stops there)."""
    case, _ = prefix_case(seed, arch, loops=True, statements=20)
    assert any(line.startswith("loop") for line in case.lines)
    check_prefix(case, arch, seed)


# ---------------------------------------------------------------- every SALU op, hand-written

# s[0:1] the kernarg pointer, s2 the workgroup id, v0 the work-item id (testing.handwritten);
# v1-v7 and s3-s7 the epilogue's. Per-wave scalar values: compare masks of lane values
# (vcc, s[8:9]) and what SALU makes of them and of the workgroup id.
SCALAR_SEEDS = """
\tv_mul_u32_u24_e32 v1, 7, v0
\tv_xor_b32_e32 v1, s2, v1
\tv_and_b32_e32 v1, 15, v1
\tv_cmp_lt_u32_e32 vcc, 5, v1
\tv_cmp_gt_u32_e64 s[8:9], 90, v0
\tv_mad_u32_u24 v2, v0, 3, v1
\ts_mul_i32 s10, s2, 0x9e3779b1
\ts_add_u32 s11, s10, 0x1234567
\ts_bcnt1_i32_b64 s12, vcc
\ts_xor_b32 s13, s8, s10
\ts_mov_b64 s[14:15], s[8:9]
\ts_xor_b64 s[16:17], vcc, s[10:11]
\ts_lshl_b32 s18, s12, 26
\ts_setprio 2
\ts_sub_u32 s19, s18, s2
\ts_nop 3
\ts_xor_b32 m0, s13, s19"""
POOL32 = [f"s{i}" for i in range(10, 20)] + ["vcc_lo", "vcc_hi", "exec_lo", "exec_hi", "m0"]
POOL64 = ["s[8:9]", "s[10:11]", "s[14:15]", "s[16:17]", "s[18:19]", "vcc", "exec"]
INLINE = ["0", "1", "-1", "7", "31", "32", "63", "64", "-16", "0x80000000", "0xffff", "0x12345678",
          "0xfffffffe", "0x7fffffff"]
SOPK = {"s_movk_i32", "s_addk_i32", "s_mulk_i32"}


class ScalarOps:
    """A hand-written prefix running salu.SOP's ops (every one, twice, on random
    sources), the scalar compares, saveexec/wrexec and forward branches that part
    the waves, each result moved into its own VGPR (SCC added into it), then
    stored: out[thread * width + j]."""

    def __init__(self, seed: int, ops: list[str]):
        self.g = random.Random(seed)
        self.lines = [SCALAR_SEEDS]
        self.width = 0
        self.dst = 20
        for name in ops:
            for _ in range(2):
                self.sop(name)
        for relation in ("eq", "lg", "gt", "ge", "lt", "le"):
            for kind in ("u32", "i32"):
                self.compare(f"s_cmp_{relation}_{kind}", self.source(32), self.source(32))
                self.compare(f"s_cmpk_{relation}_{kind}", self.g.choice(POOL32[:10]), hex(self.g.getrandbits(16)))
        for name in ("s_cmp_eq_u64", "s_cmp_lg_u64"):
            self.compare(name, self.source(64), self.g.choice([self.source(64), "0"]))
        for name in ("s_bitcmp0_b32", "s_bitcmp1_b32", "s_bitcmp0_b64", "s_bitcmp1_b64"):
            self.compare(name, self.source(int(name[-2:])), self.source(32))
        for op in salu.SAVEEXEC:
            self.saveexec(f"s_{op}_saveexec_b64")
        for name in ("s_andn1_wrexec_b64", "s_andn2_wrexec_b64"):
            self.saveexec(name)
        self.lanes()
        self.branches()

    def source(self, bits: int) -> str:
        roll = self.g.random()
        if roll < 0.25:
            return self.g.choice(INLINE)
        if roll < 0.35:
            return hex(self.g.getrandbits(32))
        return self.g.choice(POOL32 if bits == 32 else POOL64)

    def keep(self, register: int, scc: bool = True) -> None:
        """v[8 + j] = s[register] (+ SCC)."""
        if scc:
            self.lines.append(f"\ts_addc_u32 s{register}, s{register}, 0")
        self.lines.append(f"\tv_mov_b32_e32 v{8 + self.width}, s{register}")
        self.width += 1

    def destination(self, bits: int) -> int:
        self.dst = self.dst + (self.dst % 2 if bits == 64 else 0)
        if self.dst + bits // 32 > 100:
            self.dst = 20
        d, self.dst = self.dst, self.dst + bits // 32
        return d

    def sop(self, name: str) -> None:
        dst_bits, src_bits, _ = salu.SOP[name]
        self.compare("s_cmp_lt_u32", self.source(32), self.source(32), keep=False)  # an SCC to read
        d = self.destination(dst_bits)
        dst = f"s{d}" if dst_bits == 32 else f"s[{d}:{d + 1}]"
        if name in salu.READS_DESTINATION:  # the destination's old value: a source
            self.lines.append(f"\ts_mov_b{dst_bits} {dst}, {self.source(dst_bits)}")
            src_bits = src_bits[1:]
        sources = [hex(self.g.getrandbits(16)) if name in SOPK else self.source(bits) for bits in src_bits]
        self.lines.append(f"\t{name} {dst}, {', '.join(sources)}")
        self.keep(d)
        if dst_bits == 64:
            self.keep(d + 1, scc=False)

    def compare(self, name: str, a: str, b: str, keep: bool = True) -> None:
        self.lines.append(f"\t{name} {a}, {b}")
        if keep:
            d = self.destination(32)
            self.lines.append(f"\ts_cselect_b32 s{d}, {self.source(32)}, {self.source(32)}")
            self.keep(d, scc=False)

    def saveexec(self, name: str) -> None:
        """exec = op(source, exec) for a while: a VGPR move under it writes its
        lanes, a compare's mask holds them only."""
        d, m = self.destination(64), self.destination(64)
        self.lines += ["\ts_mov_b64 s[6:7], exec", f"\t{name} s[{d}:{d + 1}], {self.g.choice(POOL64[:6])}",
                       f"\tv_cmp_gt_u32_e64 s[{m}:{m + 1}], {self.g.choice(POOL32[:10])}, v2"]
        self.keep(d, scc=True)  # the lanes of the new exec only
        self.lines.append("\ts_mov_b64 exec, s[6:7]")
        self.keep(d + 1, scc=False)
        self.keep(m, scc=False)
        self.keep(m + 1, scc=False)

    def lanes(self) -> None:
        """VALU reading the waves' own SGPRs and masks; AGPRs; a compare's mask
        of lanes that differ per wave, then counted by SALU."""
        m, c = self.destination(64), self.destination(32)
        v = 8 + self.width
        self.lines += [f"\tv_cndmask_b32_e64 v{v}, s13, v2, s[8:9]",
                       f"\tv_add_u32_e32 v{v + 1}, s12, v{v}",
                       f"\tv_accvgpr_write_b32 a1, v{v + 1}",
                       f"\tv_xor_b32_e32 v{v + 2}, s19, v0",
                       f"\tv_cmp_gt_u32_e64 s[{m}:{m + 1}], v{v + 2}, v{v}",
                       "\ts_nop 4",
                       f"\tv_accvgpr_read_b32 v{v + 3}, a1",
                       f"\tv_cndmask_b32_e64 v{v + 4}, v{v + 3}, s11, s[{m}:{m + 1}]",
                       f"\ts_bcnt1_i32_b64 s{c}, s[{m}:{m + 1}]"]
        self.width += 5
        self.keep(c)

    def branches(self) -> None:
        """Forward branches on SCC, VCC and EXEC that waves take differently."""
        d = self.destination(32)
        self.lines += [f"\ts_mov_b32 s{d}, s13",
                       "\ts_cmp_lt_u32 s12, 40", "\ts_cbranch_scc1 .Lscc1", f"\ts_add_u32 s{d}, s{d}, 3",
                       ".Lscc1:", "\ts_cbranch_scc0 .Lscc0", f"\ts_mul_i32 s{d}, s{d}, 5",
                       ".Lscc0:", "\ts_cbranch_vccz .Lvccz", f"\ts_xor_b32 s{d}, s{d}, 0x55",
                       ".Lvccz:", "\ts_cbranch_vccnz .Lvccnz", f"\ts_lshl_b32 s{d}, s{d}, 1",
                       ".Lvccnz:", "\ts_mov_b64 s[6:7], exec", "\ts_and_saveexec_b64 s[4:5], s[8:9]",
                       "\ts_cbranch_execz .Lexecz", f"\ts_add_u32 s{d}, s{d}, 0x100",
                       ".Lexecz:", "\ts_cbranch_execnz .Lexecnz", f"\ts_add_u32 s{d}, s{d}, 0x10000",
                       ".Lexecnz:", "\ts_mov_b64 exec, s[6:7]", "\ts_branch .Lend", f"\ts_mov_b32 s{d}, 0",
                       ".Lend:"]
        self.keep(d, scc=True)

    def body(self, threads: int) -> str:
        stores = [f"\tglobal_store_dwordx4 v1, v[{8 + j}:{11 + j}], s[0:1] offset:{4 * j}"
                  for j in range(0, self.width - self.width % 4, 4)]
        stores += [f"\tglobal_store_dword v1, v{8 + j}, s[0:1] offset:{4 * j}"
                   for j in range(self.width - self.width % 4, self.width)]
        return "\n".join([*self.lines, "\ts_load_dwordx2 s[0:1], s[0:1], 0x0", f"\ts_mul_i32 s3, s2, {threads}",
                          "\tv_add_u32_e32 v1, s3, v0", f"\tv_mul_u32_u24_e32 v1, {4 * self.width}, v1",
                          "\ts_waitcnt lgkmcnt(0)", *stores, "\ts_waitcnt vmcnt(0)"])


def wide_handwritten(arch: str, body: str) -> str:
    """testing.handwritten's kernel with every VGPR and SGPR the body names (and 8 AGPRs)."""
    return (handwritten(arch, body).replace(".amdhsa_next_free_vgpr 32", ".amdhsa_next_free_vgpr 264")
            .replace(".amdhsa_accum_offset 32", ".amdhsa_accum_offset 256")
            .replace(".amdhsa_next_free_sgpr 16", ".amdhsa_next_free_sgpr 102"))


SOP_NAMES = sorted(salu.SOP)
SOP_PARTS = [SOP_NAMES[i::3] for i in range(3)]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("part", range(len(SOP_PARTS)))
def test_every_salu_op_in_a_private_prefix(arch, part):
    ops = ScalarOps(part, SOP_PARTS[part])
    assert ops.width <= 248
    asm = wide_handwritten(arch, ops.body(160))
    assert not hazards.find_hazards(asm_text.parse_kernel(asm, "hand"), arch, 256)  # nothing checked, stops
    assert private_prefix(asm, "hand") > 200
    arrays = {"out": np.full(5 * 160 * ops.width, 0xA5A5A5A5, np.uint32)}
    got = same_with_and_without(asm, arch, "hand", arrays, grid=(5,), block=(160,),  # the third wave: 32 lanes
                                order=random_order(5, part))
    assert got.error is None, got.error
    out = got.outputs["out"].reshape(5, 160, ops.width)
    assert (out != 0xA5A5A5A5).all()  # every thread stored every result
    # the waves computed differently (a per-wave mask, exec), the lanes alike except under saveexec
    assert len({out[g, 64 * w].tobytes() for g in range(5) for w in range(3)}) >= 10


def test_the_salu_prefixes_cover_the_table():
    covered = set().union(*SOP_PARTS)
    assert covered == set(salu.SOP)


# Waves whose SGPRs are alike but SCC or exec are not (the last wave of 160
# threads has 32 lanes): a scalar instruction run once for alike waves must see
# both. out[thread * 4 + j] = (bcnt(exec) + wg, SCC select, SCC carry, exec's high half
# as saveexec saved it, picked by the SCC saveexec set).
SCC_AND_EXEC = """
\ts_bcnt1_i32_b64 s20, exec
\ts_add_u32 s20, s20, s2
\tv_cmp_gt_u32_e32 vcc, 100, v0
\ts_cmp_lg_u64 vcc, 0
\ts_mov_b64 vcc, 0
\ts_cselect_b32 s21, 7, 9
\ts_addc_u32 s22, s2, 0x100
\ts_and_saveexec_b64 s[24:25], -1
\ts_cselect_b32 s23, s25, s24
\ts_load_dwordx2 s[4:5], s[0:1], 0x0
\ts_mul_i32 s3, s2, 0xa00
\tv_lshlrev_b32_e32 v5, 4, v0
\tv_add_u32_e32 v5, s3, v5
\tv_mov_b32_e32 v6, s20
\tv_mov_b32_e32 v7, s21
\tv_mov_b32_e32 v8, s22
\tv_mov_b32_e32 v9, s23
\ts_waitcnt lgkmcnt(0)
\tglobal_store_dwordx4 v5, v[6:9], s[4:5]
\ts_waitcnt vmcnt(0)"""


@pytest.mark.parametrize("arch", ARCHS)
def test_scc_and_exec_are_scalar_state_too(arch):
    asm = handwritten(arch, SCC_AND_EXEC)
    assert private_prefix(asm, "hand") == 9
    got = same_with_and_without(asm, arch, "hand", {"out": np.zeros(4 * 160 * 4, np.uint32)}, grid=(4,),
                                block=(160,))
    assert got.error is None, got.error
    wg, wave = np.arange(4)[:, None], np.arange(160)[None, :] // 64
    lanes = np.where(wave == 2, 32, 64)
    scc = wave < 2  # vcc = v0 < 100: lanes in waves 0 and 1
    exec_high = np.where(wave == 2, 0, 0xFFFFFFFF)
    want = np.stack(np.broadcast_arrays(lanes + wg, np.where(scc, 7, 9), wg + 0x100 + scc, exec_high), axis=-1)
    np.testing.assert_array_equal(got.outputs["out"].reshape(4, 160, 4), want.astype(np.uint32))


# ---------------------------------------------------------------- (6) errors after a private prefix

# per-wave, per-workgroup scalar state from lane compares: then the wave's
# threshold mask vcc = v0 < 40 * workgroup (zero in the waves past it)
HAND_PREFIX = """
\tv_mul_u32_u24_e32 v1, 7, v0
\tv_xor_b32_e32 v1, s2, v1
\tv_and_b32_e32 v1, 15, v1
\tv_cmp_lt_u32_e64 s[8:9], 5, v1
\ts_mul_i32 s10, s2, 0x9e3779b1
\ts_bcnt1_i32_b64 s12, s[8:9]
\ts_xor_b32 s13, s12, s10
\tv_add_u32_e32 v2, s13, v0
\ts_mul_i32 s14, s2, 40
\tv_cmp_gt_u32_e32 vcc, s14, v0"""

HAND_ERRORS = {
    # the waves with no lane under the threshold skip the s_nop: a DPP read 1 wait state
    # after the VALU write (the hazard check follows the path each wave took)
    "HazardError": HAND_PREFIX + """
\tv_mov_b32_e32 v4, v2
\ts_cbranch_vccz .Lskip
\ts_nop 1
.Lskip:
\tv_mov_b32_dpp v5, v4 quad_perm:[1,0,3,2] row_mask:0xf bank_mask:0xf""",
    # workgroup 2 only: a compare's SGPR mask read 1 wait state after it
    "HazardError sgpr": HAND_PREFIX + """
\ts_cmp_eq_u32 s2, 2
\tv_cmp_eq_u32_e64 s[4:5], v1, 3
\ts_cbranch_scc1 .Lshort
\ts_nop 0
.Lshort:
\tv_cndmask_b32_e64 v4, 0, 1, s[4:5]""",
    # an instruction the emulator does not implement, reached by the waves under the threshold
    "UnsupportedInstruction": HAND_PREFIX + """
\ts_cbranch_vccz .Lfine
\tv_frobnicate_b32 v1, v1, v2
.Lfine:""",
    # ... a scalar one (not implemented; an operand it does not take)
    "UnsupportedInstruction salu": HAND_PREFIX + """
\ts_cbranch_vccz .Lfine
\ts_frobnicate_b32 s10, s2
.Lfine:""",
    "UnsupportedInstruction operand": HAND_PREFIX + """
\ts_cbranch_vccz .Lfine
\ts_add_u32 s10, v1, s2
.Lfine:""",
    # workgroup 3 reads the loaded SGPR before the s_waitcnt that covers it
    "ScoreboardError": HAND_PREFIX + """
\ts_load_dword s20, s[0:1], 0x0
\ts_cmp_eq_u32 s2, 3
\ts_cbranch_scc0 .Lwait
\ts_add_u32 s21, s20, 1
.Lwait:
\ts_waitcnt lgkmcnt(0)""",
}
WHO = r"workgroup \d+ wave \d+"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("error", list(HAND_ERRORS))
@pytest.mark.parametrize("order", ["forward", "reverse", "random"])
def test_a_hand_written_error_after_a_private_prefix(arch, error, order):
    asm = handwritten(arch, HAND_ERRORS[error])
    got = same_with_and_without(asm, arch, "hand", {"out": np.zeros(64, np.uint32)}, grid=(5,), block=(256,),
                                order=random_order(5, 7) if order == "random" else order)
    assert got.error is not None and got.error[0] == error.split()[0], got.error
    assert error == "ScoreboardError" or re.search(WHO, got.error[1]), got.error[1]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("seed", [1, 5])
def test_a_store_that_faults_after_a_random_prefix(arch, seed):
    case, _ = prefix_case(seed, arch, fault=True)
    got = same_with_and_without(case.ir, arch, "prefix", case.arrays(), grid=case.grid, block=case.block,
                                order="reverse")
    assert got.error is not None and got.error[0] == "MemoryFault", got.error
    assert "workgroup {} wave {}".format(*case.fault) in got.error[1], (case.fault, got.error)


# A wave of workgroup 4 waits for a flag workgroup 5 raises (WAIT, below) or
# does not (STUCK: with s_sleep a deadlock, without it the wave-instruction
# limit) after private arithmetic; the other waves store theirs.
WAIT = module("""
define amdgpu_kernel void @stuck(ptr addrspace(1) %flag, ptr addrspace(1) %out) #0 {
entry:
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %wg = call i32 @llvm.amdgcn.workgroup.id.x()
  %wave = lshr i32 %tid, 6
  %h = mul i32 %wg, -1640531535
  %x = xor i32 %h, %tid
  %s = lshr i32 %x, 7
  %y = add i32 %x, %s
  %wg1 = and i32 %wg, 3
  %which = add i32 %wg1, 1
  %late = icmp eq i32 %wg, 4
  %mine = icmp eq i32 %wave, %which
  %waiter = and i1 %late, %mine
  %z = mul i32 %y, %s
  %odd = icmp ne i32 %z, 1234567
  br i1 %odd, label %go, label %done
go:                                   ; (always: the kernarg load comes after the prefix)
  br i1 %waiter, label %wait, label %work
wait:
  %f = load atomic i32, ptr addrspace(1) %flag syncscope("agent") monotonic, align 4
  %up = icmp ne i32 %f, 0
  br i1 %up, label %done, label %nap
nap:
  call void @llvm.amdgcn.s.sleep(i32 2)
  br label %wait
work:
  %row = mul i32 %wg, 512
  %at = add i32 %row, %tid
  %p = getelementptr i32, ptr addrspace(1) %out, i32 %at
  store i32 %y, ptr addrspace(1) %p
  %last = icmp eq i32 %wg, 5
  %lane0 = icmp eq i32 %tid, 0
  %raise = and i1 %last, %lane0
  br i1 %raise, label %release, label %done
release:
  fence syncscope("agent") release
  store atomic i32 RAISE, ptr addrspace(1) %flag syncscope("agent") monotonic, align 4
  br label %done
done:
  ret void
}
declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.workgroup.id.x()
declare void @llvm.amdgcn.s.sleep(i32)
""")
STUCK, WAIT = WAIT.replace("RAISE", "0"), WAIT.replace("RAISE", "1")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kind,quantum", [("deadlock", 256), ("limit", 256), ("limit", 37)])
@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_waiting_forever_after_a_private_prefix(arch, kind, quantum, order):
    ir, options = STUCK, {"stall_rounds": 40}
    if kind == "limit":  # spinning without sleep: the limit counts the prefixes' instructions too,
        # and where the spinning wave is when it trips shows how many its quanta held
        ir = STUCK.replace("  call void @llvm.amdgcn.s.sleep(i32 2)\n", "")
        options = {"max_wave_instructions": 30_000, "quantum": quantum}
    assert private_prefix(assemble(ir, arch), "stuck") >= 5
    arrays = {"flag": np.zeros(1, np.int32), "out": np.zeros(6 * 512, np.uint32)}
    got = same_with_and_without(ir, arch, "stuck", arrays, grid=(6,), block=(512,), order=order, **options)
    assert got.error is not None and got.error[0] == "Deadlock", got.error
    assert "workgroup 4 wave 1" in got.error[1]
    if kind == "limit":
        assert "more than 30,000 wave-instructions" in got.error[1]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_polls_after_a_private_prefix(arch, order):
    """The waiting wave's polls (Stats.polls) are as many with the opening."""
    arrays = {"flag": np.zeros(1, np.int32), "out": np.zeros(6 * 512, np.uint32)}
    got = same_with_and_without(WAIT, arch, "stuck", arrays, grid=(6,), block=(512,), order=order)
    assert got.error is None, got.error
    tid, wg = np.arange(512, dtype=np.uint32), np.arange(6, dtype=np.uint32)[:, None]
    x = (wg * U32(2654435761)) ^ tid
    want = x + (x >> U32(7))
    want[4, 64:128] = 0  # the waiting wave stores nothing
    np.testing.assert_array_equal(got.outputs["out"].reshape(6, 512), want)
    assert set(got.counters["polls"]) == {(4, 1)}
    if order == "forward":  # workgroup 4 started first, waited for 5
        assert got.counters["polls"][(4, 1)] > 0


# ---------------------------------------------------------------- the clock, a trace, timing mode

# each wave stores the clock it reads after a private prefix (s_memtime: in
# functional mode the wave-instructions the machine executed so far) and its pc
CLOCK = HAND_PREFIX + """
\t{clock} s[20:21]
\ts_getpc_b64 s[22:23]
\ts_load_dwordx2 s[4:5], s[0:1], 0x0
\ts_mul_i32 s3, s2, 4096
\tv_lshlrev_b32_e32 v5, 4, v0
\tv_add_u32_e32 v5, s3, v5
\ts_waitcnt lgkmcnt(0)
\tv_mov_b32_e32 v6, s20
\tv_mov_b32_e32 v7, s21
\tv_mov_b32_e32 v8, s22
\tv_mov_b32_e32 v9, s23
\tglobal_store_dwordx4 v5, v[6:9], s[4:5]
\ts_waitcnt vmcnt(0)"""


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("clock", ["s_memtime", "s_memrealtime"])
@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_the_clock_read_after_a_private_prefix(arch, clock, order):
    """The clock counts the wave-instructions the machine executed before it
    (the waves' prefixes among them: as many with the opening)."""
    asm = handwritten(arch, CLOCK.format(clock=clock))
    assert not hazards.find_hazards(asm_text.parse_kernel(asm, "hand"), arch, 32)
    got = same_with_and_without(asm, arch, "hand", {"out": np.zeros(5 * 256 * 4, np.uint32)}, grid=(5,),
                                block=(256,), order=order)
    assert got.error is None, got.error
    clocks = got.outputs["out"].reshape(5, 4, 64, 4)[:, :, 0, 0]
    assert (clocks >= 20 * 10).all()  # after the 20 waves' prefixes (batched: the turns run them first)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_trace_sees_every_instruction(arch):
    """Tracing turns the opening off: the trace sees every wave-instruction of every wave."""
    seen = []
    arrays = {"marks": np.zeros(12, np.int32), "data": np.zeros(12 * 64, np.int32)}
    traced = launch(IDLE, arch, "idle_wave", arrays, opening=True, grid=(12,), block=(512,),
                    trace=lambda w, ins: seen.append((w.name, ins.line)))
    plain = same_with_and_without(IDLE, arch, "idle_wave", arrays, grid=(12,), block=(512,))
    assert len(seen) == traced.counters["wave_instructions"] == plain.counters["wave_instructions"]
    assert len({name for name, _ in seen}) == 12 * 8
    assert traced.counters == plain.counters
    for key in arrays:
        np.testing.assert_array_equal(traced.outputs[key], plain.outputs[key])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kernel", ["idle_wave", "prefix"])
def test_timing_mode_is_the_same_with_the_opening_asked_for(arch, kernel):
    """Timing mode runs waves one at a time in modeled time: no opening, the same
    modeled times and spans."""
    if kernel == "prefix":
        case, _ = prefix_case(2, arch)
        args = (case.ir, arch, "prefix", case.arrays())
        shape = {"grid": case.grid, "block": case.block}
    else:
        args = (IDLE, arch, "idle_wave", {"marks": np.zeros(16, np.int32), "data": np.zeros(16 * 64, np.int32)})
        shape = {"grid": (16,), "block": (512,)}
    got = same_with_and_without(*args, timing=True, **shape)
    assert got.error is None and got.counters["modeled_ns"] > 0


# ---------------------------------------------------------------- launches, barriers

# Waves ((wave + workgroup) % 3 == 0) end before the others' barrier; the others
# meet there and read their partner's (wave ^ 1) LDS words (-1 for a partner that ended).
MEET = module("""
@lds = internal addrspace(3) global [512 x i32] poison, align 16
define amdgpu_kernel void @meet(ptr addrspace(1) %out) #0 {
entry:
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %wg = call i32 @llvm.amdgcn.workgroup.id.x()
  %wave = lshr i32 %tid, 6
  %h = mul i32 %wg, -1640531535
  %x = xor i32 %h, %tid
  %x3 = mul i32 %x, 3
  %y = xor i32 %x3, %wave
  %w3 = add i32 %wave, %wg
  %r = urem i32 %w3, 3
  %quit = icmp eq i32 %r, 0
  br i1 %quit, label %done, label %stay
stay:
  %slot = getelementptr i32, ptr addrspace(3) @lds, i32 %tid
  store i32 %y, ptr addrspace(3) %slot
  fence syncscope("workgroup") release
  call void @llvm.amdgcn.s.barrier()
  fence syncscope("workgroup") acquire
  %pwave = xor i32 %wave, 1
  %pw3 = add i32 %pwave, %wg
  %pr = urem i32 %pw3, 3
  %pquit = icmp eq i32 %pr, 0
  %ptid = xor i32 %tid, 64
  %from = select i1 %pquit, i32 %tid, i32 %ptid
  %pslot = getelementptr i32, ptr addrspace(3) @lds, i32 %from
  %pv = load i32, ptr addrspace(3) %pslot
  %got = select i1 %pquit, i32 -1, i32 %pv
  %row = mul i32 %wg, 512
  %at = add i32 %row, %tid
  %p = getelementptr i32, ptr addrspace(1) %out, i32 %at
  store i32 %got, ptr addrspace(1) %p
  br label %done
done:
  ret void
}
declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.workgroup.id.x()
declare void @llvm.amdgcn.s.barrier()
""")


def meet_expected(groups: int) -> np.ndarray:
    tid, wg = np.arange(512, dtype=np.uint32), np.arange(groups, dtype=np.uint32)[:, None]
    wave = tid >> U32(6)
    y = (((wg * U32(2654435761)) ^ tid) * U32(3)) ^ wave
    quit_ = (wave + wg) % 3 == 0
    partner_quit = ((wave ^ 1) + wg) % 3 == 0
    got = np.where(partner_quit, U32(0xFFFFFFFF), y[:, tid ^ 64])
    return np.where(quit_, U32(0), got).reshape(-1)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_a_barrier_after_some_waves_ended_in_the_opening(arch, order):
    assert private_prefix(assemble(MEET, arch), "meet") >= 10
    got = same_with_and_without(MEET, arch, "meet", {"out": np.zeros(7 * 512, np.uint32)}, grid=(7,),
                                block=(512,), order=order)
    assert got.error is None, got.error
    np.testing.assert_array_equal(got.outputs["out"], meet_expected(7))
    assert got.counters["barriers"] == 7


@pytest.mark.parametrize("arch", ARCHS)
def test_launches_one_after_another_on_one_machine(arch):
    """Waves that ended in the opening never were Wave objects; the machine's
    next launches (which start the wave objects again) are as they were."""
    case, _ = prefix_case(1, arch)
    launches = [(IDLE, "idle_uniform", {"marks": np.zeros(40 * 8, np.int32), "data": np.zeros(40 * 64, np.int32)},
                 (40,), (512,)),
                (case.ir, "prefix", case.arrays(), case.grid, case.block),
                (MEET, "meet", {"out": np.zeros(3 * 512, np.uint32)}, (3,), (512,)),
                (IDLE, "idle_wave", {"marks": np.zeros(9, np.int32), "data": np.zeros(9 * 64, np.int32)},
                 (9,), (512,))]
    runs = {}
    for opening in (True, False):
        machine = Machine(arch, opening=opening)
        runs[opening] = []
        for ir, name, arrays, grid, block in launches:
            copies = {k: v.copy() for k, v in arrays.items()}
            stats = run(ir, arch, name, copies, grid=grid, block=block, machine=machine)
            runs[opening].append(({k: v.tolist() for k, v in copies.items()}, counters(stats)))
    assert runs[True] == runs[False]
    np.testing.assert_array_equal(runs[True][1][0]["out"], case.expected())
    np.testing.assert_array_equal(runs[True][2][0]["out"], meet_expected(3))


# The waves of a workgroup share their scalar state through the prefix (the opening
# may run their SALU once); after a load each reads its own wave id and goes on alone.
ALONE_AFTER = """
\ts_mul_i32 s10, s2, 0x9e3779b1
\ts_add_u32 s11, s10, 5
\ts_lshl_b64 s[12:13], s[10:11], 3
\ts_load_dwordx2 s[4:5], s[0:1], 0x0
\tv_lshrrev_b32_e32 v1, 6, v0
\ts_nop 0
\tv_readfirstlane_b32 s14, v1
\ts_mul_i32 s11, s11, s14
\ts_add_u32 s10, s10, s14
\ts_xor_b32 s12, s12, s11
\ts_mul_i32 s3, s2, 0x600
\tv_lshlrev_b32_e32 v5, 3, v0
\tv_add_u32_e32 v5, s3, v5
\ts_waitcnt lgkmcnt(0)
\tv_mov_b32_e32 v2, s10
\tv_mov_b32_e32 v3, s12
\tglobal_store_dwordx2 v5, v[2:3], s[4:5]
\ts_waitcnt vmcnt(0)"""


@pytest.mark.parametrize("arch", ARCHS)
def test_scalar_state_shared_in_the_opening_is_each_waves_own_after_it(arch):
    asm = handwritten(arch, ALONE_AFTER)
    got = same_with_and_without(asm, arch, "hand", {"out": np.zeros(6 * 192 * 2, np.uint32)}, grid=(6,),
                                block=(192,), order="reverse")
    assert got.error is None, got.error
    wg, wave = np.arange(6, dtype=np.uint64)[:, None], np.arange(192, dtype=np.uint64)[None, :] >> U64(6)
    s10 = wg * U64(0x9E3779B1) & U64(M32)
    s11 = (s10 + U64(5)) & U64(M32)
    s12 = ((s10 | s11 << U64(32)) << U64(3)) & U64(M32)
    want = np.stack([(s10 + wave) & U64(M32), s12 ^ ((s11 * wave) & U64(M32))], axis=-1)
    np.testing.assert_array_equal(got.outputs["out"].reshape(6, 192, 2), want.astype(np.uint32))


# ---------------------------------------------------------------- (7) the K2 kernel


@pytest.mark.kernel
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_the_k2_kernel_with_and_without_the_opening(arch, order):
    """K2 tiny (TP 1, 16 tokens) through the emulator backend: the same output
    and scratch bytes, the same counters; the output within the reference's
    tolerance."""
    import torch

    from k2back import testing
    from k2back.runtime.emu import EmuBackend

    spec, kernel = testing.build("tiny", 1, 16, 2, arch)
    inputs = testing.make_inputs("tiny", 1, 16, 2, seed=0, arch=arch)
    runs = {}
    for opening in (True, False):
        backend = EmuBackend(opening=opening)
        scratch = backend.new_scratch(spec, torch.device("cpu"))
        out, stats = testing.run_kernel(spec, kernel, inputs, scratch, backend, order=order)
        runs[opening] = (out, scratch, counters(stats))
    (out, scratch, stats), (plain_out, plain_scratch, plain_stats) = runs[True], runs[False]
    assert torch.equal(out.view(torch.int16), plain_out.view(torch.int16))
    assert torch.equal(scratch, plain_scratch)
    for key in stats:
        assert stats[key] == plain_stats[key], f"Stats.{key} differs"
    assert stats["waves"] == 8 * stats["workgroups"]
    testing.check(spec, scratch, out, testing.reference_of(spec, inputs))
