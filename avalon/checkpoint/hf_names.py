"""The one table between avalon params and Hugging Face Nemotron-H tensors.

`param_sources(cfg, layout)` returns a tree shaped exactly like the params whose leaves are
`Source`s: for every avalon leaf, the HF tensor name(s) it is cut from and how (`View`). Import
(`hf.load`) reads through it, export (`hf.save`) writes through its inverse, and
`check_sources` proves it matches `avalon.model.params.param_specs` leaf for leaf, so a new
model leaf without an HF source fails loudly instead of being skipped.

Stacking. An avalon leaf of run b (`cfg.blocks[b] = (unit, reps)`) at unit position j has a
leading repeats axis: repeat r is HF layer `i = start_b + r * len(unit) + j`. The hub layout
also stores one tensor per routed expert, which becomes a second stacked axis. So a `Source`
holds an array of HF names whose shape is the leaf's leading stacked axes, and one `View` that
maps each named tensor to the remaining axes.

HF tensors (`[out, in]` like torch.nn.Linear; hub names `backbone.layers.{i}.mixer.*`):
  in_proj (2I+2GN+H, D)  rows z [0,I) | x [I,2I) | B | C (GN each) | dt (H)  -> in_z, in_x,
                         in_B, in_C, in_dt, each [D, ...] with head axes split out
  conv1d (CD, 1, K)      rows x [0,I) | B | C  -> conv_x/B/C [K, ...] (tap K-1 = current token)
  norm (I) -> gate_norm [H, P]; out_proj (D, I) -> out [H, P, D]; q/k/v (heads*hd, D) ->
  [D, heads, hd]; o_proj (D, nh*hd) -> [nh, hd, D]; experts.{e}.up_proj (F, W) -> experts_up
  [E, W, F]; transformers' in-memory layout (`model.*`) instead stacks experts as
  experts.up_proj (E, F, W). Router and its correction bias: gate.weight (E, D) -> router
  [D, E], gate.e_score_correction_bias (E).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterable, Sequence

import jax
import numpy as np

from avalon.model.config import LETTERS, ModelConfig
from avalon.model.params import abstract_params, layer_key


@dataclasses.dataclass(frozen=True)
class View:
    """How one avalon per-layer array is cut from one HF tensor of shape `hf_shape`.

    Axis 0 is restricted to rows [rows[0], rows[1]) when `rows` is set; HF axis a is reshaped
    into the factor sizes `factors[a]` (an empty tuple drops a size-1 axis); avalon axis k is
    factor axis `perm[k]` (factor axes numbered in HF order)."""

    hf_shape: tuple[int, ...]
    factors: tuple[tuple[int, ...], ...]
    perm: tuple[int, ...]
    rows: tuple[int, int] | None = None

    def __post_init__(self):
        if len(self.factors) != len(self.hf_shape):
            raise ValueError(f"View {self}: one factor tuple per HF axis")
        for a, (n, fs) in enumerate(zip(self.hf_shape, self.factors)):
            if a == 0 and self.rows is not None:
                n = self.rows[1] - self.rows[0]
            if math.prod(fs) != n:
                raise ValueError(f"View {self}: factors {fs} do not multiply to {n} (axis {a})")
        if sorted(self.perm) != list(range(sum(len(f) for f in self.factors))):
            raise ValueError(f"View {self}: perm is not a permutation of the factor axes")

    @property
    def shape(self) -> tuple[int, ...]:
        """The avalon per-layer shape."""
        flat = [f for fs in self.factors for f in fs]
        return tuple(flat[p] for p in self.perm)

    def read(self, read_region: Callable[[list[tuple[int, int]]], np.ndarray],
             region: Sequence[tuple[int, int]]) -> np.ndarray:
        """The avalon array's `region` (one (start, stop) per avalon axis), reading from the HF
        tensor only the rows/columns it needs: for an HF axis split into factors, the outermost
        factor's range selects a contiguous span and inner factors are read whole."""
        flat_rng: list = [None] * len(self.perm)
        for k, p in enumerate(self.perm):
            flat_rng[p] = region[k]
        hf_region, shape, post, f = [], [], [], 0
        for a, fs in enumerate(self.factors):
            base = self.rows[0] if a == 0 and self.rows is not None else 0
            if not fs:
                hf_region.append((0, 1))
                continue
            inner = math.prod(fs[1:])
            lo, hi = flat_rng[f]
            hf_region.append((base + lo * inner, base + hi * inner))
            shape += [hi - lo, *fs[1:]]
            post += [slice(None)] + [slice(*flat_rng[f + m]) for m in range(1, len(fs))]
            f += len(fs)
        block = read_region(hf_region).reshape(shape)[tuple(post)]
        return block.transpose(self.perm)

    def to_hf(self, x: np.ndarray) -> np.ndarray:
        """The inverse: the avalon per-layer array `x` as its rows of the HF tensor."""
        seg = list(self.hf_shape)
        if self.rows is not None:
            seg[0] = self.rows[1] - self.rows[0]
        return np.transpose(x, np.argsort(self.perm)).reshape(seg)


@dataclasses.dataclass(frozen=True, eq=False)
class Source:
    """An avalon leaf: `names` (object array shaped like the leaf's leading stacked axes) of HF
    tensors, each mapped by `view` to the remaining axes."""

    names: np.ndarray
    view: View

    @property
    def shape(self) -> tuple[int, ...]:
        return self.names.shape + self.view.shape


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a checkpoint names things: the hub/`save_pretrained` layout (`backbone.*`, one key
    per expert) or transformers' in-memory `state_dict` (`model.*`, stacked experts)."""

    prefix: str
    stacked_experts: bool


HUB = Layout("backbone.", stacked_experts=False)
IN_MEMORY = Layout("model.", stacked_experts=True)

_STACKED_EXPERT = re.compile(r"\.mixer\.experts\.(up|down)_proj$")
_PER_EXPERT = re.compile(r"\.mixer\.experts\.\d+\.(up|down)_proj\.weight$")


def detect_layout(names: Iterable[str]) -> Layout:
    """The layout of a checkpoint from its tensor names."""
    names = list(names)
    if any(n.startswith("backbone.") for n in names):
        prefix = "backbone."
    elif any(n.startswith("model.") for n in names):
        prefix = "model."
    else:
        raise ValueError("no 'backbone.*' (hub) or 'model.*' (transformers) tensors: not a "
                         f"Nemotron-H checkpoint (first names: {sorted(names)[:5]})")
    if any(_STACKED_EXPERT.search(n) for n in names):
        stacked = True
    elif any(_PER_EXPERT.search(n) for n in names):
        stacked = False
    else:
        stacked = prefix == "model."
    return Layout(prefix, stacked)


# ---- view constructors ----------------------------------------------------------------------
def _whole(*shape: int) -> View:
    return View(tuple(shape), tuple((n,) for n in shape), tuple(range(len(shape))))


def _transposed(out: int, inp: int) -> View:
    """torch Linear weight (out, in) -> avalon [in, out]."""
    return View((out, inp), ((out,), (inp,)), (1, 0))


def _proj_in(out: int, inp: int, split: tuple[int, ...], rows=None) -> View:
    """Rows `rows` of a (out, in) weight -> avalon [in, *split] (split covers those rows)."""
    n = len(split)
    return View((out, inp), (split, (inp,)), (n, *range(n)), rows)


def _proj_out(out: int, inp: int, split: tuple[int, ...]) -> View:
    """A (out, in) weight whose input axis has head structure -> avalon [*split, out]."""
    n = len(split)
    return View((out, inp), ((out,), split), (*range(1, n + 1), 0))


def _vector(n: int, split: tuple[int, ...], rows=None) -> View:
    return View((n,), (split,), tuple(range(len(split))), rows)


def _conv(cd: int, k: int, split: tuple[int, ...], rows) -> View:
    """Rows of a depthwise conv weight (CD, 1, K) -> avalon [K, *split]."""
    n = len(split)
    return View((cd, 1, k), (split, (), (k,)), (n, *range(n)), rows)


# ---- per-layer tables -----------------------------------------------------------------------
def _names(pre: np.ndarray, suffix: str) -> np.ndarray:
    return np.array([p + suffix for p in pre.flat], dtype=object).reshape(pre.shape)


def _per_expert(pre: np.ndarray, e: int, suffix: str) -> np.ndarray:
    flat = [f"{p}mixer.experts.{x}.{suffix}" for p in pre.flat for x in range(e)]
    return np.array(flat, dtype=object).reshape(*pre.shape, e)


def _mamba(cfg: ModelConfig, pre: np.ndarray, layout: Layout) -> dict[str, Source]:
    d, h, p, g, n, k = (cfg.hidden_size, cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.n_groups,
                        cfg.ssm_state_size, cfg.conv_kernel)
    inner, gn = h * p, g * n
    cd, proj = inner + 2 * gn, 2 * inner + 2 * gn + h
    # in_proj rows: z | x | B | C | dt.   conv rows: x | B | C.
    in_rows = {"z": (0, inner), "x": (inner, 2 * inner), "B": (2 * inner, 2 * inner + gn),
               "C": (2 * inner + gn, 2 * inner + 2 * gn), "dt": (2 * inner + 2 * gn, proj)}
    conv_rows = {"x": (0, inner), "B": (inner, inner + gn), "C": (inner + gn, cd)}
    split = {"z": (h, p), "x": (h, p), "B": (g, n), "C": (g, n), "dt": (h,)}
    m = lambda s: _names(pre, "mixer." + s)
    out = {
        "norm": Source(_names(pre, "norm.weight"), _whole(d)),
        "dt_bias": Source(m("dt_bias"), _whole(h)),
        "A_log": Source(m("A_log"), _whole(h)),
        "D": Source(m("D"), _whole(h)),
        "gate_norm": Source(m("norm.weight"), _vector(inner, (h, p))),
        "out": Source(m("out_proj.weight"), _proj_out(d, inner, (h, p))),
    }
    for part, rows in in_rows.items():
        out[f"in_{part}"] = Source(m("in_proj.weight"), _proj_in(proj, d, split[part], rows))
    for part, rows in conv_rows.items():
        out[f"conv_{part}"] = Source(m("conv1d.weight"), _conv(cd, k, split[part], rows))
        if cfg.use_conv_bias:
            out[f"conv_bias_{part}"] = Source(m("conv1d.bias"), _vector(cd, split[part], rows))
    if cfg.use_bias:
        for part, rows in in_rows.items():
            out[f"in_bias_{part}"] = Source(m("in_proj.bias"), _vector(proj, split[part], rows))
        out["out_bias"] = Source(m("out_proj.bias"), _whole(d))
    return out


def _moe(cfg: ModelConfig, pre: np.ndarray, layout: Layout) -> dict[str, Source]:
    d, e, f, fs, w = (cfg.hidden_size, cfg.n_routed_experts, cfg.moe_intermediate_size,
                      cfg.moe_shared_expert_intermediate_size, cfg.expert_width)
    m = lambda s: _names(pre, "mixer." + s)
    out = {
        "norm": Source(_names(pre, "norm.weight"), _whole(d)),
        "router": Source(m("gate.weight"), _transposed(e, d)),
        "router_bias": Source(m("gate.e_score_correction_bias"), _whole(e)),
        "shared_up": Source(m("shared_experts.up_proj.weight"), _transposed(fs, d)),
        "shared_down": Source(m("shared_experts.down_proj.weight"), _transposed(d, fs)),
    }
    if layout.stacked_experts:  # (E, F, W) -> [E, W, F] and (E, W, F) -> [E, F, W]
        out["experts_up"] = Source(m("experts.up_proj"),
                                   View((e, f, w), ((e,), (f,), (w,)), (0, 2, 1)))
        out["experts_down"] = Source(m("experts.down_proj"),
                                     View((e, w, f), ((e,), (w,), (f,)), (0, 2, 1)))
    else:
        out["experts_up"] = Source(_per_expert(pre, e, "up_proj.weight"), _transposed(f, w))
        out["experts_down"] = Source(_per_expert(pre, e, "down_proj.weight"), _transposed(w, f))
    if cfg.moe_latent_size is not None:
        lat = cfg.moe_latent_size
        out["latent_in"] = Source(m("fc1_latent_proj.weight"), _transposed(lat, d))
        out["latent_out"] = Source(m("fc2_latent_proj.weight"), _transposed(d, lat))
    if cfg.mlp_bias:
        out["shared_up_bias"] = Source(m("shared_experts.up_proj.bias"), _whole(fs))
        out["shared_down_bias"] = Source(m("shared_experts.down_proj.bias"), _whole(d))
        if cfg.moe_latent_size is not None:
            out["latent_in_bias"] = Source(m("fc1_latent_proj.bias"), _whole(cfg.moe_latent_size))
            out["latent_out_bias"] = Source(m("fc2_latent_proj.bias"), _whole(d))
    return out


def _attention(cfg: ModelConfig, pre: np.ndarray, layout: Layout) -> dict[str, Source]:
    d, nh, nkv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, \
        cfg.head_dim
    m = lambda s: _names(pre, "mixer." + s)
    return {
        "norm": Source(_names(pre, "norm.weight"), _whole(d)),
        "q": Source(m("q_proj.weight"), _proj_in(nh * hd, d, (nh, hd))),
        "k": Source(m("k_proj.weight"), _proj_in(nkv * hd, d, (nkv, hd))),
        "v": Source(m("v_proj.weight"), _proj_in(nkv * hd, d, (nkv, hd))),
        "o": Source(m("o_proj.weight"), _proj_out(d, nh * hd, (nh, hd))),
    }


def _mlp(cfg: ModelConfig, pre: np.ndarray, layout: Layout) -> dict[str, Source]:
    d, f = cfg.hidden_size, cfg.intermediate_size
    m = lambda s: _names(pre, "mixer." + s)
    out = {
        "norm": Source(_names(pre, "norm.weight"), _whole(d)),
        "up": Source(m("up_proj.weight"), _transposed(f, d)),
        "down": Source(m("down_proj.weight"), _transposed(d, f)),
    }
    if cfg.mlp_bias:
        out["up_bias"] = Source(m("up_proj.bias"), _whole(f))
        out["down_bias"] = Source(m("down_proj.bias"), _whole(d))
    return out


_LAYER_TABLES = {"mamba": _mamba, "moe": _moe, "attention": _attention, "mlp": _mlp}


def layer_index(cfg: ModelConfig, run: int, repeat: int, position: int) -> int:
    """The HF layer index of repeat `repeat`, unit position `position` of run `run`."""
    start = sum(len(u) * r for u, r in cfg.blocks[:run])
    return start + repeat * len(cfg.blocks[run][0]) + position


def param_sources(cfg: ModelConfig, layout: Layout = HUB) -> dict:
    """A tree shaped like the params of `cfg`, with a `Source` per leaf."""
    d, v, pfx = cfg.hidden_size, cfg.vocab_size, layout.prefix
    scalar = lambda name: np.array(name, dtype=object)
    tree: dict = {
        "embed": Source(scalar(f"{pfx}embeddings.weight"), _whole(v, d)),
        "blocks": [],
        "final_norm": Source(scalar(f"{pfx}norm_f.weight"), _whole(d)),
    }
    for b, (unit, reps) in enumerate(cfg.blocks):
        run = {}
        for j, ch in enumerate(unit):
            pre = np.array([f"{pfx}layers.{layer_index(cfg, b, r, j)}." for r in range(reps)],
                           dtype=object)
            run[layer_key(j, ch)] = _LAYER_TABLES[LETTERS[ch]](cfg, pre, layout)
        tree["blocks"].append(run)
    if not cfg.tie_word_embeddings:
        tree["lm_head"] = Source(scalar("lm_head.weight"), _transposed(v, d))
    if cfg.mtp_pattern:
        last = len(cfg.mtp_pattern) - 1
        tree["mtp"] = {
            "enorm": Source(scalar("mtp.layers.0.enorm.weight"), _whole(d)),
            "hnorm": Source(scalar("mtp.layers.0.hnorm.weight"), _whole(d)),
            "eh_proj": Source(scalar("mtp.layers.0.eh_proj.weight"), _transposed(d, 2 * d)),
            "layers": [_LAYER_TABLES[LETTERS[ch]](cfg, scalar(f"mtp.layers.{j}."), layout)
                       for j, ch in enumerate(cfg.mtp_pattern)],
            "final_norm": Source(scalar(f"mtp.layers.{last}.final_layernorm.weight"), _whole(d)),
        }
    return tree


def is_source(x) -> bool:
    return isinstance(x, Source)


def check_sources(cfg: ModelConfig, sources) -> None:
    """Raise if the table and the model's param description disagree on any leaf."""
    abstract = abstract_params(cfg)
    want = jax.tree.structure(abstract)
    got = jax.tree.structure(sources, is_leaf=is_source)
    if want != got:
        raise AssertionError(f"hf_names table out of date with avalon params:\n params {want}\n "
                             f"table  {got}")
    for (path, src), a in zip(jax.tree.leaves_with_path(sources, is_leaf=is_source),
                              jax.tree.leaves(abstract)):
        if src.shape != a.shape:
            raise AssertionError(f"hf_names: param {jax.tree_util.keystr(path)} is {a.shape} in "
                                 f"avalon but the table gives {src.shape}")
