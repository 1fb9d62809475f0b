"""The function families of the software-build environment: spec, reference, input generator.

Tasks ask for procedurally generated pipelines (`generated.py`); the 14 hand-written families
below stay for tests and examples. `BY_NAME` finds both: a hand-written name, or any name that
spells a generated pipeline (its `Family` is built from the name).

Each family has a signature and a one-line spec (what the task shows), a reference
implementation as source text (run in the grader's parent process to compute expected outputs,
and what the scripted teacher writes), and an input generator. Generators balance the output
classes (palindromes or not, each fizzbuzz case, shared factors for gcd, ...), so no constant
answer passes more than about half of a family's hidden tests (tests/envs checks the mode
frequency of every family).
"""

from __future__ import annotations

import dataclasses
import functools
import string
from collections.abc import Callable, Iterator, Mapping

import numpy as np

Gen = Callable[[np.random.Generator], tuple]


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    params: str  # "x, lo, hi"
    spec: str
    source: str  # the reference implementation (a def of `name`)
    gen: Gen

    @property
    def signature(self) -> str:
        return f"{self.name}({self.params})"

    def reference(self) -> Callable:
        namespace: dict = {}
        exec(self.source, namespace)  # our own constant source text
        return namespace[self.name]


def _word(rng, lo=1, hi=6, letters=string.ascii_lowercase) -> str:
    n = int(rng.integers(lo, hi + 1))
    return "".join(letters[int(i)] for i in rng.integers(0, len(letters), size=n))


def _ints(rng, lo, hi, n_lo, n_hi) -> list[int]:
    n = int(rng.integers(n_lo, n_hi + 1))
    return [int(x) for x in rng.integers(lo, hi + 1, size=n)]


def _gen_clamp(rng):
    lo = int(rng.integers(-20, 11))
    hi = lo + int(rng.integers(0, 21))
    where = int(rng.integers(3))
    x = [lo - int(rng.integers(1, 20)), int(rng.integers(lo, hi + 1)),
         hi + int(rng.integers(1, 20))][where]
    return x, lo, hi


def _gen_text(rng):
    return (" ".join(_word(rng, 1, 7, string.ascii_letters) for _ in range(rng.integers(0, 5))),)


def _gen_words(rng):
    return (" ".join(_word(rng) for _ in range(rng.integers(1, 7))),)


def _gen_palindrome(rng):
    if rng.random() < 0.5:
        half = _word(rng, 1, 5)
        s = half + _word(rng, 0, 1) + half[::-1]
    else:
        s = _word(rng, 2, 9)
        while s == s[::-1]:
            s = _word(rng, 2, 9)
    return ("".join(c.upper() if rng.random() < 0.3 else c for c in s),)


def _gen_runs(rng):
    runs = int(rng.integers(0, 6))
    return ("".join(string.ascii_lowercase[int(rng.integers(5))] * int(rng.integers(1, 5))
                    for _ in range(runs)),)


def _gen_caesar(rng):
    return _word(rng, 1, 10, string.ascii_lowercase + " .!"), int(rng.integers(0, 60))


def _gen_second(rng):
    while True:
        xs = _ints(rng, -30, 30, 2, 8)
        if len(set(xs)) >= 2:
            return (xs,)


def _gen_dedupe(rng):
    return (_ints(rng, 0, 6, 0, 10),)


def _gen_rotate(rng):
    xs = _ints(rng, -9, 9, 0, 7)
    return xs, int(rng.integers(0, 2 * len(xs) + 2))


def _gen_gcd(rng):
    g = int(rng.integers(1, 13))
    return g * int(rng.integers(1, 30)), g * int(rng.integers(1, 30))


def _gen_fizz(rng):
    kind = int(rng.integers(4))
    while True:
        n = int(rng.integers(1, 300))
        if (n % 3 == 0) + 2 * (n % 5 == 0) == kind:
            return (n,)


def _gen_digits(rng):
    return (int(rng.integers(0, 10 ** int(rng.integers(1, 8)))),)


def _gen_primes(rng):
    return (int(rng.integers(0, 200)),)


def _gen_longest(rng):
    xs = []
    for _ in range(int(rng.integers(0, 5))):
        xs += [int(rng.integers(0, 4))] * int(rng.integers(1, 5))
    return (xs,)


FAMILIES: tuple[Family, ...] = (
    Family("clamp", "x, lo, hi", "x limited to the range lo..hi (lo <= hi).",
           "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n", _gen_clamp),
    Family("count_vowels", "s", "how many letters of s are vowels (aeiou, either case).",
           "def count_vowels(s):\n    return sum(c in 'aeiouAEIOU' for c in s)\n", _gen_text),
    Family("reverse_words", "s", "the words of s (split on spaces) in reverse order, joined "
           "by one space.",
           "def reverse_words(s):\n    return ' '.join(reversed(s.split()))\n", _gen_words),
    Family("digit_sum", "n", "the sum of the decimal digits of n (n >= 0).",
           "def digit_sum(n):\n    return sum(int(c) for c in str(n))\n", _gen_digits),
    Family("is_palindrome", "s", "True if s reads the same backwards ignoring case, else "
           "False.",
           "def is_palindrome(s):\n    t = s.lower()\n    return t == t[::-1]\n", _gen_palindrome),
    Family("run_length", "s", "each run of a repeated character as the character and the run "
           "length, e.g. 'aaab' gives 'a3b1'.",
           "def run_length(s):\n    out = []\n    i = 0\n    while i < len(s):\n"
           "        j = i\n        while j < len(s) and s[j] == s[i]:\n            j += 1\n"
           "        out.append(s[i] + str(j - i))\n        i = j\n    return ''.join(out)\n",
           _gen_runs),
    Family("caesar", "s, k", "s with each lowercase letter moved k places on in the alphabet "
           "(wrapping from z to a); other characters unchanged.",
           "def caesar(s, k):\n    return ''.join(chr((ord(c) - 97 + k) % 26 + 97) "
           "if 'a' <= c <= 'z' else c for c in s)\n", _gen_caesar),
    Family("second_largest", "xs", "the second largest distinct value of the list xs (it has "
           "at least two distinct values).",
           "def second_largest(xs):\n    return sorted(set(xs))[-2]\n", _gen_second),
    Family("dedupe", "xs", "the list xs without repeats, keeping each first occurrence in "
           "order.",
           "def dedupe(xs):\n    seen = set()\n    out = []\n    for x in xs:\n"
           "        if x not in seen:\n            seen.add(x)\n            out.append(x)\n"
           "    return out\n", _gen_dedupe),
    Family("rotate", "xs, k", "the list xs rotated right by k places (k >= 0, may exceed "
           "len(xs)).",
           "def rotate(xs, k):\n    if not xs:\n        return []\n    k %= len(xs)\n"
           "    return xs[len(xs) - k:] + xs[:len(xs) - k]\n", _gen_rotate),
    Family("gcd", "a, b", "the greatest common divisor of a and b (both >= 1).",
           "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n", _gen_gcd),
    Family("fizzbuzz", "n", "'FizzBuzz' if n is a multiple of 15, 'Fizz' of 3, 'Buzz' of 5, "
           "else str(n).",
           "def fizzbuzz(n):\n    if n % 15 == 0:\n        return 'FizzBuzz'\n"
           "    if n % 3 == 0:\n        return 'Fizz'\n    if n % 5 == 0:\n"
           "        return 'Buzz'\n    return str(n)\n", _gen_fizz),
    Family("count_primes", "n", "how many primes are smaller than n (n >= 0).",
           "def count_primes(n):\n    return sum(all(p % d for d in range(2, int(p ** 0.5) + 1))"
           " for p in range(2, n))\n", _gen_primes),
    Family("longest_run", "xs", "the length of the longest run of equal adjacent values in "
           "the list xs (0 when it is empty).",
           "def longest_run(xs):\n    best = run = 0\n    for i, x in enumerate(xs):\n"
           "        run = run + 1 if i and x == xs[i - 1] else 1\n        best = max(best, run)\n"
           "    return best\n", _gen_longest),
)
HAND_WRITTEN = {f.name: f for f in FAMILIES}


@functools.cache
def _generated(name: str) -> Family | None:
    from avalon.envs.software import generated  # generated.py imports nothing of this module
    steps = generated.parse(name)
    if steps is None:
        return None
    return Family(name, "xs", generated.spec_text(steps), generated.source(name, steps),
                  generated.gen_input)


class FunctionIndex(Mapping):
    """Name -> Family for hand-written families and generated pipelines. Iterating lists the
    hand-written ones only (the generated ones are too many)."""

    def __getitem__(self, name: str) -> Family:
        fam = HAND_WRITTEN.get(name) or (_generated(name) if isinstance(name, str) else None)
        if fam is None:
            raise KeyError(name)
        return fam

    def __contains__(self, name) -> bool:
        return isinstance(name, str) and (name in HAND_WRITTEN or _generated(name) is not None)

    def __iter__(self) -> Iterator[str]:
        return iter(HAND_WRITTEN)

    def __len__(self) -> int:
        return len(HAND_WRITTEN)


BY_NAME = FunctionIndex()
