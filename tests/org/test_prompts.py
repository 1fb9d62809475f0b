"""What agents read: the organisation's vocabulary for toy tokenizers, observation caps."""

import re

from avalon.org import GroupSpec, OrgConfig, PromptStyle, RolloutDriver, RolloutSpec
from avalon.org.policy import Playbook, ScriptedPolicy
from avalon.org.vocabulary import org_vocabulary
from avalon.tokenizer import ChatFormat, WordTokenizer
from tests.org.helpers import CHAT, call, events_of, run_playbook, step
from tests.org.toyenv import PartsEnv


def test_org_vocabulary_makes_fixed_text_one_token_per_word():
    words = org_vocabulary()
    assert len(words) == len(set(words)) and "wait_for_messages" in words
    task = PartsEnv().task  # the environment's own words: its prompt and tools
    env_text = " ".join([task.prompt] + [f"{t.name} {t.description} " + " ".join(
        p.name for p in t.params) for t in task.tools])
    env_words = re.findall(r"[A-Za-z0-9_]{2,}", env_text) + ["fact1"]  # + its brief
    tok = WordTokenizer(words + env_words + ["Solver"])
    assert tok.vocab_size <= 512  # fits the toy preset
    chat = ChatFormat(tok)
    steps = {"ceo": [step(call("create_channel", name="plan"),
                          call("hire", title="Solver", role="solve", tools=["work"])),
                     step(call("teleport")), step(call("post", channel="plan", text="done")),
                     step(call("final_message", text="done"))]}
    for style in PromptStyle:
        cfg = OrgConfig.scaled(4096, prompt_style=style)
        result = RolloutDriver(ScriptedPolicy(chat, Playbook(steps)), chat, cfg).run(
            [GroupSpec(0, (RolloutSpec(PartsEnv(), 1, 0),))])
        for row in result.groups[0].rollouts[0].rows:
            prompt = [t for t, m in zip(row.tokens, row.loss_mask) if not m]
            text = re.sub(r"<\|[a-z]+\|>", " ", tok.decode(prompt))
            # Every word the simulator wrote is one token: spelling a word out would show up
            # as more tokens than pieces.
            spelt = [w for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]+", text)
                     if len(tok.encode(w)) > 1 and w != "teleport"  # the script's own word
                     and not re.fullmatch(r"m\d+", w)]  # message ids are spelt
            assert not spelt, (style, spelt)


def test_observation_is_capped_and_messages_stay_readable():
    long = "x" * 300
    cfg = OrgConfig.scaled(4096, prompt_style=PromptStyle.COMPACT, max_obs_tokens=200,
                           max_result_tokens=1024,
                           max_new_tokens=700, compaction_ratio=0.7, elide_target_ratio=0.6)
    steps = {"ceo": [step(call("create_channel", name="plan"),
                          call("hire", title="R", role="r", tools=[])),
                     step(call("post", channel="plan", text=long),
                          call("post", channel="plan", text=long + "y")),
                     step(call("wait_for_messages"))],
             # a1 waits: the first post wakes it, and the second (same turn, same clock) is
             # delivered at the same boundary.
             "a1": [step(call("wait_for_messages")),
                    step(call("read_message", message_id="m2"))]}
    result, rec, events = run_playbook(PartsEnv(), steps, budget=1, config=cfg)
    obs = rec.views["a1"][1].obs
    assert obs.endswith(")") and "(observation cut; read_message re-reads any message:" in obs
    assert len(CHAT.tok.encode(obs)) < 200 + 70  # the cap plus the note
    assert long + "y" in events_of(events, "tool_call", tool="read_message")[0]["result"]
