"""Group-level helpers: the group advantage estimator and the raw statistics of freshly
generated groups (docs/ALGORITHMS.md 1.2, 9). learner/algorithms.py turns groups into training
rows with them; `selection_metrics` shows what the staleness rule (protocol/staleness.py) and
curation take by length and stage.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from learner.advantages import drgrpo_advantages, grpo_advantages, rloo_advantages
from protocol.config import LossConfig
from protocol.messages import EngineLoad, Group, version_runs


def group_advantages(rewards: list[float], loss_cfg: LossConfig) -> list[float]:
    match loss_cfg.advantage:
        case "grpo":
            adv = grpo_advantages(rewards, std_mode=loss_cfg.std_mode)
        case "drgrpo":
            adv = drgrpo_advantages(rewards)
        case "rloo":
            adv = rloo_advantages(rewards)
    return adv.tolist()


def generation_cost(groups: list[Group], dropped: list[Group] = ()) -> dict:
    """What generating a step's groups cost, every generated group counted (docs/ALGORITHMS.md 3.7):
    `groups` (consumed, DAPO's filtered and surplus ones included) and `dropped` (too stale at
    consumption: generated all the same). Fresh responses only: reuse is the learner's."""
    every = [*groups, *dropped]
    lengths = [len(s.token_ids) for g in every for s in g.samples]
    gen_time = sum(g.gen_time_s for g in every)
    aborted_tokens = sum(g.aborted_tokens for g in every)
    gen_tokens = sum(lengths) + aborted_tokens  # aborted partial responses were generated too
    return {
        "gen/responses_per_prompt": len(lengths) / max(len(every), 1),
        "gen/responses_per_step": len(lengths),
        "gen/responses_per_prompt_max": max((len(g.samples) for g in every), default=0),
        "gen/responses_dropped_stale": sum(len(g.samples) for g in dropped),
        "gen/tokens": int(gen_tokens),
        "gen/aborted_tokens": aborted_tokens,
        "gen/aborted_samples": sum(g.aborted_samples for g in every),
        "gen/tokens_saved_first_correct": sum(g.saved_tokens_est for g in every),
        "perf/gen_tokens_per_s": gen_tokens / gen_time if gen_time > 0 else 0.0,
        # actor-seconds spent sampling and scoring these groups (each group carries its share of
        # its work item's time): `rlvr bench throughput` divides the sum by wall time x actors
        "perf/actor_gen_s": gen_time,
        "actors/groups_by_actor": groups_by_actor(every),
        # what `rlvr plan` models generation from: the length distribution and each work item
        "resp/len_q": [float(q) for q in np.percentile(lengths or [0], range(0, 101, 10))],
        # every generated response's length: a run's length distribution (p99, max, histogram;
        # `rlvr bench throughput` pools them) is exact only from the lengths themselves
        "resp/lengths": lengths,
        "gen/work_items": work_item_records(every),
        # per group, per sampling stage, its responses' lengths: a prompt's answers are long or
        # short together (a 24-digit sum), which pooled lengths do not show
        "gen/prompt_lengths": [[[len(s.token_ids) for s in g.samples if s.stage == stage]
                                for stage in sorted({s.stage for s in g.samples})]
                               for g in every],
        # the same groups' verdicts in the same shape (1 = correct): where a stage stopped
        "gen/prompt_correct": [[[int(bool(s.acc)) for s in g.samples if s.stage == stage]
                                for stage in sorted({s.stage for s in g.samples})]
                               for g in every],
        "gen/prompt_tokens": [len(g.prompt_token_ids) for g in every],  # the same groups'
    }


def group_metrics(groups: list[Group], dropped: list[Group] = (),
                  trained: list[Group] | None = None) -> dict:
    """Raw statistics of the step's freshly generated groups, before any intervention (the
    stale-dropped ones count in the generation cost only: they never reach the loss), and what
    the consumption rules took out of them: the dropped and the `trained` groups' lengths and
    sampling stages beside all generated ones (a rule that keeps short, early-stage groups
    shows as a gap between the two)."""
    samples = [s for g in groups for s in g.samples]
    lengths = np.array([len(s.token_ids) for s in samples]) if samples else np.zeros(1)
    accs = [[s.acc for s in g.samples] for g in groups]
    n = max(len(groups), 1)
    spreads = [runs[-1][0] - runs[0][0] for runs in map(version_runs, samples)]
    return {
        **generation_cost(groups, dropped),
        # versions inside one response: > 0 when it was decoded across a weight update (8.1)
        "gen/version_spread_max": max(spreads, default=0),
        "gen/version_spread_mean": float(np.mean(spreads)) if spreads else 0.0,
        # responses a sync reached mid-decode: under `recompute` each was interrupted and its
        # partial re-prefilled with the new weights, under `continue` decoded on over old KV
        "gen/responses_across_syncs": sum(spread > 0 for spread in spreads),
        "groups/frac_all_fail_raw": sum(not any(a) for a in accs) / n,
        "groups/frac_all_correct_raw": sum(all(a) for a in accs) / n,
        "reward/acc_mean": float(np.mean([s.acc for s in samples])) if samples else 0.0,
        "reward/mean": float(np.mean([s.reward for s in samples])) if samples else 0.0,
        # responses the reward function scored 0 for an error (raised, bad value, timeout)
        "reward/errors": sum(s.reward_error for s in samples),
        **named_scores(samples),
        "resp/len_mean": float(lengths.mean()),
        "resp/len_p90": float(np.percentile(lengths, 90)),
        "resp/len_max": int(lengths.max()),
        "resp/trunc_frac": float(np.mean([s.truncated for s in samples])) if samples else 0.0,
        "resp/len_mean_correct": _mean_len(samples, True),
        "resp/len_mean_incorrect": _mean_len(samples, False),
        "gen/policy_version_min": min((s.policy_version for s in samples), default=0),
        "gen/policy_version_max": max((s.policy_version for s in samples), default=0),
        **selection_metrics([*groups, *dropped], dropped, groups if trained is None else trained),
    }


def named_scores(samples: list) -> dict[str, float]:
    """`reward/<name>`: the mean of each named score a reward function returned, over the
    responses that have it (an errored response has none)."""
    values: dict[str, list[float]] = {}
    for s in samples:
        for name, value in s.scores.items():
            values.setdefault(name, []).append(value)
    return {f"reward/{name}": float(np.mean(v)) for name, v in sorted(values.items())}


def last_stage(group: Group) -> int:
    """The sampling stage a group ended in: AR3PO's stage, AERO's round, HORA's phase (0 =
    the first)."""
    return max((s.stage for s in group.samples), default=0)


def selection_metrics(generated: list[Group], dropped: list[Group], trained: list[Group]) -> dict:
    """Length and stage of what was generated (stale-dropped groups included: `resp/len_p90`
    leaves them out), dropped as stale, and trained (DAPO's filtered and surplus groups left
    out too). `groups/later_stage_frac*`: groups that needed more than their first stage."""
    def lengths(gs):
        return [len(s.token_ids) for g in gs for s in g.samples]

    def later_stage_frac(gs):
        return sum(last_stage(g) > 0 for g in gs) / len(gs) if gs else None

    out = {"resp/len_generated_p90": _p(lengths(generated), 90),
           "resp/len_trained_p90": _p(lengths(trained), 90),
           "groups/later_stage_frac": later_stage_frac(generated),
           "groups/later_stage_frac_trained": later_stage_frac(trained)}
    if dropped:
        out.update({"stale/dropped_len_p50": _p(lengths(dropped), 50),
                    "stale/dropped_len_p90": _p(lengths(dropped), 90),
                    "stale/dropped_stage_mean": float(np.mean([last_stage(g) for g in dropped]))})
    return out


def engine_load_metrics(groups: list[Group], seen: dict[int, EngineLoad]
                        ) -> tuple[dict, dict[int, EngineLoad]]:
    """`gen/engine_fill`: busy rows over row capacity across the actors' decode steps since the
    last step (the newest counters each actor sent then, in `seen`; a restarted actor, a new
    process, counts from zero), None if no engine stepped. Low under a long tail:
    the engine drains to the longest answer with most rows idle. `sync/prefix_cache_reset_refused`:
    the actors' refused prefix-cache resets so far. Returns the metrics and the new `seen`."""
    step_newest: dict[int, EngineLoad] = {}
    for g in groups:
        load, last = g.engine_load, step_newest.get(g.actor_id)
        if load is not None and (last is None or load.process != last.process
                                 or load.decode_steps > last.decode_steps):
            step_newest[g.actor_id] = load  # a new process is the live one
    # a step can hold groups sent before the last step's (injected staleness deals its fill in
    # hand-out order): an actor's counters never go back, so older ones leave it at `seen`
    newest = {**seen, **{actor: load for actor, load in step_newest.items()
                         if not _older(load, seen.get(actor))}}
    rows = capacity = 0
    for actor, load in newest.items():
        before = seen.get(actor)
        if before is None or before.process != load.process:  # new or restarted
            before = EngineLoad(decode_steps=0, busy_rows=0, max_rows=load.max_rows)
        rows += load.busy_rows - before.busy_rows
        capacity += (load.decode_steps - before.decode_steps) * load.max_rows
    return {"gen/engine_fill": rows / capacity if capacity else None,
            "sync/prefix_cache_reset_refused":
                sum(load.prefix_cache_resets_refused for load in newest.values())}, newest


def _older(load: EngineLoad, than: EngineLoad | None) -> bool:
    return (than is not None and load.process == than.process
            and load.decode_steps < than.decode_steps)


def _p(values: list[int], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def work_item_records(groups: list[Group]) -> list[list]:
    """gen/work_items: one [actor seconds, groups, stages] per work item among `groups`, with
    stages = [[prompts, responses, max length, tokens] per engine call (sample stage)]. An item
    whose groups landed in two steps is counted in each with the groups (and seconds) seen."""
    by_item: dict[str, list[Group]] = {}
    for g in groups:
        by_item.setdefault(g.work_id, []).append(g)
    records = []
    for gs in by_item.values():
        stages: dict[int, list] = {}
        for g in gs:
            for stage in sorted({s.stage for s in g.samples}):
                lengths = [len(s.token_ids) for s in g.samples if s.stage == stage]
                row = stages.setdefault(stage, [0, 0, 0, 0])
                row[0] += 1
                row[1] += len(lengths)
                row[2] = max(row[2], max(lengths))
                row[3] += sum(lengths)
        records.append([round(sum(g.gen_time_s for g in gs), 6), len(gs),
                        [stages[k] for k in sorted(stages)]])
    return records


def groups_by_actor(groups: list[Group]) -> dict[str, int]:
    """How many of the step's groups each actor sampled (keys: actor ids as strings)."""
    counts: dict[str, int] = {}
    for g in groups:
        counts[str(g.actor_id)] = counts.get(str(g.actor_id), 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: int(kv[0])))


def _mean_len(samples: list, acc: bool) -> float | None:
    lengths = [len(s.token_ids) for s in samples if s.acc == acc]
    return float(np.mean(lengths)) if lengths else None


def allocation_histogram(groups: list[Group]) -> list[int]:
    """hora/alloc_hist: entry k = prompts that were allocated k responses this step."""
    sizes = Counter(len(g.samples) for g in groups)
    return [sizes[k] for k in range(max(sizes, default=0) + 1)]
