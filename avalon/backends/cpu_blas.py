"""The update step's fp32 products on CPU through Intel MKL (the `cpu` extra), behind XLA's FFI.

XLA:CPU runs the update step's fp32 products at 130-139 GFLOP/s on one core here and the LM
head's at ~100; MKL's `cblas_sgemm` runs every one of the step's shapes, transposed or not, at
151-165 (`docs/results_history.md`, SmolLM2's update step with products on MKL), and the products
are two thirds of SmolLM2-135M's update step. `cpu_blas.cc` calls it (sequential MKL, the columns
split over XLA's intra-op threads); `product` is the product with its gradients as the same calls
(dx = g w^T, dw = x^T g; the tied LM head's with the embedding as stored), the update step's
`Ops.product` on a CPU with one device (`cpu_products.mkl_product`, `training.TrainingPlatform`).
Results equal XLA's to rounding (tests/backends/test_cpu_blas.py).

MKL is found as the `mkl` wheel installs it (`<prefix>/lib/libmkl_rt.so.*`), or at
$AVALON_BLAS_LIBRARY. Without it (not installed, or not an x86-64 machine) `ready()` is False
and the update step keeps XLA's products, with no warning: the library is optional.
"""

from __future__ import annotations

import functools
import glob
import os
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp

from avalon.backends import cpu_build

SOURCE = Path(__file__).with_suffix(".cc")
TARGET = "avalon_blas_matmul"
_SYMBOLS = {TARGET: "AvalonBlasMatmul"}
LIBRARY_ENV = "AVALON_BLAS_LIBRARY"


def find_library() -> str | None:
    """MKL's single dynamic library: $AVALON_BLAS_LIBRARY, else where the `mkl` wheel puts it
    (this interpreter's prefix), else None."""
    if os.environ.get(LIBRARY_ENV):
        return os.environ[LIBRARY_ENV]
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        found = sorted(glob.glob(os.path.join(prefix, "lib", "libmkl_rt.so*")))
        if found:
            return found[0]
    return None


@functools.cache
def ready() -> bool:
    """Load MKL and build (once per machine) and register the kernel; True when the update step
    can use it. False without MKL (silently: it is optional) or, with one warning, when the
    kernel does not build or MKL does not load."""
    path = find_library()
    if path is None:
        return False
    try:
        lib = cpu_build.register(SOURCE, _SYMBOLS)
        status = lib.AvalonBlasInit(os.fsencode(path))
        if status != 0:
            raise OSError(f"{path}: " + ("does not load" if status == 1 else "no cblas_sgemm"))
        return True
    except cpu_build.FAILURES as e:
        warnings.warn(f"avalon: the CPU BLAS kernel ({SOURCE.name}) is not available ({e}); the "
                      "update step uses XLA's products", stacklevel=2)
        return False


def _sgemm(a, b, transpose_a: bool, transpose_b: bool):
    m = a.shape[1] if transpose_a else a.shape[0]
    n = b.shape[0] if transpose_b else b.shape[1]
    return jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((m, n), jnp.float32),
                            vmap_method="sequential")(
        a, b, transpose_a=transpose_a, transpose_b=transpose_b)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def product(x2: jax.Array, w2: jax.Array, transpose_w: bool) -> jax.Array:
    """`model.dense`'s platform product on MKL (`ready()` must be True), float32: x2 [m, k] @ w2
    [k, n], or with transpose_w x2 @ w2.T for w2 [n, k] (a tied LM head: the embedding as
    stored; its gradient comes out [n, k] too, so neither is transposed in memory)."""
    return _sgemm(x2, w2, False, transpose_w)


def _product_fwd(x2, w2, transpose_w):
    return _sgemm(x2, w2, False, transpose_w), (x2, w2)


def _product_bwd(transpose_w, res, g):
    x2, w2 = res
    dx = _sgemm(g, w2, False, not transpose_w)  # g w2^T, or g w2 for a stored-transposed w2
    dw = _sgemm(g, x2, True, False) if transpose_w else _sgemm(x2, g, True, False)
    return dx, dw


product.defvjp(_product_fwd, _product_bwd)
