"""When the learner evaluates the held-out prompts, and where (docs/ALGORITHMS.md 10).

Every `run.eval_every` steps and after the last one. `run.eval_on: learner` samples the learner's
own weights there and then (tasks/evaluation.py), so a number logged at step s is the policy of
step s. `run.eval_on: actors` hands the evaluation of the version the actors hold to them and
goes on training (learner/actor_eval.py); its metrics arrive in a later step's row, the learner
waits for what is out after the last step, and evaluates the final weights itself when the final
evaluation did not come back whole.
"""

from __future__ import annotations

import logging
from pathlib import Path

from learner.actor_eval import ActorEvals
from protocol.config import Config
from tasks.evaluation import evaluate
from tasks.prompts import prompt_token_ids
from tasks.hf_engine import HFEngine
from tasks.verifier import Verifier

log = logging.getLogger(__name__)


class StepEvals:
    def __init__(self, cfg: Config, engine, tokenizer, problems: list, verifier: Verifier,
                 run_dir: Path):
        self.cfg, self.engine, self.tokenizer = cfg, engine, tokenizer
        self.problems, self.verifier = problems, verifier
        self.on_actors: ActorEvals | None = None
        if cfg.run.eval_on == "actors":
            self.on_actors = ActorEvals(
                problems, [prompt_token_ids(tokenizer, p.question, cfg.task.prompt_template)
                           for p in problems],
                cfg.task.eval_samples, cfg.rollout.max_new_tokens, cfg.rollout.temperature,
                run_dir)

    def evaluate(self) -> dict:
        """The learner's own evaluation of its current weights."""
        c = self.cfg
        return evaluate(HFEngine(self.engine.module), self.tokenizer, self.problems,
                        self.verifier, c.task.eval_samples, c.rollout.max_new_tokens,
                        c.rollout.temperature, c.task.prompt_template, seed=c.run.seed)

    def at_start(self, fleet, run_log) -> None:
        """Step 0 of a fresh run: row 0 holds the start's evaluation (on the actors: it comes
        in a later row, when they are done)."""
        if self.on_actors:
            self.on_actors.due(fleet.coord, fleet.actors_version, 0)
        else:
            run_log.log(0, {**self.evaluate(), "time_s": 0.0}, policy_version=0)

    def at_step(self, fleet, step: int, version: int) -> dict:
        """The evaluation metrics of learner step `step`'s row (now at `version`)."""
        last = step == self.cfg.run.steps
        due = step % self.cfg.run.eval_every == 0 or last
        if not self.on_actors:
            return self.evaluate() if due else {}
        actors = self.on_actors
        if due:  # of the version the actors hold, without waiting
            actors.due(fleet.coord, fleet.actors_version, step, final=last)
        if last:
            while actors.waiting:  # every one out is waited for (a lost actor's abandoned)
                fleet.coord.poll(0.05)
                fleet.keep()
        metrics = actors.row_metrics(fleet.coord, fleet.actors_version, step)
        if last and not actors.final_complete:
            log.warning("the final evaluation did not come back from the actors "
                        "(eval/abandoned): the learner evaluates version %d itself", version)
            metrics.update(actors.learner_fallback(metrics, self.evaluate(), version, step))
        return metrics
