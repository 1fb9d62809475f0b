"""An environment written with the `openreward` SDK, for the ORS tests (run as a subprocess:
`python -m tests.envs.ors_counter_env PORT LOGDIR`, served on 127.0.0.1 only).

Task i of a split asks for `target = i + 2` bumps. `bump` reads the session's count, waits,
then writes it back plus one (a race without serialisation) and logs each run to LOGDIR/runs
(so tests can count executions across the process boundary); the bump that reaches the target
is rewarded 1.0 and finishes the episode. `slow` sleeps before answering (long enough for a
test to cut the stream), `big` answers 10 KiB, `declared` declares a duration, `boom` raises,
and `submit` is the terminal tool (reward 1.0 for the message "done").
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from openreward.environments import Environment, Server, TextBlock, ToolOutput, terminal, tool
from pydantic import BaseModel


def _log(line: str) -> None:
    with open(os.path.join(os.environ["ORS_TEST_LOG"], "runs"), "a") as f:
        f.write(line + "\n")


class Tag(BaseModel):
    tag: str


class Answer(BaseModel):
    message: str


class Counter(Environment):
    def __init__(self, task_spec=None, secrets=None):
        super().__init__(task_spec or {}, secrets or {})
        self.target = int(task_spec["target"])
        self.count = 0

    @classmethod
    def list_splits(cls):
        return ["train", "test"]

    @classmethod
    def list_tasks(cls, split: str):
        n = 3 if split == "train" else 2
        return [{"target": i + 2} for i in range(n)]

    def get_prompt(self):
        return [TextBlock(text=f"bump the counter to {self.target} then submit done")]

    @tool
    async def bump(self) -> ToolOutput:
        """add one to the counter"""
        start = time.time()
        n = self.count
        await asyncio.sleep(0.05)
        self.count = n + 1
        _log(f"bump {start:.4f} {time.time():.4f} {self.count}")
        done = self.count >= self.target
        return ToolOutput(blocks=[TextBlock(text=f"count {self.count}")],
                          reward=1.0 if done else 0.0, finished=done)

    @tool
    async def slow(self, args: Tag) -> ToolOutput:
        """answer after a while"""
        _log(f"slow {args.tag}")
        await asyncio.sleep(1.0)
        return ToolOutput(blocks=[TextBlock(text=f"slow {args.tag} done")], reward=0.25)

    @tool
    def big(self) -> ToolOutput:
        """a long answer"""
        return ToolOutput(blocks=[TextBlock(text=" ".join(["word"] * 2048))])

    @tool
    def declared(self) -> ToolOutput:
        """declares its cost"""
        return ToolOutput(blocks=[TextBlock(text="ok")], metadata={"duration_s": 42.0})

    @tool
    def boom(self) -> ToolOutput:
        """raises"""
        raise RuntimeError("boom went the tool")

    @tool
    @terminal
    def submit(self, args: Answer) -> ToolOutput:
        """the final answer"""
        return ToolOutput(blocks=[TextBlock(text="graded")],
                          reward=1.0 if args.message.strip() == "done" else 0.0, finished=True)


if __name__ == "__main__":
    os.environ["ORS_TEST_LOG"] = sys.argv[2]
    Server([Counter]).run(host="127.0.0.1", port=int(sys.argv[1]))
