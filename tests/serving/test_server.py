"""The OpenAI-compatible server on a tiny model (byte tokenizer, the native chat format),
driven by the real `openai` client: greedy tokens equal the engine's own for the same prompt
ids, a streamed answer equals the unstreamed one, n choices from one prefill, a conversation's
next request prefills only its new messages, concurrent clients share dispatches, and malformed
or oversized requests get the API's 4xx error objects. SmolLM2's GGUF: test_smollm2.py."""

import concurrent.futures
import http.client
import json

import jax
import numpy as np
import pytest

from avalon import model as M
from avalon.envs.transport import ServerLimits
from avalon.inference.api import SamplingParams, TurnRequest
from avalon.inference.engine import Engine
from avalon.serving.chat import Message
from avalon.serving.server import OpenAIServer
from avalon.tokenizer import ByteTokenizer, ChatFormat

openai = pytest.importorskip("openai")

TOK = ByteTokenizer()
CFG = M.presets.get("tiny", vocab_size=TOK.vocab_size)
CHAT = ChatFormat(TOK)
NAME = "tiny"


def make_engine(params, slots=8):
    return Engine(CFG, params, num_slots=slots, max_context=256, prefill_chunk=64,
                  detokenize=TOK.decode)


@pytest.fixture(scope="module")
def params():
    return M.init_params(jax.random.key(0), CFG)


@pytest.fixture(scope="module")
def server(params):
    limits = ServerLimits(max_body_bytes=4096, read_timeout_s=10.0)
    srv = OpenAIServer(make_engine(params, slots=40), CHAT, name=NAME, limits=limits).start()
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say something."}]


def test_models(client):
    assert [m.id for m in client.models.list().data] == [NAME]


def test_greedy_tokens_equal_the_engines_own(server, client, params):
    r = client.chat.completions.create(model=NAME, messages=MESSAGES, temperature=0,
                                       max_tokens=12, logprobs=True,
                                       extra_body={"return_token_ids": True})
    prompt = server.renderer.render([Message(m["role"], m["content"]) for m in MESSAGES])
    assert prompt == CHAT.system("You are terse.") + CHAT.turn_prompt("Say something.")
    assert r.model_extra["prompt_token_ids"] == prompt
    engine = make_engine(params)
    [want] = engine.generate([TurnRequest(slot=engine.allocate(), new_tokens=np.array(prompt),
                                          max_new_tokens=12,
                                          sampling=SamplingParams(greedy=True),
                                          stop_tokens=(CHAT.end_id,))])
    got = r.choices[0].model_extra["token_ids"]
    assert got == [int(t) for t in want.tokens]
    lps = [e.logprob for e in r.choices[0].logprobs.content]
    np.testing.assert_allclose(lps, want.logprobs, rtol=0, atol=1e-5)
    body = got[:-1] if got and got[-1] == CHAT.end_id else got
    assert r.choices[0].message.content == TOK.decode(body)
    assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == len(got)
    assert r.choices[0].finish_reason == ("stop" if got[-1] == CHAT.end_id else "length")


def test_stream_equals_unstreamed(client):
    kw = dict(model=NAME, messages=MESSAGES, max_tokens=40, temperature=0.8, seed=7)
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True,
                                                  stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and
              c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    # more than one content delta: the answer streamed as it was sampled
    assert sum(bool(c.choices and c.choices[0].delta.content) for c in chunks) > 1


def test_stop_string_cuts_both_ways_alike(client):
    free = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=30,
                                          temperature=0)
    text = free.choices[0].message.content
    stop = text[5:7]
    kw = dict(model=NAME, messages=MESSAGES, max_tokens=30, temperature=0, stop=[stop])
    cut = client.chat.completions.create(**kw)
    streamed = "".join(c.choices[0].delta.content or ""
                       for c in client.chat.completions.create(**kw, stream=True) if c.choices)
    assert cut.choices[0].message.content == text[:text.find(stop)] == streamed
    assert cut.choices[0].finish_reason == "stop"


def test_n_choices_differ_by_seed_and_repeat(client):
    kw = dict(model=NAME, messages=MESSAGES, max_tokens=16, temperature=1.0, seed=3, n=3)
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    texts = [c.message.content for c in a.choices]
    assert texts == [c.message.content for c in b.choices]
    assert len(set(texts)) > 1


def test_conversation_continues_in_its_slot(server, client):
    first = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=10,
                                           temperature=0.9, seed=11,
                                           extra_body={"return_token_ids": True})
    answer = first.choices[0].message.content
    hits = server.worker.cache_hits
    follow = MESSAGES + [{"role": "assistant", "content": answer},
                         {"role": "user", "content": "More."}]
    second = client.chat.completions.create(model=NAME, messages=follow, max_tokens=4,
                                            temperature=0, extra_body={"return_token_ids": True})
    # the previous prompt and the ids it sampled are the new prompt's start, token for token
    before = first.model_extra["prompt_token_ids"] + first.choices[0].model_extra["token_ids"]
    assert second.model_extra["prompt_token_ids"][:len(before)] == before
    assert server.worker.cache_hits == hits + 1
    assert second.usage.prompt_tokens_details.cached_tokens == len(before)


def test_concurrent_clients_share_dispatches(server, client):
    before = server.worker.stats()

    def ask(i):
        return client.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": f"Question {i}"}],
            max_tokens=24, temperature=0).choices[0].message.content

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        together = list(pool.map(ask, range(32)))
    after = server.worker.stats()
    rows = (after["decode_tokens"] - before["decode_tokens"]) / (
        (after["decode_dispatches"] - before["decode_dispatches"]) * after["steps_per_dispatch"])
    assert rows > 4  # tokens per decode dispatch: many clients' rows in each
    assert together[:4] == [ask(i) for i in range(4)]  # the same answers one at a time


def _post(server, body: bytes, headers=None):
    conn = http.client.HTTPConnection(*server.address, timeout=10)
    conn.request("POST", "/v1/chat/completions", body=body,
                 headers={"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    out = r.status, json.loads(r.read() or b"{}")
    conn.close()
    return out


@pytest.mark.parametrize("body, status, param", [
    ({"model": NAME, "messages": "hi"}, 400, "messages"),
    ({"model": NAME, "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
    ({"model": NAME, "messages": MESSAGES, "temperature": -1}, 400, "temperature"),
    ({"model": NAME, "messages": MESSAGES, "n": 0}, 400, "n"),
    ({"model": NAME, "messages": MESSAGES, "max_tokens": 10 ** 6}, 400, "max_tokens"),
    ({"model": NAME, "messages": MESSAGES, "top_logprobs": 3}, 400, "top_logprobs"),
    ({"model": NAME, "messages": MESSAGES, "stop": ["a"] * 5}, 400, "stop"),
    ({"model": NAME, "messages": MESSAGES, "bogus": 1}, 400, "bogus"),
    ({"model": "other", "messages": MESSAGES}, 404, "model"),
    ({"messages": MESSAGES}, 400, "model"),
])
def test_malformed_requests_get_4xx(server, body, status, param):
    got, reply = _post(server, json.dumps(body).encode())
    assert got == status
    err = reply["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert param.split("[")[0] in err["message"]


def test_prompt_over_the_context_is_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, max_tokens=4, messages=[
            {"role": "user", "content": "x" * 300}])
    assert e.value.body["code"] == "context_length_exceeded"


def test_oversized_and_broken_bodies_get_4xx(server):
    status, reply = _post(server, b"{" + b" " * 5000 + b"}")
    assert status == 413 and "over the limit" in reply["error"]["message"]
    status, reply = _post(server, b"{not json")
    assert status == 400 and reply["error"]["type"] == "invalid_request_error"
    status, reply = _post(server, json.dumps(
        {"model": NAME, "messages": [[[[[[[[]]]]]]]] * 1}).encode())
    assert status == 400
