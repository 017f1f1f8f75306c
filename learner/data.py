"""The run's prompts: a resumable training stream, the rollout policy's per-prompt budgets, and
the held-out problems.

`PromptStream` yields one `Prompt` per training problem; `PromptSource` takes them a step's batch
at a time and sets each prompt's `n` as the rollout policy says (HORA allocates the batch's
budget by hit utility, ALGORITHMS.md 7.3); `rollout_spec` is what the actors are told to do.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterator

import msgspec

from learner.allocation import hora_allocate
from tasks.datasets import iterate_forever, load_problems
from tasks.prompts import prompt_token_ids
from tasks.arithmetic import Arithmetic, Problem
from protocol.config import Config
from protocol.messages import Prompt, RolloutSpec

_MAX_SOLUTIONS = 65536  # golden solutions remembered for prompts in flight (GCPO)


def held_out(cfg: Config) -> list[Problem]:
    t = cfg.task
    match t.kind:
        case "arithmetic":
            return Arithmetic(levels=t.levels, ops=t.ops, seed=cfg.run.seed,
                              eval_per_level=t.eval_per_level).eval_set()
        case "file":
            return load_problems(t.eval_path or t.train_path, t.prompt_field, t.answer_field,
                                 t.solution_field)


def rollout_spec(cfg: Config) -> RolloutSpec:
    """How the actors sample: the rollout policy's strategy and its parameters."""
    r, a = cfg.rollout, cfg.aero
    common = dict(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p)
    match r.policy:
        case "fixed" | "hora":
            return RolloutSpec(strategy="fixed", **common)
        case "staged":
            return RolloutSpec(strategy="staged", stage_sizes=list(cfg.ar3po.stage_sizes),
                               **common)
        case "aero":
            return RolloutSpec(strategy="aero", aero_explore=a.n_explore,
                               aero_rescue_step=a.rescue_step, aero_max_rounds=a.rescue_rounds,
                               aero_max_per_prompt=a.n_max, aero_budget=a.n_total - a.n_explore,
                               aero_rescue_threshold=a.rescue_threshold, **common)


class PromptStream:
    """Endless training prompts; `index` (the next problem's position) is the whole state a
    checkpoint needs to resume the data order exactly. With `keep_solutions`, the answer and
    golden solution of recent prompts can be looked up by group id (GCPO, bounded)."""

    def __init__(self, cfg: Config, tokenizer, start: int = 0, keep_solutions: bool = False):
        self.cfg, self.tokenizer, self.index = cfg, tokenizer, start
        self.keep_solutions = keep_solutions
        self._solutions: OrderedDict[str, tuple[str, str | None]] = OrderedDict()
        t = cfg.task
        if t.kind == "arithmetic":
            task = Arithmetic(levels=t.levels, ops=t.ops, seed=cfg.run.seed,
                              eval_per_level=t.eval_per_level)
            self._problems = task.train_stream(cfg.run.seed, t.level_weights, start=start)
        else:
            problems = load_problems(t.train_path, t.prompt_field, t.answer_field, t.solution_field)
            self._problems = iterate_forever(problems, cfg.run.seed, start=start)

    def __iter__(self) -> Iterator[Prompt]:
        return self

    def __next__(self) -> Prompt:
        p = next(self._problems)
        prompt = Prompt(group_id=f"g{self.index}", prompt_id=p.prompt_id,
                        prompt_token_ids=prompt_token_ids(self.tokenizer, p.question,
                                                          self.cfg.task.prompt_template),
                        answer=p.answer, n=self.cfg.rollout.group_size)
        self.index += 1
        if self.keep_solutions:
            self._solutions[prompt.group_id] = (p.answer, p.solution)
            if len(self._solutions) > _MAX_SOLUTIONS:
                self._solutions.popitem(last=False)
        return prompt

    def pop_solution(self, group_id: str) -> tuple[str, str | None] | None:
        """(answer, golden solution or None) of a prompt handed out, forgotten once asked."""
        return self._solutions.pop(group_id, None)


def allocation(cfg: Config, prompt_ids: list[str],
               counts: Callable[[str], tuple[float, float]]) -> list[int]:
    """Responses to sample per prompt of one step's batch, by rollout policy. For the adaptive
    policies this is the per-prompt cap (the actor stops earlier)."""
    r = cfg.rollout
    match r.policy:
        case "fixed":
            return [r.group_size] * len(prompt_ids)
        case "staged":
            return [sum(cfg.ar3po.stage_sizes)] * len(prompt_ids)
        case "aero":
            return [cfg.aero.n_max] * len(prompt_ids)
        case "hora":  # compute-matched with fixed N: the step's budget is N per prompt
            return hora_allocate([counts(p) for p in prompt_ids], r.group_size * len(prompt_ids),
                                 cfg.hora.k_min, cfg.hora.k_max_factor * r.group_size)


class PromptSource:
    """The coordinator's prompts: a step's batch (rollout.prompts_per_step) at a time from the
    stream, each with its allocated `n`. HORA decides at hand-out time with the counts then known
    and never re-allocates in flight (8.4)."""

    def __init__(self, cfg: Config, stream: Iterator[Prompt],
                 counts: Callable[[str], tuple[float, float]]):
        self.cfg, self.stream, self.counts = cfg, stream, counts
        self.pending: deque[Prompt] = deque()

    def __iter__(self) -> Iterator[Prompt]:
        return self

    def __next__(self) -> Prompt:
        if not self.pending:
            batch = [next(self.stream) for _ in range(self.cfg.rollout.prompts_per_step)]
            ns = allocation(self.cfg, [p.prompt_id for p in batch], self.counts)
            self.pending.extend(msgspec.structs.replace(p, n=k) for p, k in zip(batch, ns))
        return self.pending.popleft()
