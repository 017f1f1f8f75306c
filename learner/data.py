"""The run's prompts: a resumable training stream of `Prompt`s and the held-out problems."""

from __future__ import annotations

from collections.abc import Iterator

from actors.datasets import iterate_forever, load_problems
from actors.prompts import prompt_token_ids
from actors.tasks import Arithmetic, Problem
from protocol.config import Config
from protocol.messages import Prompt


def held_out(cfg: Config) -> list[Problem]:
    t = cfg.task
    match t.kind:
        case "arithmetic":
            return Arithmetic(levels=t.levels, ops=t.ops, seed=cfg.run.seed,
                              eval_per_level=t.eval_per_level).eval_set()
        case "file":
            return load_problems(t.eval_path or t.train_path, t.prompt_field, t.answer_field,
                                 t.solution_field)


class PromptStream:
    """Endless training prompts; `index` (the next problem's position) is the whole state a
    checkpoint needs to resume the data order exactly."""

    def __init__(self, cfg: Config, tokenizer, start: int = 0):
        self.cfg, self.tokenizer, self.index = cfg, tokenizer, start
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
        return prompt
