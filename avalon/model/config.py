"""The model configuration: one frozen, hashable dataclass for Nemotron-H and the Llama/Qwen
families.

Field names follow Hugging Face's `NemotronHConfig` (transformers 5.24) where one exists, so a
reader can map every field to `../shared/reference/nemotron_h.md`. The Llama/Qwen families are
the same layer letters with other options (`checkpoint/hf_families.py` maps their configs):

    Llama 3 / SmolLM2   pattern "*-" x L, rope_theta, SWIGLU MLP, tied embeddings (SmolLM2)
    Qwen2               + attention_qkv_bias
    Qwen3               + qk_norm
    Qwen3-MoE           pattern "*E" x L ("*-" for dense layers), Router.SOFTMAX, SWIGLU
                        experts, no shared expert (moe_shared_expert_intermediate_size=0)

A Llama layer (attention, then MLP, each with its own pre-norm and residual) is exactly two
pattern letters, so nothing about the stack, its scan or its sharding changes per family.
Implementation choices that HF does not have (MoE dispatch backend, remat, layer scanning, dtypes)
are fields too, each an enum or a plain value, never a string looked up in a registry.

The layer stack is the HF pattern string: `M` Mamba-2, `E` MoE, `*` attention, `-` dense MLP.
`layer_blocks(pattern)` splits it into runs of a repeated unit (the Nemotron patterns are mostly
repeats of `ME`); each run's params are stacked and run by one `lax.scan`, so compile time grows
with the number of distinct runs, not with depth.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math

import jax.numpy as jnp

from avalon.validation import FieldChecks

LETTERS = {"M": "mamba", "E": "moe", "*": "attention", "-": "mlp"}


class MoeBackend(enum.Enum):
    """How routed experts are dispatched (all dropless, all equal to `DENSE` up to float error).

    `AUTO` is the dispatch the caller's platform names (`ops.Ops.moe_backend`, chosen in
    `avalon/backends/`: TPU megablox, GPU capacity buckets, CPU grouped tiles); without one the
    dense reference. The backends refuse known-slow or impossible pairs for their platform
    (`RAGGED_DOT` on GPU, `MEGABLOX` off TPU)."""

    AUTO = "auto"  # the platform's fastest (see above)
    DENSE = "dense"  # every expert on every token, then masked: the readable reference
    RAGGED_DOT = "ragged_dot"  # sort by expert + `lax.ragged_dot` (CPU lowers it densely)
    CAPACITY_BUCKETS = "capacity_buckets"  # sort + batched matmul at a bucketed capacity
    GROUPED = "grouped"  # sort + per-expert tiles, a loop of 2-D products over the occupied tiles
    MEGABLOX = "megablox"  # sort + the Pallas megablox grouped matmul (TPU; gmm/tgmm backward)


class Activation(enum.Enum):
    """The feed-forward of `-` layers, routed experts and the shared expert."""

    RELU2 = "relu2"  # Nemotron-H: down(relu(up x)^2), non-gated
    SWIGLU = "swiglu"  # Llama/Qwen: down(silu(gate x) * up x)


class Router(enum.Enum):
    """How an MoE layer scores experts (`moe.route`)."""

    SIGMOID = "sigmoid"  # Nemotron-H: sigmoid + correction bias, group-limited top-k
    SOFTMAX = "softmax"  # Qwen3-MoE: softmax over all experts, top-k (renormalised or not)


class RopeScaling(enum.Enum):
    """How rotary frequencies are rescaled for long context (HF `rope_parameters.rope_type`)."""

    NONE = "default"
    LINEAR = "linear"  # every frequency / rope_factor
    LLAMA3 = "llama3"  # Llama 3.1: low frequencies / factor, a smooth ramp to the high ones


class Remat(enum.Enum):
    """What the backward pass recomputes inside each scanned layer group."""

    NONE = "none"  # keep every activation
    FULL = "full"  # recompute the whole group
    DOTS = "dots"  # save matmul outputs without batch dims, recompute the rest
    # Per layer: each Mamba and MoE layer recomputed (its input kept; an MoE layer keeps its
    # routed output too, and the routed dispatch chunks recompute themselves once); attention
    # layers not recomputed (the CAUSAL_SCAN / FLASH core keeps only q, k, v, its output and
    # log-sum-exp). Full remat's recompute without the attention core's and without the
    # routed experts' second one (model.py).
    SELECTIVE = "selective"
    # As SELECTIVE, but a scanned unit made of Mamba and MoE layers alone (Super's "EM") is one
    # checkpoint: only the unit's input is kept, half the saved inputs, for one more pass of
    # the matmuls that make a unit's inner layer input (an MoE layer's shared-expert down and
    # latent-out projections, or a Mamba out projection). Super on the pod: -10 GB per chip,
    # +0.019x FLOPs (docs/results_history.md, "The pod's update step: capacity 1.1, the
    # all-to-all switch, the blocked Mamba core").
    SELECTIVE_UNITS = "selective_units"


class AttentionImpl(enum.Enum):
    """Full-sequence attention kernel (decode against a cache always uses `NAIVE`)."""

    NAIVE = "naive"  # materialise [b, h, t, t] scores
    QUERY_CHUNKED = "query_chunked"  # scores one query chunk at a time: memory O(t * chunk)
    BLOCK_CAUSAL = "block_causal"  # query chunks skip the key blocks above the diagonal
    # Query blocks (`attention.FLASH_BLOCK`) against only the keys they see, custom VJP that
    # recomputes each block's probabilities from the rows' log-sum-exp: no [t, t] scores in
    # either pass.
    FLASH = "flash"
    # One scan over the (query block, key block) pairs at or below the diagonal, blocks of
    # `attention_query_chunk`, FlashAttention backward: causal FLOPs at fixed shapes per step,
    # for rows too long to unroll (attention_scan.py).
    CAUSAL_SCAN = "causal_scan"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A Nemotron-H model. Shapes: D hidden, V vocab, H Mamba heads × P, G groups × N state."""

    # Vocabulary, width and depth.
    vocab_size: int
    hidden_size: int
    pattern: str  # HF `hybrid_override_pattern`, one letter per layer
    # Attention (`*`): grouped-query; no positional encoding unless `rope_theta` is set.
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    # Dense MLP (`-`): down(relu(up x)^2), or down(silu(gate x) * up x) under SWIGLU.
    intermediate_size: int
    # Mamba-2 (`M`).
    mamba_num_heads: int
    mamba_head_dim: int
    ssm_state_size: int
    n_groups: int
    conv_kernel: int = 4
    chunk_size: int = 128
    time_step_min: float = 0.001  # dt lower clamp on the chunked path (HF 5.24), and init
    # Clamp dt in the one-token decode step too. False is HF 5.24 exactly (its decode path does
    # not clamp). True makes decode equal the full forward, which RL needs: the trainer
    # recomputes the sampler's log-probs with a full (clamped) forward.
    decode_dt_clamp: bool = False
    time_step_max: float = 0.1  # init of dt_bias only
    time_step_floor: float = 1e-4  # init of dt_bias only
    use_conv_bias: bool = True
    use_bias: bool = False  # bias on the Mamba in/out projections
    # MoE (`E`): sigmoid router + correction bias, group-limited top-k, one shared expert.
    n_routed_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 64
    moe_shared_expert_intermediate_size: int = 64
    moe_latent_size: int | None = None  # Super: 1024 (experts work in this latent width)
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    mlp_bias: bool = False  # bias on MLP, shared expert and latent projections
    layer_norm_epsilon: float = 1e-5
    tie_word_embeddings: bool = False
    # The Llama/Qwen families' options (defaults are Nemotron-H's).
    mlp_activation: Activation = Activation.RELU2  # `-` layers, routed and shared experts
    router: Router = Router.SIGMOID
    # Rotary position embedding on q and k (HF's rotate-half layout); None: none (NoPE).
    rope_theta: float | None = None
    rotary_dim: int | None = None  # the leading dims of each head that rotate; None: head_dim
    rope_scaling: RopeScaling = RopeScaling.NONE
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0  # LLAMA3 only
    rope_high_freq_factor: float = 4.0  # LLAMA3 only
    rope_original_max_position: int = 8192  # LLAMA3 only
    attention_qkv_bias: bool = False  # Qwen2 (and Llama's attention_bias, with the o bias)
    attention_out_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k, before the rotation
    # Multi-token prediction head (Super: "*E"); "" means none. Not used by the main forward.
    mtp_pattern: str = ""
    # Numerics: params in `param_dtype`, activations in `dtype`; norms, router, SSM and
    # softmax in fp32 (as HF).
    param_dtype: str = "float32"
    dtype: str = "float32"
    ssm_state_dtype: str = "float32"
    # Implementation.
    moe_backend: MoeBackend = MoeBackend.AUTO
    # Expert parallelism (under a mesh): tokens each chip dispatches per all-to-all round; the
    # buffers are 2 x ep x chunk x k x expert_width (see moe_ep.py).
    moe_dispatch_chunk: int = 8192
    # Expert parallelism: rows each destination chip takes per source and chunk, as a factor
    # of the mean load (chunk x k / ep); choices past it are dropped and counted (moe_ep.py).
    # None: the worst case (dropless). The update step sets it from
    # RLConfig.moe_capacity_factor; the engine keeps this default, so sampling never drops.
    moe_capacity_factor: float | None = None
    router_frozen: bool = False  # stop gradients into router weight and correction bias
    remat: Remat = Remat.NONE
    scan_layers: bool = True  # False: one block per layer (a Python loop), for debugging
    attention_impl: AttentionImpl = AttentionImpl.NAIVE
    attention_query_chunk: int = 1024
    # Training forward (no cache): the Mamba mixer's conv, chunked SSD and gated norm over
    # blocks of this many positions, each recomputed in the backward
    # (mamba2.mixer_core_blocked); 0: the whole row at once.
    ssd_block: int = 0
    max_context: int = 131072  # the agent context window this preset is served at
    initializer_range: float = 0.02
    rescale_prenorm_residual: bool = True

    def __post_init__(self):
        _validate(self)

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.pattern)

    @property
    def mamba_inner(self) -> int:
        return self.mamba_num_heads * self.mamba_head_dim

    @property
    def conv_dim(self) -> int:
        return self.mamba_inner + 2 * self.n_groups * self.ssm_state_size

    @property
    def expert_width(self) -> int:
        """Input/output width of a routed expert: the latent size if set, else hidden."""
        return self.moe_latent_size if self.moe_latent_size is not None else self.hidden_size

    def count(self, letter: str) -> int:
        return self.pattern.count(letter)

    @property
    def blocks(self) -> tuple[tuple[str, int], ...]:
        if not self.scan_layers:
            return tuple((c, 1) for c in self.pattern)
        return layer_blocks(self.pattern)

    @property
    def jnp_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def jnp_param_dtype(self):
        return jnp.dtype(self.param_dtype)

    def replace(self, **kw) -> ModelConfig:
        return dataclasses.replace(self, **kw)


CHECK = FieldChecks("ModelConfig")
_fail = CHECK.fail


def _validate(c: ModelConfig):
    if not c.pattern:
        _fail("pattern", c.pattern, "needs at least one layer letter (M, E, *, -)")
    for i, ch in enumerate(c.pattern):
        if ch not in LETTERS:
            _fail("pattern", c.pattern, f"unknown layer letter {ch!r} at index {i}; use M E * -")
    for i, ch in enumerate(c.mtp_pattern):
        if ch not in LETTERS:
            _fail("mtp_pattern", c.mtp_pattern, f"unknown layer letter {ch!r} at index {i}")
    letters = c.pattern + c.mtp_pattern
    positive = ["vocab_size", "hidden_size", "max_context", "chunk_size", "moe_dispatch_chunk"]
    if "*" in letters:
        positive += ["num_attention_heads", "num_key_value_heads", "head_dim"]
    if "M" in letters:
        positive += ["mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups",
                     "conv_kernel"]
    if "E" in letters:
        positive += ["n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
                     "n_group", "topk_group"]
        CHECK.int_at_least(c, "moe_shared_expert_intermediate_size", 0, "(0: no shared expert)")
    if "-" in letters:
        positive += ["intermediate_size"]
    for f in positive:
        CHECK.positive_int(c, f)
    CHECK.int_at_least(c, "ssd_block", 0)
    if c.ssd_block % c.chunk_size:
        _fail("ssd_block", c.ssd_block, f"must be 0 or a multiple of chunk_size={c.chunk_size}")
    if "*" in letters and c.num_attention_heads % c.num_key_value_heads:
        _fail("num_key_value_heads", c.num_key_value_heads,
              f"must divide num_attention_heads={c.num_attention_heads}")
    if "M" in letters:
        if c.mamba_num_heads % c.n_groups:
            _fail("n_groups", c.n_groups, f"must divide mamba_num_heads={c.mamba_num_heads}")
        if c.conv_kernel < 2:
            _fail("conv_kernel", c.conv_kernel, "must be at least 2")
    if "E" in letters:
        _validate_moe(c)
    for f in ("param_dtype", "dtype", "ssm_state_dtype"):
        CHECK.one_of(c, f, ("float32", "bfloat16", "float16", "float64"))
    for f, enum_type in (("moe_backend", MoeBackend), ("remat", Remat),
                         ("attention_impl", AttentionImpl), ("mlp_activation", Activation),
                         ("router", Router), ("rope_scaling", RopeScaling)):
        CHECK.is_enum(c, f, enum_type)
    CHECK.capacity_factor(c, "moe_capacity_factor")
    if c.time_step_min < 0 or not math.isfinite(c.time_step_min):
        _fail("time_step_min", c.time_step_min, "must be a finite value >= 0")
    _validate_families(c)


def _validate_moe(c: ModelConfig):
    """The expert counts, groups and latent width of the `E` layers."""
    e = c.n_routed_experts
    if e % c.n_group:
        _fail("n_group", c.n_group, f"must divide n_routed_experts={e}")
    if c.n_group > 1 and e // c.n_group < 2:
        _fail("n_group", c.n_group, "each expert group needs >= 2 experts (top-2 group score)")
    if c.topk_group > c.n_group:
        _fail("topk_group", c.topk_group, f"must be <= n_group={c.n_group}")
    if c.num_experts_per_tok > (e // c.n_group) * c.topk_group:
        _fail("num_experts_per_tok", c.num_experts_per_tok,
              "exceeds the experts left in the kept groups")
    if c.moe_latent_size is not None and c.moe_latent_size <= 0:
        _fail("moe_latent_size", c.moe_latent_size, "must be positive or None")


def _validate_families(c: ModelConfig):
    """The Llama/Qwen options: rotary settings and the router."""
    if c.rope_theta is not None:
        if isinstance(c.rope_theta, bool) or not isinstance(c.rope_theta, (int, float)) \
                or not math.isfinite(c.rope_theta) or c.rope_theta <= 1:
            _fail("rope_theta", c.rope_theta, "must be a finite number > 1, or None (no RoPE)")
        rd = c.rotary_dim
        if rd is not None and (not isinstance(rd, int) or isinstance(rd, bool) or rd <= 0
                               or rd % 2 or rd > c.head_dim):
            _fail("rotary_dim", rd, f"must be an even integer in [2, head_dim={c.head_dim}] "
                  "or None (all of head_dim)")
        if c.rope_scaling != RopeScaling.NONE and not c.rope_factor >= 1:
            _fail("rope_factor", c.rope_factor, "must be >= 1")
        if c.rope_scaling == RopeScaling.LLAMA3:
            if not 0 < c.rope_low_freq_factor < c.rope_high_freq_factor:
                _fail("rope_high_freq_factor", c.rope_high_freq_factor,
                      f"must exceed rope_low_freq_factor={c.rope_low_freq_factor} > 0")
            if c.rope_original_max_position <= 0:
                _fail("rope_original_max_position", c.rope_original_max_position,
                      "must be positive")
    elif c.rope_scaling != RopeScaling.NONE or c.rotary_dim is not None:
        _fail("rope_theta", c.rope_theta, "is None (no RoPE) but rope_scaling or rotary_dim "
              "is set")
    if "E" in c.pattern + c.mtp_pattern and c.router == Router.SOFTMAX and c.n_group != 1:
        _fail("n_group", c.n_group, "group-limited routing is for the sigmoid router; the "
              "softmax router takes n_group=1")


@functools.cache
def layer_blocks(pattern: str, max_unit: int = 4) -> tuple[tuple[str, int], ...]:
    """Split a pattern into (unit, repeats) runs, greedily covering the most layers per run.

    "MEMEMEM*EME" -> (("ME", 3), ("M*E", 1), ("ME", 1)). Every run's layers are stacked and
    scanned; a unit never repeats across the boundary of its run, so concatenating
    `unit * repeats` over the runs gives the pattern back.
    """
    out: list[tuple[str, int]] = []
    i = 0
    while i < len(pattern):
        best = (pattern[i], 1)
        for size in range(1, max_unit + 1):
            unit = pattern[i:i + size]
            if len(unit) < size:
                break
            reps = 1
            while pattern[i + reps * size:i + (reps + 1) * size] == unit:
                reps += 1
            # Prefer more layers covered, then a repeating run, then the shorter unit.
            if reps * size > best[1] * len(best[0]) and (reps > 1 or best[1] == 1):
                best = (unit, reps)
        if best[1] == 1:
            # No repeat here: take one layer and let the next position start a run.
            best = (pattern[i], 1)
        out.append(best)
        i += len(best[0]) * best[1]
    return tuple(out)
