"""The learner's loop: admit work, gather a step's groups, update, publish weights, log.

One code path serves the three schedules. `sync` is the case max_staleness = 0: exactly one
step's groups are admitted per policy version, and the actors sample them with the weights the
learner trains, so every sample has staleness 0 and the update is on-policy. `async` admits up to
max_staleness steps ahead, so the actors keep generating while the learner trains. `staged`
(Mu-GRPO) admits a whole stage of mu steps' groups with the stage's weights and publishes new
weights only when the stage is trained, so step u of a stage trains on data u versions old; the
learner starts training as soon as a step's groups are in (the data are the same either way).

What enters the loss is decided per algorithm in learner/algorithms.py; DAPO's dynamic sampling
happens here, at gathering: groups come in generation batches (3x the step's prompts), another
whole batch follows while the informative groups do not fill the step, the surplus is dropped,
and every response counts as generated.

    python -m learner.main --run-dir runs/demo        # started by `rlvr train`, not by hand
"""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path
from typing import TextIO

from tasks.tiny_model import load_tokenizer

from learner.actor_eval import ActorEvals
from learner.checkpoint import latest_checkpoint, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from learner.coordinator import run_coordinator
from learner.algorithms import AlgorithmState, build_step
from learner.data import PromptStream, held_out, rollout_spec
from learner.delay_line import DelayLine, GatheredStep
from learner.engine import build_engine, build_reference, init_learner_distributed, publish_weights
from learner.goldens import Goldens
from learner.groups import allocation_histogram, engine_load_metrics, group_metrics
from learner.losses import dapo_keep_group
from learner.ranks import PlanChannel, train_step
from learner.run_log import RunLog, set_aside_run, write_json_atomic
from protocol.config import Config, to_dict
from protocol.config_checks import config_warnings
from protocol.staleness import age
from protocol.transport import LearnerEndpoint
from protocol.weights import WeightGroup, WeightSyncError, announce_sync, host_store
from tasks.evaluation import evaluate
from tasks.prompts import prompt_token_ids
from tasks.sampling import HFSampler
from tasks.verifier import Verifier

log = logging.getLogger(__name__)


class Preempted(Exception):
    """The run stopped early on request, after checkpointing `step`; it resumes from there."""


class Learner:
    def __init__(self, cfg: Config, run_dir: Path, resume: bool, console: TextIO | None = None):
        """`console`: where the progress line goes (None: stderr)."""
        self.cfg, self.run_dir = cfg, run_dir
        self.preempt_requested = False
        self._checkpointed_step: int | None = None
        init_learner_distributed(cfg, rank=0, world_size=cfg.learner.ranks)
        self.tokenizer = load_tokenizer(cfg.model.path)
        # first: a port it cannot listen on stops the run before the engine and the verifier
        # start (CannotListen, one line at learner.main; net.master_port's is checked above)
        self.endpoint = LearnerEndpoint(cfg.net.bind_host, cfg.net.zmq_port,
                                        curve_dir=cfg.net.curve_dir or None,
                                        vocab_size=len(self.tokenizer))
        # the weight group's rendezvous store, hosted for the whole run (actors connect to it
        # before they say hello; each membership change forms a new group over it)
        self.weight_store = host_store(cfg.net.learner_host, cfg.net.weights_port,
                                       cfg.weight_sync.timeout_s)
        self.engine = build_engine(cfg, cfg.model.path)
        self.reference = build_reference(cfg)  # KL: the initial weights, also after a resume
        self.followers = PlanChannel()  # learner ranks 1..R-1 (none with one rank)
        self.step = self.version = data_index = 0
        coordinator_state, solutions = None, {}
        for warning in config_warnings(cfg):
            log.warning(warning)
        self.algo = AlgorithmState(cfg)
        checkpoint = latest_checkpoint(run_dir) if resume else None
        # resumed with no complete checkpoint (killed before the first one): start the run
        # again from step 0, with the old rows set aside rather than mixed with the new ones
        self.restarted = set_aside_run(run_dir) if resume and checkpoint is None else None
        if self.restarted is not None:
            resume = False
            log.warning("--resume found no complete checkpoint in %s: starting the run again "
                        "from step 0; the earlier metrics (%d rows) are set aside in %s",
                        run_dir, self.restarted["rows"], self.restarted["set_aside_in"])
        if checkpoint is not None:
            self.followers.tell("load", path=str(checkpoint))
            state = load_checkpoint(checkpoint, self.engine)
            self.step, self.version, data_index = state["step"], state["version"], state["data_index"]
            set_rng_state(state["rng"])
            if "algorithms" in state:
                self.algo.load_state_dict(state["algorithms"])
            # checkpoints before it kept no pending prompts: those resume as before (admission
            # slots rebuilt as version x G, the prompts in flight not handed out again)
            coordinator_state = state.get("coordinator")
            solutions = state.get("solutions", {})
            log.info("resumed from %s at step %d", checkpoint, self.step)
        self.prompts = PromptStream(cfg, self.tokenizer, start=data_index,
                                    keep_solutions=cfg.gcpo.coef > 0)
        self.prompts.restore_solutions(solutions)
        self.eval_problems = held_out(cfg)
        self.verifier = Verifier(cfg.actors.verifier_timeout_s, reward=cfg.task.reward)
        # groups admitted per policy version: one step's prompts, or DAPO's generation batch
        self.gen_batch = cfg.generation_batch
        self.coord = run_coordinator(cfg, self.endpoint, self.prompts, self.algo.prompt_counts,
                                     self.version)
        if coordinator_state is not None:  # the prompts handed out and not trained go first
            self.coord.load_state_dict(coordinator_state)
        self.stage_end = self.stage_version = self.stage_start = self.step  # mode=staged
        self.delay_line = (DelayLine(cfg.stale_inject, self._gather, self.coord.trained,
                                     self.coord.in_handout_order)
                           if cfg.stale_inject else None)
        # the version the actors hold (the last one published): admission counts from it, since
        # under weight_sync.sync_every > 1 they sample up to sync_every - 1 versions behind
        self.actors_version = self.version
        self.engine_loads: dict = {}  # actor id -> its engine's newest counters (gen/engine_fill)
        self.weights: WeightGroup | None = None
        self.sync_waits: list[float] = []  # learner waits of the syncs since the last step logged
        self.sync_sent = (0, 0)  # the last sync's buckets and bytes (weight_sync.bucket_mb)
        self._no_actors_since: float | None = None
        self.goldens = Goldens(self.prompts, self.verifier, self.tokenizer)  # GCPO
        self.actor_evals = None
        if cfg.run.eval_on == "actors":  # learner/actor_eval.py
            self.actor_evals = ActorEvals(
                self.eval_problems, [prompt_token_ids(self.tokenizer, p.question,
                                                      cfg.task.prompt_template)
                                     for p in self.eval_problems],
                cfg.task.eval_samples, cfg.rollout.max_new_tokens, cfg.rollout.temperature,
                run_dir)
            self.coord.on_eval = self.actor_evals.receive
        self._write_processes()
        self.run_log = RunLog(run_dir, to_dict(cfg), wandb_mode=cfg.run.wandb,
                              progress=cfg.run.progress, total_steps=cfg.run.steps,
                              resume_from_step=self.step if resume else None,
                              progress_stream=console)

    def _write_processes(self) -> None:
        """processes.json: every role's pid, host and endpoints; rewritten when actors change."""
        c = self.cfg
        write_json_atomic(self.run_dir / "processes.json", {
            "learner": {"pid": os.getpid(), "host": socket.gethostname(),
                        "zmq": self.endpoint.address,
                        "weights": f"{c.net.learner_host}:{c.net.weights_port}"},
            "actors": self.coord.roster()})

    def _publish_weights(self) -> float:
        """Send the current weights to the actors, first forming a new weight group when the
        live actors changed. A failed broadcast (an actor died in it) closes the group; the
        learner then waits until every member has beaten since or is taken for dead, and forms
        the group again with the live ones. Returns the seconds it took."""
        c, coord = self.cfg, self.coord
        t0 = time.time()
        while True:
            self._keep_actors(reform=False)
            try:
                self._sync_once()
                return time.time() - t0
            except WeightSyncError as e:
                coord.stats["faults/weight_sync_failures"] += 1
                log.warning("weight sync of version %d failed: %s", self.version, e)
                self._close_weight_group()
                failed_at = time.monotonic()
                deadline = failed_at + c.actors.heartbeat_timeout_s
                while any(a.last_seen < failed_at for a in coord.actors.values()) \
                        and time.monotonic() < deadline:
                    coord.poll(0.05)
                    coord.reap(c.actors.heartbeat_timeout_s)

    def _sync_once(self) -> None:
        c, coord = self.cfg, self.coord
        new_epoch = self.weights is None or coord.membership_changed
        if new_epoch:
            self._close_weight_group()
        t0 = time.time()  # sync/learner_wait_s: from telling the actors to the last one's copy
        reached = coord.sync_weights(self.version, new_epoch)
        announce_sync(self.weight_store, coord.epoch, self.version, reached)
        if new_epoch:
            self._write_processes()
        if not reached:
            raise WeightSyncError("a weight group member could not be reached")
        if new_epoch:
            self.weights = WeightGroup.create(c.net.learner_host, c.net.weights_port, 0,
                                              len(coord.members) + 1, c.weight_sync.timeout_s,
                                              c.weight_backend, epoch=coord.epoch,
                                              store=self.weight_store)
        self.sync_sent = publish_weights(self.engine, self.weights, c.weight_sync.bucket_mb << 20)
        self.actors_version = self.version
        self.sync_waits.append(time.time() - t0)

    def _close_weight_group(self) -> None:
        if self.weights is not None:
            self.weights.close()
            self.weights = None

    def _keep_actors(self, reform: bool = True) -> None:
        """Notice lost and new actors; with `reform`, give the weights to a changed group now.
        Stops the run when no actor has been alive for `weight_sync.timeout_s`."""
        c, coord = self.cfg, self.coord
        lost = coord.reap(c.actors.heartbeat_timeout_s)  # reads what is waiting first
        if lost:
            self._write_processes()
        if self.actor_evals:  # an evaluation whose share was on a lost actor is abandoned
            self.actor_evals.check_actors(coord.actors)
        now = time.monotonic()
        if coord.actors:
            self._no_actors_since = None
        elif self._no_actors_since is None:
            self._no_actors_since = now
        elif now - self._no_actors_since > c.weight_sync.timeout_s:
            raise RuntimeError(f"no live actor for {c.weight_sync.timeout_s:.0f} s "
                               "(weight_sync.timeout_s): stopping the run")
        if reform and coord.actors and coord.membership_changed:
            self._publish_weights()

    def _evaluate(self) -> dict:
        c = self.cfg
        return evaluate(HFSampler(self.engine.module), self.tokenizer, self.eval_problems, self.verifier,
                        c.task.eval_samples, c.rollout.max_new_tokens, c.rollout.temperature,
                        c.task.prompt_template, seed=c.run.seed)

    def _wait_for_actor_evals(self) -> None:
        """The end of the run: every evaluation out on the actors is waited for (one whose
        actor is lost is abandoned)."""
        while self.actor_evals.waiting:
            self.coord.poll(0.05)
            self._keep_actors(reform=False)

    def _admit(self) -> None:
        c = self.cfg
        if c.mode != "staged":
            self.coord.admit(self.actors_version)
            return
        if self.step >= self.stage_end:  # a new stage: its groups, sampled with these weights
            length = min(c.mugrpo.updates_per_stage, c.run.steps - self.step)
            self.stage_start, self.stage_version = self.step, self.version
            self.stage_end = self.step + length
        self.coord.admit(self.stage_version, self.stage_end - self.stage_start - 1)

    def _gather(self) -> GatheredStep:
        """Wait until a step's worth of fresh-enough (DAPO: informative) groups is ready.
        Returns them, every other group generated for the step (DAPO's filtered and surplus
        ones included), the groups dropped as too stale, and counts.

        Groups come in generation batches of `self.gen_batch` (one step's prompts, or DAPO's
        3x): DAPO takes another whole batch while its informative groups do not fill the step,
        up to dapo.max_gen_batches, and drops the surplus (docs/ALGORITHMS.md 2); every response of
        every batch counts as generated. A stale group frees its slot for a replacement, and its
        responses count as generated too (their generation was paid for, 3.7)."""
        c, coord, staleness = self.cfg, self.coord, self.cfg.staleness
        need, batch = c.rollout.prompts_per_step, self.gen_batch
        filtering = c.dapo.dynamic_sampling
        kept, dropped, generated, filtered, rounds = [], [], [], 0, 1
        take = coord.take_in_handout_order if c.run.deterministic else coord.take
        t0 = time.time()
        while True:
            self._admit()
            for g in take(rounds * batch - len(generated), keep_pending=c.stale_inject > 0):
                self.algo.observe(g)
                if staleness.dropped(age(g, self.version)):
                    dropped.append(g)
                    coord.release(1)
                    continue
                generated.append(g)
                if filtering and not dapo_keep_group([s.acc for s in g.samples]):
                    filtered += 1
                elif len(kept) < need:
                    kept.append(g)
            if len(generated) < rounds * batch:
                coord.poll(0.05)
                self._keep_actors()
                continue
            if len(kept) >= need or not filtering or rounds >= c.dapo.max_gen_batches:
                break
            rounds += 1  # another generation batch for this step (admitted at this version)
            coord.release(batch)
        info = {"perf/learner_idle_s": time.time() - t0,
                "stale/dropped_frac": len(dropped) / max(len(generated) + len(dropped), 1),
                # trained although staler than the bound (stale_policy tis or downweight): the
                # groups that outlived admission's bound, kept under the behaviour weight
                "stale/over_bound_groups": sum(
                    staleness.over_bound(age(g, self.version)) for g in kept)}
        if dropped:
            info["stale/dropped_groups"] = len(dropped)
        if filtering:
            info.update({"dapo/groups_generated": len(generated), "dapo/groups_filtered": filtered,
                         "dapo/groups_surplus": len(generated) - filtered - len(kept),
                         "dapo/gen_batches": rounds, "dapo/gave_up": int(len(kept) < need)})
        return GatheredStep(self.version, kept, generated, dropped, info)

    def _publishes(self) -> bool:
        c = self.cfg
        if self.step == c.run.steps:
            return True
        if c.mode == "staged":  # weights move to the actors only between stages
            return self.step >= self.stage_end
        return self.version % c.weight_sync.sync_every == 0

    def run(self) -> None:
        c = self.cfg
        self.coord.wait_for_actors(c.actors.count, c.actors.start_timeout_s)
        self._publish_weights()  # the actors start from the learner's exact weights
        self.sync_waits = []  # that first one waits for the actors to start: not a sync's cost
        t_start = time.time()
        if self.step == 0 and self.actor_evals:  # its row comes when the actors are done
            self.actor_evals.due(self.coord, self.version, self.step)
        elif self.step == 0:
            self.run_log.log(0, {**self._evaluate(), "time_s": 0.0}, policy_version=0)
        while self.step < c.run.steps:
            t_step = time.time()
            gathered = (self.delay_line.next(self.version) if self.delay_line
                        else self._gather())  # stale_inject K: the step gathered K steps ago
            groups, generated, dropped = gathered.kept, gathered.generated, gathered.dropped
            metrics = gathered.info
            batch = build_step(groups, self.algo, c, self.version, self.step,
                               self.goldens.of(groups))
            metrics.update(group_metrics(generated, dropped, trained=groups))
            load, self.engine_loads = engine_load_metrics([*generated, *dropped], self.engine_loads)
            metrics.update(load)
            metrics["groups/trained_ids"] = [g.group_id for g in groups]  # audit: none twice
            # audit of admission: the weights each group's first token was sampled with
            metrics["groups/trained_first_versions"] = [
                min(s.policy_version for s in g.samples) for g in groups]
            metrics["gen/responses_per_trained_prompt"] = (
                metrics["gen/responses_per_step"] / max(len(groups), 1))
            metrics.update(batch.metrics)
            if c.rollout.policy == "hora":
                metrics["hora/alloc_hist"] = allocation_histogram(generated)
            if c.mode == "staged":
                metrics["stage/update"] = self.step - self.stage_start
                metrics["stage/policy_version"] = self.stage_version
            self.followers.tell("train", rows=batch.rows, contrasts=batch.contrasts,
                                step=self.step)
            metrics.update(train_step(self.engine, c, self.tokenizer.pad_token_id, batch.rows,
                                      batch.contrasts, self.reference, self.step))
            self.step += 1
            self.version += 1
            if self._publishes():
                metrics["timing/sync"] = self._publish_weights()
                metrics["sync/buckets"], metrics["sync/bytes"] = self.sync_sent
            if self.sync_waits:  # the learner's wait in the broadcasts this step (one per sync)
                metrics["sync/learner_wait_s"] = sum(self.sync_waits) / len(self.sync_waits)
                metrics["sync/count"] = len(self.sync_waits)
                self.sync_waits = []
            if self.step % c.run.eval_every == 0 or self.step == c.run.steps:
                if self.actor_evals:  # of the version the actors hold, without waiting
                    self.actor_evals.due(self.coord, self.actors_version, self.step,
                                         final=self.step == c.run.steps)
                else:
                    metrics.update(self._evaluate())
            if self.actor_evals:
                if self.step == c.run.steps:
                    self._wait_for_actor_evals()
                metrics.update(self.actor_evals.row_metrics(self.coord, self.actors_version,
                                                            self.step))
                if self.step == c.run.steps and not self.actor_evals.final_complete:
                    log.warning("the final evaluation did not come back from the actors "
                                "(eval/abandoned): the learner evaluates version %d itself",
                                self.version)
                    metrics.update(self.actor_evals.learner_fallback(
                        metrics, self._evaluate(), self.version, self.step))
            step_time = time.time() - t_step
            metrics["perf/step_time"] = step_time
            metrics["learner/ranks"] = c.learner.ranks
            metrics["perf/learner_idle_frac"] = metrics["perf/learner_idle_s"] / step_time
            metrics["time_s"] = time.time() - t_start
            metrics["protocol/rejected"] = sum(self.endpoint.rejected.values())
            metrics.update({f"protocol/rejected/{reason}": n  # cumulative, by codec reason
                            for reason, n in self.endpoint.rejected.items()})
            metrics.update(self.coord.fault_metrics())
            self.run_log.log(self.step, metrics, policy_version=self.version)
            # after the step's row: a checkpoint at step S always has row S beside it (a kill
            # between the two resumes from the checkpoint before and redoes the row)
            if (c.run.checkpoint_every and self.step % c.run.checkpoint_every == 0) \
                    or self.step == c.run.steps:
                self._checkpoint()
            if self.preempt_requested:  # SIGUSR1 (SLURM's notice before the time limit)
                self._checkpoint()
                raise Preempted(self.step)

    def request_preemption(self) -> None:
        """Checkpoint after the step in progress and stop (called from a signal handler)."""
        self.preempt_requested = True

    def _checkpoint(self) -> None:
        if self._checkpointed_step == self.step:
            return
        self._checkpointed_step = self.step
        coordinator = self.coord.state_dict()
        pending = [p["group_id"] for p in coordinator["pending"]]
        state = {"step": self.step, "version": self.version, "data_index": self.prompts.index,
                 "rng": rng_state(), "algorithms": self.algo.state_dict(),
                 "coordinator": coordinator, "solutions": self.prompts.solutions_of(pending)}
        self.followers.tell("checkpoint", step=self.step)
        save_checkpoint(self.run_dir, self.step, self.engine, self.tokenizer, state,
                        keep_last=self.cfg.run.keep_checkpoints)

    def close(self, reason: str = "done") -> None:
        try:
            self.followers.tell("stop", reason=reason)
        except Exception as e:  # noqa: BLE001 - ranks already gone; the launcher stops them
            log.warning("could not tell the other learner ranks to stop: %s", e)
        self.coord.shutdown(self.version, reason)
        self._close_weight_group()
        self.weight_store = None
        extra = {"restarted_without_checkpoint": self.restarted} if self.restarted else {}
        if self.delay_line:  # gathered, still in the line when the run ended
            extra["stale_inject_untrained_groups"] = self.delay_line.waiting_groups()
        self.run_log.summary(extra or None)
        self.run_log.close()
        self.verifier.close()
        self.endpoint.close()
        try:
            from learner.plots import plot_run  # matplotlib: 0.4 s of start-up, needed at the end

            plot_run(self.run_dir)
        except Exception as e:  # noqa: BLE001 - a plotting failure must not fail the run
            log.warning("plots not written: %s", e)


__all__ = ["Learner", "group_metrics", "rollout_spec"]
