"""A real actor process generating step by step (actors/worker.py), driven by a test that plays
the learner over real ZeroMQ sockets and a real gloo weight group (tests/actor_harness.py).

- A weight sync announced in the middle of a long generation: `continue` and `abort` serve it
  at once, between two decode steps; `finish` lets the running samples decode to their end.
  Under `continue` the responses that crossed it carry both versions; under `abort` they are
  dropped, counted and sampled again under the new weights, and one already restarted
  `actors.abort_limit` times decodes on through the next sync instead.
- An actor left waiting in a broadcast that its learner never sends (a peer died in it) keeps
  beating for the whole gloo timeout; a sync the learner calls off is not waited for at all.
- Siblings of a first correct answer stop (AR3PO, rollout.abort_on_first_correct) and are
  counted in the group; with the switch off every sample runs to its end.
"""

from __future__ import annotations

import re
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tasks.prompts import prompt_token_ids
from tasks.tiny_model import build_model, build_tiny
from protocol.messages import Heartbeat, RolloutSpec
from tests.actor_harness import FakeLearner, prompt
from tests.calibration import record
from tests.logprob_refs import full_forward_logp, kept_kv_logp

pytestmark = pytest.mark.slow

LONG = 160  # tokens: an untrained model rarely writes its eos, so most samples run long


@pytest.fixture(scope="module")
def random_models(tmp_path_factory):
    """Versions 0 and 1 of an untrained tiny model (two random initialisations)."""
    path = build_tiny(tmp_path_factory.mktemp("random") / "m", hidden=32, layers=2, heads=2,
                      ffn=64, seed=0)
    tok = AutoTokenizer.from_pretrained(path)
    return path, tok, AutoModelForCausalLM.from_pretrained(path), build_model(
        tok, hidden=32, layers=2, heads=2, ffn=64, seed=1)


def served_log(learner: FakeLearner, version: int, timeout_s: float = 60.0) -> str:
    """The actor's log once it says it holds `version`'s weights."""
    deadline = time.monotonic() + timeout_s
    while f"weights of version {version} in" not in (log := learner.tail()):
        if time.monotonic() > deadline:
            return log  # steps_to_serve then fails with the log
        time.sleep(0.1)
    return log


def steps_to_serve(log: str, version: int) -> int:
    return served(log, version)[0]


def served(log: str, version: int) -> tuple[int, int, int]:
    """(decode steps from the announce to the serve, samples decoding then, the actor's decode
    step count then): the actor's own counts, which no scheduling delay of the test can shift."""
    found = re.search(rf"weights of version {version} in, (\d+) decode steps .*; (\d+) samples "
                      r"decoding; at decode step (\d+)", log)
    assert found, log[-3000:]
    return int(found.group(1)), int(found.group(2)), int(found.group(3))


@pytest.mark.parametrize("policy", ["continue", "abort", "finish"])
def test_a_sync_announced_in_the_middle_of_a_long_generation(policy, tmp_path, random_models):
    path, tok, v0, v1 = random_models
    learner = FakeLearner(tmp_path, path, f"actors.inflight_update={policy}")
    try:
        learner.sync(v0, 0)
        ids = prompt_token_ids(tok, "47+38=")
        learner.work([prompt(0, ids, n=8)], RolloutSpec(strategy="fixed", max_new_tokens=LONG))
        learner.work([prompt(1, ids, n=2)], RolloutSpec(strategy="fixed", max_new_tokens=1))
        (short,) = learner.groups(1)  # back after a decode step or so of the long samples
        assert short.group_id == "g1"
        learner.sync(v1, 1)
        (g,) = learner.groups(1)
        log = served_log(learner, 1)  # under finish the group goes out before the sync is served
    finally:
        learner.close()
    runs = [s.version_runs for s in g.samples]
    assert len(g.samples) == 8 and all(sum(n for _, n in r) == len(s.token_ids)
                                       for r, s in zip(runs, g.samples))
    longest = max(len(s.token_ids) for s in g.samples)
    match policy:
        case "continue":  # served between two decode steps; the samples decode on
            # calibrated: 0 +- 0 over 5 runs (tests/README.md)
            record("decode steps before the sync is served", steps_to_serve(log, 1), high=2)
            assert steps_to_serve(log, 1) <= 1
            crossed = [(r, s) for r, s in zip(runs, g.samples) if len(r) == 2]
            assert crossed and all([v for v, _ in r] == [0, 1] for r, _ in crossed)
            assert g.aborted_samples == 0
            for ((_, k), _), s in crossed:  # old weights, then new ones over the old KV
                old = full_forward_logp(v0, ids, s.token_ids)[:k]
                assert (torch.tensor(s.logprobs[:k]) - old).abs().max() < 1e-4
                kept = kept_kv_logp(v0, v1.eval(), ids, s.token_ids, kept=k - 1)
                assert (torch.tensor(s.logprobs[k:]) - kept).abs().max() < 1e-4
        case "abort":  # served at once; what was decoding is dropped, counted, sampled again
            # calibrated: 0 +- 0 over 5 runs (tests/README.md)
            record("decode steps before the sync is served", steps_to_serve(log, 1), high=2)
            assert steps_to_serve(log, 1) <= 1
            assert all(len(r) == 1 for r in runs)
            assert g.aborted_samples >= 1 and g.aborted_tokens >= g.aborted_samples
            assert sum(r[0][0] == 1 for r in runs) >= g.aborted_samples
        case "finish":  # every running sample decodes to its end under the old weights first
            assert runs and all(r == [(0, len(s.token_ids))] for r, s in zip(runs, g.samples))
            waited, decoding, served_at = served(log, 1)
            # the long samples started at the actor's first decode step: the sync, announced in
            # their middle, is served once the longest has decoded its last (a token a step)
            assert served_at - waited < longest, "announced after the end: proves nothing"
            assert decoding == 0 and served_at >= longest, (waited, served_at, longest)
            assert longest >= 20  # a long generation indeed (eos is rare in an untrained model)


def test_under_abort_a_sample_restarted_abort_limit_times_decodes_on_through_the_next_sync(
        tmp_path, random_models):
    # without the limit a response longer than the time between two syncs is aborted at every
    # sync and never finishes: the samples aborted at the first sync cross the second one
    path, tok, v0, v1 = random_models
    learner = FakeLearner(tmp_path, path, "actors.inflight_update=abort", "actors.abort_limit=1")
    try:
        learner.sync(v0, 0)
        ids = prompt_token_ids(tok, "47+38=")
        learner.work([prompt(0, ids, n=8)], RolloutSpec(strategy="fixed", max_new_tokens=LONG))
        short = RolloutSpec(strategy="fixed", max_new_tokens=1)
        learner.work([prompt(1, ids, n=2)], short)
        learner.groups(1)  # the long samples are decoding
        learner.sync(v1, 1)  # aborted and started again: restarted once
        learner.work([prompt(2, ids, n=2)], short)
        learner.groups(1)  # the restarted samples are decoding under version 1
        learner.sync(v0, 2)  # at the limit: they decode on
        (g,) = learner.groups(1)
    finally:
        learner.close()
    runs = [[v for v, _ in s.version_runs] for s in g.samples]
    assert len(g.samples) == 8 and 1 <= g.aborted_samples <= 8, (g.aborted_samples, runs)
    # aborted once each (at sync 1; without the limit again at sync 2), and restarted samples
    # that were still decoding at sync 2 carry both versions
    assert [r for r in runs if r == [1, 2]], runs


def logp_of(model, context: list[int], response: list[int]) -> torch.Tensor:
    """log p(response[t] | context + response[:t]) under `model`, one full forward pass."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([context + response])).logits[0]
    logp = torch.log_softmax(logits[len(context) - 1:-1].float(), -1)
    return logp.gather(-1, torch.tensor(response)[:, None])[:, 0]


def test_under_recompute_a_response_crossing_two_syncs_keeps_its_tokens_each_from_its_weights(
        tmp_path, random_models):
    # the running samples stop at each sync and go on from prompt + partial response, which the
    # new weights prefill again: every token's log-prob is that of the weights that sampled it
    # over the whole context before it (under continue the later tokens would attend to KV the
    # old weights computed, and differ)
    path, tok, v0, v1 = random_models
    weights = {0: v0.eval(), 1: v1.eval(), 2: v0.eval()}
    learner = FakeLearner(tmp_path, path, "actors.inflight_update=recompute")
    try:
        learner.sync(weights[0], 0)
        ids = prompt_token_ids(tok, "47+38=")
        learner.work([prompt(0, ids, n=4)], RolloutSpec(strategy="fixed", max_new_tokens=LONG))
        short = RolloutSpec(strategy="fixed", max_new_tokens=1)
        learner.work([prompt(1, ids, n=2)], short)
        learner.groups(1)  # the long samples are decoding
        learner.sync(weights[1], 1)
        learner.work([prompt(2, ids, n=2)], short)
        learner.groups(1)  # and decoding again, from their partial responses
        learner.sync(weights[2], 2)
        (g,) = learner.groups(1)
    finally:
        learner.close()
    assert len(g.samples) == 4 and g.aborted_samples == g.aborted_tokens == 0
    crossed = [s for s in g.samples if [v for v, _ in s.version_runs] == [0, 1, 2]]
    assert crossed, [s.version_runs for s in g.samples]
    for s in g.samples:
        start = 0
        for version, n in s.version_runs:
            got = torch.tensor(s.logprobs[start:start + n])
            want = logp_of(weights[version], ids + s.token_ids[:start], s.token_ids[start:start + n])
            assert (got - want).abs().max() < 1e-4, (version, s.version_runs)
            start += n


@pytest.mark.parametrize("abort_on_first_correct", [True, False])
def test_siblings_of_a_first_correct_answer_stop_and_are_counted(abort_on_first_correct,
                                                                   tmp_path, tiny_model):
    # the engine has 6 rows: a prompt's last 2 samples start when its first 6 are done, and a
    # correct answer among those stops them once its verdict is in. The answers are 2-3 tokens,
    # so whether the verdict beats them depends on how fast the verifier's process is scheduled:
    # prompts go one at a time (each has the rows alone) until one group shows the stop. Switched
    # off, the same 16 prompts run whole: as many chances to stop as the switched-on case needs
    tok = AutoTokenizer.from_pretrained(tiny_model)
    learner = FakeLearner(tmp_path, tiny_model, "actors.max_batch=6",
                          f"rollout.abort_on_first_correct={abort_on_first_correct}")
    questions = [(f"{a}+{b}=", str(a + b)) for a in range(1, 5) for b in range(1, 5)]
    groups = []
    try:
        learner.sync(AutoModelForCausalLM.from_pretrained(tiny_model), 0)
        spec = RolloutSpec(strategy="stop_on_correct", max_new_tokens=16, stage_sizes=[8])
        for i, (q, answer) in enumerate(questions):
            learner.work([prompt(i, prompt_token_ids(tok, q), answer=answer)], spec)
            groups += learner.groups(1)
            if abort_on_first_correct and groups[-1].aborted_samples:
                break
    finally:
        learner.close()
    if not abort_on_first_correct:
        assert len(groups) == 16
        assert all(len(g.samples) == 8 and g.aborted_samples == 0 for g in groups)
        # there was something to stop: a correct answer among the first 6 samples
        assert any(any(s.acc for s in g.samples[:6]) for g in groups)
        return
    aborted = [g for g in groups if g.aborted_samples]
    assert aborted, [[s.acc for s in g.samples] for g in groups]
    for g in aborted:
        assert any(s.acc for s in g.samples[:6]) and len(g.samples) >= 2  # correct + baseline
        assert len(g.samples) + g.aborted_samples == 8
        assert g.aborted_tokens < 16 * g.aborted_samples  # stopped before the end
        assert g.saved_tokens_est >= g.aborted_samples
    # the groups before it were not stopped: either no correct answer among the first 6, or
    # its verdict came after the last 2 finished (all 8 then returned)
    assert all(len(g.samples) == 8 for g in groups[:-1])


def test_an_actor_left_waiting_in_a_broadcast_keeps_beating_until_the_timeout_frees_it(
        tmp_path, random_models):
    """A gloo collective cannot be cancelled: a member whose broadcast a dead peer stalled waits
    the whole `weight_sync.timeout_s` (120 s by default). Silent that long, the learner took it
    for dead after `actors.heartbeat_timeout_s` (a fault test's false loss)."""
    path, _, v0, _ = random_models
    timeout_s = 8.0
    learner = FakeLearner(tmp_path, path, f"weight_sync.timeout_s={timeout_s}")
    try:
        learner.sync(v0, 0)
        t0 = time.monotonic()
        learner.announce(1)  # goes ahead, but the learner's side never broadcasts
        beats = learner.count(Heartbeat, during_s=timeout_s / 2)  # the actor is blocked all along
        learner.wait_for_log("weight sync of version 1 (epoch 1) failed", 30.0)
        freed_after_s = time.monotonic() - t0
    finally:
        learner.close()
    record("an 8 s broadcast timeout frees the actor after s", freed_after_s, low=timeout_s - 1)
    record("heartbeats in 4 s of a blocked broadcast", beats, low=3)
    assert freed_after_s >= timeout_s - 1, "the broadcast did not block: the test proves nothing"
    assert beats >= 4, f"{beats} heartbeats in {timeout_s / 2} s at actors.heartbeat_s=0.5"


def test_a_sync_the_learner_calls_off_is_given_up_at_once(tmp_path, random_models):
    path, _, v0, v1 = random_models
    learner = FakeLearner(tmp_path, path, "weight_sync.timeout_s=30")
    try:
        learner.sync(v0, 0)
        learner.announce(1, goes_ahead=False)  # a member was found dead when told
        given_up_s = learner.wait_for_log("sync of version 1 (epoch 1) called off", 30.0)
        learner.new_epoch()  # the actor left the group too: the next sync forms it anew
        learner.sync(v1, 2)
        learner.wait_for_log("weights of version 2 in", 30.0)
    finally:
        learner.close()
    record("a sync called off is given up after s", given_up_s, high=5)
    assert given_up_s < 5, f"called off, yet the actor waited {given_up_s:.1f} s"
