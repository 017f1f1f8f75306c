"""From scored groups to loss rows per algorithm (learner/algorithms.py, learner/curation.py)
and what the learner hands out per prompt (learner/data.py). docs/ALGORITHMS.md sections in names."""

import json
import random

import pytest

from learner.algorithms import AlgorithmState, build_step
from learner.curation import aero_select, rescue_outcome, shaped_reward
from learner.data import PromptSource, responses_cap, rollout_spec
from learner.group_metrics import group_metrics
from protocol.config import Config, build
from protocol.messages import Group, Prompt, Sample
from protocol.config.presets import merge_under, preset


def config(algorithm: str = "grpo", *overrides: str) -> Config:
    return build(Config, merge_under(preset(algorithm), {"algorithm": algorithm}),
                 ["max_staleness=4", *overrides])


def sample(acc: bool, version: int = 0, stage: int = 0, length: int = 3, truncated=False):
    return Sample(token_ids=[7 + acc] * length, logprobs=[-0.5] * length, policy_version=version,
                  reward=float(acc), acc=acc, truncated=truncated, stage=stage)


def group(accs, prompt="p", gid="g", version=0, stages=None) -> Group:
    stages = stages or [0] * len(accs)
    return Group(protocol_version=1, policy_version=version, group_id=gid, prompt_id=prompt,
                 actor_id=0, work_id="w", prompt_token_ids=[1, 2],
                 samples=[sample(a, version, s) for a, s in zip(accs, stages)])


def step(cfg, groups, state=None, version=0, goldens=None):
    state = state or AlgorithmState(cfg)
    return build_step(groups, state, cfg, version, 0, goldens or {}), state


def test_grpo_trains_on_every_response_with_group_advantages():
    batch, _ = step(config("grpo"), [group([True] + [False] * 7)])
    assert len(batch.rows) == 8
    assert batch.rows[0].adv == pytest.approx(2.475, abs=1e-3)
    assert batch.metrics["train/rollouts_per_prompt"] == 8


def test_zero_advantage_groups_are_counted_and_split_by_all_fail_and_all_correct():
    batch, _ = step(config("grpo"), [group([False] * 4, gid="a"), group([True] * 4, gid="b"),
                                     group([True, False], gid="c")])
    m = batch.metrics
    assert m["groups/frac_zero_adv_final"] == pytest.approx(2 / 3)
    assert m["groups/frac_zero_adv_final_all_fail"] == pytest.approx(1 / 3)
    assert m["groups/frac_zero_adv_final_all_correct"] == pytest.approx(1 / 3)


def test_ar3po_an_all_fail_group_meeting_an_empty_buffer_counts_as_unavailable():
    batch, _ = step(config("ar3po"), [group([False] * 8)])
    assert batch.metrics["reuse/unavailable"] == 1 and batch.metrics["reuse/rate"] == 0


def test_ar3po_advantage_only_reuse_sets_the_baseline_but_leaves_the_reused_row_out():
    cfg = config("ar3po")
    _, state = step(cfg, [group([True, False], gid="first")], version=0)
    batch, _ = step(cfg, [group([False] * 8, gid="later")], state=state, version=3)
    assert batch.metrics["reuse/rate"] == 1.0 and batch.metrics["reuse/age_mean"] == 3
    assert len(batch.rows) == 7  # the reused response is only in the baseline (3.5)
    assert all(r.adv == pytest.approx(-0.354, abs=1e-3) for r in batch.rows)
    assert batch.metrics["groups/frac_zero_adv_final"] == 0


def test_ar3po_policy_recomputed_reuse_trains_the_reused_response_with_weight_one():
    cfg = config("ar3po", "ar3po.reuse_mode=policy_recomputed")
    _, state = step(cfg, [group([True, False], gid="first")])
    batch, _ = step(cfg, [group([False] * 8, gid="later")], state=state, version=2)
    reused = [r for r in batch.rows if r.reuse == "policy_recomputed"]
    assert len(batch.rows) == 8 and len(reused) == 1 and reused[0].adv > 0
    assert reused[0].adv == pytest.approx(2.475, abs=1e-3) and reused[0].scale == 1.0


def test_ar3po_direct_replay_trains_the_reused_response_against_its_stored_logprobs():
    cfg = config("ar3po", "ar3po.reuse_mode=direct_replay")
    _, state = step(cfg, [group([True, False], gid="first")])
    batch, _ = step(cfg, [group([False] * 8, gid="later")], state=state, version=2)
    reused = [r for r in batch.rows if r.adv > 0]
    assert len(reused) == 1 and reused[0].reuse == "direct_replay"
    assert reused[0].policy_version == 0
    assert reused[0].behav_logp == [-0.5] * 3


def test_only_fresh_correct_responses_enter_the_reuse_buffer():
    cfg = config("ar3po")
    _, state = step(cfg, [group([True, True, False], gid="a")])
    step(cfg, [group([False] * 4, gid="b")], state=state)
    entries = state.reuse.state_dict()["prompts"][0][1]
    assert len(entries) == 2  # the reused one was not put back


def test_advantage_only_reuse_stores_no_tokens_unless_their_length_shapes_the_reward():
    _, state = step(config("ar3po"), [group([True, False])])
    assert state.reuse.latest("p").token_ids == ()
    _, state = step(config("ar3po", "dapo.overlong=shaping"), [group([True, False])])
    assert len(state.reuse.latest("p").token_ids) == 3
    _, state = step(config("ar3po", "ar3po.reuse_mode=direct_replay"), [group([True, False])])
    assert state.reuse.latest("p").logprobs == (-0.5,) * 3


def test_reuse_also_finds_a_correct_response_from_earlier_in_the_same_step():
    batch, _ = step(config("ar3po"), [group([True, False], gid="a"), group([False] * 4, gid="b")])
    assert batch.metrics["reuse/reused"] == 1


def test_stop_on_correct_rollout_reports_the_fraction_of_stage_one_failures_later_rescued():
    g1 = group([False, False, False, True], stages=[0, 0, 1, 1], gid="a")
    g2 = group([False] * 4, stages=[0, 0, 1, 1], gid="b")
    g3 = group([True, False], gid="c")
    batch, _ = step(config("ar3po"), [g1, g2, g3])
    assert batch.metrics["rescue/frac_rescued"] == 0.5 and batch.metrics["rescue/by_round"] == [1]


def test_rescue_outcome_names_the_round_of_the_first_later_success():
    assert rescue_outcome([False, False, True], [0, 1, 2]) == 2
    assert rescue_outcome([False, False], [0, 1]) == 0
    assert rescue_outcome([True, False], [0, 1]) is None


def test_aero_trains_on_fewer_rollouts_than_it_generated():
    cfg = config("aero")
    groups = [group([False] * 12, stages=[0] * 8 + [1, 1, 2, 2], gid="a"),
              group([True] + [False] * 7, gid="b"), group([True] * 8, gid="c")]
    batch, _ = step(cfg, groups)
    assert batch.metrics["train/rollouts_per_prompt"] < 28 / 3
    assert len(batch.rows) == 4 + 2 + 4


def test_aero_degenerate_groups_get_beta_posterior_advantages_over_all_observed_rollouts():
    keep, adv, stratum = aero_select([False] * 28, [0] * 8 + [1] * 20, [0.0] * 28,
                                     config("aero").aero, config("aero").loss, random.Random(0))
    assert stratum == "rescue" and len(keep) == 4
    assert adv == pytest.approx([-1 / 29 ** 0.5] * 4, abs=1e-6)


def test_aero_a_rescued_group_keeps_one_negative_per_positive():
    accs = [False] * 8 + [False, True]
    keep, adv, stratum = aero_select(accs, [0] * 8 + [1, 1], [float(a) for a in accs],
                                     config("aero").aero, config("aero").loss, random.Random(0))
    assert stratum == "rescue" and 9 in keep and len(keep) == 2
    assert sorted(adv) == pytest.approx([-1.0, 1.0], abs=1e-5)  # population std (AERO)


def test_dapo_reward_is_signed_and_shaped_for_overlong_responses():
    dapo = config("dapo").dapo
    assert shaped_reward(True, 4, dapo, max_new_tokens=10) == 1.0
    assert shaped_reward(False, 4, dapo, max_new_tokens=10) == -1.0
    assert shaped_reward(True, 9, dapo, max_new_tokens=10) == pytest.approx(0.5)  # cache = 2
    assert shaped_reward(True, 10, dapo, max_new_tokens=10) == pytest.approx(0.0)


def test_overlong_filtering_keeps_truncated_responses_out_of_the_loss_but_in_the_baseline():
    cfg = config("grpo", "dapo.overlong=filter")
    g = group([True, False, False])
    g = Group(**{**{f: getattr(g, f) for f in g.__struct_fields__},
                 "samples": [g.samples[0], g.samples[1], sample(False, truncated=True)]})
    batch, _ = step(cfg, [g])
    assert len(batch.rows) == 2 and batch.rows[1].adv == pytest.approx(-0.577, abs=1e-3)


def test_gcpo_adds_a_contrast_for_an_all_fail_group_with_a_verified_golden():
    cfg = config("gcpo")
    groups = [group([False] * 4, gid="a"), group([False] * 4, gid="b"), group([True, False], gid="c")]
    batch, _ = step(cfg, groups, goldens={"a": [9, 9, 1]})
    assert batch.metrics["gcpo/active_frac"] == pytest.approx(1 / 3)
    assert batch.metrics["gcpo/no_golden"] == 1
    (c,) = batch.contrasts
    assert c.golden == [9, 9, 1] and len(c.failures) == 4
    assert all(r.adv == 0 for r in batch.rows if r.group_id == "a")  # no double counting


def test_gcpo_is_inactive_on_a_group_that_reuse_made_informative():
    cfg = config("gcpo", "ar3po.reuse_mode=advantage_only")
    _, state = step(cfg, [group([True, False], gid="first")])
    batch, _ = step(cfg, [group([False] * 4, gid="a")], state=state, goldens={"a": [1]})
    assert batch.contrasts == [] and batch.metrics["gcpo/active_frac"] == 0


def test_reuse_picks_the_newest_stored_response_or_any_of_them_under_uniform():
    def reused_versions(*overrides):
        cfg = config("ar3po", "ar3po.reuse_mode=direct_replay", *overrides)
        state = AlgorithmState(cfg)
        for v in range(4):  # four stored correct responses, versions 0..3
            step(cfg, [group([True, False], gid=f"s{v}", version=v)], state=state, version=v)
        return {r.policy_version for k in range(40)
                for r in step(cfg, [group([False] * 4, gid=f"f{k}", version=4)], state=state,
                              version=4)[0].rows if r.reuse}
    assert reused_versions() == {3}
    assert reused_versions("ar3po.buffer_pick=uniform") == {0, 1, 2, 3}
    assert reused_versions("ar3po.buffer_pick=uniform", "ar3po.buffer_size=2") == {2, 3}


def test_a_group_over_the_bound_is_scaled_by_stale_downweight_per_version_over():
    cfg = config("grpo", "stale_policy=downweight", "stale_downweight=0.25")
    batch, _ = step(cfg, [group([True, False], version=0)], version=6)  # bound 4: 2 over
    assert {r.scale for r in batch.rows} == {0.25 ** 2}


def test_reused_rows_are_exempt_from_staleness_stats():
    cfg = config("ar3po", "ar3po.reuse_mode=policy_recomputed")
    _, state = step(cfg, [group([True, False], gid="first", version=0)])
    batch, _ = step(cfg, [group([False] * 4, gid="a", version=9)], state=state, version=10)
    assert batch.metrics["stale/max"] == 1


def test_stale_metrics_count_each_token_at_its_own_version_and_the_bound_reads_the_oldest():
    cfg = config("grpo")
    crossed = Sample(token_ids=[7] * 4, logprobs=[-0.5] * 4, policy_version=3, reward=1.0,
                     acc=True, truncated=False, version_runs=[(3, 1), (5, 3)])
    g = Group(protocol_version=1, policy_version=5, group_id="g", prompt_id="p", actor_id=0,
              work_id="w", prompt_token_ids=[1], samples=[crossed, sample(False, 5, length=4)])
    batch, _ = step(cfg, [g], version=5)
    m = batch.metrics
    assert m["stale/hist"][:3] == [7, 0, 1]  # 3 + 4 tokens of version 5, 1 token of version 3
    assert m["stale/max"] == 2 and m["stale/mean"] == pytest.approx(2 / 8)
    assert m["stale/oldest_token_max"] == 2
    assert [r.policy_version for r in batch.rows] == [3, 5]  # the rows keep the oldest


def test_algorithm_state_survives_a_json_round_trip():
    cfg = config("hora", "ar3po.reuse_mode=advantage_only")
    state = AlgorithmState(cfg)
    state.observe(group([True, False, False], prompt="q1"))
    state.observe(group([False, False], prompt="q1"))
    build_step([group([True, False], prompt="q2")], state, cfg, 0, 0, {})
    state.rng.random()
    restored = AlgorithmState(cfg)
    restored.load_state_dict(json.loads(json.dumps(state.state_dict())))
    assert restored.prompt_counts("q1") == (1, 4) and restored.prompt_counts("new") == (0, 0)
    assert restored.reuse.latest("q2") == state.reuse.latest("q2")
    assert restored.totals == state.totals
    assert restored.rng.random() == state.rng.random()


def test_hora_counts_decay_each_time_a_prompt_is_seen_again():
    state = AlgorithmState(config("hora", "hora.decay=0.5"))
    state.observe(group([True, True], prompt="q"))
    state.observe(group([False, False], prompt="q"))
    assert state.prompt_counts("q") == (1.0, 2.0)


def test_hora_prompts_carry_their_posterior_counts_at_hand_out_for_the_actor_to_allocate():
    counts = {"hard": (0.0, 40.0), "new": (0.0, 0.0)}
    stream = iter([Prompt(group_id=f"g{i}", prompt_id=p, prompt_token_ids=[1], answer="1", n=0)
                   for i, p in enumerate(counts)])
    handed = list(PromptSource(config("hora"), stream, lambda p: counts[p]))
    assert [(p.n, p.prior_correct, p.prior_incorrect) for p in handed] == \
        [(8, 0.0, 40.0), (8, 0.0, 0.0)]
    spec = rollout_spec(config("hora", "hora.two_phase=true"))
    assert (spec.strategy, spec.hora_budget_per_prompt, spec.hora_k_min, spec.hora_k_max,
            spec.hora_two_phase) == ("hora", 8, 2, 32, True)


def test_the_adaptive_policies_hand_out_their_per_prompt_cap():
    assert responses_cap(config("ar3po", "ar3po.stage_sizes=[2,2,4]")) == 8
    assert responses_cap(config("aero")) == 32
    assert responses_cap(config("grpo", "rollout.group_size=5")) == 5


def test_the_rollout_spec_carries_each_policy_to_the_actor():
    assert rollout_spec(config("ar3po")).stage_sizes == [4, 4]
    assert rollout_spec(config("ar3po")).strategy == "stop_on_correct"
    aero = rollout_spec(config("aero", "aero.rescue_threshold=2"))
    assert (aero.strategy, aero.aero_explore, aero.aero_rescue_budget_per_prompt,
            aero.aero_rescue_threshold) == ("aero", 8, 8, 2)
    assert rollout_spec(config("hora")).hora_two_phase is False
def test_generated_tokens_include_aborted_samples_and_version_spread_is_reported():
    crossed = Sample(token_ids=[7] * 4, logprobs=[-0.5] * 4, policy_version=3, reward=1.0,
                     acc=True, truncated=False, version_runs=[(3, 1), (5, 3)])
    g = Group(protocol_version=1, policy_version=5, group_id="g", prompt_id="p", actor_id=0,
              work_id="w", prompt_token_ids=[1], samples=[crossed, sample(False, 5, length=2)],
              aborted_samples=2, aborted_tokens=5, saved_tokens_est=3)
    m = group_metrics([g, group([True, False])])
    assert m["gen/tokens"] == 4 + 2 + 5 + 2 * 3
    assert m["gen/aborted_tokens"] == 5 and m["gen/aborted_samples"] == 2
    assert m["gen/tokens_saved_first_correct"] == 3
    assert m["gen/version_spread_max"] == 2 and m["gen/version_spread_mean"] == pytest.approx(0.5)
    assert m["gen/responses_across_syncs"] == 1  # the one with two version runs
    assert m["gen/responses_per_prompt"] == 2  # aborted samples are not responses


def graded_group(rewards: list[float], gid: str = "g") -> Group:
    """A group scored by a reward function of the user's: every response correct (acc), with
    partial credit in its reward."""
    return Group(protocol_version=1, policy_version=0, group_id=gid, prompt_id="p", actor_id=0,
                 work_id="w", prompt_token_ids=[1, 2],
                 samples=[Sample(token_ids=[7, 8], logprobs=[-0.5] * 2, policy_version=0,
                                 reward=r, acc=True, truncated=False, scores={"r": r})
                          for r in rewards])


def test_the_loss_trains_on_the_reward_functions_reward_not_on_its_correctness():
    batch, _ = step(config("grpo"), [graded_group([1.0, 0.5, 0.5, 0.0])])
    assert [r.adv > 0 for r in batch.rows] == [True, False, False, False]
    assert batch.rows[0].adv == pytest.approx(-batch.rows[3].adv)  # all correct, not all-equal
    assert batch.metrics["groups/frac_zero_adv_final"] == 0  # by acc alone it would be 1


def test_ar3po_reuse_keeps_a_stored_responses_own_reward():
    cfg = config("ar3po", "ar3po.reuse_mode=policy_recomputed")
    _, state = step(cfg, [graded_group([0.5], gid="first")])
    batch, _ = step(cfg, [group([False] * 4, gid="later")], state=state, version=1)
    (reused,) = [r for r in batch.rows if r.reuse]
    plain, _ = step(cfg, [group([False] * 3 + [True], gid="ref")])  # a reward-1 response in 4
    assert 0 < reused.adv < max(r.adv for r in plain.rows)  # scaled down with its reward 0.5
