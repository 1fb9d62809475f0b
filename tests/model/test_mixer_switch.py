"""The sequence-parallel switch of the Mamba and attention layers (TRAIN_SEQ_RULES): their input
projections run on a chip's own positions and their outputs move to whole rows by all-to-all,
so no chip ever holds a whole row of the layer's [b, t, D] input, forward or backward (the
pod's 1 GB tensors; docs/results_history.md, "The pod's update step: capacity 1.1, the all-to-all
switch, the blocked Mamba core"). The layers' values
and gradients under the fsdp 2 x expert 4 mesh equal the single-device ones."""

import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from avalon import model as M
from avalon.model import param_shardings
from avalon.model.model import apply_layer
from avalon.model.params import layer_key
from avalon.sharding import TRAIN_RULES, TRAIN_SEQ_RULES, make_mesh, use_rules

# 8 Mamba heads in 4 groups and 4 query heads: both split over the 4 chips of a row.
CFG = M.presets.get("tiny", pattern="M*", n_groups=4)
B, T = 2, 32


def _layers(params, h, seg):
    for bi, (unit, _) in enumerate(CFG.blocks):
        for j, ch in enumerate(unit):
            lp = jax.tree.map(lambda a: a[0], params["blocks"][bi][layer_key(j, ch)])
            h, _, _ = apply_layer(ch, lp, h, CFG, segment_ids=seg)
    return jnp.mean(jnp.square(h.astype(jnp.float32)))


def test_mixers_switch_by_all_to_all_without_whole_row_inputs():
    params = M.init_params(jax.random.key(0), CFG)
    h = jax.random.normal(jax.random.key(1), (B, T, CFG.hidden_size))
    seg = jnp.concatenate([jnp.ones((B, 13), jnp.int32), jnp.full((B, T - 13), 2)], axis=1)
    grad = jax.value_and_grad(_layers, argnums=(0, 1))
    ref_loss, ref_grads = jax.jit(grad)(params, h, seg)

    mesh = make_mesh({"fsdp": 2, "expert": 4})

    def sharded(params, h, seg):
        with use_rules(mesh, TRAIN_SEQ_RULES):
            return grad(params, h, seg)

    rows = NamedSharding(mesh, PartitionSpec("fsdp", "expert"))
    step = jax.jit(sharded, in_shardings=(param_shardings(CFG, mesh, TRAIN_RULES), rows, rows))
    compiled = step.lower(params, h, seg).compile()
    # A chip's part of a whole row of full width: [B / fsdp, T, D].
    whole = re.compile(rf"\[{B // 2},{T},{CFG.hidden_size}\]")
    assert not [line for line in compiled.as_text().splitlines() if whole.search(line)]

    loss, grads = compiled(params, h, seg)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(ref_grads),
                            jax.tree.leaves(grads)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6, err_msg=jax.tree_util.keystr(path))
