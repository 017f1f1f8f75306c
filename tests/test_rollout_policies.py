"""Rollout policies at the actor (actors/rollout.py): fixed-N, AR3PO stages, AERO rescue, HORA.

A scripted engine decides, per prompt, which of its successive samples are correct; the verifier
compares decoded text with the answer. So each test states exactly when a prompt first succeeds.
"""

from actors.engines import Completion
from actors.rollout import sample_work
from protocol.messages import Prompt, RolloutSpec, Work

RIGHT, WRONG = 1, 2  # token ids the fake tokenizer decodes to a right / wrong answer


class Tokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "\\boxed{ok}" if ids[:1] == [RIGHT] else "\\boxed{no}"


class Verifier:
    def score(self, texts, answers):
        return [t == "\\boxed{" + a + "}" for t, a in zip(texts, answers)]


class ScriptedEngine:
    """Prompt p's k-th sample overall is correct iff k is in `first_correct_at[p]`'s range:
    every sample from index first_correct_at[p] on is correct (None: never)."""

    def __init__(self, first_correct_at: dict[int, int | None]):
        self.first = first_correct_at
        self.sampled = {p: 0 for p in first_correct_at}
        self.calls: list[dict[int, int]] = []  # per engine call: prompt -> samples asked

    def generate(self, prompts, n, max_new_tokens, temperature=1.0, top_p=1.0):
        self.calls.append({p[0]: k for p, k in zip(prompts, n)})
        out = []
        for p, k in zip(prompts, n):
            pid, cs = p[0], []
            for _ in range(k):
                first = self.first[pid]
                ok = first is not None and self.sampled[pid] >= first
                cs.append(Completion([RIGHT if ok else WRONG], [-0.5], truncated=False))
                self.sampled[pid] += 1
            out.append(cs)
        return out


def work(spec: RolloutSpec, n_prompts: int, n: int = 8, priors=None) -> Work:
    priors = priors or [(0.0, 0.0)] * n_prompts
    prompts = [Prompt(group_id=f"g{i}", prompt_id=f"p{i}", prompt_token_ids=[i], answer="ok", n=n,
                      prior_correct=priors[i][0], prior_incorrect=priors[i][1])
               for i in range(n_prompts)]
    return Work(protocol_version=1, policy_version=0, work_id="w1", prompts=prompts, rollout=spec)


def run(engine, spec, n_prompts, n=8, priors=None):
    groups = sample_work(engine, Tokenizer(), Verifier(), work(spec, n_prompts, n, priors), 0,
                         version=3)
    return {int(g.prompt_id[1:]): g.samples for g in groups}


def test_fixed_gives_every_prompt_exactly_its_n_in_one_engine_call():
    engine = ScriptedEngine({0: 0, 1: None})
    groups = run(engine, RolloutSpec(strategy="fixed", max_new_tokens=4), 2, n=5)
    assert [len(groups[p]) for p in (0, 1)] == [5, 5]
    assert len(engine.calls) == 1
    assert all(s.policy_version == 3 and s.stage == 0 for s in groups[0])


def test_stop_on_correct_stops_a_prompt_at_the_stage_of_its_first_correct_response():
    engine = ScriptedEngine({0: 0, 1: 5, 2: None})
    spec = RolloutSpec(strategy="stop_on_correct", max_new_tokens=4, stage_sizes=[2, 2, 4])
    groups = run(engine, spec, 3)
    assert [len(groups[p]) for p in (0, 1, 2)] == [2, 8, 8]  # never more than sum(stages)
    assert [s.stage for s in groups[1]] == [0, 0, 1, 1, 2, 2, 2, 2]
    assert [s.acc for s in groups[1]][4:6] == [False, True]


def test_stop_on_correct_makes_one_engine_call_per_stage_over_the_still_active_prompts():
    engine = ScriptedEngine({0: 0, 1: 3, 2: None})
    run(engine, RolloutSpec(strategy="stop_on_correct", max_new_tokens=4, stage_sizes=[2, 2, 4]), 3)
    assert engine.calls == [{0: 2, 1: 2, 2: 2}, {1: 2, 2: 2}, {2: 4}]


def aero_spec(**kw) -> RolloutSpec:
    fields = dict(strategy="aero", max_new_tokens=4, aero_explore=4, aero_rescue_step=2,
                  aero_max_rounds=10, aero_max_per_prompt=32, aero_rescue_budget_per_prompt=4)
    return RolloutSpec(**(fields | kw))


def test_aero_rescues_all_fail_prompts_round_by_round_until_their_first_success():
    engine = ScriptedEngine({0: 0, 1: 5, 2: None})
    groups = run(engine, aero_spec(), 3)
    assert len(groups[0]) == 4  # explored, had a success: no rescue
    assert [s.stage for s in groups[1]] == [0, 0, 0, 0, 1, 1]  # rescued in round 1
    assert groups[1][5].acc
    # the pooled budget (4 per prompt x 3 prompts = 12) is spent on the hopeless prompt
    assert len(groups[2]) == 4 + 12 - 2


def test_aero_never_exceeds_the_per_prompt_cap_or_the_round_limit():
    engine = ScriptedEngine({0: None, 1: None})
    groups = run(engine, aero_spec(aero_max_per_prompt=8, aero_rescue_budget_per_prompt=100), 2)
    assert [len(groups[p]) for p in (0, 1)] == [8, 8]
    engine = ScriptedEngine({0: None})
    groups = run(engine, aero_spec(aero_max_rounds=1, aero_rescue_budget_per_prompt=100), 1)
    assert len(groups[0]) == 4 + 2


def test_aero_spends_no_more_than_the_pooled_budget_in_a_partial_last_round():
    engine = ScriptedEngine({0: None, 1: None, 2: None})
    groups = run(engine, aero_spec(aero_rescue_budget_per_prompt=1), 3)  # pool of 3 pays one 2-response round
    rescued = sum(len(g) - 4 for g in groups.values())
    assert rescued == 2 and len(engine.calls) == 2


def test_aero_with_a_threshold_also_rescues_prompts_with_few_successes():
    engine = ScriptedEngine({0: 3, 1: 0})  # prompt 0: 1 of 4 correct; prompt 1: 4 of 4
    groups = run(engine, aero_spec(aero_rescue_threshold=1), 2)
    assert len(groups[0]) == 6 and len(groups[1]) == 4


def hora_spec(**kw) -> RolloutSpec:
    fields = dict(strategy="hora", max_new_tokens=4, hora_budget_per_prompt=8, hora_k_min=2,
                  hora_k_max=32)
    return RolloutSpec(**(fields | kw))


def test_hora_allocates_the_work_items_budget_by_the_posterior_counts_in_one_call():
    engine = ScriptedEngine({0: None, 1: 0, 2: None, 3: 0})
    priors = [(0, 40), (40, 0), (2, 2), (0, 0)]  # hard, solved, unsure, new
    groups = run(engine, hora_spec(), 4, priors=priors)
    sizes = [len(groups[p]) for p in range(4)]
    assert sum(sizes) == 8 * 4 and min(sizes) >= 2 and max(sizes) <= 32  # budget N per prompt
    assert sizes[1] == 2  # a solved prompt is already sure to hit: only k_min
    assert len(engine.calls) == 1


def test_hora_two_phase_probes_k_min_then_spends_the_rest_on_prompts_the_probe_missed():
    # prompts 0 and 2 hit in the probe; 1 never hits; 3 would hit at its 3rd response
    engine = ScriptedEngine({0: 0, 1: None, 2: 1, 3: 2})
    groups = run(engine, hora_spec(hora_two_phase=True), 4)
    assert engine.calls[0] == {0: 2, 1: 2, 2: 2, 3: 2}  # the probe: k_min each
    assert set(engine.calls[1]) == {1, 3}  # the rest: only the prompts without a hit
    assert sum(engine.calls[1].values()) == 8 * 4 - 2 * 4  # the whole rest of the budget
    assert [len(groups[p]) for p in (0, 2)] == [2, 2]
    assert [s.stage for s in groups[3]][:3] == [0, 0, 1] and groups[3][2].acc
    assert all(len(g) <= 32 for g in groups.values())


def test_hora_two_phase_samples_nothing_more_when_every_probe_hit():
    engine = ScriptedEngine({0: 0, 1: 1})
    groups = run(engine, hora_spec(hora_two_phase=True), 2)
    assert len(engine.calls) == 1 and [len(groups[p]) for p in (0, 1)] == [2, 2]
