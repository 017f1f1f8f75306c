"""The learner's loop: admit work, gather a step's groups, update, publish weights, log.

One code path serves both schedules. `sync` is the case max_staleness = 0: exactly one step's
groups are admitted per policy version, and the actors sample them with the weights the learner
trains, so every sample has staleness 0 and the update is on-policy. `async` admits up to
max_staleness steps ahead, so the actors keep generating while the learner trains.

    python -m learner.main --run-dir runs/demo        # started by `rlvr train`, not by hand
"""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path

from transformers import AutoTokenizer

from actors.verifier import Verifier
from learner.checkpoint import latest_checkpoint, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from learner.coordinator import Coordinator
from learner.data import PromptStream, held_out
from learner.engine import build_engine, init_learner_distributed, publish_weights
from learner.evaluate import evaluate
from learner.groups import group_metrics, is_stale, rows_from_groups
from learner.plots import plot_run
from learner.run_log import RunLog, write_json_atomic
from learner.update import policy_update
from protocol.config import Config, to_dict
from protocol.messages import RolloutSpec
from protocol.transport import LearnerEndpoint
from protocol.weights import WeightGroup

log = logging.getLogger(__name__)


def rollout_spec(cfg: Config) -> RolloutSpec:
    r = cfg.rollout
    return RolloutSpec(strategy="fixed", max_new_tokens=r.max_new_tokens,
                       temperature=r.temperature, top_p=r.top_p)


def weight_backend(cfg: Config) -> str:
    if cfg.weight_sync.backend != "auto":
        return cfg.weight_sync.backend
    return "nccl" if cfg.model.device.startswith("cuda") else "gloo"


class Learner:
    def __init__(self, cfg: Config, run_dir: Path, resume: bool):
        self.cfg, self.run_dir = cfg, run_dir
        init_learner_distributed(cfg, rank=0, world_size=cfg.learner.ranks)
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
        self.engine = build_engine(cfg, cfg.model.path)
        self.step = self.version = data_index = 0
        checkpoint = latest_checkpoint(run_dir) if resume else None
        if checkpoint is not None:
            state = load_checkpoint(checkpoint, self.engine)
            self.step, self.version, data_index = state["step"], state["version"], state["data_index"]
            set_rng_state(state["rng"])
            log.info("resumed from %s at step %d", checkpoint, self.step)
        self.prompts = PromptStream(cfg, self.tokenizer, start=data_index)
        self.eval_problems = held_out(cfg)
        self.verifier = Verifier(cfg.actors.verifier_timeout_s)
        self.endpoint = LearnerEndpoint(cfg.net.bind_host, cfg.net.zmq_port,
                                        vocab_size=len(self.tokenizer))
        self.coord = Coordinator(self.endpoint, self.prompts, rollout_spec(cfg),
                                 cfg.rollout.prompts_per_step, cfg.rollout.prompts_per_work,
                                 cfg.staleness_bound)
        self._write_processes()
        self.run_log = RunLog(run_dir, to_dict(cfg), wandb_mode=cfg.run.wandb,
                              progress=cfg.run.progress, total_steps=cfg.run.steps,
                              resume_from_step=self.step if resume else None)

    def _write_processes(self) -> None:
        write_json_atomic(self.run_dir / "processes.json", {"learner": {
            "pid": os.getpid(), "host": socket.gethostname(),
            "zmq": self.endpoint.address, "weights_port": self.cfg.net.weights_port}})

    def _publish_weights(self) -> float:
        t0 = time.time()
        self.coord.sync_weights(self.version)
        publish_weights(self.engine, self.weights, self.cfg.weight_sync.bucket_mb << 20)
        return time.time() - t0

    def _evaluate(self) -> dict:
        c = self.cfg
        return evaluate(self.engine.module, self.tokenizer, self.eval_problems, self.verifier,
                        c.task.eval_samples, c.rollout.max_new_tokens, c.rollout.temperature,
                        c.task.prompt_template)

    def _gather(self) -> tuple[list, dict]:
        """Wait until a step's worth of fresh-enough groups is ready; returns them and counts."""
        c, coord = self.cfg, self.coord
        need = c.rollout.prompts_per_step
        kept, dropped = [], []
        t0 = time.time()
        while len(kept) < need:
            coord.admit(self.version)
            for g in coord.take(need - len(kept)):
                (dropped if is_stale(g, self.version, c.staleness_bound, c.stale_policy)
                 else kept).append(g)
            if len(kept) < need:
                coord.poll(0.05)
        coord.release(len(dropped))
        info = {"perf/learner_idle_s": time.time() - t0,
                "stale/dropped_frac": len(dropped) / (len(kept) + len(dropped))}
        if dropped:
            info["stale/dropped_groups"] = len(dropped)
        return kept, info

    def run(self) -> None:
        c = self.cfg
        self.coord.wait_for_actors(c.actors.count, c.weight_sync.timeout_s)
        self.weights = WeightGroup.create(c.net.learner_host, c.net.weights_port, 0,
                                          c.actors.count + 1, c.weight_sync.timeout_s,
                                          weight_backend(c))
        self._publish_weights()  # the actors start from the learner's exact weights
        t_start = time.time()
        if self.step == 0:
            self.run_log.log(0, {**self._evaluate(), "time_s": 0.0}, policy_version=0)
        while self.step < c.run.steps:
            t_step = time.time()
            groups, metrics = self._gather()
            rows, gm = rows_from_groups(groups, self.version, c.loss, c.staleness_bound,
                                        c.stale_policy)
            metrics.update(gm)
            metrics.update(policy_update(self.engine, rows, c.loss, self.tokenizer.pad_token_id,
                                         c.learner.micro_batch, c.rollout.max_new_tokens))
            self.step += 1
            self.version += 1
            if self.version % c.weight_sync.sync_every == 0 or self.step == c.run.steps:
                metrics["timing/sync"] = self._publish_weights()
            if self.step % c.run.eval_every == 0 or self.step == c.run.steps:
                metrics.update(self._evaluate())
            if (c.run.checkpoint_every and self.step % c.run.checkpoint_every == 0) \
                    or self.step == c.run.steps:
                self._checkpoint()
            step_time = time.time() - t_step
            metrics["perf/step_time"] = step_time
            metrics["perf/learner_idle_frac"] = metrics["perf/learner_idle_s"] / step_time
            metrics["time_s"] = time.time() - t_start
            metrics["protocol/rejected"] = sum(self.endpoint.rejected.values())
            self.run_log.log(self.step, metrics, policy_version=self.version)

    def _checkpoint(self) -> None:
        state = {"step": self.step, "version": self.version, "data_index": self.prompts.index,
                 "rng": rng_state()}
        save_checkpoint(self.run_dir, self.step, self.engine, self.tokenizer, state,
                        keep_last=self.cfg.run.keep_checkpoints)

    def close(self, reason: str = "done") -> None:
        self.coord.shutdown(self.version, reason)
        if getattr(self, "weights", None) is not None:
            self.weights.close()
        self.run_log.summary()
        self.run_log.close()
        self.verifier.close()
        self.endpoint.close()
        try:
            plot_run(self.run_dir)
        except Exception as e:  # noqa: BLE001 - a plotting failure must not fail the run
            log.warning("plots not written: %s", e)


__all__ = ["Learner", "group_metrics"]
