"""Parity with transformers 5.24 for the Llama/Qwen families on CPU (fp32), through real
checkpoints: `LlamaForCausalLM` (llama3 rope scaling, attention and MLP biases, tied
embeddings), `Qwen2ForCausalLM` (q/k/v biases, linear rope scaling), `Qwen3ForCausalLM` (q/k
norm) and `Qwen3MoeForCausalLM` (softmax router, SwiGLU experts, a dense layer among them).

Each tiny random HF model has every weight perturbed, is saved with `save_pretrained` and loaded
by `avalon.checkpoint.hf.load`. Logits agree to 1e-4 relative (max |avalon - hf| / max |hf|)
for a full forward, for prefill-then-decode through the cache, and for the two sequences
packed into one row (rotary positions restart per segment). An export of new weights loads in
transformers with the same logits, and the engine's greedy tokens (its default CPU path:
unstacked layers, output-first or packed weights, grouped experts) equal transformers'
`generate`.
"""

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
from avalon.inference.api import SamplingParams, TurnRequest  # noqa: E402
from avalon.inference.engine import Engine  # noqa: E402
from avalon.model.config import Activation, RopeScaling, Router  # noqa: E402

pytestmark = [
    pytest.mark.hf,
    pytest.mark.skipif(transformers.__version__ != "5.24.0",
                       reason="parity is defined against transformers==5.24.0"),
]

TOL = 1e-4
T, PREFILL, VOCAB = 21, 15, 96
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=80, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=256)
CASES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 32},
        attention_bias=True, mlp_bias=True, tie_word_embeddings=True)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(attention_bias=True)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        moe_intermediate_size=24, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
        mlp_only_layers=[1])),
}
_forward = jax.jit(M.forward, static_argnames=("cfg",))


def rel_err(got, want) -> float:
    want = np.asarray(want, np.float64)
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    config_cls, model_cls, extra = CASES[request.param]
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(**COMMON, **extra)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.add_(0.1 * torch.randn_like(p))
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    ids = torch.randint(0, VOCAB, (2, T))
    with torch.no_grad():
        full = model(ids).logits.numpy()
    return dict(name=request.param, model=model, path=path, ids=ids, full=full)


def test_config_reads_each_family(case):
    cfg, _ = hf.load(case["path"])
    assert cfg.mlp_activation == Activation.SWIGLU and cfg.rope_theta is not None
    want = {"llama": ("*-" * 3, RopeScaling.LLAMA3, True, True, False),
            "qwen2": ("*-" * 3, RopeScaling.LINEAR, False, True, False),
            "qwen3": ("*-" * 3, RopeScaling.NONE, False, True, True),
            "qwen3_moe": ("*E*-*E", RopeScaling.NONE, False, False, True)}[case["name"]]
    assert (cfg.pattern, cfg.rope_scaling, cfg.tie_word_embeddings, cfg.attention_qkv_bias,
            cfg.qk_norm) == want
    assert (cfg.router == Router.SOFTMAX) == (case["name"] == "qwen3_moe")


def test_logits_match_transformers(case):
    cfg, params = hf.load(case["path"])
    tokens = jnp.asarray(case["ids"].numpy())
    e_full = rel_err(_forward(params, tokens, cfg=cfg).logits, case["full"])
    r = _forward(params, tokens[:, :PREFILL], cfg=cfg, cache=M.init_cache(cfg, 2, 32))
    steps, cache = [r.logits], r.cache
    for s in range(PREFILL, T):
        r = _forward(params, tokens[:, s:s + 1], cfg=cfg, cache=cache)
        steps.append(r.logits)
        cache = r.cache
    e_decode = rel_err(jnp.concatenate(steps, axis=1), case["full"])
    # Both sequences in one packed row: the second restarts its positions at 0.
    a, b = 9, 12
    row = jnp.concatenate([tokens[0, :a], tokens[1, :b]])[None]
    seg = jnp.asarray([[1] * a + [2] * b])
    packed = _forward(params, row, cfg=cfg, segment_ids=seg).logits[0]
    e_packed = rel_err(packed, np.concatenate([case["full"][0, :a], case["full"][1, :b]]))
    print(f"\n[{case['name']}] max rel logit error: full {e_full:.2e}, prefill + decode "
          f"{e_decode:.2e}, packed {e_packed:.2e}")
    assert max(e_full, e_decode, e_packed) <= TOL


@pytest.mark.parametrize("case", ["llama", "qwen3_moe"], indirect=True)
def test_export_loads_in_transformers_with_the_same_logits(case, tmp_path):
    cfg, params = hf.load(case["path"])
    rng = np.random.default_rng(1)
    params = jax.tree.map(  # new weights, so this is not just the import read backwards
        lambda x: jnp.asarray(np.asarray(x) + 0.05 * rng.standard_normal(x.shape).astype(x.dtype)),
        params)
    hf.save(tmp_path, cfg, params)
    model_cls = getattr(transformers, CASES[case["name"]][1])
    model, info = model_cls.from_pretrained(tmp_path, dtype=torch.float32,
                                            output_loading_info=True)
    model.eval()
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not info["mismatched_keys"]
    with torch.no_grad():
        want = model(case["ids"]).logits.numpy()
    err = rel_err(_forward(params, jnp.asarray(case["ids"].numpy()), cfg=cfg).logits, want)
    print(f"\n[{case['name']} export -> transformers] max rel logit error: {err:.2e}")
    assert err <= TOL
    assert hf.load(tmp_path)[0] == cfg


@pytest.mark.parametrize("case", ["llama", "qwen3_moe"], indirect=True)
def test_engine_greedy_tokens_equal_transformers_generate(case):
    cfg, params = hf.load(case["path"])
    prompts = case["ids"][:, :PREFILL]
    new = 12
    with torch.no_grad():
        want = case["model"].generate(prompts, max_new_tokens=new, do_sample=False,
                                      min_new_tokens=new)[:, PREFILL:].numpy()
    engine = Engine(cfg, params, num_slots=2, max_context=64, steps_per_dispatch=4,
                    prefill_chunk=8)
    slots = [engine.allocate() for _ in range(2)]
    results = engine.generate([
        TurnRequest(slot=s, new_tokens=prompts[i].numpy().astype(np.int32),
                    max_new_tokens=new, sampling=SamplingParams(greedy=True))
        for i, s in enumerate(slots)])
    got = np.stack([r.tokens for r in results])
    np.testing.assert_array_equal(got, want)
