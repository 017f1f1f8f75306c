"""GCPO's golden trajectories (docs/ALGORITHMS.md): for an all-fail group whose prompt has a
reference solution that the verifier accepts, the solution's token ids, cached per prompt id."""

from __future__ import annotations

from protocol.messages import Group

_MAX_GOLDENS = 65536  # cached prompt ids; the cache starts over past it


class Goldens:
    def __init__(self, prompts, verifier, tokenizer):
        self.prompts, self.verifier, self.tokenizer = prompts, verifier, tokenizer
        self.cache: dict[str, list[int] | None] = {}  # prompt id -> ids, None: not verified

    def of(self, groups: list[Group]) -> dict[str, list[int]]:
        """group id -> golden token ids, for the all-fail groups that have one."""
        out = {}
        for g in groups:
            known = self.prompts.pop_solution(g.group_id)
            if known is None or any(s.acc for s in g.samples):
                continue
            if g.prompt_id not in self.cache:
                answer, solution, fields = known  # a reward function may read the row's fields
                ok = solution is not None and self.verifier.judge([solution], [answer],
                                                                  [fields])[0].acc
                if len(self.cache) >= _MAX_GOLDENS:
                    self.cache.clear()
                self.cache[g.prompt_id] = (
                    self.tokenizer(solution, add_special_tokens=False).input_ids
                    + [self.tokenizer.eos_token_id] if ok else None)
            if self.cache[g.prompt_id]:
                out[g.group_id] = self.cache[g.prompt_id]
        return out
