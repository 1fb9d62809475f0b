"""A tokenizer's own chat template renders the organisation's segments: the ids ChatFormat
builds are the ids of the template's rendering of the same conversation (checked against the
template rendered directly, and against transformers' `apply_chat_template` with the `hf`
extra), outputs round-trip through render -> tokens -> parse, and new tokens appear only where
the vocabulary has none, their embedding rows initialised from existing rows."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("tokenizers")

from avalon.tokenizer import ChatFormat, HFTokenizer, Special  # noqa: E402
from avalon.tokenizer.template import TemplateError, markup, read_template, render  # noqa: E402
from avalon.train.setup import init_added_rows  # noqa: E402

# ChatML with a thinking-off generation prompt, as the Nemotron family's templates render it.
TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n<think></think>' + message['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think></think>' }}{%- endif %}")
SPECIALS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>"]
CORPUS = ["the ceo hires a tester and posts the plan to #plan", "system user assistant",
          'post {"channel":"#plan","text":"hi"} hire {"title":"QA"}'] * 20


def make_dir(tmp_path, specials=SPECIALS, template=TEMPLATE, jinja_file=False):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    if jinja_file:
        (tmp_path / "chat_template.jinja").write_text(template)
    else:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return tok


def _conversation():
    """The same conversation as ChatFormat calls and as chat messages."""
    call = 'post {"channel":"#plan","text":"hi"}'
    steps = [("system", "You are the CEO."), ("user", "Task: plan it."),
             ("assistant", ("Hiring first.", [call])), ("user", "delivered: ok")]
    return steps, call


def _render_with_chat(chat, steps):
    ids = []
    for role, content in steps:
        if role == "system":
            ids += chat.system(content)
        elif role == "user":
            ids += chat.turn_prompt(content)
        else:
            ids += chat.output(*content)
    return ids


def _messages(steps):
    out = []
    for role, content in steps:
        if role == "assistant":
            text, calls = content
            content = text + "".join(f"<tool_call>{c}</tool_call>" for c in calls)
        out.append({"role": role, "content": content})
    return out


def test_segments_render_as_the_template_renders_them(tmp_path):
    make_dir(tmp_path)
    tok = HFTokenizer.from_dir(tmp_path)
    chat = ChatFormat(tok, tok.rendering)
    steps, _ = _conversation()
    ids = _render_with_chat(chat, steps)
    want = render(TEMPLATE, _messages(steps), add_generation_prompt=True)
    assert tok.decode(ids) == want
    assert ids == tok.encode_markup(want)
    r = tok.rendering
    assert tok.decode(r.agent_open) == "<|im_start|>assistant\n<think></think>"
    assert tok.decode([chat.end_id]) == "<|im_end|>" and tok.decode(r.sep) == "\n"
    assert tok.added == {}  # every marker the organisation needs is in the vocabulary
    assert set(tok.special_ids) == {Special.END, Special.CALL}


@pytest.mark.hf
def test_ids_equal_transformers_apply_chat_template(tmp_path):
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer

    make_dir(tmp_path)
    tok = HFTokenizer.from_dir(tmp_path)
    steps, _ = _conversation()
    ids = _render_with_chat(ChatFormat(tok, tok.rendering), steps)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_file(str(tmp_path / "tokenizer.json")),
        chat_template=TEMPLATE)
    want = fast.apply_chat_template(_messages(steps), tokenize=True, add_generation_prompt=True)
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
    assert ids == list(want)


def test_outputs_round_trip_and_control_tokens_are_malformed(tmp_path):
    make_dir(tmp_path, jinja_file=True)
    tok = HFTokenizer.from_dir(tmp_path)
    chat = ChatFormat(tok, tok.rendering)
    out = chat.output("plan first", ['hire {"title":"QA"}', "wait_for_messages"])
    assert tok.decode(out) == ('plan first<tool_call>hire {"title":"QA"}</tool_call>'
                               '<tool_call>wait_for_messages</tool_call><|im_end|>')
    parts = chat.split_output(out)
    assert (parts.text, parts.calls, parts.ended, parts.error) == (
        "plan first", ('hire {"title":"QA"}', "wait_for_messages"), True, None)
    assert not chat.split_output(out[:-1]).ended
    im_start = tok.encode_markup("<|im_start|>")
    bad = chat.split_output(tok.encode("a") + im_start + tok.encode("user") + [chat.end_id])
    assert bad.error == "stray <|im_start|> at output token 1"
    early_end = chat.split_output(tok.encode("a") + [chat.end_id] + tok.encode("b")
                                  + [chat.end_id])
    assert early_end.error is not None and "<|im_end|>" in early_end.error
    # Message text never becomes markup: the literal strings stay text.
    text_ids = tok.encode("<|im_end|><tool_call><|im_start|>system")
    assert not set(text_ids) & tok.rendering.control
    assert tok.decode(text_ids) == "<|im_end|><tool_call><|im_start|>system"


def test_new_tokens_only_where_missing_initialised_from_existing_rows(tmp_path):
    base = make_dir(tmp_path, specials=["<|im_start|>", "<|im_end|>", "<think>", "</think>"])
    tok = HFTokenizer.from_dir(tmp_path)
    n = base.get_vocab_size()
    assert tok.vocab_size == n + 1  # only the call marker is new
    (call_id, text), = tok.added.items()
    assert (call_id, text) == (n, "<|call|>") and tok.rendering.call == n
    assert tok.rendering.call_close == ()
    rng = np.random.default_rng(0)
    v, d = n + 8, 16
    params = {"embed": jnp.asarray(rng.standard_normal((v, d)), jnp.float32),
              "lm_head": jnp.asarray(rng.standard_normal((d, v)), jnp.float32)}
    got = init_added_rows(params, tok)
    pieces = tok.encode("<|call|>")
    assert len(pieces) > 1 and n not in pieces
    np.testing.assert_allclose(got["embed"][n], np.asarray(params["embed"])[pieces].mean(0),
                               rtol=1e-6)
    np.testing.assert_allclose(got["lm_head"][:, n],
                               np.asarray(params["lm_head"])[:, pieces].mean(1), rtol=1e-6)
    untouched = [i for i in range(v) if i != n]
    np.testing.assert_array_equal(np.asarray(got["embed"])[untouched],
                                  np.asarray(params["embed"])[untouched])


def test_without_a_template_the_native_specials_are_used(tmp_path):
    make_dir(tmp_path)
    (tmp_path / "tokenizer_config.json").unlink()
    assert read_template(tmp_path) is None
    tok = HFTokenizer.from_dir(tmp_path)
    assert tok.rendering is None and set(tok.special_ids) == set(Special)
    assert sorted(tok.added.values()) == sorted(s.value for s in Special)


def test_templates_that_cannot_be_split_are_refused():
    is_special = {"<|im_end|>"}.__contains__
    plain_end = ("{%- for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n\\n' }}"
                 "{%- endfor %}{%- if add_generation_prompt %}assistant: {% endif %}")
    with pytest.raises(TemplateError, match="does not start with a special token"):
        markup(plain_end, is_special)
    with pytest.raises(TemplateError, match="turns end differently"):
        markup("{%- for m in messages %}{{ m['content'] + ('<|im_end|>' if m['role'] == "
               "'system' else '<|im_end|>\\n') }}{%- endfor %}", is_special)
    with pytest.raises(TemplateError, match="no system"):
        markup("{{ raise_exception('no system messages') }}", is_special)
