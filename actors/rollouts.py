"""The actor's generation, one decode step at a time: engine, scheduler and verifier together.

`Rollouts` carries out what the per-prompt scheduler (actors/scheduler.py) asks: requests go to
the engine, finished responses to the verifier thread (actors/verify_queue.py), verdicts back
to the scheduler, aborts to the engine. The actor loop (actors/worker.py) calls `step()` between
its messages, so a weight sync waits at most one decode step to be noticed.

Weight updates while requests are in flight (`actors.inflight_update`, docs/ALGORITHMS.md 8.1):
  finish   - `hold()`: no new request starts (held until `release()`), the running ones decode to
             their end; the sync goes ahead once `engine.running()` is empty (the behaviour of
             the batch rollout, where a sync waited for the work item in progress);
  continue - the sync goes ahead between two decode steps; running requests keep decoding under
             the new weights (every token records the version that produced it; the KV cache
             keeps what the old weights computed, as PipelineRL does);
  abort    - `drop_in_flight()`: the running requests are aborted (their tokens count as
             generated, Group.aborted_tokens) and asked for again, held until the new weights
             are in;
  recompute - `interrupt_in_flight()`: the running requests stop but keep their tokens; each
             goes on as a request over prompt + partial response, held until the new weights
             are in, so its whole context is prefilled again by them (AReaL's interruption).
"""

from __future__ import annotations

import os

from actors.engines import Engine
from actors.scheduler import Actions, PromptResult, RolloutScheduler, SampleRequest
from actors.verify_queue import VerifyQueue
from protocol.messages import PROTOCOL_VERSION, EngineLoad, Group, Work
from tasks.sampling import Aborted
from tasks.verifier import Verifier


class Rollouts:
    def __init__(self, engine: Engine, tokenizer, verifier: Verifier | None,
                 abort_on_first_correct: bool = False, every_verdict: bool = False,
                 verify_queue: VerifyQueue | None = None):
        """`verify_queue`: where finished responses are scored (default: a VerifyQueue over
        `verifier`; the planner's simulated actor passes one that answers from its plan)."""
        self.engine, self.tokenizer = engine, tokenizer
        # run.deterministic: a step waits for every verdict outstanding, applied in request
        # order, so what the next decode step admits does not follow the verifier's timing
        self.every_verdict = every_verdict
        self.sched = RolloutScheduler(abort_on_first_correct)
        self.verify = verify_queue if verify_queue is not None else VerifyQueue(verifier)
        self.held: list[SampleRequest] = []
        self.holding = False
        self.decode_steps = 0  # engine steps so far (the actor logs how long a sync waited)
        self.busy_rows = 0  # summed over those steps: requests that got a token
        self._done: list[PromptResult] = []

    def add_work(self, work: Work) -> None:
        self._apply(self.sched.add_work(work))

    @property
    def busy(self) -> bool:
        """Prompts of this actor whose groups are not complete yet."""
        return self.sched.open_prompts() > 0

    @property
    def decoding(self) -> bool:
        """Requests the engine would decode at the next step."""
        return bool(self.engine.running()) or (self.engine.unfinished() > 0 and not self.holding)

    def step(self, wait_s: float = 0.0) -> list[PromptResult]:
        """One decode step if anything is decoding, then every verdict ready (waiting up to
        `wait_s` for one when nothing decodes; with `every_verdict`, for all outstanding);
        returns the prompts whose groups completed."""
        if self.decoding:
            self.decode_steps += 1
            for f in self.engine.step(admit=not self.holding):
                self._apply(self.sched.finished(f))
            self.busy_rows += self.engine.last_step_rows
        if self.verify.pending:
            verdicts = (sorted(self.verify.every_result(), key=lambda v: v[0])
                        if self.every_verdict else
                        self.verify.results(0.0 if self.decoding else wait_s))
            for rid, score in verdicts:
                self._apply(self.sched.verified(rid, score))
        done, self._done = self._done, []
        return done

    # -- weight syncs ---------------------------------------------------------------------------
    def hold(self) -> None:
        """No request starts until `release()` (the running ones go on)."""
        self.holding = True

    def drop_in_flight(self, abort_limit: int | None = None) -> int:
        """Abort the running requests and ask for each sample again, held until `release()`;
        one already asked again `abort_limit` times decodes on instead (None: abort all).
        Returns how many were dropped."""
        self.holding = True
        running = self.engine.running()
        if abort_limit is not None:
            running = [rid for rid in running if self.sched.restarts(rid) < abort_limit]
        dropped = self.engine.abort(running)
        for a in dropped:
            self._apply(self.sched.aborted(a, resubmit=True))
        return len(dropped)

    def interrupt_in_flight(self) -> int:
        """Stop the running requests, keeping what each has sampled: every one goes on as a new
        request over prompt + partial response, held until `release()` so that the new weights
        re-prefill it (`recompute`). Returns how many were stopped."""
        self.holding = True
        stopped = self.engine.abort(self.engine.running())
        for a in stopped:
            self._apply(self.sched.interrupted(a))
        return len(stopped)

    def release(self) -> None:
        self.holding = False
        held, self.held = self.held, []
        for req in held:
            self._add(req)

    # -- plumbing -------------------------------------------------------------------------------
    def _apply(self, acts: Actions) -> None:
        for req in acts.submit:
            if self.holding:
                self.held.append(req)
            else:
                self._add(req)
        if acts.abort:
            # held ones (a sync is on) are not in the engine yet: stopped here, nothing sampled
            stop = set(acts.abort)
            held = [r.request_id for r in self.held if r.request_id in stop]
            self.held = [r for r in self.held if r.request_id not in stop]
            for rid in held:
                self._apply(self.sched.aborted(Aborted(rid, 0)))
            for a in self.engine.abort(acts.abort):
                self._apply(self.sched.aborted(a))
        for rid, token_ids, answer, fields in acts.verify:
            self.verify.put(rid, self.tokenizer.decode(token_ids, skip_special_tokens=True),
                            answer, fields)
        self._done += acts.done

    def _add(self, req: SampleRequest) -> None:
        self.engine.add(req.request_id, req.prompt_token_ids, req.max_new_tokens,
                        req.temperature, req.top_p)

    def close(self) -> None:
        self.verify.close()


def engine_load(rollouts: Rollouts) -> EngineLoad:
    return EngineLoad(decode_steps=rollouts.decode_steps,
                      busy_rows=rollouts.busy_rows, max_rows=rollouts.engine.max_rows,
                      prefix_cache_resets_refused=rollouts.engine.prefix_cache_resets_refused,
                      process=os.getpid())


def to_group(r: PromptResult, actor_id: int, version: int,
             load: EngineLoad | None = None) -> Group:
    return Group(protocol_version=PROTOCOL_VERSION, policy_version=version, engine_load=load,
                 group_id=r.prompt.group_id, prompt_id=r.prompt.prompt_id, actor_id=actor_id,
                 work_id=r.work_id, prompt_token_ids=r.prompt.prompt_token_ids,
                 samples=r.samples, gen_time_s=r.gen_time_s, aborted_samples=r.aborted_samples,
                 aborted_tokens=r.aborted_tokens, saved_tokens_est=r.saved_tokens_est)
