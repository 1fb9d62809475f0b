"""The host's page allocator for the engine's KV pool.

Each slot holds an ordered list of pool pages (its position p lives in page list[p // size]).
Pages are reference-counted: a fork shares the source's full pages (positions below a context
length are never written again) and copies only its last, partly filled page. A page returns to
the free list when no slot holds it. The pool grows (the device arrays with it) when the free
list runs dry; its size is a power of two, so memory follows the pages held, not
slots x the longest context.
"""

from __future__ import annotations

import numpy as np


def pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


class PagePool:
    def __init__(self, page_size: int, num_pages: int, num_slots: int):
        self.size = page_size
        self.num_pages = num_pages
        self.refs = np.zeros(num_pages, np.int32)
        self.free = list(range(num_pages - 1, -1, -1))  # pop() hands out the lowest page
        self.held: list[list[int]] = [[] for _ in range(num_slots)]

    @property
    def pages_in_use(self) -> int:
        return self.num_pages - len(self.free)

    def pages_for(self, tokens: int) -> int:
        return -(-int(tokens) // self.size)

    def shortfall(self, needs: dict[int, int]) -> int:
        """Pages missing from the free list to give each slot s room for needs[s] tokens."""
        want = sum(max(0, self.pages_for(n) - len(self.held[s])) for s, n in needs.items())
        return max(0, want - len(self.free))

    def grow(self, num_pages: int) -> None:
        old = self.num_pages
        self.refs = np.concatenate([self.refs, np.zeros(num_pages - old, np.int32)])
        self.free = list(range(num_pages - 1, old - 1, -1)) + self.free
        self.num_pages = num_pages

    def ensure(self, slot: int, tokens: int) -> None:
        """Slot `slot` holds pages for at least `tokens` positions (call `shortfall` first)."""
        held = self.held[slot]
        while len(held) < self.pages_for(tokens):
            page = self.free.pop()
            self.refs[page] = 1
            held.append(page)

    def release(self, slot: int) -> None:
        for page in self.held[slot]:
            self.refs[page] -= 1
            if self.refs[page] == 0:
                self.free.append(page)
        self.held[slot] = []

    def fork(self, src: int, dst: list[int], length: int) -> tuple[list[int], list[int]]:
        """Slots dst share src's full pages (of a `length`-token context) and get a fresh copy
        of its partly filled last page. Returns (pages to copy from, pages to copy to)."""
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
                page = self.free.pop()
                self.refs[page] = 1
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
