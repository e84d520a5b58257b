"""The memory system of a launch: which copy of a byte a read returns, and when
a performed store reaches the other XCDs.

`Machine(arch, memory=...)` picks one of two models:

"ideal": one coherent memory; an access is performed when it is issued.

"strict" (the default): the GFX942 memory model as LLVM's AMDGPUUsage states
it ("Memory Model GFX942", which gfx950 follows; SPEC §4), every freedom it
leaves taken against the kernel, deterministically. Sources:
[LLVM] llvm/docs/AMDGPUUsage.rst, "Memory Model GFX942" and its code-sequence
table; [SIML] llvm/lib/Target/AMDGPU/SIMemoryLegalizer.cpp, SIGfx940CacheControl;
[ROCm] rocm.blogs.amd.com "Deep dive into the MI300 compute and memory partition
modes" (8 XCDs, each with its own L2); [CK] ROCm/composable_kernel PR 3652 (MI300:
"workgroups are typically scheduled round-robin across XCDs") and iree-org/wave
PR 1001 (MI350: "the hardware assigns flat workgroup indices round robin to 8 XCD").

Topology: workgroup i runs on a CU of its own on XCD i mod 8 [ROCm, CK] (a CU of
its own: no two workgroups share an L1, the least coherent placement).

What each level keeps, and what a read returns:
- memory (the mapped host arrays): the coherence point of all XCDs.
- L2, one per XCD, write-back. A performed store is a dirty byte in the L2 of the
  storing CU's XCD, visible to that XCD only. `buffer_wbl2 sc1` (agent scope) or
  `sc0 sc1` (system) "will writeback dirty L2 cache lines" [LLVM] (all of the XCD's,
  when the s_waitcnt vmcnt that covers it retires it); `buffer_wbl2` without sc1
  (workgroup / wavefront scope) writes nothing back [SIML: "no caches it would
  writeback"]. Clean bytes are as old as the L2's last invalidation (`buffer_inv
  sc1` or `sc0 sc1` by any wave of the XCD, or the kernel start): nothing in the
  model says when a line was fetched, so every line is taken as fetched at that
  moment and kept ("the oldest value the model allows"). A load's scope bits do
  not get past a stale L2 copy: only the acquire's `buffer_inv sc1` drops it [LLVM:
  it "ensures that following loads will not see stale global data"]. This is the
  strict reading: LLVM's code sequences never rely on a load's sc1 for freshness
  (its seq_cst mapping would need agent-scope loads kept coherent by the hardware),
  so a kernel that reads hand-off data with sc1 loads must still acquire.
- vector L1, one per CU, write-through: a line holds what the L2 showed when the CU
  first read it after the L1's last invalidation (`buffer_inv` sc0 or sc1), and the
  CU's own stores. Loads with sc0 or sc1 bypass it (the scope bits make a load
  bypass the caches not coherent at its scope [SIML enableLoadCacheBypass]);
  read-modify-write atomics bypass it [LLVM].
- scalar cache, one per CU: the same for SMEM loads; vector stores do not update
  it ("the scalar and vector L1 caches are not coherent" [LLVM]); `s_dcache_inv`
  drops it, an `s_load ... glc` bypasses it.
- Read-modify-write atomics are performed at memory (agent scope needs no sc1 on
  them [SIML enableRMWCacheBypass]), after the XCD's own dirty copy of the bytes.
- Eventual visibility (what lets a flag poll end): when a wave sleeps (`s_sleep`,
  the back-off of every poll loop), the lines of its last vector load, and of the
  L1-bypassing loads in flight with it (a poll of several tagged words), are made
  coherent for it: every L2's dirty bytes there are written back and its own
  stale copies dropped; a store performed into a line some wave sleeps on is
  written back at once and wakes the sleeper. Flags arrive as early as allowed,
  everything else as late as allowed. (A poll loop that never sleeps gets no such
  help and ends in Deadlock: harsher than the GPU; our kernels sleep between polls.)
- Single-copy atomicity: only a naturally aligned 8-byte piece of an access is one
  copy [LLVM: `load/store atomic i64` is one *_dwordx2, and nothing wider is one
  instruction: AMDGPUISelLowering setMaxAtomicSizeInBitsSupported(64); RCCL's LL
  lines on CDNA keep a flag in each 8-byte half, ROCm/rccl prims_ll.h]. A store
  covering several pieces (a lane's dwordx3/x4, or several lanes' words) performs
  them in two phases (store_phases), a sleeper woken by the first sees it before
  the second; a load wider than a piece reads its first piece in the oldest view
  and the later ones in the newest (tear_phases). Never is a piece torn.
- Kernel boundaries: the launch starts with empty caches (the CP invalidates them
  at dispatch [LLVM]) and ends by writing every L2 back (the end-of-kernel
  release), so memory is what the next launch and the host see.

When stores are performed (their order in a wave's queue) is `inflight`'s business;
this module performs them. Addresses here are byte addresses (int64 arrays).
"""

from __future__ import annotations

import itertools

import numpy as np

XCDS = 8
LINE_BITS = 7  # 128-byte lines
PAGE_BITS = 12  # overlays are kept in 4 KiB pages
PAGE = 1 << PAGE_BITS
LINE = 1 << LINE_BITS
MEMORY_MODELS = ("strict", "ideal")


def byte_addresses(addresses: np.ndarray, size: int) -> np.ndarray:
    """int64 [lanes * size]: every byte of a `size`-byte access at each lane address."""
    return (addresses.astype(np.int64)[:, None] + np.arange(size)).reshape(-1)


def distinct(values: np.ndarray) -> np.ndarray:
    """np.unique of int64 values (sorted), by counting when they lie close together."""
    if not values.size:
        return values
    low = int(values.min())
    if int(values.max()) - low > 4 * values.size + 1024:
        return np.unique(values)
    return np.flatnonzero(np.bincount(values - low)) + low


def among(values: np.ndarray, others: np.ndarray) -> np.ndarray:
    """np.isin of int64 values, by a table unless they lie far apart (a table of a
    MiB costs less than isin's sort of a few thousand values)."""
    low = int(values.min())
    span = int(values.max()) - low + 1
    if span > max(1 << 20, 64 * (values.size + others.size)):
        return np.isin(values, others)
    table = np.zeros(span, bool)
    others = others - low
    table[others[(others >= 0) & (others < span)]] = True
    return table[values - low]


def lines_of(addresses: np.ndarray, size: int) -> np.ndarray:
    """The distinct line numbers an access of `size` bytes at each address touches."""
    starts = addresses.astype(np.int64)
    first, last = starts >> LINE_BITS, (starts + size - 1) >> LINE_BITS
    if (first == last).all():
        return distinct(first)
    return np.unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(first, last)]))


def lines_list(addresses: np.ndarray, size: int) -> list[int]:
    """lines_of as a list (in no particular order) when each access stays in one
    line, which a sort cannot be cheaper than; else lines_of's."""
    first = addresses >> np.uint64(LINE_BITS)
    if size > 1 and not (first == (addresses + np.uint64(size - 1)) >> np.uint64(LINE_BITS)).all():
        return lines_of(addresses, size).tolist()
    return list(set(first.tolist()))


def sorted_lines(addresses: np.ndarray, size: int) -> list[int]:
    """lines_of as a list; for the few lanes of a poll's load, without numpy."""
    if addresses.size > 32:
        return lines_of(addresses, size).tolist()
    starts = addresses.tolist()
    if size > 1 and any((a ^ (a + size - 1)) >> LINE_BITS for a in starts):  # one crosses a line
        return lines_of(addresses, size).tolist()
    return sorted({a >> LINE_BITS for a in starts})


ATOM = 8  # bytes of the widest single-copy atomic access: a naturally aligned dwordx2


def tear_phases(addresses: np.ndarray, size: int) -> np.ndarray | None:
    """The pieces of an access of `size` bytes a lane at `addresses` that are single-
    copy atomic, as a phase per byte (int [lanes * size]), or None when each lane's
    access is one piece. A piece is the lane's bytes in one naturally aligned ATOM
    bytes: LLVM lowers atomic loads and stores of up to 64 bits to one
    global/buffer_load/store_dwordx2 (AMDGPUISelLowering: setMaxAtomicSizeInBitsSupported(64);
    AMDGPUUsage "Memory Model GFX942": monotonic agent load / store = *_load / *_store
    sc1=1), and nothing makes a wider access, or one across an 8-byte boundary, one
    copy (RCCL's LL lines are 16 B with a flag in each 8-byte half, ROCm/rccl prims_ll.h).
    Phase 0 is a lane's piece read in the oldest view, in the order the kernel likes
    least, deterministically: from its highest piece down in even 16-byte granules,
    from its lowest up in odd ones, so that a reader trusting one tag of a wider
    access meets a torn one either way (stores: store_phases, the same order)."""
    starts = addresses.astype(np.int64)
    first, last = starts >> 3, (starts + size - 1) >> 3
    if (first == last).all():
        return None
    chunk = (starts[:, None] + np.arange(size)) >> 3
    k = chunk - first[:, None]
    n = (last - first + 1)[:, None]
    up = ((first >> 1) & 1).astype(bool)[:, None]
    return np.where(up, k, n - 1 - k).reshape(-1)


def store_phases(flat: np.ndarray) -> np.ndarray | None:
    """The phases a store's bytes (`flat`, every lane's) perform in, as a phase per
    byte, or None for one: each lane's access, and each of a store instruction's
    lanes, is single-copy atomic only within an aligned ATOM-byte piece (tear_phases),
    so the pieces perform apart. Phase 0 (first) is the high piece of each even
    16-byte granule and the low piece of each odd one, phase 1 the other: the order
    of tear_phases for a lane's 16 bytes, and across lanes a reader trusting the
    tags of some words of a granule meets the others stale either way."""
    pieces = flat >> 3
    phase = ((pieces & 1) == ((pieces >> 1) & 1)).astype(np.int8)
    if phase.all() or not phase.any():
        return None
    return phase


def _line_bits(offsets: np.ndarray) -> int:
    """The lines of a page that byte `offsets` in it fall in, as the bits of an int."""
    return int(np.bitwise_or.reduce(np.uint32(1) << (offsets >> LINE_BITS).astype(np.uint32)))


def line_bytes(line: int) -> np.ndarray:
    return (line << LINE_BITS) + np.arange(LINE, dtype=np.int64)


class Overlay:
    """Bytes held at device addresses, sparse in pages: a cache's copies.

    Puts of bytes only where none are held (`put_later`, an L2 keeping memory's
    old bytes) wait per page until something reads, drops or takes that page:
    every other L2 receives each write-back, but most drop it unread at their
    next invalidation. Plain puts (an L2's dirty bytes) wait in `queued` until
    anything else is asked of the overlay: the stores one s_waitcnt performs
    are mostly all taken by its buffer_wbl2, straight from the queue."""

    __slots__ = ("later", "pages", "queued")

    def __init__(self):
        self.pages = {}  # page number -> (data uint8 [PAGE], present bool [PAGE])
        self.later = {}  # page number -> [lines they fill (bits), [(offsets, values)]]: missing-only puts
        self.queued = []  # [(flat, values, first line, last line)]: plain puts, oldest first, not in pages yet

    def __bool__(self) -> bool:
        return bool(self.pages or self.later or self.queued)

    def _place(self) -> None:
        """The queued puts into pages, oldest first."""
        queued, self.queued = self.queued, []
        for flat, values, _, _ in queued:
            for page, where, offsets in self._by_page(flat):
                self._put_page(page, offsets, values if where is None else values[where], False)

    @staticmethod
    def _by_page(flat: np.ndarray):
        """(page, positions in flat: None for all or a slice / index array, offsets
        in the page) per page the addresses fall in."""
        pages = flat >> PAGE_BITS
        first, last = int(pages[0]), int(pages[-1])
        if first == last and (pages == first).all():
            return ((first, None, flat & (PAGE - 1)),)
        if first < last and (pages[1:] >= pages[:-1]).all():  # sorted (lanes in order, or a page walk)
            starts = np.flatnonzero(pages[1:] != pages[:-1]) + 1
            offsets, bounds = flat & (PAGE - 1), [0, *starts.tolist(), flat.size]
            return [(page, slice(a, b), offsets[a:b])
                    for page, a, b in zip([first, *pages[starts].tolist()], bounds, bounds[1:])]
        order = np.argsort(pages, kind="stable")  # by page, positions ascending within one
        cuts = np.flatnonzero(np.diff(pages[order])) + 1
        groups = []
        for a, b in itertools.pairwise([0, *cuts.tolist(), flat.size]):
            where = order[a:b]
            groups.append((int(pages[where[0]]), where, flat[where] & (PAGE - 1)))
        return groups

    def _page(self, page: int):
        """The (data, present) of `page` with its waiting puts done, or None."""
        if self.queued:
            self._place()
        waiting = self.later.pop(page, None) if self.later else None
        if waiting is not None:
            for offsets, values in waiting[1]:
                if values is not None:
                    self._put_page(page, offsets, values, missing_only=True)
                elif page in self.pages:  # a waiting drop
                    self.pages[page][1][offsets] = False
        return self.pages.get(page)

    def _presence(self, page: int, waiting) -> np.ndarray:
        """present of `page` once its `waiting` puts and drops are done."""
        entry = self.pages.get(page)
        present = entry[1].copy() if entry is not None else np.zeros(PAGE, bool)
        for offsets, values in waiting:
            present[offsets] = values is not None
        return present

    def _settle_drops(self) -> None:
        """The pages with a waiting drop done."""
        for page in [page for page, waiting in self.later.items() if waiting[0] is None]:
            self._page(page)

    def _settle(self) -> None:
        """Every queued and waiting put done."""
        if self.queued:
            self._place()
        for page in list(self.later):
            self._page(page)

    def _line(self, line: int):
        """(data, present, the line's slice of them) of a line's page, or None."""
        entry = self._page(line >> (PAGE_BITS - LINE_BITS))
        if entry is None:
            return None
        start = (line << LINE_BITS) & (PAGE - 1)
        return entry[0], entry[1], slice(start, start + LINE)

    def drop_line(self, line: int) -> None:
        """drop(line_bytes(line))."""
        waiting = self.later.get(line >> (PAGE_BITS - LINE_BITS)) if self.later and not self.queued else None
        if waiting is not None:
            start = (line << LINE_BITS) & (PAGE - 1)
            self._drop_later(waiting, slice(start, start + LINE))
            return
        held = self._line(line)
        if held is not None:
            held[1][held[2]] = False

    def take_line(self, line: int):
        """take(line_bytes(line)): the same bytes; a page it empties goes (one a drop
        emptied stays until a take: an L2's dirty bytes, the only ones taken by
        line, are never dropped)."""
        held = self._line(line)
        if held is None:
            return None
        data, present, where = held
        chunk = present[where]
        if not chunk.any():
            return None
        offsets = np.flatnonzero(chunk)
        taken = (line << LINE_BITS) + offsets, data[where][offsets]
        present[where] = False
        if not present.any():
            del self.pages[line >> (PAGE_BITS - LINE_BITS)]
        return taken

    def may_hold_line(self, line: int) -> bool:
        """False when it holds no byte of `line` (a quick test that changes nothing)."""
        page = line >> (PAGE_BITS - LINE_BITS)
        if page in self.later or self.queued and any(first <= line <= last for _, _, first, last in self.queued):
            return True
        entry = self.pages.get(page)
        if entry is None:
            return False
        start = (line << LINE_BITS) & (PAGE - 1)
        return bool(entry[1][start:start + LINE].any())

    def has_page(self, line: int) -> bool:
        """Whether it holds anything in the page of `line` (a quick test)."""
        if self.queued:
            self._place()
        page = line >> (PAGE_BITS - LINE_BITS)
        return page in self.pages or page in self.later

    def apply(self, flat: np.ndarray, values: np.ndarray) -> int:
        """Overwrite `values` where this overlay holds the byte; returns how many."""
        if not self:
            return 0
        count = 0
        for page, where, offsets in self._by_page(flat):
            entry = self._page(page)
            if entry is None:
                continue
            data, present = entry
            hit = present[offsets]
            if hit.any():
                positions = np.flatnonzero(hit)
                if isinstance(where, slice):
                    positions += where.start
                elif where is not None:
                    positions = where[hit]
                values[positions] = data[offsets[hit]]
                count += positions.size
        return count

    def put(self, flat: np.ndarray, values: np.ndarray, missing_only: bool = False, span=None) -> None:
        """Hold `values` at `flat` (with missing_only: only where nothing is held yet;
        `span`: (flat.min(), flat.max()) when the caller knows them)."""
        if not missing_only:
            if self.later:  # queued puts are placed before waiting ones: not before a waiting drop
                self._settle_drops()
            low, high = (int(flat.min()), int(flat.max())) if span is None else span
            # `flat` and `values` are never written to
            self.queued.append((flat, values, low >> LINE_BITS, high >> LINE_BITS))
            return
        if self.queued:
            self._place()
        for page, where, offsets in self._by_page(flat):
            if self.later:  # after the waiting ones
                self._page(page)
            self._put_page(page, offsets, values if where is None else values[where], True)

    @classmethod
    def by_page(cls, flat: np.ndarray, values: np.ndarray) -> list:
        """A put's bytes as put_later takes them: [(page, offsets, values, the lines of
        the page they fall in as bits)]."""
        groups = cls._by_page(flat)
        if isinstance(groups[0][1], slice):  # sorted: every page's line bits at once
            bits = np.uint32(1) << ((flat >> LINE_BITS) & (PAGE // LINE - 1)).astype(np.uint32)
            lines = np.bitwise_or.reduceat(bits, [where.start for _, where, _ in groups]).tolist()
        else:
            lines = [_line_bits(offsets) for _, _, offsets in groups]
        return [(page, offsets, values if where is None else values[where], bits)
                for (page, where, offsets), bits in zip(groups, lines)]

    def put_later(self, by_page) -> None:
        """put(..., missing_only=True) of `by_page` (Overlay.by_page: several overlays
        may share it, it is never written to), done when something next looks at the page."""
        self.put_later_into([self], by_page)

    @staticmethod
    def put_later_into(overlays, by_page) -> None:
        """put_later(by_page) of each of `overlays`."""
        lasts = [overlay.later for overlay in overlays]
        for page, offsets, values, lines in by_page:
            put = (offsets, values)
            for later in lasts:
                waiting = later.get(page)
                if waiting is None:
                    later[page] = [lines, [put]]
                else:
                    if waiting[0] is not None:
                        waiting[0] |= lines
                    waiting[1].append(put)

    @staticmethod
    def _drop_later(waiting, offsets) -> None:
        """A drop of a page with waiting puts waits after them (values None); the
        page's line bits no longer tell which lines will be held (None)."""
        waiting[0] = None
        waiting[1].append((offsets, None))

    def _put_page(self, page: int, offsets: np.ndarray, values: np.ndarray, missing_only: bool) -> None:
        entry = self.pages.get(page)
        if entry is None:  # a new page: every byte is missing
            entry = self.pages[page] = (np.zeros(PAGE, np.uint8), np.zeros(PAGE, bool))
        elif missing_only:
            held = entry[1][offsets]
            if held.all():
                return
            if held.any():
                new = ~held
                entry[0][offsets[new]] = values[new]
                entry[1][offsets] = True
                return
        data, present = entry
        data[offsets] = values
        present[offsets] = True

    def drop(self, flat: np.ndarray, by_page=None) -> None:
        """Hold nothing at `flat` (`by_page`: Overlay.by_page of it, when at hand)."""
        if not self:
            return
        later = self.later if not self.queued else None
        for page, offsets in ([(page, offsets) for page, offsets, _, _ in by_page] if by_page is not None
                              else [(page, offsets) for page, _, offsets in self._by_page(flat)]):
            waiting = later.get(page) if later else None
            if waiting is not None:  # done when the page is next looked at, if ever
                self._drop_later(waiting, offsets)
                continue
            entry = self._page(page)
            if entry is not None:
                entry[1][offsets] = False

    def take(self, flat: np.ndarray | None = None):
        """(addresses, values) of the held bytes (all, or those among `flat`), in
        address order, no longer held; None when there are none."""
        if flat is None:
            if self.queued and not self.pages and not self.later:
                return self._take_queued()
            self._settle()
        addresses, values = [], []
        for page, _, offsets in (self._by_page(flat) if flat is not None else
                                 [(page, None, None) for page in sorted(self.pages)]):
            entry = self._page(page)
            if entry is None:
                continue
            data, present = entry
            # an atomic's lanes may repeat an address: each byte is taken once, in order
            offsets = np.flatnonzero(present) if offsets is None else np.unique(offsets[present[offsets]])
            if offsets.size:
                addresses.append((page << PAGE_BITS) + offsets)
                values.append(data[offsets].copy())
                present[offsets] = False
            if not present.any():
                del self.pages[page]
        if not addresses:
            return None
        return np.concatenate(addresses), np.concatenate(values)

    def _take_queued(self):
        """take() of an overlay whose bytes are all queued: the newest put of each
        address, in address order."""
        queued, self.queued = self.queued, []
        if len(queued) == 1:
            flat, values = queued[0][:2]
        else:  # by first address: strictly ascending when each put is and they lie apart
            ordered = sorted(queued, key=lambda put: int(put[0][0]))
            flat, values = np.concatenate([put[0] for put in ordered]), np.concatenate([put[1] for put in ordered])
        if flat.size < 2 or (flat[1:] > flat[:-1]).all():  # each address once, ascending
            return flat, values
        if len(queued) > 1:  # in put order, oldest first
            flat, values = np.concatenate([put[0] for put in queued]), np.concatenate([put[1] for put in queued])
        addresses, newest = np.unique(flat[::-1], return_index=True)  # first from the end: the newest
        return addresses, values[::-1][newest]

    def lines(self) -> np.ndarray:
        """Line numbers in which this overlay holds a byte."""
        if self.queued:
            self._place()
        # a page with a waiting drop: which bytes it will hold, without their values
        dropping = {page: self._presence(page, waiting[1]) for page, waiting in self.later.items()
                    if waiting[0] is None}
        found = [(page << (PAGE_BITS - LINE_BITS)) + np.flatnonzero(present.reshape(-1, LINE).any(1))
                 for page, present in [*((page, entry[1]) for page, entry in self.pages.items()
                                         if page not in dropping), *dropping.items()]]
        later = [(page, waiting[0]) for page, waiting in self.later.items() if waiting[0] is not None]
        if later:  # each byte of a waiting put will be held
            pages = np.array([page for page, _ in later], np.int64)
            bits = np.array([lines for _, lines in later], "<u4").view(np.uint8)
            held = np.unpackbits(bits.reshape(-1, 4), axis=1, bitorder="little").view(bool)
            rows, columns = np.nonzero(held)
            found.append((pages[rows] << (PAGE_BITS - LINE_BITS)) + columns)
        return distinct(np.concatenate(found)) if found else np.zeros(0, np.int64)


NO_COPIES = Overlay()  # PrivateCache.copies while it holds no copy (never written to)


class PrivateCache:
    """A CU's vector L1 or scalar cache. It holds the lines read through it since its
    last invalidation (`held`, line by line; `regions`, whole buffers read before
    any store touched them), each as the L2 showed it then: once the L2's view of a
    held line changes, `copies` keeps the line's old bytes (`saved`): until the
    first, NO_COPIES, an empty Overlay that every such cache shares (a grid makes
    two caches a workgroup, most of which never save a line; only _save_lines
    puts bytes in `copies`, and gives the cache its own first)."""

    __slots__ = ("copies", "held", "l2", "regions", "saved")

    def __init__(self, l2):
        self.l2 = l2
        self.copies = NO_COPIES
        self.held = set()
        self.regions = set()
        self.saved = set()

    def hold(self, lines) -> None:
        """Hold `lines` (line numbers: an array or a list)."""
        holders = self.l2.holders
        for line in (lines.tolist() if isinstance(lines, np.ndarray) else lines):
            if line not in self.held:
                self.held.add(line)
                holders.setdefault(line, set()).add(self)

    def hold_region(self, base: int) -> None:
        if base not in self.regions:
            self.regions.add(base)
            self.l2.region_readers.setdefault(base, set()).add(self)

    def drop(self, line: int) -> None:
        if line in self.saved:  # copies holds bytes of saved lines only
            self.copies.drop_line(line)
            self.saved.discard(line)

    def invalidate(self) -> None:
        for index, keys in ((self.l2.holders, self.held), (self.l2.region_readers, self.regions)):
            for key in keys:
                owners = index.get(key)
                if owners is not None:
                    owners.discard(self)
                    if not owners:
                        del index[key]
            keys.clear()
        self.saved.clear()
        self.copies = NO_COPIES


class L2:
    """One XCD's L2: `dirty` bytes its CUs stored, not yet written back; `stale`
    copies of memory as it was at the L2's last invalidation (for the bytes memory
    changed since); the CU caches above it that hold each line."""

    __slots__ = ("dirty", "holders", "index", "region_readers", "stale")

    def __init__(self, index: int):
        self.index = index
        self.dirty = Overlay()
        self.stale = Overlay()
        self.holders = {}  # line -> {PrivateCache}
        self.region_readers = {}  # buffer base -> {PrivateCache}


class Cu:
    """A compute unit: its vector L1 and scalar cache, above its XCD's L2."""

    __slots__ = ("l1", "l2", "scalar")

    def __init__(self, l2: L2):
        self.l2 = l2
        self.l1 = PrivateCache(l2)
        self.scalar = PrivateCache(l2)


class IdealMemory:
    """One coherent memory: every access performed when issued, nothing cached."""

    strict = False

    def __init__(self, memory, wake=None):
        self.memory = memory
        self.stale_bytes = self.written_back = 0

    def cu(self, workgroup: int) -> Cu:
        return Cu(L2(workgroup % XCDS))

    def touch(self, addresses: np.ndarray, size: int, who) -> None:
        """A store of `size` bytes a lane is issued: it must be mapped (else
        MemoryFault); the buffers it writes are marked and count the bytes."""
        for region, _, offsets in self.memory.locate(addresses, size, who):
            region.written += offsets.size * size
            region.touched = True

    def load(self, w, addresses, size: int, who, through_l1: bool, cus=None) -> np.ndarray:
        """uint8 [lanes, size] a vector load of `w` reads (`cus`, for a batch of
        several workgroups' waves: [(CU, the slice of the lanes of its waves)])."""
        return self.memory.read(addresses, size, who)

    def load_scalar(self, w, region, start: int, count: int, cached: bool) -> np.ndarray:
        return region.data[start:start + count].copy()

    def repeat_scalar(self, cu, region, cached: bool) -> bool:
        """A wave of `cu` loads the bytes of `region` the last load_scalar returned
        (nothing changed since): True when the same bytes are what it loads and
        this did all else that load_scalar would, False when the caller must call it."""
        return True

    def store(self, cu, flat, values, span=None) -> bool:
        self.memory.poke(flat, values)
        return False

    def atomic(self, w, addresses, dtype, update, sources, who):
        return self.memory.atomic(addresses, dtype, update, sources, who)

    def writeback(self, cu, agent: bool) -> None:
        pass

    def invalidate(self, cu, l1: bool, l2: bool) -> None:
        pass

    def invalidate_scalar(self, cu) -> None:
        pass

    def poll(self, w) -> None:
        pass

    def unpoll(self, w) -> None:
        pass

    def end(self) -> None:
        pass


class StrictMemory(IdealMemory):
    """The strict model of the module docstring: 8 L2s, an L1 and a scalar cache a CU."""

    strict = True

    def __init__(self, memory, wake):
        super().__init__(memory)
        self.wake = wake  # fn(wave): a sleeping wave runs again at once
        self.l2s = [L2(i) for i in range(XCDS)]
        # what a poll made coherent (_refreshed: the count of `changes` then, the CU, the lines): a poll
        # of the same lines from the same CU with no access since has nothing to write back or drop.
        # `changes` counts every access that may leave it some (a load, by which a sleeper stops
        # polling, after which stores to its lines stay dirty; the others to be sure)
        self.changes, self._refreshed = 0, None
        self.polled = {}  # line -> {wave sleeping on it: None}, in the order they polled (a dict, not
        # a set: the caches refreshed and the waves woken in an order that does not hang on ids)

    def cu(self, workgroup: int) -> Cu:
        return Cu(self.l2s[workgroup % XCDS])

    # ------------------------------------------------------------------ reads

    def load(self, w, addresses, size: int, who, through_l1: bool, cus=None) -> np.ndarray:
        """Memory's bytes, read at once, then each CU's view of its lanes' (`cus`,
        for several workgroups' waves, in their order; else w's CU, all lanes):
        a CU's caches change no byte another CU reads."""
        self.changes += 1
        data, touched = self.memory.read_touched(addresses, size, who)
        if not touched and through_l1:
            base = self.memory.region_of(int(addresses[0]), size, who).base
        for cu, lanes in cus or ((w.group.cu, slice(None)),):
            if not touched:
                if through_l1:
                    cu.l1.hold_region(base)
                continue
            mine, theirs = addresses[lanes], data[lanes]  # a view: the lanes' rows are consecutive
            l2 = cu.l2
            flat = None
            viewed = l2.stale or l2.dirty or (through_l1 and cu.l1.copies)
            if viewed:
                flat = byte_addresses(mine, size)
                values = theirs.reshape(-1)
                self._view(l2, flat, values, count=True)
                if through_l1:
                    self.stale_bytes += cu.l1.copies.apply(flat, values)
            if size > 4 and (viewed or any(other.dirty for other in self.l2s)):
                self._tear(l2, mine, size, flat, theirs)
            if through_l1:
                cu.l1.hold(lines_list(mine, size))
        return data

    def _tear(self, l2: L2, addresses, size: int, flat, data) -> None:
        """A wide load's pieces are read at different times (tear_phases): phase 0
        as the caches show it now (the oldest view), the later pieces the newest a
        read may see: memory with every L2's dirty bytes (a dirty line may be
        written back, and this CU's copies dropped, any time), the XCD's own last."""
        phases = tear_phases(addresses, size)
        if phases is None:
            return
        late = phases > 0
        where = (byte_addresses(addresses, size) if flat is None else flat)[late]
        newest = self.memory.peek(where)
        for other in self.l2s:
            if other is not l2 and other.dirty:
                other.dirty.apply(where, newest)
        l2.dirty.apply(where, newest)
        data.reshape(-1)[late] = newest

    def load_scalar(self, w, region, start: int, count: int, cached: bool) -> np.ndarray:
        self.changes += 1
        values = region.data[start:start + count].copy()
        cu = w.group.cu
        if not region.touched:
            if cached:
                cu.scalar.hold_region(region.base)
            return values
        flat = region.base + start + np.arange(count, dtype=np.int64)
        self._view(cu.l2, flat, values, count=True)
        if cached:
            self.stale_bytes += cu.scalar.copies.apply(flat, values)
            cu.scalar.hold(np.unique(flat >> LINE_BITS))
        return values

    def repeat_scalar(self, cu, region, cached: bool) -> bool:
        """IdealMemory.repeat_scalar: so it is in a buffer no store touched (memory's
        bytes, the scalar cache holds the whole buffer: load_scalar)."""
        if region.touched:
            return False
        self.changes += 1
        if cached:
            cu.scalar.hold_region(region.base)
        return True

    def _view(self, l2: L2, flat, values, count: bool = False) -> None:
        """`values` (memory's bytes at `flat`) as `l2` shows them: stale copies, then
        its dirty bytes."""
        stale = l2.stale.apply(flat, values)
        if count:
            self.stale_bytes += stale
        l2.dirty.apply(flat, values)

    # ------------------------------------------------------------------ writes

    def store(self, cu, flat, values, span=None) -> bool:
        """Perform a store: dirty in the XCD's L2, seen by the CU's own L1 (write-
        through). Returns whether it reached a line some wave sleeps on. `span`:
        (flat.min(), flat.max()) when the caller knows them."""
        self.changes += 1
        l2 = cu.l2
        low, high = (int(flat.min()), int(flat.max())) if span is None else span
        first, last = low >> LINE_BITS, high >> LINE_BITS
        polled = bool(self.polled) and self.polled_between(first, last)
        if polled or l2.holders or l2.region_readers and self._read_by_others(l2, first, last, cu.l1):
            lines = distinct(flat >> LINE_BITS)
            self._save_lines(l2, lines, keep=cu.l1)
        dirty = l2.dirty  # dirty.put(flat, values, span=(low, high)), inline
        if dirty.later:
            dirty._settle_drops()
        dirty.queued.append((flat, values, first, last))
        copies = cu.l1.copies
        if copies is not NO_COPIES and copies:
            copies.drop(flat)
        return polled and self._reach_pollers(lines)

    def polled_between(self, first: int, last: int) -> bool:
        """Whether a wave sleeps on a line from `first` to `last`."""
        polled = self.polled
        if not polled:
            return False
        if last - first < len(polled):  # the fewer: the lines of the range, or the polled lines
            return any(line in polled for line in range(first, last + 1))
        return any(first <= line <= last for line in polled)

    def _read_by_others(self, l2, first: int, last: int, keep) -> bool:
        """Whether a CU cache of `l2` other than `keep` may hold some of lines
        first..last by having read their whole buffer (hold_region); False only
        when it is sure (they lie in one buffer no other cache read whole)."""
        if not l2.region_readers:
            return False
        region = self.memory.region_at(first << LINE_BITS)
        if region is None or last << LINE_BITS >= region.end:
            return True
        readers = l2.region_readers.get(region.base)
        return bool(readers) and any(cache is not keep for cache in readers)

    def atomic(self, w, addresses, dtype, update, sources, who):
        """Performed at memory, after the XCD's own dirty copy of the bytes; the L1
        is bypassed (it keeps what it held)."""
        self.changes += 1
        cu = w.group.cu
        l2 = cu.l2
        flat = byte_addresses(addresses, dtype.itemsize)
        for region, _, _ in self.memory.locate(addresses, dtype.itemsize, who):
            region.touched = True
        self._write_back(l2, l2.dirty.take(flat))
        lines = np.unique(flat >> LINE_BITS)
        self._save_lines(l2, lines, keep=None)
        pages = self._memory_changes(flat, l2)
        old = self.memory.atomic(addresses, dtype, update, sources, who)
        l2.stale.drop(flat, pages)
        if self.polled:
            self._reach_pollers(lines)
        return old

    def writeback(self, cu, agent: bool) -> None:
        """buffer_wbl2 performed: at agent or system scope the XCD's dirty lines go
        to memory; at narrower scopes there is nothing to write back."""
        if agent:
            self._write_back(cu.l2, cu.l2.dirty.take())

    def _write_back(self, l2: L2, taken) -> None:
        self.changes += 1
        if taken is None:
            return
        flat, values = taken
        pages = self._memory_changes(flat, l2)
        self.memory.poke(flat, values)
        l2.stale.drop(flat, pages)  # its own copy is the new, clean line
        self.written_back += flat.size

    def _memory_changes(self, flat, source: L2) -> list:
        """Memory's bytes at `flat` are about to change: every other L2 keeps them as
        it saw them (its view does not move until it is invalidated). Returns them
        by page (Overlay.by_page)."""
        waiting = Overlay.by_page(flat, self.memory.peek(flat))
        Overlay.put_later_into([l2.stale for l2 in self.l2s if l2 is not source], waiting)
        return waiting

    def _save_lines(self, l2: L2, lines, keep) -> None:
        """`l2`'s view of `lines` (ascending) is about to change: the CU caches
        holding them (but `keep`, whose copy follows the change) keep the lines as
        they were."""
        if not len(lines) or not l2.holders and not self._read_by_others(l2, int(lines[0]), int(lines[-1]), keep):
            return
        if not isinstance(lines, list):
            lines = lines.tolist()
        savers = {}  # line -> the caches that keep it (the order is immaterial: nothing
        if l2.holders:  # it does changes what another line's or cache's save sees)
            for line in lines:
                for cache in l2.holders.get(line, ()):
                    if cache is not keep and line not in cache.saved:
                        savers.setdefault(line, set()).add(cache)
        if l2.region_readers:
            for base, group in self._by_region(lines).items():
                for cache in l2.region_readers.get(base, ()):
                    if cache is not keep:
                        for line in group.difference(cache.saved):
                            savers.setdefault(line, set()).add(cache)
        for line, caches in savers.items():
            where = line_bytes(line)
            view = self.memory.peek(where)
            self._view(l2, where, view)
            for cache in caches:
                if cache.copies is NO_COPIES:
                    cache.copies = Overlay()
                cache.copies.put(where, view, missing_only=True)
                cache.saved.add(line)

    def _by_region(self, lines: list[int]) -> dict:
        """{buffer base: the set of `lines` starting in it}."""
        region = self.memory.region_at(lines[0] << LINE_BITS)
        if region is not None and region.base <= min(lines) << LINE_BITS and max(lines) << LINE_BITS < region.end:
            return {region.base: set(lines)}
        groups, region = {}, None
        for line in lines:
            address = line << LINE_BITS
            if region is None or not region.base <= address < region.end:
                region = self.memory.region_at(address)
                if region is None:
                    continue
                group = groups.setdefault(region.base, set())
            group.add(line)
        return groups

    # ------------------------------------------------------------------ invalidation

    def invalidate(self, cu, l1: bool, l2: bool) -> None:
        """buffer_inv: sc0 drops the CU's L1, sc1 also every clean line of its L2."""
        self.changes += 1
        if l1 or l2:
            cu.l1.invalidate()
        if l2 and cu.l2.stale:
            if cu.l2.holders or cu.l2.region_readers:
                self._save_lines(cu.l2, cu.l2.stale.lines(), keep=cu.l1)
            cu.l2.stale = Overlay()

    def invalidate_scalar(self, cu) -> None:
        self.changes += 1
        cu.scalar.invalidate()

    # ------------------------------------------------------------------ polls

    def poll(self, w) -> None:
        """w sleeps: the lines of its last vector load, and of the L1-bypassing
        (sc0 / sc1) ones in flight with it (issued since the wave last had no load
        outstanding: a poll of several words at once), become coherent for it and
        stay so while it sleeps (eventual visibility, as early as allowed). A load
        the wave waited for before the poll's began is not polled: data read
        early stays as stale as the caches keep it."""
        self.unpoll(w)
        loads, w.bypass_loads = w.bypass_loads, []
        if w.last_load is not None and not any(load is w.last_load for load in loads):
            loads.append(w.last_load)  # (an L1-bypassing last load is among them already)
        if not loads:
            return
        if len(loads) == 1:
            lines = sorted_lines(*loads[0])
        else:
            lines = sorted(set().union(*(sorted_lines(*load) for load in loads)))
        cu = w.group.cu
        if self._refreshed != (self.changes, cu, lines):  # (else: a wave of the CU just did, in lock-step)
            self._write_back_lines(lines)  # (each line's bytes its own: the order of lines is immaterial)
            for line in lines:
                self._refresh(line, cu)
            self._refreshed = (self.changes, cu, lines)
        for line in lines:
            self.polled.setdefault(line, {})[w] = None
        w.polled_lines = lines

    def unpoll(self, w) -> None:
        for line in w.polled_lines:
            waves = self.polled.get(line)
            if waves is not None:
                waves.pop(w, None)
                if not waves:
                    del self.polled[line]
        w.polled_lines = ()

    def _reach_pollers(self, lines) -> bool:
        woke = False
        for line in lines.tolist():
            waves = self.polled.get(line)
            if waves:
                self._write_back_lines((line,))
                waves = list(waves)
                # a CU's caches drop the line once, an L2 its stale copy once: again
                # would change nothing (the CUs in the order of their first wave)
                dropped = set()
                for cu in dict.fromkeys([w.group.cu for w in waves]):
                    self._refresh(line, cu, cu.l2 not in dropped)
                    dropped.add(cu.l2)
                for w in waves:  # (waking changes no cache)
                    self.wake(w)
                woke = True
        return woke

    def _write_back_lines(self, lines) -> None:
        """Every L2's dirty bytes of `lines` to memory."""
        for l2 in self.l2s:
            dirty = l2.dirty
            if dirty:
                for line in lines:
                    if dirty.may_hold_line(line):
                        self._write_back(l2, dirty.take_line(line))

    def _refresh(self, line: int, cu, drop: bool = True) -> None:
        """The caches of a wave's CU drop their copies of `line`: its next read sees
        memory (`drop` False: its L2 dropped its stale copy already)."""
        l2 = cu.l2
        if l2.stale.has_page(line):
            # (else no cache to save the line in: _save_lines's own test, for one line)
            if l2.holders.get(line) or self._read_by_others(l2, line, line, cu.l1):
                self._save_lines(l2, [line], keep=cu.l1)
            if drop:
                l2.stale.drop_line(line)
        cu.l1.drop(line)

    def end(self) -> None:
        """The end-of-kernel release: every L2 writes back. Then each L2 forgets the
        caches that hold its lines: they referred to each other (L2.holders,
        region_readers <-> PrivateCache.l2), cycles the collector would free only
        after walking every object of the process, torch's too (~1,900 objects
        of an idle grid, a full collection ~0.2 s now and then). Nothing reads
        after it: memory takes each L2's dirty bytes, L2 by L2 as _write_back
        would, without the other L2s keeping its old bytes as stale copies
        (_memory_changes), which no load would see."""
        self.changes += 1
        for l2 in self.l2s:
            taken = l2.dirty.take()
            self.changes += 1
            if taken is not None:
                self.memory.poke(*taken)
                self.written_back += taken[0].size
            l2.holders.clear()
            l2.region_readers.clear()
