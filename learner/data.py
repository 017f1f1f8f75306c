"""The run's prompts: a resumable training stream, the rollout policy's per-prompt budgets, and
the held-out problems.

`PromptStream` yields one `Prompt` per training problem; `PromptSource` sets each prompt's `n` as
the rollout policy says and, for HORA, the prompt's posterior counts at hand-out time, from which
the actor allocates the work item's budget by hit utility (docs/ALGORITHMS.md 7.3, 8.4);
`rollout_spec` is what the actors are told to do.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator

import msgspec

from tasks.datasets import iterate_forever, load_problems
from tasks.prompts import prompt_token_ids
from tasks.rewards import BUILTIN
from tasks.arithmetic import Arithmetic, Problem
from protocol.config import Config
from protocol.messages import Prompt, RolloutSpec

_MAX_SOLUTIONS = 65536  # golden solutions remembered for prompts in flight (GCPO)


def held_out(cfg: Config) -> list[Problem]:
    t = cfg.task
    match t.kind:
        case "arithmetic":
            return Arithmetic(levels=t.levels, ops=t.ops, seed=cfg.run.seed,
                              eval_per_level=t.eval_per_level,
                              response_format=t.response_format).eval_set()
        case "file":
            return load_problems(t.eval_path or t.train_path, t.prompt_field, t.answer_field,
                                 t.solution_field)


def rollout_spec(cfg: Config) -> RolloutSpec:
    """How the actors sample: the rollout policy's strategy and its parameters."""
    r, a = cfg.rollout, cfg.aero
    common = dict(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p)
    match r.policy:
        case "fixed":
            return RolloutSpec(strategy="fixed", **common)
        case "stop_on_correct":
            return RolloutSpec(strategy="stop_on_correct", stage_sizes=list(cfg.ar3po.stage_sizes),
                               **common)
        case "aero":
            return RolloutSpec(strategy="aero", aero_explore=a.n_explore,
                               aero_rescue_step=a.rescue_step, aero_max_rounds=a.rescue_rounds,
                               aero_max_per_prompt=a.n_max,
                               aero_rescue_budget_per_prompt=a.n_total - a.n_explore,
                               aero_rescue_threshold=a.rescue_threshold, **common)
        case "hora":  # compute-matched with fixed N: the budget is N per prompt
            h = cfg.hora
            return RolloutSpec(strategy="hora", hora_budget_per_prompt=r.group_size,
                               hora_k_min=h.k_min, hora_k_max=h.k_max_factor * r.group_size,
                               hora_two_phase=h.two_phase, **common)


class PromptStream:
    """Endless training prompts; `index` (the next problem's position) is the whole state a
    checkpoint needs to resume the data order exactly. With `keep_solutions`, the answer and
    golden solution of recent prompts can be looked up by group id (GCPO, bounded)."""

    def __init__(self, cfg: Config, tokenizer, start: int = 0, keep_solutions: bool = False):
        self.cfg, self.tokenizer, self.index = cfg, tokenizer, start
        self.keep_solutions = keep_solutions
        self._solutions: OrderedDict[str, tuple[str, str | None, dict]] = OrderedDict()
        t = cfg.task
        if t.kind == "arithmetic":
            task = Arithmetic(levels=t.levels, ops=t.ops, seed=cfg.run.seed,
                              eval_per_level=t.eval_per_level,
                              response_format=t.response_format)
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
                        answer=p.answer, n=self.cfg.rollout.group_size,
                        fields={} if self.cfg.task.reward == BUILTIN else p.fields)
        self.index += 1
        if self.keep_solutions:
            self._solutions[prompt.group_id] = (p.answer, p.solution, prompt.fields)
            if len(self._solutions) > _MAX_SOLUTIONS:
                self._solutions.popitem(last=False)
        return prompt

    def pop_solution(self, group_id: str) -> tuple[str, str | None, dict] | None:
        """(answer, golden solution or None, the fields a reward function is given) of a prompt
        handed out, forgotten once asked."""
        return self._solutions.pop(group_id, None)

    def solutions_of(self, group_ids: list[str]) -> dict[str, list]:
        """The stored (answer, solution, fields) of these group ids, for a checkpoint (GCPO)."""
        return {g: list(self._solutions[g]) for g in group_ids if g in self._solutions}

    def restore_solutions(self, solutions: dict[str, list]) -> None:
        """Put a checkpoint's stored solutions back (the prompts it hands out again). A
        checkpoint written before the fields were kept has (answer, solution): no fields."""
        if self.keep_solutions:
            self._solutions.update((g, (saved[0], saved[1], saved[2] if len(saved) > 2 else {}))
                                   for g, saved in solutions.items())


def responses_cap(cfg: Config) -> int:
    """`Prompt.n` by rollout policy: the responses to sample (fixed), the per-prompt cap
    (AR3PO, AERO: the actor stops earlier), or HORA's mean budget per prompt."""
    r = cfg.rollout
    match r.policy:
        case "fixed" | "hora":
            return r.group_size
        case "stop_on_correct":
            return sum(cfg.ar3po.stage_sizes)
        case "aero":
            return cfg.aero.n_max


class PromptSource:
    """The coordinator's prompts, each with its `n` and, for HORA, its Beta counts as known when
    it is handed out (the actor allocates from them; nothing is re-allocated in flight, 8.4)."""

    def __init__(self, cfg: Config, stream: Iterator[Prompt],
                 counts: Callable[[str], tuple[float, float]]):
        self.stream, self.counts = stream, counts
        self.n, self.hora = responses_cap(cfg), cfg.rollout.policy == "hora"

    def __iter__(self) -> Iterator[Prompt]:
        return self

    def __next__(self) -> Prompt:
        p = next(self.stream)
        if not self.hora:
            return msgspec.structs.replace(p, n=self.n)
        c, f = self.counts(p.prompt_id)
        return msgspec.structs.replace(p, n=self.n, prior_correct=float(c),
                                       prior_incorrect=float(f))

