"""What a prompt asks of an actor: a model of its stages and sample lengths, fitted to a run.

What: `GenerationModel` draws one `PromptPlan` per prompt for the simulator (rlvr/plan/sim.py):
the rollout policy's stages (AR3PO: stage s samples for a prompt still without a correct
response; GRPO: one stage of group_size; AERO: exploration then rescue rounds) with the lengths
of their samples. A prompt active in stage s-1 is still active in stage s with the rate the run
showed, and gets the run's mean responses per active prompt of that stage (rounded up or down at
random, so the mean holds). Response lengths are drawn from the run's length distribution
(`resp/len_q`, deciles per step), trained tokens per group from the run's steps. Where the run
logged each group's lengths by stage (`gen/prompt_lengths`) and its prompt's tokens
(`gen/prompt_tokens`), a prompt is one of those drawn whole instead: its answers are long or short
together, its later stage is the one a hard prompt had and its prompt as long as that prompt's,
so an engine holds as many rows, as wide, as the run's did (lengths drawn one by one leave
most of a prompt's rows ended while its longest runs on: half the rows under `continue` on the
long-tail task). What a stage
costs in time is the actor model's business (rlvr/plan/sim_engine.py, DecodeCost).

Pure: random only; `fit_generation` takes plain records (rlvr/plan/measure.py reads them from a
run folder's `gen/work_items`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from rlvr.plan.sim_engine import PromptPlan


@dataclass(frozen=True)
class ItemRecord:
    """One work item as the run logged it (gen/work_items)."""

    seconds: float
    prompts: int
    stages: tuple[tuple[int, int, int, int], ...]
    """Per stage: (prompts, responses, max length, tokens)."""


@dataclass(frozen=True)
class GenerationModel:
    stay_rate: tuple[float, ...]
    """Per stage: the fraction of the previous stage's active prompts still active (1 for the
    first)."""
    responses_per_active: tuple[float, ...]
    """Per stage: mean responses per active prompt."""
    length_quantiles: tuple[tuple[float, ...], ...]
    """Response-length deciles of the run's steps (each 11 values, p0..p100)."""
    train_tokens_per_group: tuple[float, ...]
    """Trained tokens per group of the run's steps (one value per step)."""
    prompts: tuple[tuple[int, tuple[tuple[int, ...], ...], tuple[tuple[bool, ...], ...]],
                   ...] = ()
    """The run's groups as generated: (prompt tokens or 0, per stage its responses' lengths,
    per stage their verdicts or () where not logged) (gen/prompt_tokens, gen/prompt_lengths,
    gen/prompt_correct); empty: stages and lengths drawn from the fitted rates and the pooled
    lengths."""

    def draw_length(self, rng: random.Random) -> int:
        q = self.length_quantiles[rng.randrange(len(self.length_quantiles))]
        x = rng.random() * (len(q) - 1)
        lo = int(x)
        hi = min(lo + 1, len(q) - 1)
        return max(1, round(q[lo] + (q[hi] - q[lo]) * (x - lo)))

    def __call__(self, rng: random.Random) -> PromptPlan:
        if self.prompts:
            tokens = self.train_tokens_per_group[rng.randrange(len(self.train_tokens_per_group))]
            prompt, stages, correct = self.prompts[rng.randrange(len(self.prompts))]
            return PromptPlan(stages, tokens, prompt, correct)
        stages = []
        for s, (stay, per) in enumerate(zip(self.stay_rate, self.responses_per_active)):
            if s > 0 and rng.random() >= stay:
                break
            n = max(1, math.floor(per) + (rng.random() < per - math.floor(per)))
            stages.append(tuple(self.draw_length(rng) for _ in range(n)))
        tokens = self.train_tokens_per_group[rng.randrange(len(self.train_tokens_per_group))]
        return PromptPlan(tuple(stages), tokens)


def fit_generation(items: list[ItemRecord], length_quantiles: list[list[float]],
                   train_tokens_per_group: list[float],
                   prompts: list[tuple[int, list[list[int]], list[list[int]]]] = ()
                   ) -> GenerationModel:
    """The run's stages, lengths and trained tokens, from its work items (gen/work_items), and
    its groups where logged: (prompt tokens or 0, lengths by stage, verdicts by stage or [])
    (gen/prompt_tokens, gen/prompt_lengths, gen/prompt_correct)."""
    if len(items) < 5 or not any(it.stages for it in items):
        raise ValueError(f"{len(items)} work items logged (gen/work_items): too few to fit the "
                         "run's stages (need >= 5; is the run older than that metric?)")
    if not length_quantiles:
        raise ValueError("no response-length distribution logged (resp/len_q)")
    depth = max(len(it.stages) for it in items)
    prompts_at = [sum(it.stages[s][0] for it in items if len(it.stages) > s) for s in range(depth)]
    responses_at = [sum(it.stages[s][1] for it in items if len(it.stages) > s)
                    for s in range(depth)]
    stay = tuple([1.0] + [prompts_at[s] / prompts_at[s - 1] if prompts_at[s - 1] else 0.0
                          for s in range(1, depth)])
    per = tuple(responses_at[s] / prompts_at[s] if prompts_at[s] else 0.0 for s in range(depth))
    kept = []
    for n, lengths, correct in prompts:
        if [len(s) for s in correct] != [len(s) for s in lengths]:
            correct = []  # not logged (or not for these lengths): the plan's default verdicts
        stages = [(tuple(max(1, int(x)) for x in s), tuple(bool(c) for c in v))
                  for s, v in zip(lengths, correct or [[]] * len(lengths)) if s]
        if stages:
            kept.append((max(0, int(n)), tuple(s for s, _ in stages),
                         tuple(v for _, v in stages) if correct else ()))
    return GenerationModel(stay, per, tuple(tuple(q) for q in length_quantiles),
                           tuple(train_tokens_per_group) or (0.0,), tuple(kept))
