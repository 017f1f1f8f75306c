"""Held-out evaluation handed to the actors (`run.eval_on: actors`, docs/ALGORITHMS.md 10).

The learner does not stop to evaluate: right after the sync that published version v it sends
each member of the weight group an `EvalWork` for its share of the held-out prompts (every
n-th, n members), and goes on training. The actors decode them beside their training rows on a
snapshot of version v (actors/evaluation.py) and send back per-prompt counts; once every share
of v is in, the sums give the same metrics as the learner's own evaluation
(tasks.evaluation.eval_metrics), logged in the row of the step they arrived at, with
`eval/version` v (the weights they measured) and `eval/lag_steps`.

At most one periodic evaluation is out at a time: one that falls due meanwhile waits and goes
out at the first step after (its version is then that step's). The final evaluation goes out
at once and the learner waits for everything out before it stops. Each complete evaluation is
also appended to `RUN_DIR/evals.jsonl` with its per-prompt counts: when two complete within one
step (only at the end), the row carries the newer one and counts the other in
`eval/superseded`, and the file keeps both. An evaluation whose share was refused (the actor no
longer held v), came back malformed, or whose actor was lost is abandoned: `eval/abandoned`
counts it, a warning says why, and the next one is not held up. The final one abandoned, the
learner evaluates the final weights itself (`learner_fallback`, learner/step_eval.py).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from protocol.messages import PROTOCOL_VERSION, EvalResult, EvalWork, Prompt
from protocol.transport import PeerGone, TransportError
from tasks.arithmetic import Problem
from tasks.evaluation import eval_metrics

log = logging.getLogger(__name__)


@dataclass
class _Outstanding:
    version: int
    step: int  # the learner's step when it went out
    sent_at: float
    shares: dict[str, tuple[bytes, list[int]]]  # eval id -> (actor's peer, problem indices)
    final: bool = False
    results: dict[str, EvalResult] = field(default_factory=dict)


class ActorEvals:
    def __init__(self, problems: list[Problem], prompt_ids: list[list[int]], k: int,
                 max_new_tokens: int, temperature: float, run_dir: Path):
        self.problems, self.prompt_ids = problems, prompt_ids
        self.k, self.max_new_tokens, self.temperature = k, max_new_tokens, temperature
        self.path = run_dir / "evals.jsonl"
        self.out: list[_Outstanding] = []
        self.done: list[dict] = []  # complete, not yet in a metrics row
        self.deferred = False
        self.final_complete = False  # the final evaluation came back whole
        self.abandoned = self.superseded = 0

    # -- sending ------------------------------------------------------------------------------
    def due(self, coord, version: int, step: int, final: bool = False) -> None:
        """An evaluation of `version` falls due at `step`: send it, or defer it while a
        periodic one is still out (the final one always goes)."""
        if self.out and not final:
            self.deferred = True
            return
        self.deferred = False
        self._send(coord, version, step, final)

    def _send(self, coord, version: int, step: int, final: bool) -> None:
        members = sorted((a for a in coord.actors.values() if a.rank > 0),
                         key=lambda a: a.actor_id)
        if not members:
            self._abandon(version, "no actor holds the weights")
            return
        shares = {}
        for i, actor in enumerate(members):
            idx = list(range(i, len(self.problems), len(members)))
            eval_id = f"v{version}-a{actor.actor_id}"
            prompts = [Prompt(group_id=f"eval-{eval_id}-{j}", prompt_id=self.problems[j].prompt_id,
                              prompt_token_ids=self.prompt_ids[j], answer=self.problems[j].answer,
                              n=self.k, fields=self.problems[j].fields) for j in idx]
            try:
                coord.endpoint.send(actor.peer, EvalWork(
                    protocol_version=PROTOCOL_VERSION, policy_version=version, eval_id=eval_id,
                    prompts=prompts, k=self.k, max_new_tokens=self.max_new_tokens,
                    temperature=self.temperature))
            except TransportError as e:
                coord.lose(actor, f"evaluation not delivered: {e}",
                           departed=isinstance(e, PeerGone))
                self._abandon(version, f"actor {actor.actor_id} could not be reached")
                return
            shares[eval_id] = (actor.peer, idx)
        self.out.append(_Outstanding(version, step, time.time(), shares, final))

    # -- receiving ----------------------------------------------------------------------------
    def receive(self, result: EvalResult) -> None:
        ev = next((e for e in self.out if result.eval_id in e.shares), None)
        if ev is None:
            log.warning("evaluation result %s matches nothing sent (abandoned earlier?): ignored",
                        result.eval_id)
            return
        _, idx = ev.shares[result.eval_id]
        why = result.error or _malformed(result, ev.version, len(idx), self.k)
        if why:
            self._drop(ev, f"actor {result.actor_id}: {why}")
            return
        ev.results[result.eval_id] = result
        if len(ev.results) == len(ev.shares):
            self.out.remove(ev)
            self.done.append(self._complete(ev))
            self.final_complete |= ev.final

    def check_actors(self, live_peers) -> None:
        """Abandon the evaluations whose missing share's actor is gone."""
        for ev in list(self.out):
            lost = [eid for eid, (peer, _) in ev.shares.items()
                    if eid not in ev.results and peer not in live_peers]
            if lost:
                self._drop(ev, f"the actor of share {lost[0]} was lost")

    def row_metrics(self, coord, version: int, step: int) -> dict:
        """What the step's row carries: the newest evaluation complete since the last row, the
        counters, and a deferred evaluation sent now if nothing is out any more."""
        metrics = {}
        if self.done:
            metrics.update(self.done[-1])
            self.superseded += len(self.done) - 1
            self.done = []
            metrics["eval/lag_steps"] = step - metrics["eval/step_sent"]
        if self.abandoned or self.superseded:
            metrics.update({"eval/abandoned": self.abandoned, "eval/superseded": self.superseded})
        if self.deferred and not self.out:
            self.due(coord, version, step)
        return metrics

    def learner_fallback(self, row: dict, evaluation: dict, version: int, step: int) -> dict:
        """What the last step's `row` takes when the final evaluation did not come back whole:
        `evaluation`, the learner's own of `version` (training is over: it stops nothing). An
        older evaluation the row carried is superseded by it (counted)."""
        if "eval/version" in row:
            self.superseded += 1
        return {**evaluation, "eval/version": version, "eval/step_sent": step, "eval/lag_steps": 0,
                "eval/actors": 0, "eval/final_on_learner": 1, "eval/abandoned": self.abandoned,
                "eval/superseded": self.superseded}

    @property
    def waiting(self) -> bool:
        return bool(self.out)

    # -- plumbing -----------------------------------------------------------------------------
    def _complete(self, ev: _Outstanding) -> dict:
        n = len(self.problems)
        correct, greedy, texts = [0] * n, [False] * n, [""] * n
        for eval_id, (_, idx) in ev.shares.items():
            r = ev.results[eval_id]
            for j, c, g, t in zip(idx, r.correct, r.greedy, r.greedy_texts):
                correct[j], greedy[j], texts[j] = c, g, t
        rs = ev.results.values()
        metrics = {**eval_metrics(self.problems, correct, greedy, self.k),
                   "eval/version": ev.version, "eval/step_sent": ev.step,
                   "eval/actors": len(ev.shares), "eval/tokens": sum(r.tokens for r in rs),
                   "timing/eval_actor_s": max(r.seconds for r in rs),
                   "timing/eval_wall_s": time.time() - ev.sent_at}
        with open(self.path, "a") as f:
            f.write(json.dumps({**metrics, "prompt_ids": [p.prompt_id for p in self.problems],
                                "correct": correct, "greedy": greedy, "greedy_texts": texts})
                    + "\n")
        return metrics

    def _drop(self, ev: _Outstanding, why: str) -> None:
        self.out.remove(ev)
        self._abandon(ev.version, why)

    def _abandon(self, version: int, why: str) -> None:
        self.abandoned += 1
        log.warning("evaluation of version %d on the actors abandoned: %s", version, why)


def _malformed(r: EvalResult, version: int, prompts: int, k: int) -> str:
    if r.policy_version != version:
        return f"sampled by version {r.policy_version}, asked for {version}"
    if len(r.correct) != prompts:
        return f"{len(r.correct)} verdicts for {prompts} prompts"
    if any(c > k for c in r.correct):
        return f"a count above k = {k}"
    return ""
