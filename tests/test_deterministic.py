"""`run.deterministic`: a sync run repeats from its seed. Without it the decode step
at which a verdict's consequence (AR3PO's next stage) joins the actor's batch follows the
verifier's timing, the actor's one sampler then draws differently for every later row, and a
step's groups reach the learner in the order several actors happen to finish them."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from actors.rollouts import Rollouts
from protocol.messages import Prompt, RolloutSpec, Work
from tasks.hf_engine import HFEngine
from tasks.tiny_model import build_tiny, load_tokenizer
from tasks.verifier import Verifier
from tests.conftest import TINY, run_rlvr


def staged_samples(model_path, reward: str) -> list[list[list[int]]]:
    """Every sample's tokens, per prompt, of AR3PO stages [2, 4] (all answers wrong) on 3 prompts
    of 4-token answers beside 3 of 40: the short ones' second stage is asked for while the long
    ones decode."""
    prompts = [Prompt(group_id=f"g{i}", prompt_id=f"p{i}", prompt_token_ids=[5 + i, 9], answer="1",
                      n=6) for i in range(6)]
    torch.manual_seed(0)
    rollouts = Rollouts(HFEngine(AutoModelForCausalLM.from_pretrained(model_path)),
                        load_tokenizer(model_path),
                        Verifier(5.0, reward=reward), every_verdict=True)
    try:
        for i, max_new in enumerate((4, 40)):
            spec = RolloutSpec(strategy="stop_on_correct", max_new_tokens=max_new,
                               stage_sizes=[2, 4])
            rollouts.add_work(Work(protocol_version=1, policy_version=0, work_id=f"w{i}",
                                   prompts=prompts[3 * i:3 * i + 3], rollout=spec))
        done = []
        while rollouts.busy:
            done += rollouts.step(wait_s=0.1)
    finally:
        rollouts.close()
    by_prompt = {r.prompt.group_id: [s.token_ids for s in r.samples] for r in done}
    return [by_prompt[p.group_id] for p in prompts]


def test_the_samples_do_not_depend_on_how_fast_the_verifier_answers(tmp_path):
    path = build_tiny(tmp_path / "m", hidden=32, layers=1, heads=2, ffn=64, seed=0)
    quick = staged_samples(path, "tests.reward_plugins:never")
    slow = staged_samples(path, "tests.reward_plugins:never_slowly")
    assert [len(samples) for samples in quick] == [6] * 6  # both stages ran for every prompt
    assert quick == slow


STEP_KEYS = ("groups/trained_ids", "grad_norm", "loss", "reward/mean", "resp/lengths", "gen/tokens",
             "gen/responses_per_prompt")
EVAL_KEYS = ("eval/avg@8", "eval/pass@8", "eval/greedy")


def trained(run) -> list[dict]:
    """What each step trained on and computed, and each evaluation, without the times: every key
    read by indexing, so a key the run stopped logging fails here instead of comparing None."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    return [{k: r[k] for k in (EVAL_KEYS if r["step"] in (0, 4) else ()) +
             (STEP_KEYS if r["step"] > 0 else ())} for r in rows]


@pytest.mark.slow
def test_a_sync_run_with_two_actors_repeats_bit_for_bit(tmp_path, tiny_model):
    def run(name: str, *deterministic: str) -> list[dict]:
        done = run_rlvr("train", str(TINY), f"run.out_dir={tmp_path}", f"run.name={name}",
                        f"model.path={tiny_model}", "run.wandb=disabled", "run.progress=false",
                        "task.eval_per_level=8", "mode=sync", "run.steps=4", "run.eval_every=4",
                        "run.checkpoint_every=0", "actors.count=2", *deterministic)
        assert done.returncode == 0, done.stderr[-3000:]
        return trained(tmp_path / name)

    # the control: without the key two runs of one seed part (the order two actors' groups
    # arrive in changes a gradient's sum, the verifier's timing the sampled tokens)
    assert run("free-a") != run("free-b")
    assert run("a", "run.deterministic=true") == run("b", "run.deterministic=true")


@pytest.mark.parametrize("actors, per_actor", [(1, 96), (2, 48), (3, 32)])
def test_each_actor_takes_its_share_of_a_dapo_round_in_one_work_item(actors, per_actor):
    # DAPO generates 3x a step's prompts a round: an item of a step's prompts would leave two
    # more to arrive while the actor decodes, joining its batch when the sockets deliver them
    from protocol.config import load_config

    cfg = load_config(TINY, ["algorithm=dapo", "mode=sync", "run.deterministic=true",
                             f"actors.count={actors}"])
    assert cfg.generation_batch == 96
    assert cfg.work_size == per_actor
