"""Generation cost counts every generated response (docs/ALGORITHMS.md 3.7): groups dropped as too
stale at consumption were generated all the same, so they count in `gen/responses_per_*`.

The learner's own gathering loop (`StepGatherer.gather`) runs here against a scripted coordinator:
the groups arrive as they would from the actors, one of them staler than the bound."""

from __future__ import annotations

from types import SimpleNamespace

import msgspec
import pytest

from learner.algorithms import AlgorithmState
from learner.group_metrics import engine_load_metrics, group_metrics
from learner.gather import StepGatherer
from protocol.config import Config, build
from protocol.messages import EngineLoad, Group, Sample
from protocol.config.presets import merge_under, preset


def config(*overrides: str) -> Config:
    return build(Config, merge_under(preset("grpo"), {"algorithm": "grpo"}),
                 ["mode=async", "max_staleness=1", "rollout.prompts_per_step=2", *overrides])


def group(gid: str, version: int, n: int, gen_time_s: float = 0.5, length: int = 3,
          stage: int = 0) -> Group:
    samples = [Sample(token_ids=[5] * length, logprobs=[-0.1] * length, policy_version=version,
                      reward=float(i == 0), acc=i == 0, truncated=False,
                      stage=stage if i == n - 1 else 0) for i in range(n)]
    return Group(protocol_version=3, policy_version=version, group_id=gid, prompt_id=gid,
                 actor_id=0, work_id="w", prompt_token_ids=[1], samples=samples,
                 gen_time_s=gen_time_s)


class ScriptedCoordinator:
    """The groups the actors sent, in arrival order; counts released admission slots."""

    def __init__(self, groups: list[Group]):
        self.ready, self.released = list(groups), 0

    def take(self, count: int, keep_pending: bool = False) -> list[Group]:
        taken, self.ready = self.ready[:count], self.ready[count:]
        return taken

    def release(self, groups: int) -> None:
        self.released += groups

    def poll(self, timeout_s: float) -> bool:
        return False

    def admit(self, version: int, bound: int | None = None) -> None:
        pass  # what arrives is scripted


def gather(cfg: Config, arrivals: list[Group], version: int):
    coord = ScriptedCoordinator(arrivals)
    fleet = SimpleNamespace(actors_version=version, keep=lambda reform_at=None: None)
    gatherer = StepGatherer(cfg, coord, AlgorithmState(cfg), fleet, step=0, version=0)
    step = gatherer.next(step=version, version=version)
    return step.kept, step.generated, step.dropped, step.info, coord


def test_a_stale_dropped_group_counts_in_the_steps_generation_cost():
    # learner at version 5, bound 1: the group sampled with version 2 is dropped, and replaced
    arrivals = [group("old", 2, n=8), group("a", 5, n=8), group("b", 4, n=6)]
    kept, generated, dropped, info, coord = gather(config("stale_policy=drop"), arrivals, 5)
    assert [g.group_id for g in kept] == ["a", "b"] and [g.group_id for g in dropped] == ["old"]
    assert coord.released == 1  # its admission slot went to a replacement
    m = group_metrics(generated, dropped)
    assert m["gen/responses_per_step"] == 8 + 8 + 6  # the dropped group's 8 included
    assert m["gen/responses_dropped_stale"] == 8
    assert m["gen/responses_per_prompt"] == (8 + 8 + 6) / 3  # 3 prompts were generated for
    assert m["gen/tokens"] == 3 * (8 + 8 + 6) and m["perf/actor_gen_s"] == 1.5
    # the raw group statistics describe what reached the step, not the dropped group
    assert m["groups/frac_all_fail_raw"] == 0.0 and m["resp/len_mean"] == 3.0
    assert info["stale/dropped_frac"] == 1 / 3 and info["stale/over_bound_groups"] == 0
    # ...while the run's length distribution holds every response generated, dropped ones too
    assert sorted(m["resp/lengths"]) == sorted(len(s.token_ids) for g in arrivals
                                               for s in g.samples)


def test_without_drops_the_cost_is_that_of_the_consumed_groups():
    kept, generated, dropped, _, coord = gather(config(), [group("a", 5, 8), group("b", 5, 4)], 5)
    assert dropped == [] and coord.released == 0
    assert group_metrics(generated, dropped)["gen/responses_per_step"] == 12


def test_by_default_a_group_staler_than_the_bound_is_trained_and_shows_in_the_step():
    # the long, second-stage group admitted three versions ago: trained (the truncated behaviour
    # weight corrects it), no slot released, and the length and stage statistics agree
    arrivals = [group("long", 2, n=8, length=40, stage=1), group("a", 5, n=8), group("b", 5, 6)]
    kept, generated, dropped, info, coord = gather(config(), arrivals, version=5)
    assert [g.group_id for g in kept] == ["long", "a"] and dropped == [] and coord.released == 0
    assert info["stale/dropped_frac"] == 0 and "stale/dropped_groups" not in info
    assert info["stale/over_bound_groups"] == 1
    m = group_metrics(generated, dropped, trained=kept)
    assert m["resp/len_trained_p90"] == m["resp/len_generated_p90"] == 40
    assert m["groups/later_stage_frac_trained"] == 1 / 2
    assert "stale/dropped_len_p90" not in m


def test_what_drop_takes_is_measured_against_what_was_generated():
    arrivals = [group("long", 2, n=8, length=40, stage=1), group("a", 5, n=8), group("b", 5, 6)]
    kept, generated, dropped, _, _ = gather(config("stale_policy=drop"), arrivals, version=5)
    m = group_metrics(generated, dropped, trained=kept)
    assert (m["stale/dropped_len_p50"], m["stale/dropped_len_p90"]) == (40, 40)
    assert m["stale/dropped_stage_mean"] == 1.0
    assert m["resp/len_generated_p90"] == 40 and m["resp/len_trained_p90"] == 3
    assert m["groups/later_stage_frac"] == 1 / 3 and m["groups/later_stage_frac_trained"] == 0


def loaded(actor: int, steps: int, rows: int, max_rows: int = 4, refused: int = 0,
           process: int = 1) -> Group:
    return msgspec.structs.replace(group("x", 0, 2), actor_id=actor, engine_load=EngineLoad(
        decode_steps=steps, busy_rows=rows, max_rows=max_rows, prefix_cache_resets_refused=refused,
        process=process))


def test_engine_fill_is_busy_rows_over_capacity_since_the_last_step_across_actors():
    # actor 0: 10 steps of 4 rows, 30 busy; actor 1: 10 steps of 8 rows, 20 busy (one long
    # answer draining the engine); the step's groups carry growing counters, the newest counts
    first, seen = engine_load_metrics([loaded(0, 4, 12), loaded(0, 10, 30), loaded(1, 10, 20, 8)],
                                      {})
    assert first["gen/engine_fill"] == pytest.approx(50 / (10 * 4 + 10 * 8))
    # next step: actor 0 moved on 10 steps, all rows busy; actor 1 restarted, a new process
    # whose counters (from 0) are already past the old one's
    second, seen = engine_load_metrics([loaded(0, 20, 70, refused=2),
                                        loaded(1, 12, 30, 8, process=2)], seen)
    assert second["gen/engine_fill"] == pytest.approx((40 + 30) / (10 * 4 + 12 * 8))
    assert second["sync/prefix_cache_reset_refused"] == 2
    # a step whose groups came from engines that did not step: no fill to speak of
    third, seen = engine_load_metrics([loaded(0, 20, 70)], seen)
    assert third["gen/engine_fill"] is None
    # a step of groups sent before the last step's (the delay line's fill, dealt in hand-out
    # order): the counters do not go back, the fill counted since is not taken twice
    fourth, seen = engine_load_metrics([loaded(0, 14, 50)], seen)
    assert fourth["gen/engine_fill"] is None and seen[0].decode_steps == 20
    fifth, _ = engine_load_metrics([loaded(0, 25, 90)], seen)
    assert fifth["gen/engine_fill"] == pytest.approx(20 / (5 * 4))


def test_each_groups_lengths_are_logged_by_stage_for_the_planner():
    # `rlvr plan` draws a prompt's whole generation from these: lengths kept with their group
    # and their stage, dropped groups' too
    short, long_ = group("a", 5, n=4, length=3), group("b", 5, n=4, length=200, stage=1)
    m = group_metrics([short], [long_])
    assert m["gen/prompt_lengths"] == [[[3, 3, 3, 3]], [[200, 200, 200], [200]]]
    assert m["gen/prompt_tokens"] == [1, 1]  # their prompts, in the same order
    # and their verdicts, where each stage stopped: the first sample of each group is correct
    assert m["gen/prompt_correct"] == [[[1, 0, 0, 0]], [[1, 0, 0], [0]]]
