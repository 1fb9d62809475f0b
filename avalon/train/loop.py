"""The main job: teacher traces -> SFT -> RLCR, with evaluation, checkpoints and resume.

    run(config, workdir)      # what `python -m avalon.main --config=... --workdir=...` calls

Steps are counted globally: `step` = SFT updates, then RLCR steps, so far (an RLCR step whose
rollouts pack into more than `rollout.max_update_rows` rows applies several updates of that
shape, `train/updates`);
every line of `WORKDIR/metrics.jsonl` carries it, with `phase` ("sft", "rl" or "eval") and, for
RLCR lines, `rl_step`. An evaluation runs once SFT ends (the starting point) and every
`eval.every` RLCR steps; it compares the organisation with a single agent on held-out tasks.

One RLCR step (`rl_step`): the learning-progress sampler picks `groups_per_step` training
tasks, the budget sampler a hire budget per rollout, the clock curriculum the wall clock; the
organisation simulator plays K rollouts per task through the engine (every agent's turn of a
tick in one batched decode call); collective advantages and packing build the batch; the
jitted update step donates and replaces the params, and the engine is pointed at the new arrays.
There is no separate log-prob pass: the engine returns the sampler's log-probs (pi_old) with
every token, and the trainer's log-probs are computed inside the update's own forward (routing
replayed), whose ratio statistics (`train/ratio_*`, before the parameter change) are the
train/inference agreement check. The time split is rollout / build (advantages, packing) /
update (log-probs, loss, gradients, AdamW) / switch (the engine's decode view of the new params,
`engine.decode_dtype`: its time, bytes and share of the step are `time/switch_*`, `switch/bytes`,
`perf/switch_step_share`).

Checkpoints (orbax, async, atomic) hold the train state and the host state: phase, counters,
the samplers' generators and statistics. A killed run (even SIGKILL) rerun with the same
command resumes from the newest checkpoint: teacher traces are regenerated from the seed,
rollout seeds derive from (seed, rl_step), so the resumed run repeats what was lost. Resume
takes the newest *intact* step (content sums verified): a corrupt newer step is skipped, said
on stderr and in a `phase: "resume"` line of metrics.jsonl (`skipped_checkpoints`: step and
why), and renamed aside to `<step>.corrupt` so that the step is written again.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import jax

from avalon import paths
from avalon.analysis.logs import IndexEntry, rollout_file, step_dir, write_index
from avalon.checkpoint.train_state import TrainCheckpointer
from avalon.envs.base import Split
from avalon.envs.difficulty import DifficultySampler, train_tiers
from avalon.envs.samplers import BudgetSampler, LearningProgressSampler
from avalon.inference.engine import Engine
from avalon.model import accounting
from avalon.org.driver import RolloutDriver
from avalon.org.engine_policy import EnginePolicy
from avalon.rl.update import TrainState
from avalon.tokenizer.record import RECORD_FILE
from avalon.tokenizer.record import describe as tokenizer_record
from avalon.train import (
    baselines,
    code_version,
    config_history,
    eta,
    host_metrics,
    interrupt,
    org_metrics,
    plots,
    program_maps,
    telemetry,
)
from avalon.train.config import TrainConfig, describe, from_config_dict
from avalon.train.distributed import allgather_json, barrier, host_shard, open_collectives
from avalon.train.eval_seeds import EVAL_SEED
from avalon.train.evaluation import evaluate
from avalon.train.rl_groups import StepGroups
from avalon.train.rl_update import RLUpdate
from avalon.train.setup import Setup, Switch, build, global_batch, initial_params
from avalon.train.sft import SFTBatches, teacher_traces
from avalon.train.telemetry import Telemetry


@dataclasses.dataclass
class HostState:
    """Everything besides the arrays that a resumed run needs (JSON in the checkpoint)."""

    sft_step: int = 0
    rl_step: int = 0
    budget_sampler: dict | None = None
    progress_sampler: dict | None = None

    @property
    def step(self) -> int:
        return self.sft_step + self.rl_step


class Run:
    def __init__(self, cfg: TrainConfig, env_section, workdir: str, *, config_name: str = "",
                 command: tuple[str, ...] = ()):
        self.cfg, self.workdir = cfg, workdir
        self.env_section = env_section
        self.config_name, self.command = config_name, tuple(command)
        self.config_changes, self.previous_config = {}, None  # set by `prepare` on resume
        self.code: dict | None = None  # the code this invocation runs (`run`, process 0)
        self.t_start = time.time()
        self.main = jax.process_index() == 0
        self.setup: Setup = build(cfg, env_section)
        _, params = initial_params(cfg, self.setup.mesh)
        self.state: TrainState = self.setup.rl_step.init_state(params)
        self.host = HostState()
        self.budget = BudgetSampler(cfg.budget, seed=cfg.seed + 2)
        # The step's task draws: the report's learning-progress sampler, or (`curriculum`)
        # online difficulty filtering over the environments' tiers.
        self.progress = DifficultySampler(train_tiers(self.setup.envs), cfg.curriculum,
                                          seed=cfg.seed + 3) if cfg.curriculum.enabled else \
            LearningProgressSampler({e.name: e.task_ids(Split.TRAIN) for e in self.setup.envs},
                                    cfg.progress, seed=cfg.seed + 3)
        self.ckpt = TrainCheckpointer(paths.join(workdir, "checkpoints"),
                                      max_to_keep=cfg.checkpoint.keep,
                                      ocdbt=cfg.checkpoint.ocdbt)
        skipped = self._restore()
        total = cfg.sft.steps + cfg.rollout.steps
        self.resumed_at = self.host.step
        self.telemetry = Telemetry(workdir, resume_step=self.host.step, enabled=self.main,
                                   total_steps=total, **self._timings(env_section))
        if skipped:
            self.telemetry.log(self.host.step, {"phase": "resume", "resumed_from": self.host.step,
                                                "skipped_checkpoints": [
                                                    {"step": s, "why": why} for s, why in skipped]})
        self.engine: Engine | None = None
        self.switch = Switch(cfg, self.setup.mesh, self.setup.local_mesh)
        self.rl_update = RLUpdate(cfg, self.setup.rl_step, jax.process_count())
        self.peak_flops = telemetry.peak_flops(jax.devices()[0].device_kind)

    def _timings(self, env_section) -> dict:
        """The machine's record of this config's unit times and the reference shipped for it
        (what a fresh run's ETA is forecast from before it has timed anything)."""
        description = describe(self.cfg, env_section)
        devices = eta.device_text(jax.devices(), jax.process_count())
        key = eta.timing_key(description, devices=devices, jax_version=jax.__version__)
        return {"timings": os.path.join(eta.machine_dir(), f"{key}.jsonl"),
                "shipped": eta.shipped_record(description, devices=devices)}

    # ---- checkpoints -----------------------------------------------------------------------
    def _restore(self) -> tuple[tuple[int, str], ...]:
        """Resumes from the newest intact checkpoint; returns the (step, why) it skipped."""
        if self.ckpt.latest_step() is None:
            return ()
        target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                                             sharding=a.sharding), self.state)
        got = self.ckpt.restore_newest_intact(target=target)
        for step, why in got.skipped:
            moved = self.ckpt.quarantine(step)
            if self.main:
                print(f"resume: skipped checkpoint step {step} (moved to {moved}): {why}",
                      file=sys.stderr, flush=True)
        if self.main and got.skipped:
            print(f"resume: from checkpoint step {got.step}", file=sys.stderr, flush=True)
        self.state, host = got.state, got.host_state
        self.host = HostState(**{k: v for k, v in host.items() if k in HostState.__annotations__})
        if self.host.budget_sampler is not None:
            self.budget.load_state(self.host.budget_sampler)
        if self.host.progress_sampler is not None:
            self.progress.load_state(self.host.progress_sampler)
        return got.skipped

    def _save(self) -> None:
        self.host.budget_sampler = self.budget.state()
        self.host.progress_sampler = self.progress.state()
        self.ckpt.save(self.host.step, self.state, dataclasses.asdict(self.host))

    # ---- phases ----------------------------------------------------------------------------
    def finished(self) -> bool:
        # Every run ends with an evaluation at its last step, so one without it has work
        # left: an evaluation-only run (`init_from` with 0 SFT + 0 RLCR steps: a trained run
        # evaluated under other settings, as the budget sweep's `from=` form does) has only that.
        return (self.host.sft_step >= self.cfg.sft.steps
                and self.host.rl_step >= self.cfg.rollout.steps
                and self._logged_eval_at(self.host.step))

    def _remaining_evals(self) -> list[int]:
        """The RLCR steps still to be evaluated at (an evaluation's ordinal)."""
        cfg, done = self.cfg, self.host.rl_step
        later = [s for s in range(done + 1, cfg.rollout.steps + 1)
                 if s % cfg.eval.every == 0 or s == cfg.rollout.steps]
        first = done == 0 and not self._logged_eval_at(self.host.step)
        return [0] * first + later

    def _schedule(self) -> list[tuple[str, int]]:
        """The units left, in the order `run` runs them, each with its ordinal (SFT step k,
        RLCR step k, the evaluation at RLCR step k): what the ETA forecasts."""
        cfg, host = self.cfg, self.host
        evals = self._remaining_evals()
        out = [("teacher", 0)] * (host.sft_step < cfg.sft.steps)
        out += [("sft", k) for k in range(host.sft_step, cfg.sft.steps)]
        out += [("eval", 0)] * (0 in evals)
        for k in range(host.rl_step, cfg.rollout.steps):
            out += [("rl", k)] + [("eval", k + 1)] * (k + 1 in evals)
        return out + [("finish", 0)]

    def _start_line(self) -> str:
        devices = jax.devices()
        mesh = " ".join(f"{k}={v}" for k, v in self.setup.mesh.shape.items())
        resumed = f" | resuming at step {self.host.step}" if self.host.step else ""
        steps = f"{self.cfg.sft.steps} SFT + {self.cfg.rollout.steps} RLCR steps"
        if not self.cfg.sft.steps and not self.cfg.rollout.steps:
            steps = f"evaluation only, of {self.cfg.init_from or 'a random init'}"
        return (f"avalon: {self.config_name or 'config'} -> {self.workdir} | {len(devices)} "
                f"{devices[0].device_kind} device(s), {jax.process_count()} process(es) | "
                f"mesh {mesh} | {steps}{resumed}")

    def run(self) -> dict:
        with interrupt.catching():
            return self._run()

    def _run(self) -> dict:
        cfg = self.cfg
        say = lambda text: telemetry.console(text, enabled=self.main)
        if self.finished():
            self.ckpt.close()
            self.telemetry.close()
            summary = self._read_summary()
            say(f"avalon: {self.workdir} is finished ({self.host.sft_step} SFT + "
                f"{self.host.rl_step} RLCR steps); nothing to do. {_eval_text(summary)}Use "
                "another --workdir (or raise --config.rollout.steps) to train more.")
            return summary
        say(self._start_line())
        if self.main:
            # Every start, with the code it runs; config changes (allowed or meant for
            # resuming) keep both configs.
            self.code = code_version.code_version()
            config_history.record(self.workdir, self.host.step, self.config_changes,
                                  self.previous_config, self.command, code=self.code)
            paths.join(self.workdir, "config.json").write_text(
                json.dumps(describe(cfg, self.env_section), indent=1, sort_keys=True))
            # The ids a word tokenizer gives depend on the run's environments: tools that
            # evaluate the run on others (experiments.safety.run --tokenizer=run) read them here.
            paths.join(self.workdir, RECORD_FILE).write_text(
                json.dumps(tokenizer_record(self.setup.chat.tok, cfg.tokenizer_path)))
        self.telemetry.progress.plan(self._schedule())
        open_collectives(self.setup.mesh)  # before the first step on the mesh (multi-process)
        if self.host.sft_step < cfg.sft.steps:
            self._sft()
            self._save()
        self.engine = self.make_engine()
        if self.host.rl_step == 0 and not self._logged_eval_at(self.host.step):
            self._evaluate()
        while self.host.rl_step < cfg.rollout.steps:
            interrupt.check()
            self._rl_step()
            if self.host.rl_step % cfg.eval.every == 0 or self.host.rl_step == cfg.rollout.steps:
                self._evaluate()
            if self.host.rl_step % cfg.checkpoint.every == 0 or \
                    self.host.rl_step == cfg.rollout.steps:
                self._save()
        self.telemetry.progress.begin("finish")
        self.telemetry.progress.status("waiting for the last checkpoint")
        self.ckpt.close()
        summary = self._summary()
        if self.main:
            if cfg.plots:
                summary["files"] += [os.path.basename(p) for p in plots.write_plots(self.workdir)]
            paths.join(self.workdir, "summary.json").write_text(
                json.dumps(summary, indent=1, sort_keys=True))
        self.telemetry.close()  # after the plots: the finish unit is timed to here
        say(f"avalon: done in {telemetry.fmt_seconds(summary['wall_s'])} "
            f"({summary['steps']} steps, {telemetry.fmt_seconds(summary['compile_s'])} of it "
            f"compiling). {_eval_text(summary)}Wrote {self.workdir}/: "
            + ", ".join(summary["files"] + ["summary.json"]))
        return summary

    def _read_summary(self) -> dict:
        path = paths.join(self.workdir, "summary.json")
        if not path.exists():
            return self._summary()
        return json.loads(path.read_text())

    def make_engine(self) -> Engine:
        """The engine of this process, decoding the current params' view (`Switch`)."""
        cfg = self.cfg
        return Engine(cfg.model, self.switch(self.state.params), num_slots=cfg.engine.slots,
                      max_context=cfg.org.window, mesh=self.setup.local_mesh,
                      steps_per_dispatch=cfg.engine.steps_per_dispatch,
                      prefill_chunk=cfg.engine.prefill_chunk, kv_pages=cfg.engine.kv_pages,
                      max_kv_pages=cfg.engine.max_kv_pages or None,
                      detokenize=self.setup.chat.tok.decode,
                      # a fresh program's first run is compile time, not work (the ETA)
                      on_first_run=telemetry.CompileClock.process().add)

    def switch_engine(self) -> dict:
        """Point the engine at the updated params' view; returns the switch's metrics."""
        t0 = time.perf_counter()
        self.engine.set_params(self.switch(self.state.params))
        return {"time/switch_s": time.perf_counter() - t0, **self.switch.metrics}

    def _logged_eval_at(self, step: int) -> bool:
        from avalon.train.telemetry import read_metrics
        return any(r.get("phase") == "eval" and r.get("step") == step
                   for r in read_metrics(self.telemetry.path))

    def _sft(self) -> None:
        cfg = self.cfg
        t0 = time.perf_counter()
        self.telemetry.progress.begin("teacher")
        self.telemetry.progress.status(f"teacher traces ({cfg.sft.teacher_episodes} episodes)")
        traces = teacher_traces(self.setup)
        batches = SFTBatches(self.setup, traces)
        self.telemetry.progress.record("teacher")
        self.telemetry.log(self.host.step, {
            "phase": "sft_data", "sft/teacher_reward": traces.mean_reward,
            "sft/teacher_episodes": traces.episodes, "sft/rows": len(traces.rows),
            "sft/sequences": batches.n, "sft/fill": batches.fill,
            "sft/teacher_cut_turns": traces.cut_turns,
            "time/teacher_s": time.perf_counter() - t0})
        step_fn = self.setup.sft_step
        while self.host.sft_step < cfg.sft.steps:
            interrupt.check()
            if not self.telemetry.progress.seconds.get("sft"):
                self.telemetry.progress.status("SFT: compiling the update step")
            t = time.perf_counter()
            self.telemetry.progress.begin("sft")
            batch = global_batch(batches.batch(self.host.sft_step), step_fn.batch_sharding)
            barrier("sft_update")
            self.state, m = step_fn(self.state, batch)
            m = {k: float(v) for k, v in m.items()}
            self.host.sft_step += 1
            dt = time.perf_counter() - t
            self.telemetry.progress.record("sft")
            self.telemetry.log(self.host.step, {"phase": "sft", "sft_step": self.host.sft_step,
                                                **{f"sft/{k}": v for k, v in m.items()},
                                                "time/step_s": dt,
                                                "perf/tokens_per_s": m["tokens"] / dt})
            self.telemetry.progress.update(self.host.step, f"SFT nll {m.get('nll', 0):.3f}")
            if self.host.sft_step % cfg.checkpoint.every == 0 and \
                    self.host.sft_step < cfg.sft.steps:
                self._save()

    def _rl_step(self) -> None:
        cfg, setup = self.cfg, self.setup
        maps = program_maps.release_near_limit(self.engine.release_programs)
        t0, compile0 = time.perf_counter(), telemetry.CompileClock.process()()
        self.telemetry.progress.begin("rl")
        first = "; the first compiles the update step" \
            if not self.telemetry.progress.seconds.get("rl") else ""
        self.telemetry.progress.status(f"RL {self.host.rl_step + 1}/{cfg.rollout.steps}: "
                                       f"rollouts{first}")
        step_groups = StepGroups(cfg, setup.env_by_name, self.progress, self.budget,
                                 self.host.rl_step)
        all_specs = step_groups.initial()
        info = _process_info()
        specs = host_shard(all_specs, info)
        policy = EnginePolicy(self.engine, setup.chat, cfg.sampling)
        every = cfg.rollout.log_every
        logged = cfg.keep_event_logs or (every > 0 and self.host.rl_step % every == 0)
        log_dir = step_dir(self.workdir, "rl", self.host.step) if logged else None
        # More agents than engine slots: rollouts are admitted as slots free up (the driver's
        # `max_agents`), so a pod host plays its share in waves of what its HBM holds.
        note = f"RL {self.host.rl_step + 1}/{cfg.rollout.steps}: rollouts"
        driver = RolloutDriver(policy, setup.chat, cfg.org, log_dir=log_dir,
                               max_agents=cfg.engine.slots, continuous=cfg.engine.continuous,
                               progress=lambda done, n: self.telemetry.progress.status(
                                   f"{note} {done}/{n}{first}"))
        stats0 = self.engine.stats.snapshot()
        # Groups without signal are replaced as they end (one process: the refills' task
        # draws would differ between hosts otherwise; `train.config` refuses it there).
        result = driver.run(specs, refill=step_groups.refill
                            if step_groups.refills_left else None)
        env_of, specs = step_groups.env_of, result.specs
        # Every slot is free again: the engine's params view and slot state (KV pool, Mamba
        # state) leave the device while the update runs there; the switch brings them back.
        self.engine.suspend()
        t_rollout = time.perf_counter() - t0
        if log_dir is not None:
            write_index(log_dir, (
                IndexEntry(rollout_file(g.group_id, i), "rl", self.host.step, self.host.rl_step,
                           env_of[g.rollouts[0].session.task.task_id], "train")
                for g in specs for i in range(len(g.rollouts))),
                part=f"p{info.process_id}" if info.process_id else "")

        groups = result.groups
        local_success = org_metrics.per_task_success(groups, env_of)
        all_success = _gather_results(local_success)
        self.progress.update(all_success)

        self.state, upd = self.rl_update(self.state, groups, self.host.rl_step)
        m, bstats = upd.metrics, upd.build
        t_build, t_update = upd.times["time/build_s"], upd.times["time/update_s"]

        switch = self.switch_engine()
        self.host.rl_step += 1

        total = time.perf_counter() - t0
        engine_stats = self.engine.stats
        tokens_model = m["tokens"]
        flops = accounting.train_flops_per_token(cfg.model, cfg.rollout.seq_len) * tokens_model
        rollouts = sum(len(g.rollouts) for g in groups)
        # This host's numbers, reduced across hosts by name (`host_metrics`; the measures as
        # their sums, divided over every host's rollouts); the update's metrics are global.
        local = {
            **{f"batch/{k}": v for k, v in bstats.as_metrics().items()},
            **org_metrics.rollout_sums(groups),
            "rollouts": rollouts,
            "time/rollout_s": t_rollout, "time/build_s": t_build, "time/step_s": total,
            **switch, "perf/switch_step_share": switch["time/switch_s"] / max(total, 1e-9),
            "perf/generated_tokens_per_s": (engine_stats.decode_tokens
                                            - stats0.decode_tokens) / max(t_rollout, 1e-9),
            **_engine_counters(engine_stats, stats0),
            **_rollout_split(engine_stats, stats0, t_rollout),
            "time/compile_s": telemetry.CompileClock.process()() - compile0,
            "perf/rollouts_per_hour": 3600.0 * rollouts / max(total, 1e-9),
            "engine/ticks": len(result.ticks), **maps,
            "rollout/refilled_groups": step_groups.refilled,
            "rollout/groups_without_signal": step_groups.without_signal,
        }
        record = {
            "phase": "rl", "rl_step": self.host.rl_step,
            "clock_s": cfg.clock(self.host.rl_step - 1),
            **{f"train/{k}": v for k, v in m.items()},
            **host_metrics.reduce_across_hosts(local, weight=rollouts),
            "time/update_s": t_update,
            "perf/update_tokens_per_s": tokens_model / max(t_update, 1e-9),
            "processes": info.num_processes,
            # The sampler's state after this step's update: the same on every process.
            **(self.progress.metrics() if cfg.curriculum.enabled else {}),
        }
        if self.peak_flops is not None:  # against this device's peak (none known for CPUs)
            record["perf/mfu"] = flops / max(t_update, 1e-9) / (self.peak_flops
                                                               * jax.device_count())
        self.telemetry.progress.record("rl")
        self.telemetry.log(self.host.step, record)
        self.telemetry.progress.update(
            self.host.step, f"RL {self.host.rl_step}/{cfg.rollout.steps} "
                            f"reward {record.get('reward/mean', 0.0):.2f}")

    def _evaluate(self) -> None:
        interrupt.check()
        maps = program_maps.release_near_limit(self.engine.release_programs)
        t = time.perf_counter()
        self.telemetry.progress.begin("eval")
        cfg = self.cfg
        self.telemetry.progress.status(
            f"evaluating at RL step {self.host.rl_step}: {cfg.eval.tasks} held-out tasks x "
            f"{cfg.eval.seeds} seeds, organisation and single agent")
        # Every process writes the logs of its share of the tasks (a shared workdir).
        log_dir = step_dir(self.workdir, "eval", self.host.step) if cfg.eval.log_events else None
        stats0 = self.engine.stats.snapshot()
        note = (f"evaluating at RL step {self.host.rl_step}: {cfg.eval.tasks} held-out tasks x "
                f"{cfg.eval.seeds} seeds, organisation and single agent")
        m = evaluate(self.setup, self.engine, log_dir=log_dir, at_step=self.host.step,
                     at_rl_step=self.host.rl_step, progress=lambda done, total:
                     self.telemetry.progress.status(f"{note}: {done}/{total} rollouts"))
        stats, t_eval = self.engine.stats, time.perf_counter() - t
        m.update(host_metrics.reduce_across_hosts({  # `evaluate` reduced its own metrics
            "perf/eval_generated_tokens_per_s": (
                (stats.decode_tokens - stats0.decode_tokens) / max(t_eval, 1e-9)),
            "engine/eval_dispatches": stats.dispatches - stats0.dispatches}))
        if baselines.enabled(self.cfg.eval) and self.main:
            # Main process only (it holds the logs S8 matches), after the cross-process means.
            m.update(baselines.run_baselines(
                self.cfg.eval, self.cfg.org, self.setup.envs, self.setup.chat,
                EnginePolicy(self.engine, self.setup.chat, self.cfg.sampling),
                slots=self.cfg.engine.slots,
                log_dir=log_dir or step_dir(self.workdir, "eval", self.host.step),
                at_step=self.host.step, at_rl_step=self.host.rl_step, eval_seed=EVAL_SEED,
                clock_start_s=self.cfg.clock.start_s))
        self.telemetry.progress.record("eval")
        self.telemetry.log(self.host.step, {"phase": "eval", "rl_step": self.host.rl_step, **m,
                                            **maps, "time/eval_s": time.perf_counter() - t})

    def _summary(self) -> dict:
        from avalon.train.telemetry import read_metrics
        records = read_metrics(self.telemetry.path) if self.main else []
        evals = [r for r in records if r.get("phase") == "eval"]
        files = [name for name in ("metrics.jsonl", "config.json", "tensorboard", "checkpoints",
                                   "events") if paths.join(self.workdir, name).exists()]
        return {
            "steps": self.host.step, "sft_steps": self.host.sft_step,
            "rl_steps": self.host.rl_step,
            "evals": [{k: r.get(k) for k in ("step", "rl_step", "eval/org_reward",
                                             "eval/single_reward")} for r in evals],
            "config": self.config_name, "command": list(self.command),
            "code": self.code, "commit": code_version.describe(self.code),
            "wall_s": time.time() - self.t_start,  # this invocation (a resumed run: since resume)
            "compile_s": telemetry.CompileClock.process()(),  # of it, JAX compiling
            "resumed_at_step": self.resumed_at, "files": files,
        }


def _process_info():
    from avalon.train.distributed import ProcessInfo
    return ProcessInfo(process_id=jax.process_index(), num_processes=jax.process_count())


def _gather_results(local: list[tuple[str, str, float]]) -> list[tuple[str, str, float]]:
    """Every process's (env, task, success) results, in process order."""
    return [tuple(x) for part in allgather_json(local) for x in part]


def _engine_counters(stats, before) -> dict:
    """This host's engine counters over the step (summed across hosts by `host_metrics`)."""
    d = lambda name: getattr(stats, name) - getattr(before, name)
    out = {f"engine/{name}": d(name) for name in (
        "dispatches", "prefill_dispatches", "decode_dispatches", "prefill_tokens",
        "decode_tokens", "decode_rows", "decode_row_slots", "turns_deferred",
        "turns_cut_by_pool")}
    # Rows live in a decode dispatch, on average (the batch the engine decoded at), and the
    # share of its bucket's rows they filled.
    out["engine/live_rows_mean"] = d("decode_rows") / max(d("decode_dispatches"), 1)
    out["engine/live_row_fill"] = d("decode_rows") / max(d("decode_row_slots"), 1)
    return out


def _rollout_split(stats, before, rollout_s: float) -> dict:
    """The rollout phase's time: in prefill and decode dispatches (their compute on a CPU
    host), and the rest (the organisations, tools, scheduling and state ops: `host`); the
    engine's own decode speed in its decode dispatches beside it."""
    prefill = stats.prefill_seconds - before.prefill_seconds
    decode = stats.decode_seconds - before.decode_seconds
    return {"time/rollout_prefill_s": prefill, "time/rollout_decode_s": decode,
            "time/rollout_host_s": max(rollout_s - prefill - decode, 0.0),
            "perf/engine_decode_tokens_per_s":
                (stats.decode_tokens - before.decode_tokens) / max(decode, 1e-9)}


def prepare(config, workdir: str, *, config_name: str = "", command: tuple[str, ...] = (),
            check_resume: bool = False, allow_config_change: bool = False) -> Run:
    """Validate `config` and build the run (resuming from `workdir` if it holds checkpoints).
    Every configuration problem surfaces here, as a ValueError naming the field; with
    `check_resume`, so does a config that differs from the one the workdir's checkpoints were
    trained with (`config_history`). `config_name` and `command` are recorded in summary.json."""
    cfg = from_config_dict(config, num_devices=jax.device_count(),
                           num_processes=jax.process_count())
    changes = config_history.check_resume(workdir, describe(cfg, config.env),
                                          allow_change=allow_config_change) \
        if check_resume else {}
    previous = json.loads(paths.join(workdir, "config.json").read_text()) if changes else None
    paths.path(workdir).mkdir(parents=True, exist_ok=True)
    run = Run(cfg, config.env, workdir, config_name=config_name, command=command)
    run.config_changes, run.previous_config = changes, previous
    return run


def _eval_text(summary: dict) -> str:
    """`Held-out reward at RL step 30: organisation 2.88, single agent 1.73. ` or ''."""
    evals = summary.get("evals") or []
    if not evals:
        return ""
    last = evals[-1]
    org, single = last.get("eval/org_reward"), last.get("eval/single_reward")
    if org is None or single is None:
        return ""
    return (f"Held-out reward at RL step {last.get('rl_step')}: organisation {org:.2f}, "
            f"single agent {single:.2f}. ")


def run(config, workdir: str, *, config_name: str = "") -> dict:
    """Train per `config` (an ml_collections ConfigDict, see `configs/`), writing to `workdir`;
    `config_name` (e.g. "configs/toy_org.py:smoke") is recorded in summary.json."""
    return prepare(config, workdir, config_name=config_name).run()
