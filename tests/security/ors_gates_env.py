"""The `openreward` SDK's call ordering, as an environment for `test_ors_ordering.py` (run as a
subprocess: `python -m tests.security.ors_gates_env PORT LOGFILE`, on 127.0.0.1 only).

Every tool sleeps (`nap` seconds of its input) and logs `tool tag start end` to LOGFILE: `a`
and `b` are plain tools (one lock each), `c` is `concurrent=True`, `x` is `exclusive=True`,
`fin` finishes the episode, `submit` is the terminal tool.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from openreward.environments import Environment, Server, TextBlock, ToolOutput, terminal, tool
from pydantic import BaseModel


class Nap(BaseModel):
    tag: str
    nap: float


class Answer(BaseModel):
    message: str


async def _nap(tool_name: str, args: Nap, finished: bool = False) -> ToolOutput:
    start = time.time()
    await asyncio.sleep(args.nap)
    with open(os.environ["ORS_GATES_LOG"], "a") as f:
        f.write(f"{tool_name} {args.tag} {start:.4f} {time.time():.4f}\n")
    return ToolOutput(blocks=[TextBlock(text=f"{tool_name} {args.tag}")], reward=0.0,
                      finished=finished)


class Gates(Environment):
    def __init__(self, task_spec=None, secrets=None):
        super().__init__(task_spec or {}, secrets or {})

    @classmethod
    def list_splits(cls):
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str):
        return [{"n": 0}]

    def get_prompt(self):
        return [TextBlock(text="nap")]

    @tool
    async def a(self, args: Nap) -> ToolOutput:
        """plain"""
        return await _nap("a", args)

    @tool
    async def b(self, args: Nap) -> ToolOutput:
        """plain"""
        return await _nap("b", args)

    @tool(concurrent=True)
    async def c(self, args: Nap) -> ToolOutput:
        """concurrent"""
        return await _nap("c", args)

    @tool(exclusive=True)
    async def x(self, args: Nap) -> ToolOutput:
        """exclusive"""
        return await _nap("x", args)

    @tool
    async def fin(self, args: Nap) -> ToolOutput:
        """finishes the episode"""
        return await _nap("fin", args, finished=True)

    @tool
    @terminal
    async def submit(self, args: Answer) -> ToolOutput:
        """the final answer"""
        return ToolOutput(blocks=[TextBlock(text="graded")], reward=1.0, finished=True)


if __name__ == "__main__":
    os.environ["ORS_GATES_LOG"] = sys.argv[2]
    Server([Gates]).run(host="127.0.0.1", port=int(sys.argv[1]))
