"""Parameters described once: shape, dtype, logical axes and initializer per leaf.

`param_specs(cfg)` returns a pytree of `ParamSpec` with exactly the structure of the params.
From it derive `init_params` (random init), `abstract_params` (`jax.ShapeDtypeStruct`s for
`eval_shape`, parameter counts and checkpoint restore targets) and the shardings
(`param_shardings`, through `avalon.sharding`'s rules tables, which know nothing of the model).

Layout. Weights are stored `[in, out]` (JAX style; the HF converter transposes). Head axes are
kept explicit (`[D, heads, head_dim]`) so tensor parallelism shards whole heads. Layers are stacked
per run of the pattern (`config.layer_blocks`): `params["blocks"][b][f"{j}_{kind}"]` holds the
`kind` layer at position `j` of run `b`'s unit, with a leading `layers` axis of the run's repeats.

Logical axes (mapped to mesh axes by `avalon.sharding`):
  layers (the stack; never sharded), vocab, embed (D), q_heads, kv_heads, head_dim,
  mamba_heads (H), mamba_head_dim (P), groups (G), state (N), conv (K), experts (E),
  expert_in (expert input width: latent or D), expert_mlp (F), mlp (dense / shared width),
  latent (L), router_experts (E of the fp32 router; kept replicated).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from avalon import sharding
from avalon.model.config import LETTERS, Activation, ModelConfig, Router


@dataclasses.dataclass(frozen=True)
class Init:
    """How a leaf is initialised, as a function of standard-normal and uniform draws.

    kind: "normal" (std * N(0,1)), "ones", "zeros", "a_log" (log(1..H) along the last axis),
    "dt_bias" (softplus^-1 of dt, dt log-uniform in [dt_min, dt_max], clamped below by floor).
    """

    kind: str
    std: float = 0.0
    dt_min: float = 0.0
    dt_max: float = 0.0
    floor: float = 0.0

    @property
    def draws(self) -> str | None:
        return {"normal": "normal", "dt_bias": "uniform"}.get(self.kind)

    def __call__(self, draw: jax.Array | None, shape: tuple[int, ...], dtype) -> jax.Array:
        if self.kind == "normal":
            return (self.std * draw.reshape(shape)).astype(dtype)
        if self.kind == "ones":
            return jnp.ones(shape, dtype)
        if self.kind == "zeros":
            return jnp.zeros(shape, dtype)
        if self.kind == "a_log":
            return jnp.broadcast_to(jnp.log(jnp.arange(1, shape[-1] + 1, dtype=jnp.float32)),
                                    shape).astype(dtype)
        if self.kind == "dt_bias":
            u = draw.reshape(shape)
            dt = jnp.exp(u * (math.log(self.dt_max) - math.log(self.dt_min))
                         + math.log(self.dt_min))
            dt = jnp.maximum(dt, self.floor)
            return (dt + jnp.log(-jnp.expm1(-dt))).astype(dtype)
        raise ValueError(f"Init.kind={self.kind!r} is unknown")


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    shape: tuple[int, ...]
    axes: tuple[str | None, ...]
    init: Init
    dtype: str

    def __post_init__(self):
        if len(self.shape) != len(self.axes):
            raise ValueError(f"ParamSpec shape {self.shape} and axes {self.axes} differ in rank")

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def stacked(self, n: int) -> ParamSpec:
        # Every Init is elementwise in its draws (a_log broadcasts over leading axes), so a
        # stacked leaf is the same Init over a bigger shape.
        return ParamSpec((n, *self.shape), ("layers", *self.axes), self.init, self.dtype)


def is_spec(x) -> bool:
    return isinstance(x, ParamSpec)


def normal(std: float) -> Init:
    return Init("normal", std=std)


ones = Init("ones")
zeros = Init("zeros")
a_log_init = Init("a_log")


def dt_bias_init(dt_min: float, dt_max: float, floor: float) -> Init:
    return Init("dt_bias", dt_min=dt_min, dt_max=dt_max, floor=floor)


# ---- per-layer descriptions ----------------------------------------------------------------
def _w(cfg: ModelConfig, shape, axes, std=None, dtype=None) -> ParamSpec:
    std = cfg.initializer_range if std is None else std
    return ParamSpec(tuple(shape), tuple(axes), normal(std), dtype or cfg.param_dtype)


def _vec(shape, axes, init, dtype) -> ParamSpec:
    return ParamSpec(tuple(shape), tuple(axes), init, dtype)


def mamba_specs(cfg: ModelConfig) -> dict:
    d, h, p, g, n, k = (cfg.hidden_size, cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.n_groups,
                        cfg.ssm_state_size, cfg.conv_kernel)
    pd = cfg.param_dtype
    # Residual-branch output scaled by 1/sqrt(depth) as HF's rescale_prenorm_residual does.
    out_std = cfg.initializer_range / math.sqrt(cfg.num_layers) \
        if cfg.rescale_prenorm_residual else cfg.initializer_range
    conv_std = 1.0 / math.sqrt(k)
    dt_init = dt_bias_init(cfg.time_step_min, cfg.time_step_max, cfg.time_step_floor)
    s = {
        "norm": _vec([d], ["embed"], ones, pd),
        "in_z": _w(cfg, [d, h, p], ["embed", "mamba_heads", "mamba_head_dim"]),
        "in_x": _w(cfg, [d, h, p], ["embed", "mamba_heads", "mamba_head_dim"]),
        "in_B": _w(cfg, [d, g, n], ["embed", "groups", "state"]),
        "in_C": _w(cfg, [d, g, n], ["embed", "groups", "state"]),
        "in_dt": _w(cfg, [d, h], ["embed", "mamba_heads"]),
        "conv_x": _w(cfg, [k, h, p], ["conv", "mamba_heads", "mamba_head_dim"], conv_std),
        "conv_B": _w(cfg, [k, g, n], ["conv", "groups", "state"], conv_std),
        "conv_C": _w(cfg, [k, g, n], ["conv", "groups", "state"], conv_std),
        "dt_bias": _vec([h], ["mamba_heads"], dt_init, pd),
        "A_log": _vec([h], ["mamba_heads"], a_log_init, pd),
        "D": _vec([h], ["mamba_heads"], ones, pd),
        "gate_norm": _vec([h, p], ["mamba_heads", "mamba_head_dim"], ones, pd),
        "out": _w(cfg, [h, p, d], ["mamba_heads", "mamba_head_dim", "embed"], out_std),
    }
    if cfg.use_conv_bias:
        s["conv_bias_x"] = _vec([h, p], ["mamba_heads", "mamba_head_dim"], zeros, pd)
        s["conv_bias_B"] = _vec([g, n], ["groups", "state"], zeros, pd)
        s["conv_bias_C"] = _vec([g, n], ["groups", "state"], zeros, pd)
    if cfg.use_bias:
        s["in_bias_z"] = _vec([h, p], ["mamba_heads", "mamba_head_dim"], zeros, pd)
        s["in_bias_x"] = _vec([h, p], ["mamba_heads", "mamba_head_dim"], zeros, pd)
        s["in_bias_B"] = _vec([g, n], ["groups", "state"], zeros, pd)
        s["in_bias_C"] = _vec([g, n], ["groups", "state"], zeros, pd)
        s["in_bias_dt"] = _vec([h], ["mamba_heads"], zeros, pd)
        s["out_bias"] = _vec([d], ["embed"], zeros, pd)
    return s


def moe_specs(cfg: ModelConfig) -> dict:
    d, e, f, fs, w = (cfg.hidden_size, cfg.n_routed_experts, cfg.moe_intermediate_size,
                      cfg.moe_shared_expert_intermediate_size, cfg.expert_width)
    pd = cfg.param_dtype
    swiglu = cfg.mlp_activation == Activation.SWIGLU
    s = {
        "norm": _vec([d], ["embed"], ones, pd),
        # HF keeps the router and its correction bias in fp32 whatever the model dtype.
        "router": _w(cfg, [d, e], ["embed", "router_experts"], dtype="float32"),
        "experts_up": _w(cfg, [e, w, f], ["experts", "expert_in", "expert_mlp"]),
        "experts_down": _w(cfg, [e, f, w], ["experts", "expert_mlp", "expert_in"]),
    }
    if cfg.router == Router.SIGMOID:
        s["router_bias"] = _vec([e], ["router_experts"], zeros, "float32")
    if swiglu:
        s["experts_gate"] = _w(cfg, [e, w, f], ["experts", "expert_in", "expert_mlp"])
    if fs:
        s["shared_up"] = _w(cfg, [d, fs], ["embed", "mlp"])
        s["shared_down"] = _w(cfg, [fs, d], ["mlp", "embed"])
        if swiglu:
            s["shared_gate"] = _w(cfg, [d, fs], ["embed", "mlp"])
    if cfg.moe_latent_size is not None:
        s["latent_in"] = _w(cfg, [d, cfg.moe_latent_size], ["embed", "latent"])
        s["latent_out"] = _w(cfg, [cfg.moe_latent_size, d], ["latent", "embed"])
    if cfg.mlp_bias:
        if fs:
            s["shared_up_bias"] = _vec([fs], ["mlp"], zeros, pd)
            s["shared_down_bias"] = _vec([d], ["embed"], zeros, pd)
        if cfg.moe_latent_size is not None:
            s["latent_in_bias"] = _vec([cfg.moe_latent_size], ["latent"], zeros, pd)
            s["latent_out_bias"] = _vec([d], ["embed"], zeros, pd)
    return s


def attention_specs(cfg: ModelConfig) -> dict:
    d, nh, nkv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    pd = cfg.param_dtype
    s = {
        "norm": _vec([d], ["embed"], ones, pd),
        "q": _w(cfg, [d, nh, hd], ["embed", "q_heads", "head_dim"]),
        "k": _w(cfg, [d, nkv, hd], ["embed", "kv_heads", "head_dim"]),
        "v": _w(cfg, [d, nkv, hd], ["embed", "kv_heads", "head_dim"]),
        "o": _w(cfg, [nh, hd, d], ["q_heads", "head_dim", "embed"]),
    }
    if cfg.attention_qkv_bias:
        s["q_bias"] = _vec([nh, hd], ["q_heads", "head_dim"], zeros, pd)
        s["k_bias"] = _vec([nkv, hd], ["kv_heads", "head_dim"], zeros, pd)
        s["v_bias"] = _vec([nkv, hd], ["kv_heads", "head_dim"], zeros, pd)
    if cfg.attention_out_bias:
        s["o_bias"] = _vec([d], ["embed"], zeros, pd)
    if cfg.qk_norm:
        s["q_norm"] = _vec([hd], ["head_dim"], ones, pd)
        s["k_norm"] = _vec([hd], ["head_dim"], ones, pd)
    return s


def mlp_specs(cfg: ModelConfig) -> dict:
    d, f = cfg.hidden_size, cfg.intermediate_size
    s = {
        "norm": _vec([d], ["embed"], ones, cfg.param_dtype),
        "up": _w(cfg, [d, f], ["embed", "mlp"]),
        "down": _w(cfg, [f, d], ["mlp", "embed"]),
    }
    if cfg.mlp_activation == Activation.SWIGLU:
        s["gate"] = _w(cfg, [d, f], ["embed", "mlp"])
        if cfg.mlp_bias:
            s["gate_bias"] = _vec([f], ["mlp"], zeros, cfg.param_dtype)
    if cfg.mlp_bias:
        s["up_bias"] = _vec([f], ["mlp"], zeros, cfg.param_dtype)
        s["down_bias"] = _vec([d], ["embed"], zeros, cfg.param_dtype)
    return s


LAYER_SPECS = {"mamba": mamba_specs, "moe": moe_specs, "attention": attention_specs,
               "mlp": mlp_specs}


def layer_key(j: int, letter: str) -> str:
    """The params/cache key of the layer at position j of a run's unit, e.g. '1_moe'."""
    return f"{j}_{LETTERS[letter]}"


def param_specs(cfg: ModelConfig) -> dict:
    d, v = cfg.hidden_size, cfg.vocab_size
    specs: dict = {
        "embed": _w(cfg, [v, d], ["vocab", "embed"]),
        "blocks": [
            {layer_key(j, ch): _stack_tree(LAYER_SPECS[LETTERS[ch]](cfg), reps)
             for j, ch in enumerate(unit)}
            for unit, reps in cfg.blocks
        ],
        "final_norm": _vec([d], ["embed"], ones, cfg.param_dtype),
    }
    if not cfg.tie_word_embeddings:
        specs["lm_head"] = _w(cfg, [d, v], ["embed", "vocab"])
    if cfg.mtp_pattern:
        specs["mtp"] = {
            "enorm": _vec([d], ["embed"], ones, cfg.param_dtype),
            "hnorm": _vec([d], ["embed"], ones, cfg.param_dtype),
            "eh_proj": _w(cfg, [2 * d, d], ["mtp_in", "embed"]),
            "layers": [LAYER_SPECS[LETTERS[ch]](cfg) for ch in cfg.mtp_pattern],
            "final_norm": _vec([d], ["embed"], ones, cfg.param_dtype),
        }
    return specs


def _stack_tree(tree: dict, n: int) -> dict:
    return jax.tree.map(lambda s: s.stacked(n), tree, is_leaf=is_spec)


# ---- things derived from the description ---------------------------------------------------
def abstract_params(cfg: ModelConfig):
    """`jax.ShapeDtypeStruct` per leaf: counts, `eval_shape` and restore targets, no memory."""
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, jnp.dtype(s.dtype)),
                        param_specs(cfg), is_leaf=is_spec)


def param_axes(cfg: ModelConfig):
    """Logical axes per leaf (same tree structure as the params)."""
    return jax.tree.map(lambda s: s.axes, param_specs(cfg), is_leaf=is_spec)


def param_shardings(cfg: ModelConfig, mesh, rules: sharding.Rules = sharding.TRAIN_RULES):
    """A `NamedSharding` per leaf of `cfg`'s params on `mesh` under `rules` (a mesh axis that
    does not divide a dimension is dropped for that array; `sharding.logical_to_spec`)."""
    return sharding.tree_shardings(param_axes(cfg), abstract_params(cfg), mesh, rules)


# Up to this many elements, all leaves are cut from one normal and one uniform draw: XLA's
# CPU compile of a threefry draw costs ~0.2 s per distinct shape, which dominated test time.
_ONE_DRAW_LIMIT = 1 << 27


def init_params(key: jax.Array, cfg: ModelConfig, shardings=None):
    """Random params per the specs; with `shardings` (a tree like the params) each leaf lands
    on its devices. Small models are cut from one draw; large ones are drawn leaf by leaf inside
    a jit with `out_shardings`, so no device ever holds the whole model."""
    specs = param_specs(cfg)
    leaves, treedef = jax.tree.flatten(specs, is_leaf=is_spec)
    shard_leaves = [None] * len(leaves) if shardings is None else jax.tree.leaves(shardings)
    total = sum(s.size for s in leaves)
    out = []
    if total <= _ONE_DRAW_LIMIT:
        k_normal, k_uniform = jax.random.split(key)
        sizes = {kind: sum(s.size for s in leaves if s.init.draws == kind)
                 for kind in ("normal", "uniform")}
        draws = {"normal": jax.random.normal(k_normal, (sizes["normal"],), jnp.float32),
                 "uniform": jax.random.uniform(k_uniform, (sizes["uniform"],), jnp.float32)}

        def cut(draws):
            offsets, made = {"normal": 0, "uniform": 0}, []
            for s in leaves:
                draw = None
                if s.init.draws:
                    o = offsets[s.init.draws]
                    draw = draws[s.init.draws][o:o + s.size]
                    offsets[s.init.draws] = o + s.size
                made.append(s.init(draw, s.shape, jnp.dtype(s.dtype)))
            return made

        out = jax.jit(cut)(draws)
        if shardings is not None:
            out = [jax.device_put(leaf, sh) for leaf, sh in zip(out, shard_leaves)]
    else:
        keys = jax.random.split(key, len(leaves))
        for k, s, sh in zip(keys, leaves, shard_leaves):
            out.append(_init_leaf(s, sh)(k))
    return jax.tree.unflatten(treedef, out)


def _init_leaf(s: ParamSpec, sharding):
    def make(k):
        draw = None
        if s.init.draws == "normal":
            draw = jax.random.normal(k, s.shape, jnp.float32)
        elif s.init.draws == "uniform":
            draw = jax.random.uniform(k, s.shape, jnp.float32)
        return s.init(draw, s.shape, jnp.dtype(s.dtype))
    return jax.jit(make) if sharding is None else jax.jit(make, out_shardings=sharding)


def count_params(tree) -> int:
    return int(sum(np.prod(x.shape, dtype=np.int64) for x in jax.tree.leaves(tree)))
