"""The run configuration: one tree of frozen dataclasses, YAML in, dotted overrides on top.

    rlvr train configs/tiny-cpu.yaml run.steps=50 mode=async max_staleness=2

Every field has a docstring (the string under it); `rlvr train CONFIG --describe` prints them.
`load_config` fails before any process starts, naming the key, for unknown keys and bad values.
The resolved config (ports and the warm-start model path filled in) is written to the run folder
and is the only thing the learner and actor processes read.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import yaml

from protocol.config.actors import ActorsConfig, WeightSyncConfig
from protocol.config.algorithms import (AEROConfig, AR3POConfig, DAPOConfig, GCPOConfig,
                                        HORAConfig, MuGRPOConfig)
from protocol.config.checks import renamed_value_problems, value_problems
from protocol.config.inert import inert_problems, removed_key_problems, without_removed_keys
from protocol.config.loader import ConfigError, build, dump, load, read_yaml, to_dict  # noqa: F401
from protocol.config.model import ModelConfig, WarmStartConfig
from protocol.config.presets import merge_under, preset
from protocol.config.rollout import RolloutConfig
from protocol.config.run import NetConfig, RunConfig
from protocol.config.task import TaskConfig
from protocol.config.training import (  # noqa: F401
    Aggregation, LearnerConfig, LossConfig, OptimConfig)
from protocol.staleness import Staleness

Algorithm = Literal["grpo", "dapo", "drgrpo", "rloo", "ar3po", "aero", "hora", "mugrpo", "gcpo"]


@dataclass(frozen=True)
class Config:
    algorithm: Algorithm = "grpo"
    """Algorithm preset: its rollout policy, reuse, curation and loss settings
    (protocol/config/presets.py) fill every key the YAML and the overrides leave unset."""
    mode: Literal["sync", "async", "staged"] = "async"
    """sync: generate then train, staleness 0; async: actors keep generating while the learner
    trains; staged: Mu-GRPO stages of mugrpo.updates_per_stage steps on data sampled with the
    stage's frozen weights (weights are published only between stages)."""
    max_staleness: int = 2
    """Async (mode sync trains at 0, staged at mugrpo.updates_per_stage - 1; another value is
    refused there): bound on policy versions between the actors' weights and the learner's, enforced
    when work is handed out (admission). A group still running when the learner moves on can
    come back staler than the bound: stale_policy says what happens to it."""
    stale_policy: Literal["drop", "downweight", "tis"] = "tis"
    """A group staler than max_staleness when consumed: tis (default) = trained like any other,
    its off-policy part corrected per token by the truncated behaviour weight (loss.
    behav_weight_cap), as AReaL and PipelineRL do; drop = thrown away (its slot goes to another
    prompt); downweight = loss x stale_downweight per version over the bound. drop and downweight
    act on the long and late-stage groups, so they filter by length and difficulty (a warning
    says so). Async only: sync and staged runs fix the bound and nothing comes back staler."""
    stale_downweight: float = 0.5
    """Under stale_policy downweight: a group's loss factor per version over the bound (0, 1)."""
    stale_inject: int = 0
    """Injected staleness K (docs/ALGORITHMS.md 8.2b), for measuring how stale an objective can
    train: the learner trains each group K versions after the version that sampled it (a delay
    line at the learner, learner/delay_line.py; admission lets the actors run K steps further
    ahead). During the first
    K steps after a start or a resume the line fills: the oldest groups train, sampled with the
    start's weights, at staleness 0, 1, .. K - 1. 0 = off. Not with mode staged."""
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    actors: ActorsConfig = field(default_factory=ActorsConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    net: NetConfig = field(default_factory=NetConfig)
    weight_sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    ar3po: AR3POConfig = field(default_factory=AR3POConfig)
    aero: AEROConfig = field(default_factory=AEROConfig)
    hora: HORAConfig = field(default_factory=HORAConfig)
    dapo: DAPOConfig = field(default_factory=DAPOConfig)
    mugrpo: MuGRPOConfig = field(default_factory=MuGRPOConfig)
    gcpo: GCPOConfig = field(default_factory=GCPOConfig)

    def validate(self) -> None:
        """Raise one ConfigError listing every value that cannot work (config/checks.py)."""
        problems = value_problems(self)
        if problems:
            raise ConfigError("\n".join(problems))

    def problems(self, cfg: Config) -> list[str]:
        """The top-level keys' values that cannot work: the bound, the injected delay, the
        downweight (`cfg` is this config: every section's `problems` takes the whole tree)."""
        found = []
        if self.max_staleness < 0:
            found.append("max_staleness must be >= 0")
        if self.stale_inject < 0:
            found.append(f"'stale_inject' must be >= 0 (0 = off), got {self.stale_inject}")
        if self.stale_inject and self.mode == "staged":
            found.append(f"'stale_inject' ({self.stale_inject}) is refused in mode staged: a "
                         "Mu-GRPO stage already fixes each update's staleness (update u trains "
                         "on data u versions old); inject into mode sync or async")
        if not 0 < self.stale_downweight < 1:
            found.append(f"'stale_downweight' must be in (0, 1), got {self.stale_downweight} (1 "
                         "is stale_policy tis without a weight, 0 is drop)")
        return found

    def inert(self, cfg: Config) -> list[tuple[str, str]]:
        """The staleness keys a mode fixes, and the downweight of another stale_policy."""
        found = []
        fixed = {"sync": "0", "staged": "mugrpo.updates_per_stage - 1"}.get(self.mode)
        if fixed and self.max_staleness not in (Config.max_staleness, self.staleness.bound):
            found.append(("max_staleness", f"'max_staleness' ({self.max_staleness}) does "
                          f"nothing in mode {self.mode}: its staleness bound is {fixed} "
                          f"({self.staleness.bound})"))
        if fixed and self.stale_policy != Config.stale_policy:
            found.append(("stale_policy", f"'stale_policy' ({self.stale_policy}) does nothing in "
                          f"mode {self.mode}: no group comes back staler than the bound, which "
                          "the mode fixes"))
        if self.stale_downweight != Config.stale_downweight and (
                self.stale_policy != "downweight" or fixed):
            found.append(("stale_downweight", f"'stale_downweight' ({self.stale_downweight}) "
                          f"acts only under stale_policy downweight in mode async (got "
                          f"{self.stale_policy}, mode {self.mode})"))
        return found

    @property
    def staleness(self) -> Staleness:
        """How old trained data may be (protocol/staleness.py): the mode's bound (sync mode is
        the special case max_staleness = 0; in a Mu-GRPO stage of mu steps, step u trains on
        data u versions old), the delay stale_inject adds, and stale_policy's rule."""
        match self.mode:
            case "sync":
                bound = 0
            case "staged":
                bound = self.mugrpo.updates_per_stage - 1
            case _:
                bound = self.max_staleness
        return Staleness(bound, self.stale_inject, self.stale_policy, self.stale_downweight)

    @property
    def work_size(self) -> int:
        """Prompts per work item in force: rollout.prompts_per_work, null = a whole step's;
        under run.deterministic an actor's share of a step's, so that no item arrives while an
        actor decodes (when it would join its batch depends on timing)."""
        r = self.rollout
        if self.run.deterministic:
            return -(-self.generation_batch // max(self.actors.count, 1))
        return r.prompts_per_step if r.prompts_per_work is None else r.prompts_per_work

    @property
    def generation_batch(self) -> int:
        """Groups generated per round: a step's prompts, or DAPO's generation batch."""
        need = self.rollout.prompts_per_step
        return math.ceil(self.dapo.gen_batch_factor * need) if self.dapo.dynamic_sampling else need

    @property
    def weight_backend(self) -> str:
        """Weight-broadcast backend in force: 'auto' = NCCL with the model on CUDA, else gloo."""
        if self.weight_sync.backend != "auto":
            return self.weight_sync.backend
        return "nccl" if self.model.device.startswith("cuda") else "gloo"

    @property
    def run_dir(self) -> Path:
        return Path(self.run.out_dir) / self.run.name


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = (),
                run_folder: bool = False, refuse_inert: bool | None = None) -> Config:
    """The YAML at `path` with `overrides` on top and the preset of its `algorithm` underneath
    (defaults < preset < YAML < overrides). Keys set where they cannot act are refused.
    `run_folder`: `path` is a run's resolved config.yaml, written when the run began: a key
    removed since is dropped and keys that newer rules find inert are let through, so a run
    resumes (or requeues) under the rules it started with. `refuse_inert=False` lets inert keys
    through anyway (a tool that first resets them, protocol.config.inert.neutral_overrides)."""
    data = read_yaml(Path(path))
    if run_folder:
        data = without_removed_keys(data)
    name = data.get("algorithm", "grpo")
    for text in overrides:  # the last `algorithm=` override wins, as in `build`
        key, eq, raw = text.partition("=")
        if eq and key.strip() == "algorithm":
            try:
                name = yaml.safe_load(raw)
            except yaml.YAMLError:
                pass  # `build` reports the bad override, naming it
    _refuse_renamed(data, overrides)
    cfg = build(Config, merge_under(preset(name) if isinstance(name, str) else {}, data),
                list(overrides))
    refuse = not run_folder if refuse_inert is None else refuse_inert
    if refuse and (problems := inert_problems(cfg)):
        raise ConfigError("\n".join(problems))
    return cfg


def _refuse_renamed(data: dict, overrides) -> None:
    """An old spelling of a value (a user's YAML from before a rename) names the new one."""
    problems = renamed_value_problems(data, list(overrides)) + removed_key_problems(
        data, list(overrides))
    if problems:
        raise ConfigError("\n".join(problems))


def with_overrides(config: Config, overrides: list[str]) -> Config:
    """`config` with dotted overrides on top. No preset is applied: every key of a built config
    is already explicit, so `algorithm=` here renames the run's algorithm and nothing else."""
    _refuse_renamed({}, overrides)
    cfg = build(Config, to_dict(config), overrides)
    if problems := inert_problems(cfg):
        raise ConfigError("\n".join(problems))
    return cfg


def write_resolved(config: Config, run_dir: Path) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.yaml"
    dump(config, path)
    return path


__all__ = ["Config", "ConfigError", "load_config", "with_overrides", "write_resolved", "replace"]
