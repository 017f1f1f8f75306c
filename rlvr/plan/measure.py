"""What `rlvr plan` takes from a run folder: the measured costs the simulator is driven by.

From RUN_DIR/config.yaml the step's shape (prompts per step and per work item, sync_every, the
run's own split) and from RUN_DIR/metrics.jsonl, over the steady window (the first tenth of the
steps and the last step left out, as `rlvr bench throughput` does):
  - generation: the stages of every work item (`gen/work_items`: per stage the prompts,
    responses, longest response and tokens), the response-length deciles (`resp/len_q`) and
    every group's lengths by stage (`gen/prompt_lengths`), fitted into rlvr/plan/model.py's
    GenerationModel;
  - the engine's cost per decode step by rows in flight and the context they attend over, and
    per request started by its width (and each group's prompt, `gen/prompt_tokens`): measured by
    rlvr/plan/decode_probe.py with the run's engine and model on this machine, kept in
    RUN_DIR/plan/decode_cost.json (measured once, reused);
  - the actor loop's own time per decode step (messages, the verifier): in a sync run the
    learner's wait for a step (`perf/learner_idle_s`) is the step's generation alone, so the
    overhead is the one that makes the simulated sync run wait as long (bisection; a probe
    slower than the run, on a busier machine, is scaled down instead);
  - the learner: update seconds (`timing/update`) against trained tokens (`perf/train_tokens_per_s`
    x `timing/update`), the weight broadcast (`timing/sync`; in a sync run the actors are idle,
    so it is the broadcast alone), and the rest of a step (step time - wait - update - sync -
    evaluation): bookkeeping.
Only a sync run measures generation and the learner apart; an async run's sync time includes
waiting for the actor's requests in progress, and its waits overlap generation. `measure` says
so in `notes`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from learner.data import rollout_spec
from learner.run_log import read_metrics
from rlvr.bench.run_metrics import is_number, run_throughput, steady_window, step_train_tokens
from rlvr.plan.decode_probe import PROBE_KEYS
from rlvr.plan.model import GenerationModel, ItemRecord, fit_generation
from rlvr.plan.sim import DecodeCost, LearnerCosts, Split, Workload, simulate

DECODE_COST_FILE = "plan/decode_cost.json"


@dataclass
class Measurements:
    run_dir: str
    mode: str
    max_staleness: int
    actors: int
    learner_ranks: int
    algorithm: str
    inflight_update: str
    """The run's actors.inflight_update (the plan's default)."""
    abort_limit: int
    """The run's actors.abort_limit."""
    stale_policy: str
    """The run's stale_policy (the plan's)."""
    workload: Workload
    learner: LearnerCosts
    generation: GenerationModel
    decode: DecodeCost
    """The probe's costs with the calibrated overhead in step_s."""
    decode_probe: dict
    """What rlvr/plan/decode_probe.py measured (without the overhead)."""
    overhead_s: float
    """The actor loop's own seconds per decode step, calibrated on the sync run (0 otherwise)."""
    decode_scale: float
    """1, or the factor the probe's costs were scaled by when they alone were slower than the
    sync run (the machine busier during the probe)."""
    gen_s_per_step: float
    """G: a step's generation on one actor, as the (calibrated) model plays a sync run."""
    items: int
    measured: dict
    """The run's own throughput numbers (rlvr/bench/run_metrics.py run_throughput)."""
    notes: list[str] = field(default_factory=list)


def _mean(xs) -> float:
    xs = [x for x in xs if is_number(x)]
    return float(np.mean(xs)) if xs else math.nan


def item_records(rows: list[dict]) -> list[ItemRecord]:
    return [ItemRecord(float(rec[0]), int(rec[1]), tuple(tuple(int(v) for v in st)
                                                         for st in rec[2]))
            for r in rows for rec in (r.get("gen/work_items") or [])]


def measure(run_dir: str | Path, skip_first: int | None = None,
            decode_probe: dict | None = None) -> Measurements:
    """The run's costs; `decode_probe` (rlvr/plan/decode_probe.py's result) skips the probe."""
    from protocol.config import load_config

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise ValueError(f"{run_dir}: no config.yaml (not a run folder)")
    cfg = load_config(run_dir / "config.yaml", run_folder=True)
    rows = read_metrics(run_dir)
    train = [r for r in rows if isinstance(r.get("step"), int) and r["step"] >= 1]
    if len(train) < 5:
        raise ValueError(f"{run_dir}: {len(train)} training steps logged; need at least 5")
    skip = max(1, len(train) // 10) if skip_first is None else skip_first
    window = steady_window(rows, skip)
    staleness = cfg.staleness.bound
    notes = []
    if cfg.mode == "staged":
        raise ValueError(f"{run_dir}: mode staged (Mu-GRPO) is not modelled; plan from a sync run")
    if cfg.dapo.dynamic_sampling:
        notes.append("DAPO's extra generation batches are not modelled: generation per step is "
                     "taken as the run's mean")
    work = Workload(cfg.rollout.prompts_per_step, cfg.rollout.prompts_per_work,
                    cfg.weight_sync.sync_every, rollout_spec(cfg),
                    cfg.rollout.abort_on_first_correct)
    items = item_records(window)
    learner, tokens = _learner_costs(window, cfg, notes)
    train_per_group = [t / work.prompts_per_step for t in tokens if is_number(t)]
    lengths = [r["resp/len_q"] for r in window if isinstance(r.get("resp/len_q"), list)]
    prompts = _prompt_groups(window, notes)
    generation = fit_generation(items, lengths, train_per_group, prompts)
    probe = decode_probe if decode_probe is not None else load_or_probe(run_dir)
    decode = _decode_cost(probe, cfg)
    split = Split(cfg.actors.count, cfg.learner.ranks, 0)
    waits = [r["perf/learner_idle_s"] for r in window if is_number(r.get("perf/learner_idle_s"))]
    overhead, scale = 0.0, 1.0
    if staleness == 0 and waits:
        decode, overhead, scale = calibrate(split, work, learner, generation, decode,
                                            _mean(waits))
        if scale < 1.0:
            notes.append(f"the decode probe's costs alone make the simulated sync run wait longer "
                         f"than the run did ({_mean(waits):.4f} s per step): every decode cost "
                         f"is scaled by {scale:.3f} (the machine was busier during the probe, or "
                         "the run's engine costs differ from the probe's linear model)")
    else:
        notes.append("the actor loop's own time per decode step is calibrated only on a sync "
                     "run: taken as 0")
    gen_s = simulate(Split(1, cfg.learner.ranks, 0), work, replace(learner, fixed_s=0.0,
                     update_s=0.0, update_s_per_token=0.0, broadcast_s=0.0), generation, decode,
                     steps=100, seed=0).gather_s_per_step
    return Measurements(
        run_dir=str(run_dir), mode=cfg.mode, max_staleness=staleness, actors=cfg.actors.count,
        learner_ranks=cfg.learner.ranks, algorithm=cfg.algorithm,
        inflight_update=cfg.actors.inflight_update, abort_limit=cfg.actors.abort_limit,
        stale_policy=cfg.stale_policy, workload=work, learner=learner,
        generation=generation, decode=decode, decode_probe=probe, overhead_s=overhead,
        decode_scale=scale,
        gen_s_per_step=gen_s, items=len(items),
        measured=run_throughput(rows, cfg.actors.count, skip), notes=notes)


def _learner_costs(window: list[dict], cfg, notes: list[str]) -> tuple[LearnerCosts, list]:
    """The learner's costs per step (update, broadcast, the rest) in the steady window, and the
    tokens each step trained on."""
    staleness = cfg.staleness.bound
    update = [r.get("timing/update") for r in window]
    tokens = [step_train_tokens(r) for r in window]
    sync = [r.get("timing/sync") for r in window if is_number(r.get("timing/sync"))]
    other = [r["perf/step_time"] - r["perf/learner_idle_s"] - r.get("timing/update", 0.0)
             - (r.get("timing/sync") or 0.0) - (r.get("timing/eval") or 0.0)
             for r in window if is_number(r.get("perf/step_time"))
             and is_number(r.get("perf/learner_idle_s"))]
    pairs = [(t, u) for t, u in zip(tokens, update) if is_number(t) and is_number(u)]
    per_token = 0.0
    if len(pairs) >= 5 and np.std([t for t, _ in pairs]) > 0:
        per_token = max(0.0, float(np.polyfit([t for t, _ in pairs], [u for _, u in pairs], 1)[0]))
    if staleness == 0:
        broadcast = _mean(sync)
    else:  # waits for the item in progress are in it: the quick ones are closest to the broadcast
        broadcast = float(np.percentile(sync, 10)) if sync else math.nan
        notes.append(f"measured from a {cfg.mode} run (max_staleness {staleness}): its weight-sync "
                     "times include waiting for the actor's work item in progress (the broadcast "
                     "is taken as their 10th percentile) and generation overlaps the learner; a "
                     "sync run measures both apart")
    learner = LearnerCosts(fixed_s=max(0.0, _mean(other)), update_s=_mean(update),
                           update_s_per_token=per_token, mean_train_tokens=_mean(tokens),
                           broadcast_s=0.0 if math.isnan(broadcast) else broadcast)
    return learner, tokens


def _prompt_groups(window: list[dict], notes: list[str]) -> list[tuple[int, list, list]]:
    """(prompt tokens, its group's response lengths by stage, their verdicts by stage) of every
    group in the window."""
    prompts = []
    for r in window:
        groups = r.get("gen/prompt_lengths") or []
        prompt_tokens = r.get("gen/prompt_tokens") or []
        if len(prompt_tokens) != len(groups):  # logged before gen/prompt_tokens: DecodeCost's
            prompt_tokens = [0] * len(groups)  # mean and widest prompt stand in
        correct = r.get("gen/prompt_correct") or []
        if len(correct) != len(groups):  # logged before gen/prompt_correct: PromptPlan's
            correct = [[]] * len(groups)  # default verdicts stand in
        prompts += zip(prompt_tokens, groups, correct)
    if not prompts:
        notes.append("the run logged no gen/prompt_lengths (older than that metric): a prompt's "
                     "response lengths are drawn one by one from the pooled distribution, so its "
                     "rows end at different times (under continue the simulated engine then "
                     "holds about half the rows a long-tail run's does)")
    return prompts


def _decode_cost(probe: dict, cfg) -> DecodeCost:
    """The decode probe's fit as the simulator's engine costs."""
    return DecodeCost(probe["step_s"], probe["row_s"], probe["prefill_s"],
                      probe["prefill_row_s"], int(probe.get("max_batch", cfg.actors.max_batch)),
                      col_s=probe["col_s"], prefill_col_s=probe["prefill_col_s"],
                      prefill_sq_s=probe["prefill_sq_s"],
                      prefill_tokens_sq_s=probe["prefill_tokens_sq_s"],
                      prompt_tokens=probe["prompt_tokens"],
                      prompt_width=probe["prompt_width"],
                      kv_slots=bool(probe.get("kv_slots", cfg.actors.engine == "hf")))


def read_probe(path: Path, remedy: str) -> dict:
    """A decode probe's result (or a profile written like one) from `path`: every cost in
    PROBE_KEYS, as numbers; an error names the file and the `remedy`."""
    try:
        probe = json.loads(Path(path).read_text())
        if not isinstance(probe, dict):
            raise TypeError(f"a {type(probe).__name__}, not an object")
        costs = {k: float(probe[k]) for k in PROBE_KEYS if k in probe}
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"{path}: not a decode probe result ({e}); {remedy}") from None
    missing = [k for k in PROBE_KEYS if k not in costs]
    if missing:
        raise ValueError(f"{path}: no {', '.join(missing)} (a decode probe result has every "
                         f"one of {', '.join(PROBE_KEYS)}); {remedy}")
    if min(costs.values()) < 0:
        raise ValueError(f"{path}: a cost below 0 ({costs}); {remedy}")
    return probe | costs


def load_or_probe(run_dir: Path) -> dict:
    """The decode probe's result for this run: RUN_DIR/plan/decode_cost.json, else measured now
    (the run's engine and model on this machine) and kept there."""
    path = run_dir / DECODE_COST_FILE
    if path.exists():
        return read_probe(path, "delete it to measure again")
    from rlvr.plan.decode_probe import measure_decode_cost  # loads torch: only when needed

    print(f"plan: measuring the engine's decode step costs for {run_dir} "
          "(rlvr/plan/decode_probe.py)", flush=True)
    probe = measure_decode_cost(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(probe, indent=1) + "\n")
    return probe


def calibrate(split: Split, work: Workload, learner: LearnerCosts, generation: GenerationModel,
              decode: DecodeCost, measured_wait_s: float) -> tuple[DecodeCost, float, float]:
    """`decode` made to replay the measured sync run: the simulated run's wait per step for its
    groups equals `measured_wait_s`. Returns (costs, overhead_s, scale): the actor loop's own
    seconds added to every decode step, or, when the probe's costs alone already wait longer
    (the machine was busier during the probe), every cost scaled by `scale` < 1. The wait
    grows with either: bisection."""
    def wait(cost: DecodeCost) -> float:
        return simulate(split, work, learner, generation, cost, steps=100,
                        seed=0).gather_s_per_step

    def plus(extra: float) -> DecodeCost:
        return replace(decode, step_s=decode.step_s + extra)

    if wait(decode) <= measured_wait_s:
        lo, hi = 0.0, max(decode.step_s, 1e-4)
        while wait(plus(hi)) < measured_wait_s:
            lo, hi = hi, 2 * hi
            if hi > 1e3:
                raise ValueError(f"no decode overhead reaches the measured wait "
                                 f"{measured_wait_s} s")
        make = plus
    else:
        lo, hi, make = 0.0, 1.0, decode.scaled
    while hi - lo > 1e-3 * hi:  # a thousandth of the overhead (or scale): far below the noise
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if wait(make(mid)) < measured_wait_s else (lo, mid)
    x = (lo + hi) / 2
    return (make(x), x, 1.0) if make is plus else (make(x), 0.0, x)
