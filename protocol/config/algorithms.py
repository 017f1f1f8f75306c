"""Per-algorithm config sections: `ar3po:`, `aero:`, `hora:`, `dapo:`, `mugrpo:`, `gcpo:`.

Every switch that turns an algorithm's mechanism on defaults to off here (`ar3po.reuse_mode: off`,
`gcpo.coef: 0`, `mugrpo.veto_scope: off`, ...); the preset of `algorithm=<name>` (presets.py)
turns on its own, under whatever the YAML and the overrides say. The other fields are the
papers' values (docs/ALGORITHMS.md sections in each docstring). Each class's `validate()`
checks its own values as it is built (the loader names the section); `inert(cfg)` lists its keys
set where nothing reads them (protocol/config/inert.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class AR3POConfig:
    stage_sizes: tuple[int, ...] = (4, 4)
    """Staged rollout (rollout.policy=stop_on_correct): responses per stage, each >= 2; a prompt
    leaves the active set once it has a correct response, so it gets at most sum(stage_sizes)
    (docs/ALGORITHMS.md 3.2)."""
    reuse_mode: Literal["off", "advantage_only", "policy_recomputed", "direct_replay"] = "off"
    """Response reuse for all-fail groups (3.5): advantage_only = a past correct response only
    enters the group baseline; policy_recomputed = it also enters the loss with w = 1;
    direct_replay = it enters the loss weighted against its stored behaviour log-probs."""
    buffer_size: int = 4
    """Correct responses kept per prompt in the reuse buffer (3.3); acts under buffer_pick
    uniform (latest reads only the newest)."""
    buffer_pick: Literal["latest", "uniform"] = "latest"
    """Which stored response is reused: latest = the newest one (smallest age, least
    off-policy); uniform = any of the prompt's buffer_size, uniformly (3.3's alternative)."""

    def validate(self) -> None:
        if not self.stage_sizes or min(self.stage_sizes) < 2:
            raise ValueError(f"stage_sizes must be a non-empty list of sizes >= 2 (a group that "
                             f"stops after a stage needs a baseline; docs/ALGORITHMS.md 3.2), got "
                             f"{list(self.stage_sizes)}")
        if self.buffer_size < 1:
            raise ValueError("buffer_size must be >= 1")

    def inert(self, cfg) -> list[tuple[str, str]]:
        """The reuse buffer with reuse off, or read only at its newest entry."""
        found = []
        if self.reuse_mode == "off":
            for key in ("buffer_size", "buffer_pick"):
                if getattr(self, key) != getattr(AR3POConfig, key):
                    found.append((f"ar3po.{key}", f"'ar3po.{key}' ({getattr(self, key)}) does "
                                  "nothing with ar3po.reuse_mode off: no response is reused"))
        elif self.buffer_pick == "latest" and self.buffer_size != AR3POConfig.buffer_size:
            found.append(("ar3po.buffer_size", f"'ar3po.buffer_size' ({self.buffer_size}) does "
                          "nothing with ar3po.buffer_pick latest, which reads only the newest "
                          "entry (uniform picks among them)"))
        return found


@dataclass(frozen=True)
class AEROConfig:
    n_total: int = 16
    """Average responses per prompt the rollout may spend: explore plus the pooled rescue budget
    (n_total - n_explore) x prompts of a work item, which the aero preset makes a whole step's
    prompts (rollout.prompts_per_work: null = rollout.prompts_per_step; docs/ALGORITHMS.md 4.1, 4.4)."""
    n_explore: int = 8
    """Responses per prompt in the exploration stage."""
    n_max: int = 32
    """Per-prompt cap on responses, rescue included."""
    rescue_step: int = 2
    """Responses added per rescue round to each still-failing prompt (delta n)."""
    rescue_rounds: int = 10
    """Most rescue rounds (K_max)."""
    rescue_threshold: int = 0
    """S: a prompt with at most S correct of n_explore is rescued (S = 0: all-fail only)."""
    tau: float = 0.5
    """Success rate at or above which a group is 'high' and keeps all its rollouts."""
    curate: bool = False
    """Curate what enters the loss (4.3-4.4): Beta-posterior advantages for all-fail and
    all-correct groups (keeping `keep_degenerate` rollouts), 1:k negatives for rescued and
    low-success groups. Works with any rollout policy (stratum from the first stage)."""
    negatives_per_positive: int = 1
    """k: incorrect rollouts kept per correct one in rescued and low-success groups."""
    keep_degenerate: int = 4
    """Rollouts kept from an all-fail or all-correct group."""
    prior_alpha: float = 1.0
    """Beta prior alpha of the degenerate-group posterior."""
    prior_beta: float = 1.0
    """Beta prior beta of the degenerate-group posterior."""
    advantage_form: Literal["std", "mean_only"] = "std"
    """Degenerate-group advantage: (r - u) / sqrt(u (1 - u)), or r - u (4.3)."""

    def validate(self) -> None:
        if self.n_explore < 2:
            raise ValueError("n_explore must be >= 2 (a group needs a baseline)")
        if not self.n_explore <= self.n_total <= self.n_max:
            raise ValueError("need n_explore <= n_total <= n_max")
        if self.rescue_step < 1 or self.rescue_rounds < 0:
            raise ValueError("need rescue_step >= 1 and rescue_rounds >= 0")
        if not 0 <= 2 * self.rescue_threshold <= self.n_explore:
            raise ValueError("rescue_threshold must be in [0, n_explore / 2]")
        if not 0 < self.tau <= 1:
            raise ValueError("tau must be in (0, 1]")
        if self.negatives_per_positive < 1 or self.keep_degenerate < 1:
            raise ValueError("need negatives_per_positive >= 1 and keep_degenerate >= 1")
        if self.prior_alpha <= 0 or self.prior_beta <= 0:
            raise ValueError("prior_alpha and prior_beta must be > 0")


@dataclass(frozen=True)
class HORAConfig:
    k_min: int = 2
    """Fewest responses a prompt is allocated (a group needs a baseline) (docs/ALGORITHMS.md 7.3)."""
    k_max_factor: int = 4
    """Most responses a prompt is allocated, as a multiple of rollout.group_size (k_max = 4N)."""
    decay: float = 1.0
    """Each time a prompt is sampled again its past correct/incorrect counts are multiplied by
    this before the new ones are added (1 = keep the whole history)."""
    two_phase: bool = False
    """7.3 `two_phase`: probe k_min responses per prompt, update each posterior with the probe,
    then allocate the rest of the budget greedily; a prompt whose probe already holds a correct
    response has residual hit utility 0 and gets no more. Works from a prompt's first visit.
    The budget is group_size x the work item's prompts (the hora preset: one step's)."""

    def validate(self) -> None:
        if self.k_min < 2:
            raise ValueError("k_min must be >= 2")
        if self.k_max_factor < 1:
            raise ValueError("k_max_factor must be >= 1")
        if not 0 < self.decay <= 1:
            raise ValueError("decay must be in (0, 1]")


@dataclass(frozen=True)
class DAPOConfig:
    dynamic_sampling: bool = False
    """Keep only groups with 0 < correct < n, generating whole generation batches until a
    step's batch is full and dropping the surplus (docs/ALGORITHMS.md 2); every generated response
    is counted in gen/responses_per_step."""
    gen_batch_factor: float = 3.0
    """Prompts per generation batch, as a multiple of rollout.prompts_per_step (DAPO: 1536
    for 512 training prompts)."""
    max_gen_batches: int = 10
    """Dynamic sampling gives up after this many generation batches for one step and trains on
    the informative groups it has."""
    signed_reward: bool = False
    """Reward -1/+1 instead of 0/1 (DAPO)."""
    overlong: Literal["off", "shaping", "filter"] = "off"
    """Long responses: 'shaping' adds the soft overlong penalty to the reward; 'filter' keeps
    truncated responses out of the loss (they still count in the group baseline)."""
    cache_frac: float = 0.2
    """Overlong shaping buffer L_cache as a fraction of rollout.max_new_tokens (DAPO: 4096 of
    20480): the penalty ramps from 0 to -phi over the last L_cache tokens."""
    phi: float = 1.0
    """Largest overlong penalty."""

    def validate(self) -> None:
        if self.gen_batch_factor < 1:
            raise ValueError("gen_batch_factor must be >= 1")
        if self.max_gen_batches < 1:
            raise ValueError("max_gen_batches must be >= 1")
        if not 0 <= self.cache_frac <= 1:
            raise ValueError("cache_frac must be in [0, 1]")
        if self.phi < 0:
            raise ValueError("phi must be >= 0")


@dataclass(frozen=True)
class MuGRPOConfig:
    updates_per_stage: int = 16
    """mode=staged: mu, the optimizer steps per generate-then-optimise stage. A stage hands out
    mu x rollout.prompts_per_step prompts sampled with the stage's frozen weights, then trains mu
    steps on them (staleness 0..mu-1). The paper uses 4 stages with mu = 1024 (docs/ALGORITHMS.md 5)."""
    veto_scope: Literal["off", "suffix", "nontrigger_suffix", "sequence"] = "off"
    """Negative-advantage veto (5.2): in a negative-advantage response, tokens after the first
    trigger (ratio pi_theta / pi_behav < veto_delta) leave the loss ('suffix'), only the
    non-trigger ones among them ('nontrigger_suffix'), or the whole response ('sequence')."""
    veto_delta: float = 1e-4
    """Trigger threshold delta on pi_theta / pi_behav."""

    def validate(self) -> None:
        if self.updates_per_stage < 1:
            raise ValueError("updates_per_stage must be >= 1")
        if self.veto_delta <= 0:
            raise ValueError("veto_delta must be > 0")


@dataclass(frozen=True)
class GCPOConfig:
    coef: float = 0.0
    """lambda_gc: weight of the contrastive term on all-fail groups that have a verified golden
    trajectory (task solution) (docs/ALGORITHMS.md 6.2); 0 = off."""
    eps_c: float = 0.2
    """Gate: the golden's token stops being raised above ratio 1 + eps_c, a failure's stops
    being lowered below 1 - eps_c."""
    form: Literal["gated", "logsigmoid"] = "gated"
    """'gated' = the proximal contrastive loss; 'logsigmoid' = -log sigmoid(beta_c M)."""
    beta_c: float = 1.0
    """Scale of the margin in the logsigmoid form."""

    def validate(self) -> None:
        if self.coef < 0 or self.eps_c <= 0:
            raise ValueError("need coef >= 0 and eps_c > 0")

    def inert(self, cfg) -> list[tuple[str, str]]:
        """The other form's knob."""
        key = {"gated": "beta_c", "logsigmoid": "eps_c"}[self.form]
        if getattr(self, key) == getattr(GCPOConfig, key):
            return []
        return [(f"gcpo.{key}", f"'gcpo.{key}' ({getattr(self, key)}) does nothing with "
                 f"gcpo.form {self.form}")]
