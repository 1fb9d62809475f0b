"""The RL core's configuration: one frozen dataclass, validated on construction.

Every number the write-ups give is a default here (SPEC §3–4). Where they are silent the field
says "our reading" and the choice is ours:

- `cap_mode`: the report's "ε_high = 5" does not say whether the upper clip is `1 + ε_high`
  (delta-from-1: verl, slime, SkyRL, NeMo-RL) or `ε_high` itself (an absolute cap: TRL, EasyDeL,
  SkyRL-tx). Default DELTA, so the importance weight is clipped to [1 − ε_low, 6].
- `eps_low = 1.0`: the lower bound 1 − ε_low = 0 never binds (ρ ≥ 0), i.e. no lower clip, as
  slime recommends for CISPO.
- `underhire_slope`: the penalty −slope · max(budget − worked, 0) is added to R_i before the
  group normalisation (worked: specialists that worked, `Rollout.worked`); the slope is not
  published.
- Truncated sampling (top_p < 1, top_k > 0) is refused for RL rollouts (`check_rl_sampling`,
  called where the training config is read): the sampler's log-prob is that of the untruncated
  temperature softmax, the distribution the trainer scores, and a truncated sampler's
  behaviour policy would differ from it without the trainer knowing.
- `weight_decay`, `b1`, `b2`, `adam_eps`, `clip_norm`: not published; common RL values.
"""

from __future__ import annotations

import dataclasses
import enum

from avalon.validation import FieldChecks


def check_rl_sampling(top_p: float, top_k: int, where: str) -> None:
    """Refuses truncated sampling for RL rollouts, naming the field (`where`.top_p / top_k).

    The engine's log-probs are those of softmax(logits / T) over the whole vocabulary
    (avalon/inference/sampling.py) and the trainer recomputes the same; a top-p or top-k
    sampler draws from another, renormalised distribution, so its tokens' importance ratios
    and its loss would be silently off-policy. One rule, no quiet fix: refuse at start-up.
    """
    check = FieldChecks(f"config.{where}")
    if not top_p == 1.0:
        check.fail("top_p", top_p, "RL rollouts need top_p = 1 (the trainer scores the "
                   "untruncated distribution; see rl/config.py)")
    if top_k != 0:
        check.fail("top_k", top_k, "RL rollouts need top_k = 0 (the trainer scores the "
                   "untruncated distribution; see rl/config.py)")


class CapMode(enum.Enum):
    """How `eps_high` bounds the importance weight from above."""

    DELTA = "delta"  # upper bound 1 + eps_high (verl, slime, SkyRL, NeMo-RL)
    ABSOLUTE = "absolute"  # upper bound eps_high itself (TRL/Liger, EasyDeL, SkyRL-tx)


class UpdateMode(enum.Enum):
    """How an RL step whose rows take several update calls (`rollout.max_update_rows`, or the
    one-row calls of a one-device CPU) updates the params."""

    # The recipe (SPEC §3, docs/recipe.md): one AdamW step per RL step. Each call adds its
    # rows' gradient of the loss normalised by the *whole step's* loss tokens (1/ΣT) to one
    # accumulator; the clip, the guard and AdamW then run once on the sum, so the step equals
    # one call on the whole batch and every call's importance ratio is taken at the same
    # (sampler's) params.
    ONE = "one"
    # One AdamW step per call, each normalised by its own tokens: the behaviour before the
    # accumulator existed (after the first call the CISPO ratio is no longer 1 on-policy).
    PER_CALL = "per_call"


class GroupFilter(enum.Enum):
    """Which reward decides that a group carries no signal and is dropped (zero spread)."""

    # The collective reward alone, before any shaping: a group whose rollouts all scored the
    # same is dropped, whatever its penalties, so no shaping term can hand an all-fail group
    # advantages (the underhire penalty's budget luck would otherwise give it +-1).
    RAW = "raw"
    # R_i with the underhire penalty (the reward the advantages normalise): the reading
    # before this field existed, where an all-zero group with unequal budgets is kept.
    SHAPED = "shaped"


class LossKind(enum.Enum):
    """Which loss the update step minimises (one step function, switched statically)."""

    CISPO = "cispo"  # clipped importance-sampling policy gradient (RL; GKPO uses it too)
    SFT = "sft"  # next-token cross-entropy on loss tokens (the SFT stage before RL)


# GKPO's utility exponent, defined once: the loss's `RLConfig.beta` and the wealth environment's
# reported utility (`envs/wealth`, `WealthConfig.utility_beta`) both default to it.
# R_i = u_beta(W_T / W_0) = (x^beta - 1) / beta, bounded below by -1/beta.
GKPO_BETA = 0.2582


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """Advantages, losses, packing and optimiser settings of the RL core."""

    loss: LossKind = LossKind.CISPO
    # CISPO: weight sg(clip(rho, lo, hi)); lo = 1 - eps_low, hi per cap_mode.
    eps_low: float = 1.0  # 1.0: no lower clip (rho >= 0 always)
    eps_high: float = 5.0  # the report's value
    cap_mode: CapMode = CapMode.DELTA
    # GKPO: R_i = u_beta(W_T / W_0) = (x^beta - 1) / beta; bounded below by -1/beta.
    beta: float = GKPO_BETA
    # Advantages and shaping.
    underhire_slope: float = 0.1  # our reading: reward units per unused hire slot
    malformed_penalty: float = -0.1  # per token of a turn whose tool call did not parse
    tool_error_penalty: float = -0.05  # per token of a turn whose tool call failed
    zero_std_tol: float = 1e-6  # a group whose reward std (ddof=0) is <= this is dropped
    group_filter: GroupFilter = GroupFilter.RAW  # the reward whose spread keeps a group
    # Log-probs: must match the sampler (the engine samples from softmax(logits / temperature)).
    temperature: float = 1.0
    logprob_chunk: int = 512  # positions per LM-head chunk (see logprobs.py for why positions)
    # Update step.
    micro_batches: int = 1  # gradient accumulation steps per update call (a `lax.scan`)
    update_mode: UpdateMode = UpdateMode.ONE  # several calls of one RL step: see UpdateMode
    # Expert-parallel capacity of the update step (ModelConfig.moe_capacity_factor: rows per
    # destination chip = this x the mean load); choices past it are dropped and counted in the
    # metric `moe_dropped_choices`. 1.25 keeps the routed-expert matmuls at 1.25x their exact
    # work at any expert-axis size (dropless buffers are ep times); None: dropless. With one
    # expert shard (no `expert` mesh axis) nothing is ever dropped.
    moe_capacity_factor: float | None = 1.25
    # Sequence parallelism in the update step (sharding.TRAIN_SEQ_RULES): each row's positions
    # split over the `expert` axis, rows over data x fsdp only; for rows too long for one chip.
    sequence_parallel: bool = False
    freeze_router: bool = True  # SPEC §4: router weight and correction bias never change
    lr: float = 4e-6  # constant (SPEC §4)
    weight_decay: float = 0.01  # our reading
    b1: float = 0.9
    b2: float = 0.999
    adam_eps: float = 1e-8
    clip_norm: float = 1.0  # global-norm gradient clipping; 0 disables
    # RL steps between per-role gradient norms (rl/roles.py: one extra backward pass per role,
    # CEO and specialists); 0 = never. Per-role loss tokens and advantages come every step.
    role_grad_every: int = 10

    def __post_init__(self):
        _validate(self)

    def replace(self, **kw) -> RLConfig:
        return dataclasses.replace(self, **kw)

    @property
    def clip_bounds(self) -> tuple[float, float]:
        """(lo, hi) of the CISPO importance weight under `cap_mode`."""
        return clip_bounds(self.eps_low, self.eps_high, self.cap_mode)


def clip_bounds(eps_low: float, eps_high: float, cap_mode: CapMode) -> tuple[float, float]:
    """The CISPO weight bounds: lo = 1 − eps_low; hi = 1 + eps_high (DELTA) or eps_high
    (ABSOLUTE)."""
    if not isinstance(cap_mode, CapMode):
        raise ValueError(f"cap_mode={cap_mode!r}: must be a CapMode (DELTA or ABSOLUTE)")
    lo = 1.0 - eps_low
    hi = 1.0 + eps_high if cap_mode == CapMode.DELTA else eps_high
    return lo, hi


CHECK = FieldChecks("RLConfig")
_fail = CHECK.fail


def _validate(c: RLConfig):
    for f, enum_type in (("loss", LossKind), ("cap_mode", CapMode),
                         ("update_mode", UpdateMode), ("group_filter", GroupFilter)):
        CHECK.is_enum(c, f, enum_type)
    for f in ("eps_low", "eps_high", "beta", "underhire_slope", "malformed_penalty",
              "tool_error_penalty", "zero_std_tol", "temperature", "lr", "weight_decay", "b1",
              "b2", "adam_eps", "clip_norm"):
        CHECK.finite(c, f)
    if not 0.0 <= c.eps_low <= 1.0:
        _fail("eps_low", c.eps_low, "must be in [0, 1] (lower weight bound 1 - eps_low >= 0)")
    lo, hi = c.clip_bounds
    if hi <= max(lo, 0.0) or hi < 1.0:
        _fail("eps_high", c.eps_high, f"gives an upper weight bound {hi} under {c.cap_mode}; it "
              "must be >= 1 and above the lower bound (an on-policy token has weight 1)")
    if c.beta <= 0:
        _fail("beta", c.beta, "must be > 0 (at 0, Kelly's log utility, a ruined rollout gets "
              "-inf and the group's advantages become NaN)")
    for f in ("underhire_slope", "zero_std_tol", "weight_decay", "clip_norm"):
        if getattr(c, f) < 0:
            _fail(f, getattr(c, f), "must be >= 0")
    for f in ("malformed_penalty", "tool_error_penalty"):
        if getattr(c, f) > 0:
            _fail(f, getattr(c, f), "is a penalty: must be <= 0")
    for f in ("temperature", "lr", "adam_eps"):
        if getattr(c, f) <= 0:
            _fail(f, getattr(c, f), "must be > 0")
    for f in ("b1", "b2"):
        if not 0.0 <= getattr(c, f) < 1.0:
            _fail(f, getattr(c, f), "must be in [0, 1)")
    CHECK.int_at_least(c, "role_grad_every", 0, "(0 = never)")
    for f in ("logprob_chunk", "micro_batches"):
        CHECK.positive_int(c, f)
    CHECK.capacity_factor(c, "moe_capacity_factor")
    CHECK.is_bool(c, "freeze_router")
