"""Typed messages between the learner and its actors.

Every message is a tagged msgspec Struct: the tag is its `kind`, and each one carries the
`protocol_version` it was written with and a `policy_version` (the newest weights its sender knew
of). The codec (`protocol/codec.py`) encodes them as msgpack and checks them on the way in; nothing
on the wire is ever unpickled or evaluated.

Flow (ZeroMQ ROUTER at the learner, one DEALER per actor):
    actor   -> learner   Hello, Heartbeat, Group, EvalResult
    learner -> actor     Work, SyncWeights, EvalWork, Shutdown
Weights themselves travel over a torch.distributed broadcast group (`protocol/weights.py`); the
SyncWeights message only tells the actors to join the next broadcast.
"""

from __future__ import annotations

from typing import Any, Literal, Union

import msgspec

PROTOCOL_VERSION = 7
# 2: SyncWeights names the weight group's epoch, rank and size
# 3: the rollout strategy staged -> stop_on_correct, aero_budget -> aero_rescue_budget_per_prompt,
#    hora allocated at the actor from the posterior counts each Prompt carries
# 4: Sample.version_runs (per-token policy versions), Group's aborted-sample counts
# 5: Group.engine_load (the actor engine's cumulative decode counters)
# 6: Prompt.fields (a reward function's data), Sample.scores and Sample.reward_error
# 7: EvalWork and EvalResult (held-out evaluation on the actors, `run.eval_on: actors`)


class _Message(msgspec.Struct, tag_field="kind", forbid_unknown_fields=True, frozen=True):
    protocol_version: int
    policy_version: int


class Prompt(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One prompt to sample a group for. `group_id` is unique for the run: the learner ingests a
    group id at most once, so a prompt handed out again after an actor crash is never counted
    twice."""

    group_id: str
    prompt_id: str
    prompt_token_ids: list[int]
    answer: str
    n: int  # responses to sample for this prompt (fixed-N / AR3PO cap / HORA's mean budget)
    # HORA: the learner's Beta counts of this prompt when it was handed out (docs/ALGORITHMS.md 7.3)
    prior_correct: float = 0.0
    prior_incorrect: float = 0.0
    # the row's other fields, for a reward function of the user's (`task.reward`; empty under
    # the built-in math reward, which needs only the answer)
    fields: dict[str, Any] = {}


class RolloutSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """How an actor samples the prompts of one Work item.

    strategy:
      fixed           - `Prompt.n` responses per prompt in one engine call (GRPO, DAPO,
                        Mu-GRPO).
      stop_on_correct - AR3PO: successive stages of `stage_sizes[s]` responses, a prompt leaves
                        the active set once it has a correct response.
      aero            - AERO: `aero_explore` responses, then rescue rounds of
                        `aero_rescue_step` for prompts with at most `aero_rescue_threshold`
                        correct (0: all-fail) until their first correct response, at most
                        `aero_max_rounds` rounds and `aero_max_per_prompt` responses per prompt,
                        while the pooled budget lasts: `aero_rescue_budget_per_prompt` x the
                        work item's prompts, shared by all of them.
      hora            - HORA: `hora_budget_per_prompt` x the work item's prompts responses,
                        allocated by greedy hit utility under each prompt's Beta counts
                        (`Prompt.prior_correct`, `prior_incorrect`), between `hora_k_min` and
                        `hora_k_max` per prompt; with `hora_two_phase`, first a probe of
                        `hora_k_min` each, then the rest to the prompts still without a hit.
    """

    strategy: Literal["fixed", "stop_on_correct", "aero", "hora"]
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stage_sizes: list[int] = []
    aero_explore: int = 0
    aero_rescue_step: int = 0
    aero_max_rounds: int = 0
    aero_max_per_prompt: int = 0
    aero_rescue_budget_per_prompt: int = 0
    aero_rescue_threshold: int = 0
    hora_budget_per_prompt: int = 0
    hora_k_min: int = 0
    hora_k_max: int = 0
    hora_two_phase: bool = False


class Work(_Message, tag="work"):
    """Learner -> actor: sample these prompts with this rollout policy."""

    work_id: str
    prompts: list[Prompt]
    rollout: RolloutSpec


class Sample(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One generated response. `logprobs[t]` is the behaviour log-prob of `token_ids[t]` under the
    weights that sampled it; `acc` is the verifier's verdict and `reward` the scalar the learner
    trains on before any shaping it applies itself (both from the reward function, `task.reward`:
    tasks/rewards.py), `scores` its other named scores and `reward_error` whether it scored 0 for
    an error (raised, returned a bad value, timed out).

    A response decoded across a weight update (`actors.inflight_update: continue`) was sampled
    by several policy versions: `version_runs` lists them oldest first as (version, consecutive
    tokens), summing to len(token_ids), and `policy_version` is the oldest (its first token's),
    which the staleness rules use. Empty `version_runs` = every token at `policy_version`."""

    token_ids: list[int]
    logprobs: list[float]
    policy_version: int
    reward: float
    acc: bool
    truncated: bool
    stage: int = 0  # AR3PO stage / AERO round that produced it (0 = first)
    version_runs: list[tuple[int, int]] = []
    scores: dict[str, float] = {}
    reward_error: bool = False


def version_runs(sample: Sample) -> list[tuple[int, int]]:
    """(policy version, tokens) runs of a sample, oldest first, whichever way it was sent."""
    return list(sample.version_runs) or [(sample.policy_version, len(sample.token_ids))]


class EngineLoad(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """An actor engine's counters since the actor started, as they stood when a group was sent:
    the learner takes their growth over a step for `gen/engine_fill` (how full the engine's
    rows were while it decoded: the long-tail bubble) and `sync/prefix_cache_reset_refused`."""

    decode_steps: int
    busy_rows: int  # summed over decode steps: requests that got a token at that step
    max_rows: int  # requests the engine decodes at once (HF: actors.max_batch; vLLM: max_num_seqs)
    prefix_cache_resets_refused: int = 0  # vLLM under continue (actors/engines/vllm_step.py)
    process: int = 0  # the actor's pid: counters of a restarted actor start again from 0


class Group(_Message, tag="group"):
    """Actor -> learner: every fresh response sampled for one prompt."""

    group_id: str
    prompt_id: str
    actor_id: int
    work_id: str
    prompt_token_ids: list[int]
    samples: list[Sample]
    gen_time_s: float = 0.0
    aborted_samples: int = 0
    """Samples of this prompt stopped before they finished (siblings of a first correct answer,
    in-flight samples dropped by a weight sync under `actors.inflight_update: abort`). Never
    sent, never trained on; their tokens count as generated."""
    aborted_tokens: int = 0
    """Tokens those aborted samples had generated."""
    saved_tokens_est: int = 0
    """Estimate of the tokens the siblings of a first correct answer would still have produced
    had they not been aborted (per sibling: the mean length of the prompt's finished samples
    minus what it had, at least 1)."""
    engine_load: EngineLoad | None = None


class Hello(_Message, tag="hello"):
    """Actor -> learner, once at start-up (and again after a restart)."""

    actor_id: int
    host: str
    pid: int


class Heartbeat(_Message, tag="heartbeat"):
    """Actor -> learner, every `heartbeat_s`, so a dead actor is noticed and its work re-issued."""

    actor_id: int
    busy: bool
    sync_s: float = 0.0
    """Its last weight sync's seconds from joining the broadcast to decoding with the weights
    (receive and commit; `policy_version` is that sync's); 0 before the first."""


class SyncWeights(_Message, tag="sync_weights"):
    """Learner -> actor: join the weight broadcast for `policy_version` now, as `rank` of the
    weight group of `group_epoch` (`world_size` ranks, the learner is rank 0). A new epoch means
    the membership changed (an actor died or joined): the actor leaves its old group first."""

    group_epoch: int
    rank: int
    world_size: int


class EvalWork(_Message, tag="eval_work"):
    """Learner -> actor: held-out evaluation of the weights of `policy_version` (the version the
    SyncWeights just before it published), never trained on: per prompt, `k` samples at
    `temperature` and one greedy answer, all of them decoded by exactly those weights."""

    eval_id: str
    prompts: list[Prompt]
    k: int
    max_new_tokens: int
    temperature: float


class EvalResult(_Message, tag="eval_result"):
    """Actor -> learner: what an `EvalWork` measured, per prompt in its order: correct samples
    of k and whether the greedy answer was correct. `policy_version` is the version that sampled
    them; a non-empty `error` says why the actor could not evaluate that version (no result)."""

    eval_id: str
    actor_id: int
    correct: list[int]
    greedy: list[bool]
    greedy_texts: list[str] = []  # the greedy responses, decoded
    tokens: int = 0  # generated by the evaluation (k + 1 responses per prompt)
    seconds: float = 0.0  # from the weights' snapshot to the last verdict
    error: str = ""


class Shutdown(_Message, tag="shutdown"):
    """Learner -> actor: finish and exit cleanly."""

    reason: str = ""


Message = Union[Work, Group, Hello, Heartbeat, SyncWeights, EvalWork, EvalResult, Shutdown]
