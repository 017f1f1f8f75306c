"""Held-out evaluation on an actor (`run.eval_on: actors`, docs/ALGORITHMS.md 10): an `EvalWork`
decoded beside the training rows by a frozen copy of the weights it names.

Why a copy: the training rows move on to newer weights at the next sync, mid-response under
`continue`, and the learner must not wait at its next broadcast for an evaluation to end. So the
evaluation gets an engine of its own over a snapshot of the parameters, taken while they are
exactly `EvalWork.policy_version`, and syncs go ahead as if it were not there. It takes the
actor's idle time first: the actor loop gives it a decode step whenever the training engine has
nothing to decode, and otherwise one after every `TRAINING_STEPS_PER_EVAL_STEP` training decode
steps, so that it ends on an actor that is never idle while taking little from its training
rows. Its engine decodes at most `EVAL_ROWS` rows at a time, so one of its steps stays short
(a sync waits for the loop's current step to be noticed). The snapshot costs one more copy of the parameters while the evaluation runs; only the HF
engine's model can be copied so (protocol/config/checks.py refuses `eval_on: actors` with vLLM).

Per prompt: `k` samples at the work's temperature and one greedy answer (temperature 0), scored
by the actor's reward function on a verifier thread of its own, so a slow verdict never holds a
decode step. The result carries, per prompt in the work's order, the correct samples of k and
the greedy verdict; the learner adds the actors' parts up (learner/actor_eval.py).
"""

from __future__ import annotations

import copy
import time

from actors.verify_queue import VerifyQueue
from protocol.messages import PROTOCOL_VERSION, EvalResult, EvalWork
from tasks.hf_engine import HFEngine
from tasks.verifier import Verifier


TRAINING_STEPS_PER_EVAL_STEP = 4  # [I] the evaluation's share of a busy actor's decode steps
EVAL_ROWS = 64  # rows the evaluation decodes at once


class ActorEval:
    def __init__(self, work: EvalWork, engine: HFEngine, tokenizer, verifier: Verifier):
        self.work, self.tokenizer = work, tokenizer
        self.t0 = time.perf_counter()
        self.engine = HFEngine(copy.deepcopy(engine.model), max_batch=EVAL_ROWS)
        self.engine.policy_version = work.policy_version
        self.verify = VerifyQueue(verifier)
        k = work.k
        self.correct = [0] * len(work.prompts)
        self.greedy = [False] * len(work.prompts)
        self.greedy_texts = [""] * len(work.prompts)
        self.unscored = len(work.prompts) * (k + 1)
        self.tokens = 0
        for i, p in enumerate(work.prompts):  # request i*(k+1)+j: sample j, j == k the greedy one
            for j in range(k + 1):
                self.engine.add(i * (k + 1) + j, p.prompt_token_ids, work.max_new_tokens,
                                work.temperature if j < k else 0.0)

    @property
    def done(self) -> bool:
        return self.unscored == 0

    def step(self, decode: bool = True) -> None:
        """One decode step of the evaluation's rows (with `decode`), then every verdict ready."""
        k1 = self.work.k + 1
        if decode and self.engine.unfinished():
            for f in self.engine.step():
                i, j = divmod(f.request_id, k1)
                p = self.work.prompts[i]
                self.tokens += len(f.token_ids)
                text = self.tokenizer.decode(f.token_ids, skip_special_tokens=True)
                if j == self.work.k:
                    self.greedy_texts[i] = text
                self.verify.put(f.request_id, text, p.answer, p.fields)
        for rid, score in self.verify.results(0.0):
            self.unscored -= 1
            i, j = divmod(rid, k1)
            if j == self.work.k:
                self.greedy[i] = bool(score.acc)
            else:
                self.correct[i] += bool(score.acc)

    def result(self, actor_id: int) -> EvalResult:
        return EvalResult(protocol_version=PROTOCOL_VERSION,
                          policy_version=self.work.policy_version, eval_id=self.work.eval_id,
                          actor_id=actor_id, correct=self.correct, greedy=self.greedy,
                          greedy_texts=self.greedy_texts,
                          tokens=self.tokens, seconds=time.perf_counter() - self.t0)

    def close(self) -> None:
        self.verify.close()
        self.engine.close()


def refusal(work: EvalWork, actor_id: int, why: str, version: int) -> EvalResult:
    """The answer to an evaluation this actor cannot run at its version (`why` says so)."""
    return EvalResult(protocol_version=PROTOCOL_VERSION, policy_version=version,
                      eval_id=work.eval_id, actor_id=actor_id, correct=[], greedy=[], error=why)
