"""The per-prompt rollout scheduler (actors/scheduler.py), driven as the actor loop drives it.

A scripted engine decides each sample's length and verdict: sample k of prompt p (in the order
they were asked for) takes `length(p, k)` decode steps and is correct iff `correct(p, k)`.
Verdicts come back `verify_delay` decode steps after a response finishes, as they do from the
verifier thread. So each test states exactly when what finishes.
"""

from __future__ import annotations

from actors.scheduler import Actions, RolloutScheduler
from protocol.messages import Prompt, RolloutSpec, Work
from tasks.sampling import Aborted, Finished


class Sim:
    def __init__(self, sched: RolloutScheduler, correct, length=lambda p, k: 3,
                 verify_delay: int = 0):
        self.sched, self.correct, self.length, self.delay = sched, correct, length, verify_delay
        self.running: dict[int, list] = {}  # request id -> [prompt, k, tokens so far]
        self.asked: dict[int, int] = {}  # prompt -> samples asked for
        self.verdicts: list[tuple[int, int, bool]] = []  # (due step, request id, ok)
        self.results, self.aborted, self.step_no = {}, [], 0
        self.submitted_at: list[tuple[int, int, int]] = []  # (step, prompt, stage)

    def apply(self, acts: Actions) -> None:
        for req in acts.submit:
            p = req.prompt_token_ids[0]
            k = self.asked.get(p, 0)
            self.asked[p] = k + 1
            self.running[req.request_id] = [p, k, 0]
            self.submitted_at.append((self.step_no, p, self.sched._owner[req.request_id].stage))
        for rid in acts.abort:
            p, k, n = self.running.pop(rid)
            self.aborted.append((p, k, n))
            self.apply(self.sched.aborted(Aborted(rid, n)))
        for rid, *_ in acts.verify:
            p, k = self.finished_pk[rid]
            self.verdicts.append((self.step_no + self.delay, rid, self.correct(p, k)))
        for r in acts.done:
            self.results[r.prompt.prompt_token_ids[0]] = r

    def run(self, work: Work, max_steps: int = 500) -> dict:
        self.finished_pk = {}
        self.apply(self.sched.add_work(work))
        while (self.running or self.verdicts) and self.step_no < max_steps:
            self.step_no += 1
            for state in self.running.values():  # one decode step for every running sample
                state[2] += 1
            ended = [(rid, s) for rid, s in self.running.items() if s[2] == self.length(*s[:2])]
            for rid, (p, k, n) in ended:
                del self.running[rid]
                self.finished_pk[rid] = (p, k)
                self.apply(self.sched.finished(Finished(rid, [7] * n, [-0.5] * n, [(4, n)],
                                                        truncated=False, compute_s=0.01)))
            due = [v for v in self.verdicts if v[0] <= self.step_no]
            self.verdicts = [v for v in self.verdicts if v[0] > self.step_no]
            for _, rid, ok in due:
                self.apply(self.sched.verified(rid, ok))
        return self.results


def work(spec: RolloutSpec, n_prompts: int, n: int = 8) -> Work:
    prompts = [Prompt(group_id=f"g{i}", prompt_id=f"p{i}", prompt_token_ids=[i], answer="ok", n=n)
               for i in range(n_prompts)]
    return Work(protocol_version=1, policy_version=0, work_id="w1", prompts=prompts, rollout=spec)


def first_correct_at(first: dict[int, int | None]):
    """Sample k of prompt p is correct iff k >= first[p] (None: never)."""
    return lambda p, k: first[p] is not None and k >= first[p]


STAGED = RolloutSpec(strategy="stop_on_correct", max_new_tokens=16, stage_sizes=[2, 2, 4])


def stages(*sizes: int, max_new_tokens: int = 16) -> RolloutSpec:
    return RolloutSpec(strategy="stop_on_correct", max_new_tokens=max_new_tokens,
                       stage_sizes=list(sizes))


def test_fixed_gives_every_prompt_exactly_its_n_in_one_stage():
    sim = Sim(RolloutScheduler(abort_on_first_correct=True), first_correct_at({0: 0, 1: None}))
    out = sim.run(work(RolloutSpec(strategy="fixed", max_new_tokens=4), 2, n=5))
    assert [len(out[p].samples) for p in (0, 1)] == [5, 5]  # GRPO's groups are never cut short
    assert all(s.stage == 0 and s.policy_version == 4 for s in out[0].samples)
    assert sim.aborted == []


def test_staged_stops_a_prompt_at_the_stage_of_its_first_correct_response():
    sim = Sim(RolloutScheduler(), first_correct_at({0: 0, 1: 5, 2: None}))
    out = sim.run(work(STAGED, 3))
    assert [len(out[p].samples) for p in (0, 1, 2)] == [2, 8, 8]  # never more than sum(stages)
    assert [s.stage for s in out[1].samples] == [0, 0, 1, 1, 2, 2, 2, 2]
    assert [s.acc for s in out[1].samples][4:6] == [False, True]


def test_a_prompts_next_stage_starts_without_waiting_for_the_other_prompts():
    # prompt 0's samples take 2 steps, prompt 1's take 10: prompt 0 is in stage 2 long before
    # prompt 1 finishes stage 0
    sim = Sim(RolloutScheduler(), first_correct_at({0: None, 1: None}),
              length=lambda p, k: 2 if p == 0 else 10)
    out = sim.run(work(STAGED, 2))
    starts = {(p, stage): step for step, p, stage in sim.submitted_at}
    assert starts[(0, 1)] == 2 and starts[(0, 2)] == 4 and starts[(1, 1)] == 10
    assert len(out[0].samples) == len(out[1].samples) == 8


def test_siblings_of_a_first_correct_answer_are_aborted_and_counted():
    # stage of 4: sample 0 (correct) ends at step 2, sample 1 at 3, samples 2 and 3 need 9
    sim = Sim(RolloutScheduler(abort_on_first_correct=True), lambda p, k: k == 0,
              length=lambda p, k: [2, 3, 9, 9][k % 4])
    out = sim.run(work(stages(4, 4), 1))
    r = out[0]
    assert [s.acc for s in r.samples] == [True, False]  # the group: the finished samples
    assert sorted(sim.aborted) == [(0, 2, 3), (0, 3, 3)]  # stopped at step 3, 3 tokens each
    assert r.aborted_samples == 2 and r.aborted_tokens == 6
    # each would still have produced about the finished samples' mean length (2.5) - 3: >= 1
    assert r.saved_tokens_est == 2
    assert sim.step_no == 3  # nothing decoded after the abort


def test_the_abort_waits_until_the_group_has_a_baseline():
    # the correct sample finishes alone at step 2; the others would take 5, 9, 9 steps
    sim = Sim(RolloutScheduler(abort_on_first_correct=True), lambda p, k: k == 0,
              length=lambda p, k: [2, 5, 9, 9][k])
    out = sim.run(work(stages(4, 4), 1))
    assert len(out[0].samples) == 2 and sim.step_no == 5
    assert sorted(n for _, _, n in sim.aborted) == [5, 5]


def test_with_the_switch_off_a_stage_runs_all_its_samples():
    sim = Sim(RolloutScheduler(abort_on_first_correct=False), lambda p, k: k == 0,
              length=lambda p, k: [2, 3, 9, 9][k])
    out = sim.run(work(stages(4, 4), 1))
    assert len(out[0].samples) == 4 and sim.aborted == [] and out[0].aborted_tokens == 0


def test_siblings_decode_on_until_the_verdict_arrives():
    # verdicts take 3 steps: the siblings (length 20) are aborted 3 steps after the correct one
    sim = Sim(RolloutScheduler(abort_on_first_correct=True), lambda p, k: k == 0,
              length=lambda p, k: [2, 2, 20, 20][k], verify_delay=3)
    out = sim.run(work(stages(4, max_new_tokens=32), 1))
    assert len(out[0].samples) == 2
    assert sorted(n for _, _, n in sim.aborted) == [5, 5]


def test_a_sample_aborted_by_a_weight_sync_is_asked_for_again_in_its_stage():
    sched = RolloutScheduler(abort_on_first_correct=True)
    acts = sched.add_work(work(RolloutSpec(strategy="stop_on_correct", max_new_tokens=8,
                                           stage_sizes=[2, 2]), 1))
    first, second = (r.request_id for r in acts.submit)
    again = sched.aborted(Aborted(first, tokens=3), resubmit=True)
    assert len(again.submit) == 1 and again.submit[0].request_id not in (first, second)
    for rid in (second, again.submit[0].request_id):
        sched.finished(Finished(rid, [7, 7], [-1.0, -1.0], [(1, 2)], truncated=False))
    sched.verified(second, False)
    done = sched.verified(again.submit[0].request_id, True).done
    assert len(done) == 1 and len(done[0].samples) == 2
    assert done[0].aborted_samples == 1 and done[0].aborted_tokens == 3
    assert done[0].saved_tokens_est == 0  # not a first-correct abort
    assert sched.open_prompts() == 0


def test_a_sample_interrupted_twice_goes_on_from_its_partial_response_and_is_one_sample():
    # recompute: each interruption asks for the rest over prompt + partial response; the
    # sample trained is the partial responses and the rest, with the versions that sampled them
    sched = RolloutScheduler()
    (req,) = sched.add_work(work(RolloutSpec(strategy="fixed", max_new_tokens=10), 1, n=1)).submit
    first = sched.interrupted(Aborted(req.request_id, 3, 0.1, (5, 6, 7), (-1.0, -2.0, -3.0),
                                      ((0, 3),)))
    (cont,) = first.submit
    assert cont.prompt_token_ids == [0, 5, 6, 7] and cont.max_new_tokens == 7
    second = sched.interrupted(Aborted(cont.request_id, 2, 0.1, (8, 9), (-4.0, -5.0), ((1, 2),)))
    (last,) = second.submit
    assert last.prompt_token_ids == [0, 5, 6, 7, 8, 9] and last.max_new_tokens == 5
    acts = sched.finished(Finished(last.request_id, [4, 2], [-6.0, -7.0], [(2, 1), (3, 1)],
                                   truncated=False, compute_s=0.1))
    assert acts.verify == [(last.request_id, [5, 6, 7, 8, 9, 4, 2], "ok", {})]
    (done,) = sched.verified(last.request_id, True).done
    (sample,) = done.samples
    assert sample.token_ids == [5, 6, 7, 8, 9, 4, 2]
    assert sample.logprobs == [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0]
    assert sample.version_runs == [(0, 3), (1, 2), (2, 1), (3, 1)] and sample.policy_version == 0
    assert done.aborted_samples == done.aborted_tokens == 0  # nothing thrown away
    assert sched.open_prompts() == 0


def aero_spec(**kw) -> RolloutSpec:
    fields = dict(strategy="aero", max_new_tokens=4, aero_explore=4, aero_rescue_step=2,
                  aero_max_rounds=10, aero_max_per_prompt=32, aero_rescue_budget_per_prompt=4)
    return RolloutSpec(**(fields | kw))


def test_aero_rescues_all_fail_prompts_round_by_round_until_their_first_success():
    sim = Sim(RolloutScheduler(), first_correct_at({0: 0, 1: 5, 2: None}))
    out = sim.run(work(aero_spec(), 3))
    assert len(out[0].samples) == 4  # explored, had a success: no rescue
    assert [s.stage for s in out[1].samples] == [0, 0, 0, 0, 1, 1]  # rescued in round 1
    assert out[1].samples[5].acc
    # the pooled budget (4 per prompt x 3 prompts = 12) is spent on the hopeless prompt
    assert len(out[2].samples) == 4 + 12 - 2


def test_aero_exploration_is_never_cut_short_but_rescue_rounds_stop_at_a_correct_answer():
    # prompt 0: every sample correct; prompt 1: explore fails, the first rescue sample is right
    lengths = lambda p, k: 2 if k % 2 == 0 else 6  # noqa: E731
    sim = Sim(RolloutScheduler(abort_on_first_correct=True),
              lambda p, k: p == 0 or k >= 4, length=lengths)
    out = sim.run(work(aero_spec(aero_rescue_step=4), 2))
    assert len(out[0].samples) == 4  # all of the exploration
    assert [s.stage for s in out[1].samples] == [0, 0, 0, 0, 1, 1]
    assert out[1].aborted_samples == 2


def test_aero_never_exceeds_the_per_prompt_cap_or_the_round_limit():
    out = Sim(RolloutScheduler(), first_correct_at({0: None, 1: None})).run(
        work(aero_spec(aero_max_per_prompt=8, aero_rescue_budget_per_prompt=100), 2))
    assert [len(out[p].samples) for p in (0, 1)] == [8, 8]
    out = Sim(RolloutScheduler(), first_correct_at({0: None})).run(
        work(aero_spec(aero_max_rounds=1, aero_rescue_budget_per_prompt=100), 1))
    assert len(out[0].samples) == 4 + 2


def test_aero_pays_rescue_rounds_from_the_pool_first_come_first_served():
    # pool of 3 pays one 2-response round: the prompt whose exploration ends first gets it
    sim = Sim(RolloutScheduler(), first_correct_at({0: None, 1: None, 2: None}),
              length=lambda p, k: 1 + p)
    out = sim.run(work(aero_spec(aero_rescue_budget_per_prompt=1), 3))
    assert [len(out[p].samples) for p in (0, 1, 2)] == [6, 4, 4]


def test_aero_with_a_threshold_also_rescues_prompts_with_few_successes():
    out = Sim(RolloutScheduler(), first_correct_at({0: 3, 1: 0})).run(
        work(aero_spec(aero_rescue_threshold=1), 2))  # prompt 0: 1 of 4 correct; 1: 4 of 4
    assert len(out[0].samples) == 6 and len(out[1].samples) == 4


def work_with_priors(spec: RolloutSpec, priors: list[tuple[float, float]]) -> Work:
    prompts = [Prompt(group_id=f"g{i}", prompt_id=f"p{i}", prompt_token_ids=[i], answer="ok", n=8,
                      prior_correct=c, prior_incorrect=f) for i, (c, f) in enumerate(priors)]
    return Work(protocol_version=1, policy_version=0, work_id="w1", prompts=prompts, rollout=spec)


def hora_spec(**kw) -> RolloutSpec:
    fields = dict(strategy="hora", max_new_tokens=4, hora_budget_per_prompt=8, hora_k_min=2,
                  hora_k_max=32)
    return RolloutSpec(**(fields | kw))


def test_hora_allocates_the_work_items_budget_by_the_posterior_counts_in_one_stage():
    sim = Sim(RolloutScheduler(), first_correct_at({0: None, 1: 0, 2: None, 3: 0}))
    out = sim.run(work_with_priors(hora_spec(), [(0, 40), (40, 0), (2, 2), (0, 0)]))
    sizes = [len(out[p].samples) for p in range(4)]
    assert sum(sizes) == 8 * 4 and min(sizes) >= 2 and max(sizes) <= 32  # budget N per prompt
    assert sizes[1] == 2  # a solved prompt is already sure to hit: only k_min
    assert {stage for _, _, stage in sim.submitted_at} == {0}


def test_hora_two_phase_probes_k_min_then_spends_the_rest_on_prompts_the_probe_missed():
    # prompts 0 and 2 hit in the probe; 1 never hits; 3 would hit at its 3rd response. Prompt
    # 0's probe is slow: the rest is allocated only when every probe is in.
    sim = Sim(RolloutScheduler(), first_correct_at({0: 0, 1: None, 2: 1, 3: 2}),
              length=lambda p, k: 9 if p == 0 else 2)
    out = sim.run(work_with_priors(hora_spec(hora_two_phase=True), [(0, 0)] * 4))
    second = [(step, p) for step, p, stage in sim.submitted_at if stage == 1]
    assert {p for _, p in second} == {1, 3} and min(step for step, _ in second) == 9
    assert len(second) == 8 * 4 - 2 * 4  # the whole rest of the budget
    assert [len(out[p].samples) for p in (0, 2)] == [2, 2]
    assert [s.stage for s in out[3].samples][:3] == [0, 0, 1]


def test_hora_two_phase_samples_nothing_more_when_every_probe_hit():
    sim = Sim(RolloutScheduler(), first_correct_at({0: 0, 1: 1}))
    out = sim.run(work_with_priors(hora_spec(hora_two_phase=True), [(0, 0)] * 2))
    assert [len(out[p].samples) for p in (0, 1)] == [2, 2]


def test_stopping_samples_held_through_a_sync_takes_them_out_of_the_hold(tmp_path):
    # a first correct answer's verdict can arrive while a sync holds the prompt's other samples
    # (recompute puts every running sample there): they must stop, not start after the sync
    from transformers import AutoModelForCausalLM

    from tasks.hf_engine import HFEngine
    from actors.rollouts import Rollouts
    from tasks.tiny_model import build_tiny
    from tasks.verifier import Verifier

    path = build_tiny(tmp_path / "m", hidden=32, layers=1, heads=2, ffn=64, seed=0)
    rollouts = Rollouts(HFEngine(AutoModelForCausalLM.from_pretrained(path)), None,
                        Verifier(5.0), abort_on_first_correct=True)
    try:
        rollouts.hold()
        rollouts.add_work(work(RolloutSpec(strategy="stop_on_correct", max_new_tokens=8,
                                           stage_sizes=[8]), 1))
        held = [r.request_id for r in rollouts.held]
        assert len(held) == 8
        rollouts._apply(Actions(abort=held[:3]))
        assert [r.request_id for r in rollouts.held] == held[3:]
        assert rollouts.sched.in_flight() == 5
    finally:
        rollouts.close()
