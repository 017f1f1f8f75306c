"""A learner step's row: what was gathered and trained, timing, the actors' counters.

The row of step s holds the gathering's counts, the groups' generation cost and selection
metrics, the audit of admission (each trained group's id and the weights its first token was
sampled with), the update's metrics, the sync and evaluation of that step, and the cumulative
fault and protocol counters; learner/run_log.py writes it (metrics.jsonl, wandb, progress).
"""

from __future__ import annotations

import time

from learner.delay_line import GatheredStep
from learner.group_metrics import allocation_histogram, engine_load_metrics, group_metrics
from learner.run_log import RunLog
from protocol.config import Config


class StepLog:
    def __init__(self, cfg: Config, run_log: RunLog, restarted: dict | None = None):
        """`restarted`: a resume that found no checkpoint set the old rows aside (the summary
        says where)."""
        self.cfg, self.run_log, self.restarted = cfg, run_log, restarted
        self.engine_loads: dict = {}  # actor id -> its engine's newest counters (gen/engine_fill)
        self.started = time.time()

    def start(self) -> None:
        """The run's clock (time_s) starts now: after the actors joined and took the weights."""
        self.started = time.time()

    def gathered(self, gathered: GatheredStep, batch_metrics: dict) -> dict:
        """A step's metrics from its gathered groups and the batch built from them."""
        groups, generated, dropped = gathered.kept, gathered.generated, gathered.dropped
        metrics = dict(gathered.info)
        metrics.update(group_metrics(generated, dropped, trained=groups))
        load, self.engine_loads = engine_load_metrics([*generated, *dropped], self.engine_loads)
        metrics.update(load)
        metrics["groups/trained_ids"] = [g.group_id for g in groups]  # audit: none twice
        # audit of admission: the weights each group's first token was sampled with
        metrics["groups/trained_first_versions"] = [
            min(s.policy_version for s in g.samples) for g in groups]
        metrics["gen/responses_per_trained_prompt"] = (
            metrics["gen/responses_per_step"] / max(len(groups), 1))
        metrics.update(batch_metrics)
        if self.cfg.rollout.policy == "hora":
            metrics["hora/alloc_hist"] = allocation_histogram(generated)
        return metrics

    def log(self, step: int, version: int, metrics: dict, step_started: float) -> None:
        """Write step `step`'s row, with its timing."""
        step_time = time.time() - step_started
        metrics["perf/step_time"] = step_time
        metrics["learner/ranks"] = self.cfg.learner.ranks
        metrics["perf/learner_idle_frac"] = metrics["perf/learner_idle_s"] / step_time
        metrics["time_s"] = time.time() - self.started
        self.run_log.log(step, metrics, policy_version=version)

    def close(self, extra: dict | None = None) -> None:
        """summary.json (with `extra`), then the files and wandb closed."""
        restarted = {"restarted_without_checkpoint": self.restarted} if self.restarted else {}
        self.run_log.summary({**restarted, **(extra or {})} or None)
        self.run_log.close()
