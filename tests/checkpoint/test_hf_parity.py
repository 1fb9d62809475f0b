"""Parity with transformers 5.24 `NemotronHForCausalLM` on CPU (fp32), through real checkpoints.

A tiny random HF model with M, E, *, - layers, a latent MoE and a repeated run ("MEME*-") has
every weight perturbed (so router bias, D, conv bias and norm weights matter), is saved with
`save_pretrained`, and loaded by `avalon.checkpoint.hf.load`. Logits must agree to 1e-4
relative (max |avalon - hf| / max |hf|) for a full forward and for prefill-then-decode through
the avalon cache; group-limited routing (n_group=2) is checked on the full forward (its decode
path is the same router; each extra case costs ~5 s of XLA compile on 2 cores). The reverse
direction exports avalon params and loads them in transformers. Skipped without the `hf` extra
(torch, transformers).
"""

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from avalon import model as M  # noqa: E402
from avalon.checkpoint import hf  # noqa: E402
from avalon.checkpoint.safetensors_io import write_sharded  # noqa: E402
from avalon.sharding import make_mesh  # noqa: E402

pytestmark = [
    pytest.mark.hf,
    pytest.mark.skipif(transformers.__version__ != "5.24.0",
                       reason="parity is defined against transformers==5.24.0"),
]

TOL = 1e-4
T, PREFILL = 21, 17
HF_CONFIG = dict(
    vocab_size=128, hidden_size=64, hybrid_override_pattern="MEME*-",
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96,
    mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16, n_groups=2, conv_kernel=4,
    chunk_size=8, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
    moe_shared_expert_intermediate_size=48, moe_latent_size=24, routed_scaling_factor=2.5,
    norm_topk_prob=True)
VARIANTS = {
    "latent_moe": dict(n_group=1, topk_group=1),
    "group_routing": dict(n_group=2, topk_group=1),
}

_forward = jax.jit(M.forward, static_argnames=("cfg",))


def rel_err(got, want) -> float:
    want = np.asarray(want, np.float64)
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


def hf_logits(model, ids):
    """Full-forward logits and prefill-then-one-token-decode logits from transformers."""
    with torch.no_grad():
        full = model(ids).logits.numpy()
        out = model(ids[:, :PREFILL], use_cache=True)
        steps, cache = [out.logits.numpy()], out.cache
        for s in range(PREFILL, ids.shape[1]):
            out = model(ids[:, s:s + 1], cache=cache, use_cache=True)
            steps.append(out.logits.numpy())
            cache = out.cache
    return full, np.concatenate(steps, axis=1)


def avalon_logits(params, tokens, cfg, decode: bool):
    full = _forward(params, tokens, cfg=cfg).logits
    if not decode:
        return full, None
    r = _forward(params, tokens[:, :PREFILL], cfg=cfg, cache=M.init_cache(cfg, 2, 32))
    steps, cache = [r.logits], r.cache
    for s in range(PREFILL, tokens.shape[1]):
        r = _forward(params, tokens[:, s:s + 1], cfg=cfg, cache=cache)
        steps.append(r.logits)
        cache = r.cache
    return full, jnp.concatenate(steps, axis=1)


@pytest.fixture(scope="module", params=list(VARIANTS))
def case(request, tmp_path_factory):
    """A perturbed tiny HF model saved with save_pretrained, and its reference logits."""
    torch.manual_seed(0)
    config = transformers.NemotronHConfig(**HF_CONFIG, **VARIANTS[request.param])
    model = transformers.NemotronHForCausalLM(config).eval()
    with torch.no_grad():
        for _, p in [*model.named_parameters(), *model.named_buffers()]:
            if p.is_floating_point():
                p.add_(0.1 * torch.randn_like(p))
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    ids = torch.randint(0, HF_CONFIG["vocab_size"], (2, T))
    full, decode = hf_logits(model, ids)
    return dict(name=request.param, model=model, path=path, ids=ids, full=full, decode=decode)


def test_logits_match_transformers(case):
    cfg, params = hf.load(case["path"])
    assert cfg.pattern == "MEME*-" and cfg.param_dtype == "float32"
    assert cfg.blocks == (("ME", 2), ("*", 1), ("-", 1))  # a stacked run: the layer mapping
    with_decode = case["name"] == "latent_moe"
    full, decode = avalon_logits(params, jnp.asarray(case["ids"].numpy()), cfg, with_decode)
    e_full = rel_err(full, case["full"])
    print(f"\n[{case['name']}] max rel logit error: full {e_full:.2e}")
    assert e_full <= TOL
    if with_decode:
        e_decode = rel_err(decode, case["decode"])
        print(f"[{case['name']}] max rel logit error: prefill {PREFILL} + decode "
              f"{T - PREFILL} x 1 token {e_decode:.2e}")
        assert e_decode <= TOL


def test_transformers_in_memory_layout_loads_the_same(case, tmp_path):
    """`model.state_dict()` names (`model.*`, stacked experts), in several files, onto an
    expert x tensor mesh, gives exactly the params of the hub-layout checkpoint."""
    sd = {k: v.detach().numpy() for k, v in case["model"].state_dict().items()}
    assert "model.layers.1.mixer.experts.up_proj" in sd
    write_sharded(tmp_path, [(k, v.shape, v.dtype) for k, v in sd.items()], iter(sd.values()),
                  max_shard_bytes=60_000)
    (tmp_path / "config.json").write_text((case["path"] / "config.json").read_text())
    cfg_hub, hub = hf.load(case["path"])
    cfg_mem, mem = hf.load(tmp_path, make_mesh({"expert": 2, "tensor": 4}))
    assert cfg_mem == cfg_hub
    for (path, a), b in zip(jax.tree.leaves_with_path(hub), jax.tree.leaves(mem)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b),
                                      err_msg=jax.tree_util.keystr(path))


def test_hub_style_config_loads_the_same(case, tmp_path):
    """The hub's spelling (pattern string, legacy mamba_* names, torch_dtype) of the same config
    describes the same model."""
    d = json.loads((case["path"] / "config.json").read_text())
    d["hybrid_override_pattern"] = "".join(
        {"linear_attention": "M", "moe": "E", "full_attention": "*", "mlp": "-"}[t]
        for t in d.pop("layers_block_type"))
    for new, old in (("n_groups", "mamba_n_groups"), ("conv_kernel", "mamba_d_conv"),
                     ("chunk_size", "mamba_chunk_size"), ("dtype", "torch_dtype")):
        d[old] = d.pop(new)
    for f in case["path"].iterdir():
        if f.name != "config.json":
            (tmp_path / f.name).symlink_to(f)
    (tmp_path / "config.json").write_text(json.dumps(d))
    assert hf.load(tmp_path)[0] == hf.load(case["path"])[0]


@pytest.mark.parametrize("case", ["latent_moe"], indirect=True)
def test_export_loads_in_transformers_with_the_same_logits(case, tmp_path):
    cfg, params = hf.load(case["path"])
    rng = np.random.default_rng(1)
    params = jax.tree.map(  # new weights, so this is not just the import read backwards
        lambda x: jnp.asarray(np.asarray(x) + 0.05 * rng.standard_normal(x.shape).astype(x.dtype)),
        params)
    hf.save(tmp_path, cfg, params)
    model, info = transformers.NemotronHForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float32, output_loading_info=True)
    model.eval()
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not info["mismatched_keys"]
    ids = case["ids"]
    with torch.no_grad():
        want = model(ids).logits.numpy()
    got = _forward(params, jnp.asarray(ids.numpy()), cfg=cfg).logits
    err = rel_err(got, want)
    print(f"\n[export -> transformers] max rel logit error: {err:.2e}")
    assert err <= TOL
