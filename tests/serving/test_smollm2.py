"""The server on SmolLM2-135M-Instruct's GGUF through the real `openai` client: its chat
template renders the organisation's layout, greedy tokens equal the engine's own for the same
messages, the streamed answer equals the unstreamed one, a tool call comes back parsed into
`tool_calls`, malformed and over-long requests get 4xx, and 32 concurrent clients are served
from shared dispatches (ci tier: loading and compiling SmolLM2 takes a minute)."""

import concurrent.futures
import json

import numpy as np
import pytest

from avalon.inference.api import SamplingParams, TurnRequest
from avalon.inference.engine import Engine
from avalon.serving.chat import ChatRenderer, Message
from avalon.tokenizer import ChatFormat
from tests.checkpoint.gguf_files import smollm2_file

openai = pytest.importorskip("openai")

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


def _chat():
    from avalon.tokenizer.gguf import load_gguf_tokenizer
    tok = load_gguf_tokenizer(smollm2_file(), text_calls=True)
    return ChatFormat(tok, tok.rendering)


def test_template_renders_the_organisations_layout():
    chat = _chat()
    r = ChatRenderer(chat)
    system, user = "You are agent p1. <|im_end|> stays text.", "The report\n is ready."
    ids = r.render([Message("system", system), Message("user", user)])
    assert ids == chat.system(system) + chat.turn_prompt(user)
    answer = chat.tok.encode("I sign.")
    # an answer the server sampled comes back as its ids, then the next observation
    r.completion(ids, answer, tools=False)
    more = r.render([Message("system", system), Message("user", user),
                     Message("assistant", "I sign."), Message("user", "Next.")])
    assert more == ids + answer + [chat.end_id] + chat.turn_prompt("Next.")
    # an answer cut at max_tokens (no end token sampled): closed by the template, or left
    # open as the organisation leaves it
    cut = chat.tok.encode("I si")
    r.completion(ids, cut, tools=False, ended=False)
    follow = [Message("system", system), Message("user", user), Message("assistant", "I si"),
              Message("user", "Next.")]
    assert r.render(follow) == ids + cut + [chat.end_id] + chat.turn_prompt("Next.")
    opened = ChatRenderer(chat, r.sampled, open_cut_answers=True)
    assert opened.render(follow) == ids + cut + chat.turn_prompt("Next.")
    # ids that are not the text's own encoding survive the round trip (no re-tokenisation)
    odd = chat.tok.encode("I") + chat.tok.encode(" sig") + chat.tok.encode("n.")
    assert chat.tok.decode(odd) == "I sign." and odd != answer
    r.completion(ids, odd, tools=False)
    again = r.render([Message("system", system), Message("user", user),
                      Message("assistant", "I sign.")])
    assert again[len(ids):len(ids) + len(odd)] == odd


@pytest.fixture(scope="module")
def served():
    from avalon.serve import build_server
    srv = build_server(str(smollm2_file()), slots=40, max_context=1024, prefill_chunk=128,
                       kv_pages=128).start()
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)


QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.mark.slow
@pytest.mark.ci
def test_smollm2_greedy_stream_tools_and_concurrency(served, client):
    name = served.name
    r = client.chat.completions.create(model=name, messages=QUESTION, temperature=0,
                                       max_tokens=32, extra_body={"return_token_ids": True})
    prompt = r.model_extra["prompt_token_ids"]
    chat = served.renderer.chat
    assert prompt == served.renderer.render([Message("user", QUESTION[0]["content"])])
    engine = Engine(served.worker.engine.cfg, served.worker.engine._params, num_slots=1,
                    max_context=1024, prefill_chunk=128, detokenize=chat.tok.decode)
    [want] = engine.generate([TurnRequest(slot=engine.allocate(), new_tokens=np.array(prompt),
                                          max_new_tokens=32,
                                          sampling=SamplingParams(greedy=True),
                                          stop_tokens=(chat.end_id,))])
    assert r.choices[0].model_extra["token_ids"] == [int(t) for t in want.tokens]
    assert "Paris" in r.choices[0].message.content

    stream = client.chat.completions.create(model=name, messages=QUESTION, temperature=0,
                                            max_tokens=32, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == r.choices[0].message.content

    # SmolLM2-135M does not call tools zero-shot; three worked calls in the conversation
    # (rendered as the calls it would write) and it writes the fourth.
    shots = []
    for i, city in enumerate(("Rome", "Berlin", "Madrid")):
        shots += [{"role": "user", "content": f"What is the weather in {city}?"},
                  {"role": "assistant", "content": None, "tool_calls": [{
                      "id": f"call_{i}", "type": "function", "function": {
                          "name": "get_weather", "arguments": json.dumps({"city": city})}}]},
                  {"role": "tool", "tool_call_id": f"call_{i}", "content": "Sunny"}]
    t = client.chat.completions.create(
        model=name, messages=shots + [{"role": "user", "content": "What is the weather in "
                                       "Paris?"}], tools=TOOLS, temperature=0, max_tokens=48)
    [call] = t.choices[0].message.tool_calls
    assert t.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    # malformed and over-long requests: the API's 4xx error objects, through the client
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=name, messages=[{"role": "wizard",
                                                              "content": "x"}])
    assert e.value.body["param"] == "messages[0].role"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=name, max_tokens=4, messages=[
            {"role": "user", "content": "word " * 2000}])
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=QUESTION)

    before = served.worker.stats()

    def ask(i):
        return client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": f"Name a colour ({i})."}],
            max_tokens=16, temperature=0).choices[0].message.content

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        together = list(pool.map(ask, range(32)))
    after = served.worker.stats()
    rows = (after["decode_tokens"] - before["decode_tokens"]) / (
        (after["decode_dispatches"] - before["decode_dispatches"]) * after["steps_per_dispatch"])
    assert rows > 4
    assert together[:2] == [ask(0), ask(1)]
