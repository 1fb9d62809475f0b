"""`dense` equals its einsum reference, on the model's own JAX and on the CPU's products of
flattened tokens (`backends.cpu_products` as `Ops.product`): values and the gradients of both
operands, for one and two contracted axes, with and without a mesh; the LM head's product with
its weight gradient on a transposed copy. (The backends' weight layouts against the same
reference: tests/backends/.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon.backends import cpu_products
from avalon.model.dense import dense, dense_einsum
from avalon.model.ops import PLAIN, Ops
from avalon.sharding import TRAIN_RULES, make_mesh, use_rules

CPU = Ops(product=cpu_products.product, head_product=cpu_products.head_product)

CASES = [  # (x shape, w shape, n_in)
    ((3, 5, 8), (8, 6), 1),  # [b, t, d] @ [d, f]: the LM head, Mamba in_proj, MLP
    ((3, 5, 8), (8, 2, 4), 1),  # [b, t, d] @ [d, h, k]: attention q/k/v
    ((3, 5, 2, 4), (2, 4, 8), 2),  # [b, t, h, k] @ [h, k, d]: attention o, Mamba out
    ((7, 8), (8, 6), 1),  # already 2-D (the MTP head on flat tokens)
]


@pytest.mark.parametrize("ops", [PLAIN, CPU], ids=["plain", "cpu"])
@pytest.mark.parametrize("xs,ws,n_in", CASES)
def test_dense_equals_einsum_values_and_gradients(xs, ws, n_in, ops):
    kx, kw, kg = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, xs)
    w = jax.random.normal(kw, ws)
    probe = jax.random.normal(kg, xs[:len(xs) - n_in] + ws[n_in:])
    dense_ops = lambda x, w, n_in: dense(x, w, n_in, ops)
    got = jax.jit(dense_ops, static_argnums=2)(x, w, n_in)
    want = dense_einsum(x, w, n_in)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)

    def loss(fn, x, w):
        return jnp.sum(fn(x, w, n_in) * probe)

    g_got = jax.jit(jax.grad(lambda x, w: loss(dense_ops, x, w), argnums=(0, 1)))(x, w)
    g_want = jax.grad(lambda x, w: loss(dense_einsum, x, w), argnums=(0, 1))(x, w)
    for name, a, b in zip(("dx", "dw"), g_got, g_want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=name)


def test_dense_under_a_mesh_equals_einsum():
    mesh = make_mesh({"data": 2, "tensor": 4})
    x = jax.random.normal(jax.random.key(1), (4, 5, 8))
    w = jax.random.normal(jax.random.key(2), (8, 2, 4))

    def fn(x, w):
        with use_rules(mesh, TRAIN_RULES):
            return dense(x, w, ops=CPU)  # under a mesh the einsum, whatever the ops

    np.testing.assert_allclose(jax.jit(fn)(x, w), dense_einsum(x, w), rtol=1e-6, atol=1e-6)


def test_dense_rejects_mismatched_axes():
    with pytest.raises(ValueError, match="input axes"):
        dense(jnp.ones((2, 3, 4)), jnp.ones((5, 6)))


@pytest.mark.parametrize("ops", [PLAIN, CPU], ids=["plain", "cpu"])
def test_dense_gradients_keep_each_operand_dtype(ops):
    """A bf16 activation against an fp32 weight (mixed-precision training): the weight's
    gradient comes back fp32 and equals the einsum reference's."""
    x = jax.random.normal(jax.random.key(3), (4, 6, 8)).astype(jnp.bfloat16)
    w = jax.random.normal(jax.random.key(4), (8, 5))

    def loss(fn, x, w):
        return jnp.sum(fn(x, w).astype(jnp.float32) ** 2)

    dense_ops = lambda x, w: dense(x, w, ops=ops)
    gx, gw = jax.jit(jax.grad(lambda x, w: loss(dense_ops, x, w), argnums=(0, 1)))(x, w)
    rx, rw = jax.grad(lambda x, w: loss(dense_einsum, x, w), argnums=(0, 1))(x, w)
    assert (gx.dtype, gw.dtype) == (jnp.bfloat16, jnp.float32)
    np.testing.assert_allclose(gw, rw, rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(gx.astype(jnp.float32), rx.astype(jnp.float32), rtol=2e-2,
                               atol=2e-2)


def test_dense_head_value_and_gradients_equal_the_plain_product():
    """The CPU's LM head product (its weight gradient on a transposed copy of x) against
    autodiff of x @ w, and the tied head on the embedding as stored."""
    from avalon.model.dense import dense_head, tied_head

    kx, kw, kg = jax.random.split(jax.random.key(11), 3)
    x = jax.random.normal(kx, (3, 40, 24))
    w = jax.random.normal(kw, (24, 96))
    c = jax.random.normal(kg, (3, 40, 96))

    def loss(fn):
        return lambda x, w: jnp.sum(c * jnp.tanh(fn(x, w)))

    ref = jax.jit(jax.value_and_grad(loss(lambda x, w: jnp.einsum("bsd,dv->bsv", x, w)),
                                     argnums=(0, 1)))(x, w)
    heads = {"head": lambda x, w: dense_head(x, w, CPU),
             "tied": lambda x, w: tied_head(x, w.T, CPU)}
    for name, head in heads.items():
        got = jax.jit(jax.value_and_grad(loss(head), argnums=(0, 1)))(x, w)
        np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, err_msg=name)
        for a, b in zip(got[1], ref[1]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=name)
    with pytest.raises(ValueError, match="dense_head: x"):
        dense_head(x, w[:5], CPU)
