"""A verifiers v1 taskset for the adapter's tests (`avalon/envs/verifiers_env.py`): each task
asks for one word back, and its reward is how close the answer is to that word (difflib's
ratio), so untrained answers still differ in reward. `EchoTaskset(vf.TasksetConfig(id=...))`
is what `vf.load_taskset` builds for an installed taskset package exporting it."""

import difflib

import verifiers.v1 as vf

WORDS = ("apple", "river", "stone", "cloud", "maple", "tiger", "ocean", "lemon", "piano",
         "amber", "frost", "cedar")


class EchoData(vf.TaskData):
    target: str


class EchoTask(vf.Task[EchoData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def closeness(self, task: EchoData, trace) -> float:
        return difflib.SequenceMatcher(None, trace.last_reply, task.target).ratio()


class EchoTaskset(vf.Taskset[EchoTask, vf.TasksetConfig]):
    def load(self):
        for w in WORDS:
            yield EchoTask(EchoData(prompt=f"Answer with the single word {w}.", target=w,
                                    system_prompt="Be brief."), self.config.task)


__all__ = ["EchoTaskset"]
