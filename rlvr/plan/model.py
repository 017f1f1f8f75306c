"""How long a work item takes an actor: a model of the rollout's engine calls, fitted to a run.

What: `GenerationModel` draws work items for the simulator (rlvr/plan/sim.py). An item of P
prompts is the rollout policy's engine calls, one per stage (AR3PO: stage s samples
stage_sizes[s] responses for each prompt still without a correct one; GRPO: one call of
group_size each; AERO: exploration then rescue rounds), then scoring and sending the groups:

    item_s = per_item_s + sum over calls of (per_call_s + per_step_s x max length in the call
                                             + per_token_s x tokens + per_response_s x responses)

Decoding runs until the longest response of the call ends, hence the max length; the tokens and
responses terms are the per-sequence compute and the verifier. Stages are drawn per prompt: a
prompt active in stage s-1 is still active in stage s with the rate the run showed, and gets the
run's mean responses per active prompt of that stage. Response lengths are drawn from the run's
length distribution (`resp/len_q`, deciles per step). The coefficients are non-negative least
squares over the run's work items (`gen/work_items`), then scaled so the model's mean item time
equals the run's (the scale is reported: far from 1 means the linear form fits badly).

Pure: numpy and random only; `fit_generation` takes plain records (rlvr/plan/measure.py reads
them from a run folder).
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

import numpy as np

from rlvr.plan.sim import Item

COST_NAMES = ("per_item_s", "per_call_s", "per_step_s", "per_token_s", "per_response_s")


@dataclass(frozen=True)
class ItemRecord:
    """One work item as the run logged it (gen/work_items)."""

    seconds: float
    prompts: int
    stages: tuple[tuple[int, int, int, int], ...]
    """Per engine call: (prompts, responses, max length, tokens)."""


def features(stages) -> list[float]:
    """The regressors of one item's time, in COST_NAMES order."""
    return [1.0, float(len(stages)), float(sum(s[2] for s in stages)),
            float(sum(s[3] for s in stages)), float(sum(s[1] for s in stages))]


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares by trying every support set (a handful of columns)."""
    n = a.shape[1]
    best, best_err = np.zeros(n), float(np.sum(b ** 2))
    for k in range(1, n + 1):
        for cols in itertools.combinations(range(n), k):
            x, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if np.any(x < 0):
                continue
            err = float(np.sum((a[:, cols] @ x - b) ** 2))
            if err < best_err - 1e-15:
                best, best_err = np.zeros(n), err
                best[list(cols)] = x
    return best


@dataclass(frozen=True)
class GenerationModel:
    costs: tuple[float, ...]
    """Coefficients in COST_NAMES order (seconds per unit)."""
    stay_rate: tuple[float, ...]
    """Per stage: the fraction of the previous stage's active prompts still active (1 for the
    first)."""
    responses_per_active: tuple[float, ...]
    """Per stage: mean responses per active prompt."""
    length_quantiles: tuple[tuple[float, ...], ...]
    """Response-length deciles of the run's steps (each 11 values, p0..p100)."""
    train_tokens_per_group: tuple[float, ...]
    """Trained tokens per group of the run's steps (one value per step)."""
    gap_s: float = 0.0
    """Actor-side seconds per item outside sample_work (messages, encoding), from the run."""
    scale: float = 1.0
    """Factor the fitted costs were multiplied by to match the run's mean item time."""

    def draw_length(self, rng: random.Random) -> int:
        q = self.length_quantiles[rng.randrange(len(self.length_quantiles))]
        x = rng.random() * (len(q) - 1)
        lo = int(x)
        hi = min(lo + 1, len(q) - 1)
        return max(1, round(q[lo] + (q[hi] - q[lo]) * (x - lo)))

    def draw_stages(self, rng: random.Random, prompts: int) -> list[tuple[int, int, int, int]]:
        stages, active = [], prompts
        for s, (stay, per) in enumerate(zip(self.stay_rate, self.responses_per_active)):
            if s > 0:
                active = sum(rng.random() < stay for _ in range(active))
            if active == 0:
                break
            n = max(1, round(active * per))
            lengths = [self.draw_length(rng) for _ in range(n)]
            stages.append((active, n, max(lengths), sum(lengths)))
        return stages

    def seconds(self, stages) -> float:
        return self.scale * float(np.dot(self.costs, features(stages))) + self.gap_s

    def __call__(self, rng: random.Random, prompts: int) -> Item:
        stages = self.draw_stages(rng, prompts)
        tokens = self.train_tokens_per_group[rng.randrange(len(self.train_tokens_per_group))]
        return Item(self.seconds(stages), (tokens,) * prompts)

    def mean_item_s(self, prompts: int, draws: int = 2000, seed: int = 1) -> float:
        rng = random.Random(seed)
        return sum(self(rng, prompts).seconds for _ in range(draws)) / draws


def fit_generation(items: list[ItemRecord], length_quantiles: list[list[float]],
                   train_tokens_per_group: list[float], prompts_per_work: int,
                   gap_s: float = 0.0) -> GenerationModel:
    """Fit the model to complete work items (those of `prompts_per_work` prompts)."""
    full = [it for it in items if it.prompts == prompts_per_work and it.stages]
    if len(full) < 5:
        raise ValueError(f"{len(full)} complete work items of {prompts_per_work} prompts logged "
                         "(gen/work_items): too few to fit generation times (need >= 5; is the "
                         "run older than that metric?)")
    if not length_quantiles:
        raise ValueError("no response-length distribution logged (resp/len_q)")
    a = np.array([features(it.stages) for it in full])
    b = np.array([it.seconds for it in full])
    costs = nnls(a, b)
    depth = max(len(it.stages) for it in full)
    prompts_at = [sum(it.stages[s][0] for it in full if len(it.stages) > s) for s in range(depth)]
    responses_at = [sum(it.stages[s][1] for it in full if len(it.stages) > s)
                    for s in range(depth)]
    stay = tuple([1.0] + [prompts_at[s] / prompts_at[s - 1] if prompts_at[s - 1] else 0.0
                          for s in range(1, depth)])
    per = tuple(responses_at[s] / prompts_at[s] if prompts_at[s] else 0.0 for s in range(depth))
    model = GenerationModel(tuple(float(c) for c in costs), stay, per,
                            tuple(tuple(q) for q in length_quantiles),
                            tuple(train_tokens_per_group) or (0.0,), gap_s=0.0)
    measured = float(np.mean(b))
    modelled = model.mean_item_s(prompts_per_work)
    scale = measured / modelled if modelled > 0 and math.isfinite(measured) else 1.0
    return GenerationModel(model.costs, stay, per, model.length_quantiles,
                           model.train_tokens_per_group, gap_s=gap_s, scale=scale)
