"""The model's projections on CPU: products of flattened tokens, and the LM head's weight
gradient on a transposed copy (`Ops.product`, `Ops.head_product`).

Why flattened: for a matmul whose activations keep two leading axes ([b, t, d]), the weight
gradient contracts over both, and XLA:CPU (jax 0.10) lowers the einsum as a transposed copy of
the output gradient followed by a matmul with a transposed operand, several times slower than
the same product on flattened tokens (the LM head's gradient at 8 x 512 tokens, width 256, vocab
4096: 1.78 s against 1.01 s for its whole forward and backward, one core).

Why the head's transposed copy: XLA:CPU's product contracting the rows of the [N, V] logits'
gradient in place runs at 31 GFLOP/s, on a transposed copy of x2 [N, D] at 59 (one AVX2 core,
N = 4,096, D = 256, V = 4,096); the copy is N x D, a sixteenth of the gradient. The barrier stops
XLA folding the transpose back into the dot.

With MKL installed (`cpu_blas`), the update step's float32 products run on it instead (`mkl_*`);
other dtypes keep XLA's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from avalon.backends import cpu_blas


def product(x2: jax.Array, w2: jax.Array, transpose_w: bool = False) -> jax.Array:
    """x2 [m, k] @ w2 [k, n] (with transpose_w, w2 [n, k] and x2 @ w2.T): XLA's 2-D product."""
    return x2 @ (w2.T if transpose_w else w2)


def head_product(x2: jax.Array, w2: jax.Array, transpose_w: bool = False) -> jax.Array:
    """`product` for the LM head (w2 [D, V]; with transpose_w the tied embedding [V, D]), its
    weight gradient on a transposed copy of x2."""
    return _head_product(x2, w2.T if transpose_w else w2)


def _on_mkl(xla_fn):
    """`xla_fn` (`product` or `head_product`) on MKL for float32 operands (`cpu_blas.ready()`
    must be True: a tied embedding used as stored, no [D, V] copy of it nor of its gradient per
    step), else `xla_fn` itself."""
    def fn(x2: jax.Array, w2: jax.Array, transpose_w: bool = False) -> jax.Array:
        if x2.dtype == jnp.float32 and w2.dtype == jnp.float32:
            return cpu_blas.product(x2, w2, transpose_w)
        return xla_fn(x2, w2, transpose_w)
    return fn


mkl_product = _on_mkl(product)
mkl_head_product = _on_mkl(head_product)


def _transposed(a: jax.Array) -> jax.Array:
    return jax.lax.optimization_barrier(a.T)


@jax.custom_vjp
def _head_product(x2, w):
    return x2 @ w


def _head_fwd(x2, w):
    return x2 @ w, (x2, w)


def _head_bwd(res, g):
    x2, w = res
    return g @ w.T, _transposed(x2) @ g


_head_product.defvjp(_head_fwd, _head_bwd)
