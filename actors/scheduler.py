"""Per-prompt rollout scheduling at the actor: a state machine, with no engine in it.

The actor loop (actors/worker.py) feeds it events and carries out what it returns:
  add_work(work)            -> the first requests of every prompt of a work item
  finished(f)               -> the response goes to the verifier (off the decode loop)
  verified(request_id, score) -> maybe: siblings to abort, the prompt's next stage, a done group
  aborted(a, resubmit)      -> an aborted request's tokens are counted; with `resubmit` (a weight
                               sync under `actors.inflight_update: abort`) the sample is asked
                               for again under the new weights
  interrupted(a)            -> a weight sync under `recompute` stopped the request: the sample
                               goes on from its partial response, a new request whose prompt is
                               prompt + partial (re-prefilled under the new weights); when it
                               finishes, the partial and the rest are one response
Every call returns `Actions`: requests to submit, requests to abort, responses to verify and
prompts whose group is complete. One request is one sample.

Per-prompt stages: a prompt's next stage is submitted the moment its current stage is verified,
without waiting for the other prompts of its work item. The rollout policies (docs/ALGORITHMS.md):
  fixed           - one stage of `Prompt.n` samples (GRPO, DAPO, Mu-GRPO);
  stop_on_correct - AR3PO (3.2): stage s has stage_sizes[s] samples; a prompt stops at the first
                    stage that gives it a correct response;
  aero            - AERO (4.4): an exploration stage of aero_explore samples, then rescue rounds
                    of aero_rescue_step for a prompt with at most aero_rescue_threshold correct,
                    until its first correct response, aero_max_rounds rounds or
                    aero_max_per_prompt samples, each round paid from the work item's pooled
                    budget (aero_rescue_budget_per_prompt x its prompts) when it is submitted:
                    first come, first served, where the batch version visited the failing
                    prompts in random order;
  hora            - HORA (7.3): the work item's budget (hora_budget_per_prompt x its prompts)
                    allocated by hit utility under each prompt's posterior counts, one stage;
                    two-phase: a probe of hora_k_min each, then, once every probe of the work
                    item is verified (the allocation needs them all: the one barrier left),
                    the rest to the prompts the probe missed (actors/allocation.py).

Abort on first correct (`abort_on_first_correct`, for the stages that stop at a correct answer:
every AR3PO stage, AERO's rescue rounds, HORA's second phase, where a hit leaves a prompt no
residual hit utility): once a prompt has a verified correct response, its samples still decoding
in that stage are aborted. The group is the prompt's finished samples;
so that it still has a baseline, the abort waits until at least `min_group` (2) samples have
finished. Aborted partial responses are counted (Group.aborted_*) and never sent. With the
switch off a stage runs all its samples, as the batch rollout did.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from actors.allocation import hora_allocate, hora_second_phase
from protocol.messages import Prompt, RolloutSpec, Sample, Work
from tasks.rewards import Score
from tasks.sampling import Aborted, Finished, extend_version_runs


@dataclass(frozen=True)
class SampleRequest:
    request_id: int
    prompt_token_ids: list[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    restarts: int = 0  # times this sample was aborted by a weight sync and asked for again


@dataclass(frozen=True)
class PromptResult:
    """A prompt whose group is complete: what the actor sends as a `Group`."""

    work_id: str
    prompt: Prompt
    samples: list[Sample]
    aborted_samples: int
    aborted_tokens: int
    saved_tokens_est: int
    gen_time_s: float


@dataclass
class Actions:
    submit: list[SampleRequest] = field(default_factory=list)
    abort: list[int] = field(default_factory=list)
    # request id, tokens, answer, the prompt's fields
    verify: list[tuple[int, list[int], str, dict]] = field(default_factory=list)
    done: list[PromptResult] = field(default_factory=list)

    def merge(self, other: "Actions") -> "Actions":
        self.submit += other.submit
        self.abort += other.abort
        self.verify += other.verify
        self.done += other.done
        return self


@dataclass
class _Work:
    work: Work
    budget: int  # AERO's pooled rescue budget left (responses)
    parked: dict[int, "_Prompt"] = field(default_factory=dict)  # HORA: probes done, by index


@dataclass
class _Prompt:
    work: _Work
    prompt: Prompt
    index: int  # in its work item
    stage: int = 0
    rounds: int = 0  # AERO rescue rounds started
    in_flight: set[int] = field(default_factory=set)  # decoding
    unverified: dict[int, Finished] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    stopping: bool = False  # a correct answer is in: no more samples in this stage or later
    aborted_samples: int = 0
    aborted_tokens: int = 0
    saved_tokens_est: int = 0
    compute_s: float = 0.0

    @property
    def spec(self) -> RolloutSpec:
        return self.work.work.rollout

    def finished_count(self) -> int:
        return len(self.samples) + len(self.unverified)


class RolloutScheduler:
    def __init__(self, abort_on_first_correct: bool = False, min_group: int = 2):
        self.abort_on_first_correct = abort_on_first_correct
        self.min_group = min_group
        self._next_id = 0
        self._owner: dict[int, _Prompt] = {}  # request id -> its prompt, while in flight/unverified
        self._restarts: dict[int, int] = {}  # request id -> restarts, where > 0 (in flight)
        self._partial: dict[int, Aborted] = {}  # request id -> the response it continues

    # -- events -------------------------------------------------------------------------------
    def add_work(self, work: Work) -> Actions:
        w = _Work(work, work.rollout.aero_rescue_budget_per_prompt * len(work.prompts))
        acts = Actions()
        for i, n in enumerate(first_stage_sizes(work)):
            acts.merge(self._start_stage(_Prompt(w, work.prompts[i], i), n))
        return acts

    def finished(self, f: Finished) -> Actions:
        p = self._owner[f.request_id]
        self._restarts.pop(f.request_id, None)
        if (head := self._partial.pop(f.request_id, None)) is not None:
            f = _joined(head, f)
        p.in_flight.discard(f.request_id)
        p.unverified[f.request_id] = f
        p.compute_s += f.compute_s
        acts = Actions(verify=[(f.request_id, f.token_ids, p.prompt.answer, p.prompt.fields)])
        return acts.merge(self._maybe_abort_siblings(p))

    def verified(self, request_id: Hashable, score: Score | bool) -> Actions:
        """`score`: the reward function's (a bare verdict counts as reward 0 or 1)."""
        if not isinstance(score, Score):
            score = Score.of_acc(score)
        p = self._owner.pop(request_id)
        f = p.unverified.pop(request_id)
        runs = [(int(v), int(n)) for v, n in f.version_runs]  # engines tag every token
        p.samples.append(Sample(token_ids=f.token_ids, logprobs=f.logprobs,
                                policy_version=runs[0][0], reward=score.reward, acc=score.acc,
                                truncated=f.truncated, stage=p.stage, version_runs=runs,
                                scores=score.scores, reward_error=score.error is not None))
        return self._maybe_abort_siblings(p).merge(self._maybe_end_stage(p))

    def aborted(self, a: Aborted, resubmit: bool = False) -> Actions:
        """`a` was aborted: by `Actions.abort` (a sibling was correct), or with `resubmit` by a
        weight sync under `inflight_update: abort` (asked for again unless the prompt stops)."""
        p = self._owner.pop(a.request_id, None)
        restarts = self._restarts.pop(a.request_id, 0)
        if (head := self._partial.pop(a.request_id, None)) is not None:
            a = _joined_aborted(head, a)  # a continuation: its partial is lost with it
        if p is None:
            return Actions()
        p.in_flight.discard(a.request_id)
        p.aborted_samples += 1
        p.aborted_tokens += a.tokens
        p.compute_s += a.compute_s
        if p.stopping:  # a sibling of a correct answer: what it would still have generated
            done = [len(s.token_ids) for s in p.samples if s.stage == p.stage]
            done += [len(f.token_ids) for f in p.unverified.values()]
            mean = sum(done) / len(done) if done else a.tokens + 1
            p.saved_tokens_est += max(round(mean) - a.tokens, 1)
        elif resubmit:
            return self._submit(p, 1, restarts=restarts + 1)
        return self._maybe_end_stage(p)

    def interrupted(self, a: Aborted) -> Actions:
        """A weight sync under `recompute` stopped `a`: its sample goes on from the partial
        response under the new weights (the request is held by the caller until they are in)."""
        p = self._owner.get(a.request_id)
        if p is None or p.stopping:  # a sibling of a correct answer: stopped anyway
            return self.aborted(a, resubmit=True)
        head = self._partial.pop(a.request_id, None)
        if a.token_ids:
            head = a if head is None else _joined_aborted(head, a)
        if head is not None and len(head.token_ids) >= p.spec.max_new_tokens:  # kept whole
            return self.finished(Finished(a.request_id, list(head.token_ids),
                                          list(head.logprobs), list(head.version_runs), True,
                                          head.compute_s))
        del self._owner[a.request_id]
        p.in_flight.discard(a.request_id)
        self._restarts.pop(a.request_id, None)
        return self._submit(p, 1, head=head)  # its compute time travels with `head`

    # -- state --------------------------------------------------------------------------------
    def in_flight(self) -> int:
        """Requests submitted and not yet finished or aborted."""
        return sum(len(p.in_flight) for p in {id(p): p for p in self._owner.values()}.values())

    def open_prompts(self) -> int:
        return len({id(p) for p in self._owner.values()})

    def stage(self, request_id: Hashable) -> int:
        """The sampling stage of the prompt a request in flight belongs to."""
        return self._owner[request_id].stage

    # -- stages -------------------------------------------------------------------------------
    def _start_stage(self, p: _Prompt, n: int) -> Actions:
        if n <= 0:
            return self._done(p)
        return self._submit(p, n)

    def _submit(self, p: _Prompt, n: int, restarts: int = 0, head: Aborted | None = None
                ) -> Actions:
        """n requests of prompt `p`; with `head`, one that continues that partial response."""
        spec = p.spec
        prompt, max_new = p.prompt.prompt_token_ids, spec.max_new_tokens
        if head is not None:
            prompt, max_new = [*prompt, *head.token_ids], max_new - len(head.token_ids)
        acts = Actions()
        for _ in range(n):
            rid = self._next_id
            self._next_id += 1
            self._owner[rid] = p
            p.in_flight.add(rid)
            if restarts:
                self._restarts[rid] = restarts
            if head is not None:
                self._partial[rid] = head
            acts.submit.append(SampleRequest(rid, prompt, max_new, spec.temperature, spec.top_p,
                                             restarts))
        return acts

    def restarts(self, request_id: Hashable) -> int:
        """Times the sample behind `request_id` was aborted by a weight sync and asked again."""
        return self._restarts.get(request_id, 0)

    def _maybe_abort_siblings(self, p: _Prompt) -> Actions:
        if (not self.abort_on_first_correct or p.stopping or not p.in_flight
                or not stops_at_correct(p.spec, p.stage)
                or not any(s.acc for s in p.samples if s.stage == p.stage)
                or p.finished_count() < self.min_group):
            return Actions()
        p.stopping = True
        return Actions(abort=sorted(p.in_flight))

    def _maybe_end_stage(self, p: _Prompt) -> Actions:
        if p.in_flight or p.unverified:
            return Actions()
        spec = p.spec
        if spec.strategy == "hora" and spec.hora_two_phase and p.stage == 0:
            return self._park_for_second_phase(p)
        n = 0 if p.stopping else self._next_stage_size(p)
        if n > 0:
            p.stage += 1
        return self._start_stage(p, n)

    def _park_for_second_phase(self, p: _Prompt) -> Actions:
        """HORA two-phase: the rest is allocated once every probe of the work item is in."""
        w = p.work
        w.parked[p.index] = p
        prompts = w.work.prompts
        if len(w.parked) < len(prompts):
            return Actions()
        spec, k_min = w.work.rollout, w.work.rollout.hora_k_min
        probes = [w.parked[i] for i in range(len(prompts))]
        rest = hora_second_phase([(q.prior_correct, q.prior_incorrect) for q in prompts],
                                 [sum(s.acc for s in q.samples) for q in probes], k_min,
                                 (spec.hora_budget_per_prompt - k_min) * len(prompts),
                                 spec.hora_k_max - k_min)
        w.parked = {}
        acts = Actions()
        for q, n in zip(probes, rest):
            q.stage = 1
            acts.merge(self._start_stage(q, n))
        return acts

    def _next_stage_size(self, p: _Prompt) -> int:
        spec, accs = p.spec, [s.acc for s in p.samples]
        match spec.strategy:
            case "fixed" | "hora":
                return 0
            case "stop_on_correct":
                more = p.stage + 1 < len(spec.stage_sizes) and not any(accs)
                return spec.stage_sizes[p.stage + 1] if more else 0
            case "aero":
                failing = (sum(accs) <= spec.aero_rescue_threshold if p.stage == 0
                           else not any(accs))
                step = spec.aero_rescue_step
                if (failing and p.rounds < spec.aero_max_rounds and p.work.budget >= step
                        and len(accs) + step <= spec.aero_max_per_prompt):
                    p.rounds += 1
                    p.work.budget -= step
                    return step
                return 0
        raise AssertionError(spec.strategy)

    def _done(self, p: _Prompt) -> Actions:
        return Actions(done=[PromptResult(p.work.work.work_id, p.prompt, p.samples,
                                          p.aborted_samples, p.aborted_tokens,
                                          p.saved_tokens_est, p.compute_s)])


def first_stage_sizes(work: Work) -> list[int]:
    """Samples each prompt of `work` gets in its first stage."""
    spec, prompts = work.rollout, work.prompts
    match spec.strategy:
        case "fixed":
            return [p.n for p in prompts]
        case "stop_on_correct":
            return [spec.stage_sizes[0]] * len(prompts)
        case "aero":
            return [spec.aero_explore] * len(prompts)
        case "hora" if spec.hora_two_phase:
            return [spec.hora_k_min] * len(prompts)
        case "hora":
            return hora_allocate([(p.prior_correct, p.prior_incorrect) for p in prompts],
                                 spec.hora_budget_per_prompt * len(prompts), spec.hora_k_min,
                                 spec.hora_k_max)
    raise ValueError(f"rollout strategy {spec.strategy!r} is not available in this actor")


def stops_at_correct(spec: RolloutSpec, stage: int) -> bool:
    """Does this stage end at a prompt's first correct response? AR3PO: every stage; AERO: the
    rescue rounds, not the exploration whose success count sets the strata; HORA two-phase: the
    second phase (a hit leaves the prompt no residual hit utility)."""
    match spec.strategy:
        case "stop_on_correct":
            return True
        case "aero":
            return stage > 0
        case "hora":
            return spec.hora_two_phase and stage > 0
        case _:
            return False


def _joined(head: Aborted, rest: Finished) -> Finished:
    """One response from a partial one and the request that continued it."""
    return Finished(rest.request_id, [*head.token_ids, *rest.token_ids],
                    [*head.logprobs, *rest.logprobs], _joined_runs(head, rest), rest.truncated,
                    head.compute_s + rest.compute_s)


def _joined_aborted(head: Aborted, rest: Aborted) -> Aborted:
    return Aborted(rest.request_id, head.tokens + rest.tokens, head.compute_s + rest.compute_s,
                   (*head.token_ids, *rest.token_ids), (*head.logprobs, *rest.logprobs),
                   tuple(_joined_runs(head, rest)))


def _joined_runs(head: Aborted, rest: Finished | Aborted) -> list[tuple[int, int]]:
    runs = [tuple(r) for r in head.version_runs]
    for version, n in rest.version_runs:
        extend_version_runs(runs, version, n)
    return runs
