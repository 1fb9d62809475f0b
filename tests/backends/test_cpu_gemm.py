"""The CPU product kernel (`backends/cpu_gemm.py`) against references: float64 NumPy products for
every row count the kernel splits differently (groups of up to 8 rows, sets of 32 sharing a
chunk), depths that end in a partial chunk, output widths that end in a partial block, and
weights large enough to split over threads; the grouped product per expert run, padding rows
included; the packed layout's round trip; `dense` and the MoE layer on packed weights against
their einsum / dense-backend references; the tied head packed for decode against the
embedding's product (the fallback when no compiler can build it: test_cpu_build.py).

`.ci/run` sets AVALON_REQUIRE_CPU_KERNEL=1, so in CI a kernel that does not build fails these
tests; elsewhere (a machine without a C++ compiler) they skip."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon.backends import cpu_gemm
from avalon.backends.cpu_gemm import Packed, grouped_rows_product, rows_product
from avalon.backends.decode import out_in_params
from avalon.model import init_params, presets
from avalon.model.config import MoeBackend
from avalon.model.dense import dense, dense_einsum
from avalon.model.model import lm_logits
from avalon.model.moe import moe_layer


@pytest.fixture(autouse=True)
def kernel(cpu_kernel):
    """Every test here needs the kernel (tests/conftest.py: fail in CI, skip without c++)."""


def _f64(a):
    return np.asarray(a, np.float64)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 8, 13, 31])
@pytest.mark.parametrize("k,o", [(256, 512), (24, 70), (5, 32), (7, 1)])
def test_rows_product_equals_float64(n, k, o):
    kx, kw = jax.random.split(jax.random.key(n * 1000 + o))
    x = jax.random.normal(kx, (n, k))
    w = jax.random.normal(kw, (k, o))
    got = jax.jit(rows_product)(x, Packed.of(w, 1))
    assert got.shape == (n, o) and got.dtype == jnp.float32
    np.testing.assert_allclose(_f64(got), _f64(x) @ _f64(w), atol=2e-5 * np.sqrt(k), rtol=1e-5)


@pytest.mark.parametrize("n", [1, 8, 9, 32, 40, 77])
@pytest.mark.parametrize("k,o", [(576, 1536), (100, 96)])
@pytest.mark.parametrize("w_dtype", [jnp.float32, jnp.bfloat16])
def test_rows_product_sets_chunks_and_threads_equal_float64(n, k, o, w_dtype):
    """Row counts past one group (8) and one set (32: the groups sharing a chunk of the block)
    and depths that end in a partial 64-step chunk; [576, 1536] (3.5 MB fp32, 1.8 MB bf16) is
    split by blocks over XLA's intra-op threads wherever the process has more than one core.
    A bf16 weight gives the float64 product of its own values."""
    kx, kw = jax.random.split(jax.random.key(n * 7 + k))
    x = jax.random.normal(kx, (n, k))
    w = jax.random.normal(kw, (k, o)).astype(w_dtype)
    got = jax.jit(rows_product)(x, Packed.of(w, 1))
    np.testing.assert_allclose(_f64(got), _f64(x) @ _f64(w), atol=2e-5 * np.sqrt(k), rtol=1e-5)


@pytest.mark.parametrize("w_dtype", [jnp.float32, jnp.bfloat16])
def test_grouped_rows_product_large_experts_split_over_threads(w_dtype):
    """Experts large enough to split by blocks over the intra-op threads: every part takes the
    same blocks of each run's expert (runs of 1, 12 and 40 rows, a padding row); a bf16 weight
    gives the float64 product of its own values."""
    e, k, o = 3, 576, 704
    w = jax.random.normal(jax.random.key(5), (e, k, o)).astype(w_dtype)
    expert = np.array([1] + [0] * 12 + [2] * 40 + [-1], np.int32)
    x = jax.random.normal(jax.random.key(6), (expert.size, k))
    got = jax.jit(grouped_rows_product)(x, jnp.asarray(expert), Packed.of(w, 1, lead=1))
    want = np.stack([_f64(x[i]) @ _f64(w[j]) if 0 <= j < e else np.zeros(o)
                     for i, j in enumerate(expert)])
    np.testing.assert_allclose(_f64(got), want, atol=2e-5 * np.sqrt(k), rtol=1e-5)
    assert not np.asarray(got[-1]).any()


def test_grouped_rows_product_per_expert_run():
    """Runs of 2, 3, 1, 9 rows (9 = 8 + 1: two row groups of one expert), an expert past E and
    a negative one (padding: zero rows), and an expert with no rows."""
    e, k, o = 5, 48, 40
    w = jax.random.normal(jax.random.key(0), (e, k, o))
    expert = np.array([0, 0, 2, 2, 2, 3] + [4] * 9 + [7, -1], np.int32)
    x = jax.random.normal(jax.random.key(1), (expert.size, k))
    got = jax.jit(grouped_rows_product)(x, jnp.asarray(expert), Packed.of(w, 1, lead=1))
    want = np.stack([_f64(x[i]) @ _f64(w[j]) if 0 <= j < e else np.zeros(o)
                     for i, j in enumerate(expert)])
    np.testing.assert_allclose(_f64(got), want, atol=1e-4, rtol=1e-5)
    assert not np.asarray(got[-2:]).any()


@pytest.mark.parametrize("shape,n_in,lead", [((3, 8, 2, 4), 1, 1), ((2, 4, 8), 2, 0),
                                             ((2, 5, 6, 33), 1, 2)])
def test_packed_round_trip(shape, n_in, lead):
    w = jax.random.normal(jax.random.key(3), shape)
    p = Packed.of(w, n_in, lead)
    assert p.shape == shape and p.p.shape[-1] == cpu_gemm.BLOCK
    np.testing.assert_array_equal(p.as_in_out(), w)
    # Indexing the pytree takes a leading axis off, as for any other leaf.
    if lead:
        np.testing.assert_array_equal(jax.tree.map(lambda a: a[1], p).as_in_out(), w[1])


@pytest.mark.parametrize("xs,ws,n_in", [((3, 5, 8), (8, 6), 1), ((3, 5, 8), (8, 2, 4), 1),
                                        ((3, 5, 2, 4), (2, 4, 40), 2), ((1, 1, 8), (8, 6), 1)])
def test_dense_on_packed_equals_einsum(xs, ws, n_in):
    kx, kw = jax.random.split(jax.random.key(4))
    x, w = jax.random.normal(kx, xs), jax.random.normal(kw, ws)
    got = jax.jit(dense, static_argnums=2)(x, Packed.of(w, n_in), n_in)
    np.testing.assert_allclose(got, dense_einsum(x, w, n_in), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n", [1, 8, 40])
@pytest.mark.parametrize("x_dtype", [jnp.float32, jnp.bfloat16])
def test_bf16_weights_equal_float64_of_their_values(n, x_dtype):
    """A bf16 packed weight (half the bytes streamed, widened in the kernel) gives the float64
    product of its own values, in x's dtype; a cast of the packed weight to float32 (what the
    layers do with a bf16 view) shares the stored array instead of copying it."""
    kx, kw = jax.random.split(jax.random.key(n))
    k, o = 300, 200
    x = jax.random.normal(kx, (n, k)).astype(x_dtype)
    w = jax.random.normal(kw, (k, o)).astype(jnp.bfloat16)
    packed = Packed.of(w, 1)
    wide = packed.astype(jnp.float32)
    assert wide.p is packed.p and wide.dtype == jnp.float32 and packed.dtype == jnp.bfloat16
    got = jax.jit(rows_product)(x, wide)
    assert got.dtype == x_dtype
    want = _f64(x) @ _f64(w)
    # float32 sums; a bf16 result then rounded once (half a bf16 ulp: 2^-9 relative).
    rtol = 1e-5 if x_dtype == jnp.float32 else 2.0 ** -8
    np.testing.assert_allclose(_f64(got), want, atol=2e-5 * np.sqrt(k), rtol=rtol)
    np.testing.assert_array_equal(wide.as_in_out(), w.astype(jnp.float32))


def test_rows_product_rejects_other_dtypes():
    w = Packed.of(jnp.ones((8, 4)), 1)
    with pytest.raises(ValueError, match="x is float16"):
        rows_product(jnp.ones((2, 8), jnp.float16), w)
    with pytest.raises(ValueError, match="stored as one of float32, bfloat16"):
        w.astype(jnp.float16)
    # bf16 -> float16 is the same size but not a widening: a real cast, refused too.
    with pytest.raises(ValueError, match="stored as one of float32, bfloat16"):
        w.astype(jnp.bfloat16).astype(jnp.float16)


@pytest.mark.parametrize("tokens", [(1, 1), (8, 1), (3, 11), (8, 64)],
                         ids=["b1", "b8_decode", "prefill", "many_rows"])
def test_packed_experts_equal_dense(tokens):
    """The engine's layout with the kernel (`out_in_params(..., packed=True)`): the MoE layer
    (routed experts by expert run, shared expert, latent projections) equals the dense backend
    on the [in, out] weights."""
    cfg = presets.get("tiny")
    lp = jax.tree.map(lambda a: a[0], init_params(jax.random.key(0), cfg)["blocks"][0]["1_moe"])
    lp = {**lp, "router": lp["router"] * 20, "experts_up": lp["experts_up"] * 10,
          "experts_down": lp["experts_down"] * 10}
    x = jax.random.normal(jax.random.key(9), (*tokens, cfg.hidden_size))
    grouped = cfg.replace(moe_backend=MoeBackend.GROUPED)
    one = {"blocks": [{"0_moe": jax.tree.map(lambda a: a[None], lp)}]}
    packed = jax.tree.map(lambda a: a[0], out_in_params(grouped.replace(pattern="E"), one,
                                                        packed=True)["blocks"][0]["0_moe"])
    assert isinstance(packed["experts_up"], Packed) and isinstance(packed["shared_up"], Packed)
    y_dense, idx_dense, _ = moe_layer(lp, x, cfg, backend=MoeBackend.DENSE)
    y, idx, _ = jax.jit(lambda p, x: moe_layer(p, x, grouped))(packed, x)
    np.testing.assert_array_equal(idx, idx_dense)
    np.testing.assert_allclose(y, y_dense, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows", [1, 8, 33])
def test_tied_head_packed_for_decode_equals_embedding_product(rows):
    """A tied model's packed decode layout carries the head as `lm_head` (the embedding, which
    the token lookup reads, stays as it is), and the model's head on it equals the logits of
    the embedding's own product; the training params keep no `lm_head`."""
    cfg = presets.get("tiny_llama")
    assert cfg.tie_word_embeddings
    params = init_params(jax.random.key(2), cfg)
    run = out_in_params(cfg, params, packed=True)
    assert "lm_head" not in params and isinstance(run["lm_head"], Packed)
    assert run["embed"] is params["embed"]
    np.testing.assert_array_equal(run["lm_head"].as_in_out(), params["embed"].T)
    h = jax.random.normal(jax.random.key(3), (rows, cfg.hidden_size))
    got = jax.jit(lm_logits, static_argnums=2)(run, h, cfg)
    want = jax.jit(lm_logits, static_argnums=2)(params, h, cfg)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
