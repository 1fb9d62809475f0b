"""The host's page allocator for the engine's KV pool.

Each slot holds an ordered list of pool pages (its position p lives in page list[p // size]).
Pages are reference-counted: a fork shares the source's full pages (positions below a context
length are never written again) and copies only its last, partly filled page. A page returns to
the free list when no slot holds it. The pool grows (the device arrays with it) when the free
list runs dry; its size is a power of two, so memory follows the pages held, not
slots x the longest context.

Shards: under a mesh the device pool is split by pages over `shards` chips in blocks (chip c
holds pages [c * n / shards, (c + 1) * n / shards)), and each chip attends over the pages it
holds (`avalon.model.attention`, the sharded paged attention). Page j of every slot comes from
chip j % shards, so a slot's pages, and the attention work over them, spread evenly over the
chips, and chip c scans only table columns c, c + shards, ... Growing the pool keeps each
page on its chip at the same local offset, so its id changes (`grow` renumbers the tables).
"""

from __future__ import annotations

import functools

import numpy as np


def pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def ladder(least: int, most: int, ratio: int) -> tuple[int, ...]:
    """Bucket sizes least, least * ratio, ... up to and including `most`."""
    out = [min(least, most)]
    while out[-1] < most:
        out.append(min(most, out[-1] * ratio))
    return tuple(out)


def bucket(n: int, sizes: tuple[int, ...]) -> int:
    """The smallest bucket of `sizes` (ascending) holding n."""
    for size in sizes:
        if n <= size:
            return size
    raise ValueError(f"bucket: {n} exceeds the largest bucket {sizes[-1]}")


def chunk_take(need: int, sizes: tuple[int, ...], dispatch_cost: int) -> int:
    """How many of `need` tokens (<= sizes[-1]) one prefill dispatch should feed.

    Feeding all of them pads to bucket(need); a 4x ladder pads a 64-token prompt to 128, and a
    CPU's prefill costs in proportion to the padded tokens. Feeding a smaller rung first and
    the rest in later dispatches costs the rung, `dispatch_cost` padded tokens' worth of
    per-dispatch work, and the best plan for the rest. Returns `need` when one dispatch is no
    dearer (ties go to fewer dispatches), else the first rung of the cheapest plan."""
    if not 0 < need <= sizes[-1]:
        raise ValueError(f"chunk_take: need={need} must be in [1, {sizes[-1]}]")
    return _chunk_plan(need, tuple(sizes), dispatch_cost)[1]


@functools.lru_cache(maxsize=4096)
def _chunk_plan(need: int, sizes: tuple[int, ...], dispatch_cost: int) -> tuple[int, int]:
    """(padded work of the cheapest way to feed `need` tokens, tokens its first dispatch feeds)."""
    best = (bucket(need, sizes), need)
    for rung in sizes:
        if rung >= need:
            break
        work = rung + dispatch_cost + _chunk_plan(need - rung, sizes, dispatch_cost)[0]
        if work < best[0]:
            best = (work, rung)
    return best


class PagePool:
    def __init__(self, page_size: int, num_pages: int, num_slots: int, shards: int = 1):
        if num_pages % shards:
            raise ValueError(f"PagePool: num_pages={num_pages} is not a multiple of the "
                             f"{shards} chips the pool is split over")
        self.size = page_size
        self.shards = shards
        self.num_pages = num_pages
        self.refs = np.zeros(num_pages, np.int32)
        self.held: list[list[int]] = [[] for _ in range(num_slots)]
        self._fill_free()

    def _fill_free(self) -> None:
        """Free lists per chip from the reference counts; pop() hands out the lowest page."""
        per = self.num_pages // self.shards
        self.free_by_shard = [[p for p in range(c * per + per - 1, c * per - 1, -1)
                               if self.refs[p] == 0] for c in range(self.shards)]

    @property
    def free(self) -> int:
        """Free pages, over all chips."""
        return sum(map(len, self.free_by_shard))

    @property
    def pages_in_use(self) -> int:
        return self.num_pages - self.free

    def pages_for(self, tokens: int) -> int:
        return -(-int(tokens) // self.size)

    def wanted(self, needs: dict[int, int]) -> np.ndarray:
        """New pages per chip to give each slot s room for needs[s] tokens."""
        want = np.zeros(self.shards, np.int64)
        for s, n in needs.items():
            for j in range(len(self.held[s]), self.pages_for(n)):
                want[j % self.shards] += 1
        return want

    def shortfall(self, needs: dict[int, int]) -> int:
        """Pages missing (summed over chips, each short of its own share) to give each slot s
        room for needs[s] tokens. Growing the pool by `shortfall * shards` pages covers it."""
        want = self.wanted(needs)
        have = np.array([len(f) for f in self.free_by_shard])
        return int(np.maximum(want - have, 0).max()) * self.shards if want.any() else 0

    def _pop(self, j: int) -> int:
        page = self.free_by_shard[j % self.shards].pop()
        self.refs[page] = 1
        return page

    def grow(self, num_pages: int) -> dict[int, int]:
        """Grow to `num_pages` pages (a multiple of shards). Each page keeps its chip and local
        offset, so with shards > 1 its id changes: returns {old id: new id} (empty when no id
        changed) after renumbering every slot's pages."""
        if num_pages % self.shards:
            raise ValueError(f"PagePool.grow: num_pages={num_pages} is not a multiple of "
                             f"{self.shards} chips")
        old_per, new_per = self.num_pages // self.shards, num_pages // self.shards
        remap = np.array([(p // old_per) * new_per + p % old_per
                          for p in range(self.num_pages)], np.int64)
        refs = np.zeros(num_pages, np.int32)
        refs[remap] = self.refs
        self.refs = refs
        self.held = [[int(remap[p]) for p in held] for held in self.held]
        self.num_pages = num_pages
        self._fill_free()
        return {p: int(q) for p, q in enumerate(remap) if p != q}

    def ensure(self, slot: int, tokens: int) -> None:
        """Slot `slot` holds pages for at least `tokens` positions (call `shortfall` first)."""
        held = self.held[slot]
        while len(held) < self.pages_for(tokens):
            held.append(self._pop(len(held)))

    def release(self, slot: int) -> None:
        per = self.num_pages // self.shards
        for page in self.held[slot]:
            self.refs[page] -= 1
            if self.refs[page] == 0:
                self.free_by_shard[page // per].append(page)
        self.held[slot] = []

    def fork(self, src: int, dst: list[int], length: int) -> tuple[list[int], list[int]]:
        """Slots dst share src's full pages (of a `length`-token context) and get a fresh copy
        of its partly filled last page (on the same chip). Returns (pages to copy from, pages
        to copy to)."""
        full = length // self.size
        shared = self.held[src][:full]
        partial = self.held[src][full] if length % self.size else None
        copy_from, copy_to = [], []
        for d in dst:
            self.release(d)
            for page in shared:
                self.refs[page] += 1
            self.held[d] = list(shared)
            if partial is not None:
                page = self._pop(full)
                self.held[d].append(page)
                copy_from.append(partial)
                copy_to.append(page)
        return copy_from, copy_to

    def table(self, slots, width: int) -> np.ndarray:
        """Page tables [len(slots), width] (entries past a slot's pages = num_pages, i.e. none);
        a slot id < 0 is a padding row."""
        out = np.full((len(slots), width), self.num_pages, np.int32)
        for r, s in enumerate(slots):
            if s >= 0:
                held = self.held[s][:width]
                out[r, :len(held)] = held
        return out
