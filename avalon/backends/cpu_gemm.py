"""Products with few token rows on CPU: a small C++ kernel behind XLA's FFI, for the engine.

In decode every projection reads its whole weight for a handful of rows, so its speed is how fast
it streams the weight from memory. XLA:CPU's product does that poorly at few rows: 6-7 GB/s for
an 8-row product against a cold [256, 512] weight on one Zen 4 core, where a plain read of
memory runs at ~28 GB/s (`experiments/bench/RESULTS.md`, "The C++ kernel for the engine's
products on CPU"). `cpu_gemm.cc` computes the
same product reading the weight once, in the order it is stored (`Packed`): 2.3-2.5x XLA's rate
at 8 rows, 1.3-1.9x at 1, 1.1x at 64, level at 512 (compute bound; `experiments/bench/
cpu_gemm.py`), so the engine uses it for prefill too.

The kernel is compiled once per machine, at first use (`cpu_build`: the system's C++ compiler,
`-O3 -march=native`, a cache keyed by the source, jaxlib and the CPU); `ready()` builds and
registers it and says whether it can be used. Without a
compiler (or on a failed build) it warns once and the engine keeps XLA's products
(`cpu_out_in.OutIn`).

`Packed` holds a weight w [*in, *out] as p [..., nb, K, B]: K = prod(in), the output columns in
blocks of B = 32 (zero-padded to a whole block), block-major. Leading axes (a layer stack's, the
experts') stay in front, so indexing the pytree takes them off as for any other leaf. The routed
experts in this layout run sorted by expert, each expert's rows one run (`experts_packed`).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import jax
import jax.numpy as jnp

from avalon.backends import cpu_build
from avalon.model.activations import activate
from avalon.model.config import Activation
from avalon.model.dense import BackendWeight
from avalon.model.moe import sort_choices

BLOCK = 32  # output columns per packed block (cpu_gemm.cc: kBlock)
SOURCE = Path(__file__).with_suffix(".cc")
ROWS_TARGET = "avalon_rows_product"
GROUPED_TARGET = "avalon_grouped_rows_product"
# The kernel's targets per stored weight dtype (x and y are float32 for both).
_TARGETS = {"float32": (ROWS_TARGET, GROUPED_TARGET),
            "bfloat16": (ROWS_TARGET + "_bf16", GROUPED_TARGET + "_bf16")}
_SYMBOLS = {ROWS_TARGET: "AvalonRowsProduct", GROUPED_TARGET: "AvalonGroupedRowsProduct",
            ROWS_TARGET + "_bf16": "AvalonRowsProductBf16",
            GROUPED_TARGET + "_bf16": "AvalonGroupedRowsProductBf16"}
STORED_DTYPES = tuple(_TARGETS)


@jax.tree_util.register_pytree_node_class
class Packed(BackendWeight):
    """A projection weight w [*in, *out] held as p [..., nb, K, BLOCK] (see the module doc).
    `shape` and `dtype` read as the weight's own (`model.dense.BackendWeight`).

    p is stored float32 or bfloat16 (`STORED_DTYPES`); `astype` to a wider float type does not
    copy it: the kernel widens a bf16 weight in registers and computes in float32, so the cast
    is exact and costs nothing per step (the layers cast every weight to the activations' dtype;
    a copy of a bf16 view's weights at every decode step would cost more than their bytes
    save). `dtype` is then the cast's, `p.dtype` the storage's."""

    def __init__(self, p: jax.Array, in_shape: tuple, out_shape: tuple, dtype=None):
        self.p, self.in_shape, self.out_shape = p, tuple(in_shape), tuple(out_shape)
        self._dtype = jnp.dtype(p.dtype if dtype is None else dtype)

    @classmethod
    def of(cls, w: jax.Array, n_in: int, lead: int = 0) -> Packed:
        """w [*lead, *in, *out] -> Packed (one copy)."""
        in_shape = w.shape[lead:lead + n_in]
        out_shape = w.shape[lead + n_in:]
        k, o = math.prod(in_shape), math.prod(out_shape)
        nb = -(-o // BLOCK)
        flat = w.reshape(*w.shape[:lead], k, o)
        flat = jnp.pad(flat, [(0, 0)] * (lead + 1) + [(0, nb * BLOCK - o)])
        blocks = flat.reshape(*w.shape[:lead], k, nb, BLOCK)
        return cls(jnp.swapaxes(blocks, -3, -2), in_shape, out_shape)

    @property
    def shape(self) -> tuple:
        return (*self.p.shape[:-3], *self.in_shape, *self.out_shape)

    @property
    def dtype(self):
        return self._dtype

    @property
    def out_size(self) -> int:
        return math.prod(self.out_shape)

    def astype(self, dtype) -> Packed:
        dtype = jnp.dtype(dtype)
        # Widening (bf16 -> float32 / float64, or the stored type itself): no copy. Not to
        # float16 from bf16 (same size, but a narrower range: a real cast).
        if dtype == self.p.dtype or (jnp.issubdtype(dtype, jnp.floating)
                                     and dtype.itemsize > self.p.dtype.itemsize):
            return Packed(self.p, self.in_shape, self.out_shape, dtype)
        if dtype.name not in STORED_DTYPES:
            raise ValueError(f"Packed.astype({dtype}): a packed weight is stored as one of "
                             f"{', '.join(STORED_DTYPES)}")
        return Packed(self.p.astype(dtype), self.in_shape, self.out_shape)

    def as_in_out(self) -> jax.Array:
        """The weight in its own layout [*in, *out] and dtype (a copy; the reference)."""
        lead = self.p.shape[:-3]
        k = self.p.shape[-2]
        flat = jnp.swapaxes(self.p, -3, -2).reshape(*lead, k, -1)[..., :self.out_size]
        return flat.reshape(self.shape).astype(self.dtype)

    def product(self, x2: jax.Array) -> jax.Array:
        return rows_product(x2, self)

    def routed_experts(self, xl, idx, down: Packed, act=Activation.RELU2) -> jax.Array:
        return experts_packed(xl, idx, self, down, act)

    def tree_flatten(self):
        return (self.p,), (self.in_shape, self.out_shape, self._dtype)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(children[0], *aux)


def _targets(where: str, x: jax.Array, w: Packed) -> tuple[str, str]:
    """The kernel's (rows, grouped) targets for w's storage; x float32 or bfloat16."""
    if w.p.dtype.name not in _TARGETS or x.dtype not in (jnp.float32, jnp.bfloat16):
        raise ValueError(f"{where}: x is {x.dtype} and the packed weight {w.p.dtype}; the CPU "
                         f"kernel takes float32 or bfloat16 of each (weights stored as "
                         f"{', '.join(STORED_DTYPES)})")
    return _TARGETS[w.p.dtype.name]


def rows_product(x2: jax.Array, w: Packed) -> jax.Array:
    """x2 [n, K] @ w -> [n, prod(w.out_shape)] in x2's dtype, on the CPU kernel (`ready()` must
    be True): float32 products and sums whatever the dtypes stored."""
    target = _targets("cpu_gemm.rows_product", x2, w)[0]
    if w.p.ndim != 3 or x2.ndim != 2 or x2.shape[1] != w.p.shape[1]:
        raise ValueError(f"cpu_gemm.rows_product: x {x2.shape} and packed {w.p.shape} are not "
                         "[n, K] and [nb, K, B]")
    out = jax.ShapeDtypeStruct((x2.shape[0], w.out_size), jnp.float32)
    y = jax.ffi.ffi_call(target, out)(x2.astype(jnp.float32), w.p)
    return y.astype(x2.dtype)


def grouped_rows_product(rows: jax.Array, expert: jax.Array, w: Packed) -> jax.Array:
    """rows [r, K], expert [r] (each expert's rows one run; outside [0, E): zeros), w packed
    experts [E, ...] -> [r, prod(w.out_shape)] in rows' dtype: row i times expert expert[i]'s
    weight."""
    target = _targets("cpu_gemm.grouped_rows_product", rows, w)[1]
    if w.p.ndim != 4 or rows.ndim != 2 or rows.shape[1] != w.p.shape[2] \
            or expert.shape != rows.shape[:1]:
        raise ValueError(f"cpu_gemm.grouped_rows_product: rows {rows.shape}, expert "
                         f"{expert.shape} and packed {w.p.shape} are not [r, K], [r] and "
                         "[E, nb, K, B]")
    out = jax.ShapeDtypeStruct((rows.shape[0], w.out_size), jnp.float32)
    y = jax.ffi.ffi_call(target, out)(rows.astype(jnp.float32), expert.astype(jnp.int32), w.p)
    return y.astype(rows.dtype)


def experts_packed(xl, idx, up: Packed, down: Packed, act=Activation.RELU2):
    """The routed experts on the kernel (forward only): choices sorted by expert, each expert's
    rows one run, and each run's products read that expert's weights in place, once, for
    however many rows it has (no tiles, no padding rows, no weight copies). xl [n, w], idx
    [n, k] -> per-choice outputs [n, k, w]."""
    n, k = idx.shape
    flat, order, _ = sort_choices(idx, up.shape[0])
    expert = flat[order].astype(jnp.int32)
    rows = jnp.take(xl, order // k, axis=0)  # [n*k, w], grouped by expert
    h = activate(act, grouped_rows_product(rows, expert, up))
    y = grouped_rows_product(h, expert, down)
    inverse = jnp.zeros_like(order).at[order].set(jnp.arange(n * k, dtype=order.dtype))
    return jnp.take(y, inverse, axis=0).reshape(n, k, -1)


@functools.cache
def ready() -> bool:
    """Build (once per machine) and register the kernel; True when the engine can use it. On a
    failure, one warning and False: the engine then keeps XLA's products."""
    return cpu_build.ready(SOURCE, _SYMBOLS, "product", "the engine uses XLA's products")
