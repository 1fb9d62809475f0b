"""Procedurally generated functions for the software-build environment: compositions of
primitives over a list of integers, so held-out tasks ask for functions no training task had.

A function is a pipeline: two or three list steps, then optionally a reducer, e.g.
`keep_even__add_3__sum(xs)`: "keep the even values, then add 3 to each, then return their
sum". The name spells the pipeline (steps joined by `__`), so `family(name)` rebuilds its
`Family` (spec, reference source, input generator) from the name alone, and the grader and the
teacher look generated functions up exactly like the hand-written ones (`functions.BY_NAME`).

Splits. A pipeline's bucket is a fixed hash of its name mod `HELDOUT_BUCKETS`; held-out tasks
draw only pipelines of bucket 0 and training tasks only the others, so no held-out function
appears in any training task (not just no held-out *task*). About 10^5 pipelines exist.

Constant-answer floor: a pipeline is drawn only if, over `FLOOR_DRAWS` random inputs, no
single output occurs in more than half of them (so no constant answer passes about half of its
hidden tests), and its output is not always its input.
"""

from __future__ import annotations

import dataclasses
import functools
import zlib

import numpy as np

HELDOUT_BUCKETS = 8
FLOOR_DRAWS = 64
MAX_MODE_SHARE = 0.5


@dataclasses.dataclass(frozen=True)
class Primitive:
    key: str  # name part, `{k}` for the parameter (e.g. "add_{k}")
    params: tuple[int, ...]  # allowed k (empty: no parameter)
    phrase: str  # spec text, `{k}` for the parameter
    code: str  # a statement on `xs` (`{k}` for the parameter); reducers: an expression
    reducer: bool = False

    def name(self, k: int | None) -> str:
        return self.key.format(k=k)


STEPS = (
    Primitive("add_{k}", tuple(range(1, 10)), "add {k} to each value",
              "xs = [x + {k} for x in xs]"),
    Primitive("mul_{k}", (2, 3, 4, 5), "multiply each value by {k}",
              "xs = [x * {k} for x in xs]"),
    Primitive("keep_even", (), "keep the even values", "xs = [x for x in xs if x % 2 == 0]"),
    Primitive("keep_odd", (), "keep the odd values", "xs = [x for x in xs if x % 2 != 0]"),
    Primitive("keep_gt_{k}", tuple(range(0, 8)), "keep the values greater than {k}",
              "xs = [x for x in xs if x > {k}]"),
    Primitive("drop_{k}", (1, 2, 3), "drop the first {k} values", "xs = xs[{k}:]"),
    Primitive("take_{k}", (2, 3, 4), "keep only the first {k} values", "xs = xs[:{k}]"),
    Primitive("reverse", (), "reverse the order", "xs = xs[::-1]"),
    Primitive("sort", (), "sort ascending", "xs = sorted(xs)"),
    Primitive("sort_desc", (), "sort descending", "xs = sorted(xs, reverse=True)"),
    Primitive("dedupe", (), "remove repeated values, keeping first occurrences",
              "xs = list(dict.fromkeys(xs))"),
    Primitive("abs", (), "replace each value by its absolute value",
              "xs = [abs(x) for x in xs]"),
    Primitive("mod_{k}", (2, 3, 4, 5), "replace each value by its remainder mod {k} (0 to "
              "{k} minus 1)", "xs = [x % {k} for x in xs]"),
    Primitive("cumsum", (), "replace each value by the running sum up to it",
              "xs = [sum(xs[:i + 1]) for i in range(len(xs))]"),
    Primitive("pairsum", (), "replace the list by the sums of adjacent pairs (one shorter)",
              "xs = [a + b for a, b in zip(xs, xs[1:])]"),
)
REDUCERS = (
    Primitive("sum", (), "return their sum", "sum(xs)", True),
    Primitive("max", (), "return the largest (0 when none)", "max(xs, default=0)", True),
    Primitive("min", (), "return the smallest (0 when none)", "min(xs, default=0)", True),
    Primitive("len", (), "return how many there are", "len(xs)", True),
    Primitive("first", (), "return the first (0 when none)", "xs[0] if xs else 0", True),
    Primitive("last", (), "return the last (0 when none)", "xs[-1] if xs else 0", True),
    Primitive("count_even", (), "return how many are even", "sum(x % 2 == 0 for x in xs)",
              True),
)
_BY_NAME = {p.key: (p, None) for p in STEPS + REDUCERS if not p.params}
_BY_NAME.update({p.key.format(k=k): (p, k) for p in STEPS for k in p.params})


def gen_input(rng: np.random.Generator) -> tuple:
    n = int(rng.integers(0, 9))
    return ([int(x) for x in rng.integers(-9, 10, size=n)],)


def parse(name: str) -> list[tuple[Primitive, int | None]] | None:
    """The pipeline a name spells, or None when it is not one."""
    parts = name.split("__")
    if len(parts) < 2:
        return None
    steps = [_BY_NAME.get(p) for p in parts]
    if any(s is None for s in steps) or any(p.reducer for p, _ in steps[:-1]):
        return None
    return steps


def spec_text(steps) -> str:
    phrases = [p.phrase.format(k=k) for p, k in steps]
    tail = "" if steps[-1][0].reducer else ", then return the list"
    return "xs is a list of integers: " + ", then ".join(phrases) + tail + "."


def source(name: str, steps) -> str:
    body = [f"    {p.code.format(k=k)}\n" for p, k in steps if not p.reducer]
    last = steps[-1]
    ret = last[0].code.format(k=last[1]) if last[0].reducer else "xs"
    return f"def {name}(xs):\n" + "".join(body) + f"    return {ret}\n"


def bucket(name: str) -> int:
    return zlib.crc32(name.encode()) % HELDOUT_BUCKETS


def _draw_name(rng: np.random.Generator) -> str:
    parts: list[str] = []
    while len(parts) < int(rng.integers(2, 4)) or not parts:
        p = STEPS[int(rng.integers(len(STEPS)))]
        k = p.params[int(rng.integers(len(p.params)))] if p.params else None
        if not parts or p.name(k) != parts[-1]:  # no step twice in a row
            parts.append(p.name(k))
    if rng.random() < 0.6:
        parts.append(REDUCERS[int(rng.integers(len(REDUCERS)))].key)
    return "__".join(parts)


@functools.cache
def _floor(name: str, make_family) -> bool:
    return passes_floor(name, make_family(name).reference())


def passes_floor(name: str, reference, seed: int = 0) -> bool:
    """No output in more than half of `FLOOR_DRAWS` random inputs, and not the identity."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    seen: dict[str, int] = {}
    identity = True
    for _ in range(FLOOR_DRAWS):
        (xs,) = gen_input(rng)
        out = reference(list(xs))
        identity &= out == xs
        key = repr(out)
        seen[key] = seen.get(key, 0) + 1
    return not identity and max(seen.values()) <= MAX_MODE_SHARE * FLOOR_DRAWS


def draw(rng: np.random.Generator, n: int, heldout: bool, make_family) -> tuple[str, ...]:
    """n distinct pipeline names of the split's buckets that pass the floor (sorted)."""
    names: set[str] = set()
    while len(names) < n:
        name = _draw_name(rng)
        if (bucket(name) == 0) != heldout or name in names:
            continue
        if _floor(name, make_family):
            names.add(name)
    return tuple(sorted(names))
