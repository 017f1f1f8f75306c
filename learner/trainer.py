"""The learner's loop: admit work, gather a step's groups, update, publish weights, log.

One code path serves the three schedules. `sync` is the case max_staleness = 0: exactly one
step's groups are admitted per policy version, and the actors sample them with the weights the
learner trains, so every sample has staleness 0 and the update is on-policy. `async` admits up to
max_staleness steps ahead, so the actors keep generating while the learner trains. `staged`
(Mu-GRPO) admits a whole stage of mu steps' groups with the stage's weights and publishes new
weights only when the stage is trained, so step u of a stage trains on data u versions old; the
learner starts training as soon as a step's groups are in (the data are the same either way).

Each part has its room: admission and gathering (DAPO's dynamic sampling, the staged clock, the
injected delay) in learner/gather.py, what enters the loss per algorithm in
learner/algorithms.py, the update on every learner rank in learner/ranks.py, the actors'
liveness and weights in learner/fleet.py, evaluation in learner/step_eval.py and the step's row
in learner/step_log.py. The learner holds the run's position (step, version, data, algorithm
state) and checkpoints it.

    python -m learner.main --run-dir runs/demo        # started by `rlvr train`, not by hand
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TextIO

from tasks.tiny_model import load_tokenizer

from learner.algorithms import AlgorithmState, build_step
from learner.checkpoint import latest_checkpoint, rng_state, set_rng_state
from learner.coordinator import run_coordinator
from learner.data import PromptStream, held_out
from learner.engine import init_learner_distributed
from learner.fleet import Fleet
from learner.gather import StepGatherer
from learner.goldens import Goldens
from learner.ranks import Leader
from learner.run_log import RunLog, set_aside_run
from learner.step_eval import StepEvals
from learner.step_log import StepLog
from protocol.config import Config, to_dict
from protocol.config.checks import config_warnings
from protocol.transport import LearnerEndpoint
from protocol.weights import host_store
from tasks.verifier import Verifier

log = logging.getLogger(__name__)


class Preempted(Exception):
    """The run stopped early on request, after checkpointing `step`; it resumes from there."""


class Learner:
    def __init__(self, cfg: Config, run_dir: Path, resume: bool, console: TextIO | None = None):
        """`console`: where the progress line goes (None: stderr)."""
        self.cfg, self.run_dir = cfg, run_dir
        self.preempt_requested = False
        init_learner_distributed(cfg, rank=0, world_size=cfg.learner.ranks)
        tokenizer = load_tokenizer(cfg.model.path)
        # first: a port it cannot listen on stops the run before the engine and the verifier
        # start (CannotListen, one line at learner.main; net.master_port's is checked above)
        endpoint = LearnerEndpoint(cfg.net.bind_host, cfg.net.zmq_port,
                                   curve_dir=cfg.net.curve_dir or None, vocab_size=len(tokenizer))
        # the weight group's rendezvous store, hosted for the whole run (actors connect to it
        # before they say hello; each membership change forms a new group over it)
        store = host_store(cfg.net.learner_host, cfg.net.weights_port, cfg.weight_sync.timeout_s)
        self.leader = Leader(cfg, run_dir, tokenizer)
        for warning in config_warnings(cfg):
            log.warning(warning)
        self.algo = AlgorithmState(cfg)
        state, restarted = self._resume(resume)
        self.step, self.version = state["step"], state["version"]
        self.prompts = PromptStream(cfg, tokenizer, start=state["data_index"],
                                    keep_solutions=cfg.gcpo.coef > 0)
        self.prompts.restore_solutions(state.get("solutions", {}))
        self.verifier = Verifier(cfg.actors.verifier_timeout_s, reward=cfg.task.reward)
        self.coord = run_coordinator(cfg, endpoint, self.prompts, self.algo.prompt_counts,
                                     self.version)
        # the prompts handed out and not trained go first (checkpoints before it kept none:
        # admission slots rebuilt as version x G, the prompts in flight not handed out again)
        if state.get("coordinator") is not None:
            self.coord.load_state_dict(state["coordinator"])
        self.evals = StepEvals(cfg, self.leader.engine, tokenizer, held_out(cfg), self.verifier,
                               run_dir)
        if self.evals.on_actors:
            self.coord.on_eval = self.evals.on_actors.receive
        self.fleet = Fleet(cfg, self.coord, endpoint, store, self.leader.engine, run_dir,
                           self.version, self.evals.on_actors)
        self.gatherer = StepGatherer(cfg, self.coord, self.algo, self.fleet, self.step,
                                     self.version)
        self.goldens = Goldens(self.prompts, self.verifier, tokenizer)  # GCPO
        self.fleet.write_processes()
        resuming = resume and restarted is None
        self.log = StepLog(cfg, RunLog(run_dir, to_dict(cfg), wandb_mode=cfg.run.wandb,
                                       progress=cfg.run.progress, total_steps=cfg.run.steps,
                                       resume_from_step=self.step if resuming else None,
                                       progress_stream=console), restarted)

    def _resume(self, resume: bool) -> tuple[dict, dict | None]:
        """The run state to start from: a fresh run's, or with `resume` the newest complete
        checkpoint's (its weights loaded on every rank). Resumed with no complete checkpoint
        (killed before the first one), the run starts again from step 0 with the old rows set
        aside rather than mixed with the new ones; the second value says what was moved."""
        fresh = {"step": 0, "version": 0, "data_index": 0}
        checkpoint = latest_checkpoint(self.run_dir) if resume else None
        if checkpoint is None:
            restarted = set_aside_run(self.run_dir) if resume else None
            if restarted is not None:
                log.warning("--resume found no complete checkpoint in %s: starting the run again "
                            "from step 0; the earlier metrics (%d rows) are set aside in %s",
                            self.run_dir, restarted["rows"], restarted["set_aside_in"])
            return fresh, restarted
        state = self.leader.load(checkpoint)
        set_rng_state(state["rng"])
        if "algorithms" in state:
            self.algo.load_state_dict(state["algorithms"])
        log.info("resumed from %s at step %d", checkpoint, state["step"])
        return state, None

    def run(self) -> None:
        c = self.cfg
        self.coord.wait_for_actors(c.actors.count, c.actors.start_timeout_s)
        self.fleet.publish(self.version)  # the actors start from the learner's exact weights
        self.fleet.waits = []  # that first one waits for the actors to start: not a sync's cost
        self.log.start()
        if self.step == 0:
            self.evals.at_start(self.fleet, self.log.run_log)
        while self.step < c.run.steps:
            self._train_step()
            # after the step's row: a checkpoint at step S always has row S beside it (a kill
            # between the two resumes from the checkpoint before and redoes the row)
            if (c.run.checkpoint_every and self.step % c.run.checkpoint_every == 0) \
                    or self.step == c.run.steps:
                self._checkpoint()
            if self.preempt_requested:  # SIGUSR1 (SLURM's notice before the time limit)
                self._checkpoint()
                raise Preempted(self.step)

    def _train_step(self) -> None:
        """Gather, build and train one step's batch, publish and evaluate as due, log its row."""
        c, started = self.cfg, time.time()
        gathered = self.gatherer.next(self.step, self.version)
        groups = gathered.kept
        batch = build_step(groups, self.algo, c, self.version, self.step, self.goldens.of(groups))
        metrics = self.log.gathered(gathered, batch.metrics)
        metrics.update(self.gatherer.stage_metrics(self.step))
        metrics.update(self.leader.train(batch.rows, batch.contrasts, self.step))
        self.step += 1
        self.version += 1
        if self.gatherer.publishes(self.step, self.version):
            metrics["timing/sync"] = self.fleet.publish(self.version)
            metrics["sync/buckets"], metrics["sync/bytes"] = self.fleet.sent
        metrics.update(self.fleet.sync_metrics())
        metrics.update(self.evals.at_step(self.fleet, self.step, self.version))
        metrics.update(self.fleet.metrics())
        self.log.log(self.step, self.version, metrics, started)

    def request_preemption(self) -> None:
        """Checkpoint after the step in progress and stop (called from a signal handler)."""
        self.preempt_requested = True

    def _checkpoint(self) -> None:
        coordinator = self.coord.state_dict()
        pending = [p["group_id"] for p in coordinator["pending"]]
        self.leader.checkpoint(self.step, {
            "step": self.step, "version": self.version, "data_index": self.prompts.index,
            "rng": rng_state(), "algorithms": self.algo.state_dict(),
            "coordinator": coordinator, "solutions": self.prompts.solutions_of(pending)})

    def close(self, reason: str = "done") -> None:
        self.leader.stop(reason)
        self.fleet.close(self.version, reason)
        delay_line = self.gatherer.delay_line
        # gathered, still in the line when the run ended
        self.log.close({"stale_inject_untrained_groups": delay_line.waiting_groups()}
                       if delay_line else None)
        self.verifier.close()
        try:
            from learner.plots import plot_run  # matplotlib: 0.4 s of start-up, needed at the end

            plot_run(self.run_dir)
        except Exception as e:  # noqa: BLE001 - a plotting failure must not fail the run
            log.warning("plots not written: %s", e)

