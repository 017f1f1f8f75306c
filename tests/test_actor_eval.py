"""Held-out evaluation on the actors (`run.eval_on: actors`): the shares add up to the learner's
numbers, answer for answer, and an evaluation that cannot complete is counted, never waited on
forever nor logged half-done."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from learner.actor_eval import ActorEvals
from learner.checkpoint import latest_checkpoint
from learner.data import held_out
from protocol.codec import ProtocolError, decode, encode
from protocol.config import load_config
from protocol.messages import PROTOCOL_VERSION, EvalResult, EvalWork
from tasks.arithmetic import Problem
from tasks.evaluation import eval_metrics
from tasks.prompts import prompt_token_ids
from tasks.tiny_model import load_tokenizer
from tasks.hf_engine import HFEngine
from tests.conftest import quick_run_args, read_rows, run_rlvr

K = 4


class Recorder:
    """The coordinator's face as ActorEvals sees it: its actors and what was sent to whom."""

    def __init__(self, *actor_ids: int):
        self.actors = {f"peer{i}".encode(): SimpleNamespace(actor_id=i, peer=f"peer{i}".encode(),
                                                            rank=n + 1)
                       for n, i in enumerate(actor_ids)}
        self.sent: list[tuple[bytes, EvalWork]] = []
        self.endpoint = SimpleNamespace(send=lambda peer, msg: self.sent.append((peer, msg)))


def book(tmp_path, n: int = 5) -> ActorEvals:
    problems = [Problem(f"p{i}", f"q{i}", str(i), level=1 + i % 2) for i in range(n)]
    return ActorEvals(problems, [[1, 2, i + 3] for i in range(n)], K, 16, 1.0, tmp_path)


def answer(work: EvalWork, actor_id: int, correct: list[int], greedy: list[bool],
           **kw) -> EvalResult:
    return EvalResult(protocol_version=PROTOCOL_VERSION, policy_version=work.policy_version,
                      eval_id=work.eval_id, actor_id=actor_id, correct=correct, greedy=greedy,
                      greedy_texts=[f"g{c}" for c in correct], **kw)


def test_shares_add_up_to_the_whole_evaluation(tmp_path):
    evals, coord = book(tmp_path), Recorder(0, 1)
    evals.due(coord, version=3, step=3)
    assert [len(w.prompts) for _, w in coord.sent] == [3, 2]  # every n-th prompt, n = 2 actors
    truth = {"p0": (4, True), "p1": (0, False), "p2": (1, False), "p3": (3, True), "p4": (2, True)}
    for i, (_, work) in enumerate(coord.sent):
        evals.receive(answer(work, i, [truth[p.prompt_id][0] for p in work.prompts],
                             [truth[p.prompt_id][1] for p in work.prompts], tokens=10))
    row = evals.row_metrics(coord, version=5, step=5)
    whole = eval_metrics(evals.problems, [c for c, _ in truth.values()],
                         [g for _, g in truth.values()], K)
    assert {k: row[k] for k in whole} == whole
    assert row["eval/version"] == 3 and row["eval/lag_steps"] == 2 and row["eval/tokens"] == 20
    kept = json.loads((tmp_path / "evals.jsonl").read_text())
    assert kept["prompt_ids"] == list(truth) and kept["greedy_texts"] == ["g4", "g0", "g1", "g3", "g2"]
    assert evals.row_metrics(coord, version=6, step=6) == {}  # logged once


def test_one_periodic_evaluation_out_at_a_time_the_final_one_always(tmp_path):
    evals, coord = book(tmp_path), Recorder(0)
    evals.due(coord, 2, 2)
    evals.due(coord, 4, 4)  # the first is still out: deferred, not sent
    assert [w.policy_version for _, w in coord.sent] == [2]
    first = coord.sent[0][1]
    evals.receive(answer(first, 0, [1] * 5, [True] * 5))
    row = evals.row_metrics(coord, version=5, step=5)  # logs v2, then sends the deferred one
    assert row["eval/version"] == 2
    assert [w.policy_version for _, w in coord.sent] == [2, 5]
    evals.due(coord, 6, 6, final=True)  # the final one goes although v5 is out
    for _, work in coord.sent[1:]:
        evals.receive(answer(work, 0, [0] * 5, [False] * 5))
    row = evals.row_metrics(coord, version=6, step=6)
    assert row["eval/version"] == 6 and row["eval/superseded"] == 1
    assert [json.loads(line)["eval/version"] for line in
            (tmp_path / "evals.jsonl").read_text().splitlines()] == [2, 5, 6]


@pytest.mark.parametrize("broken, why", [
    (dict(error="this actor holds version 4"), "holds version 4"),
    (dict(policy_version=9), "sampled by version 9"),
    (dict(correct=[1, 1]), "2 verdicts for 3 prompts"),
    (dict(correct=[1, 9, 1]), "a count above k"),
])
def test_a_refused_or_malformed_share_abandons_the_evaluation(tmp_path, caplog, broken, why):
    evals, coord = book(tmp_path), Recorder(0, 1)
    evals.due(coord, 3, 3)
    (_, w0), (_, w1) = coord.sent
    evals.receive(answer(w1, 1, [1, 1], [True, True]))
    fields = {"correct": [1, 1, 1], "policy_version": 3, **broken}
    fields["greedy"] = [True] * len(fields["correct"])
    fields["greedy_texts"] = ["x"] * len(fields["correct"])
    evals.receive(EvalResult(protocol_version=PROTOCOL_VERSION, eval_id=w0.eval_id, actor_id=0,
                             **fields))
    assert not evals.waiting and why in caplog.text
    row = evals.row_metrics(coord, 4, 4)
    assert row == {"eval/abandoned": 1, "eval/superseded": 0}  # nothing half-done logged


def test_a_lost_actor_abandons_its_evaluation(tmp_path):
    evals, coord = book(tmp_path), Recorder(0, 1)
    evals.due(coord, 3, 3)
    evals.check_actors(coord.actors)
    assert evals.waiting  # both alive: still waiting
    del coord.actors[b"peer1"]
    evals.check_actors(coord.actors)
    assert not evals.waiting and evals.row_metrics(coord, 4, 4)["eval/abandoned"] == 1


def test_a_final_evaluation_that_does_not_come_back_is_the_learners_in_the_last_row(tmp_path):
    evals, coord = book(tmp_path), Recorder(0, 1)
    evals.due(coord, 3, 3)
    evals.due(coord, 6, 6, final=True)
    assert not evals.final_complete
    for _, work in coord.sent[:2]:  # v3 comes back whole, the final one's actor is lost
        evals.receive(answer(work, int(work.eval_id[-1]), [1] * len(work.prompts),
                             [True] * len(work.prompts)))
    del coord.actors[b"peer1"]
    evals.check_actors(coord.actors)
    assert not evals.waiting and not evals.final_complete
    row = evals.row_metrics(coord, 6, 6)
    assert row["eval/version"] == 3
    learners = {"eval/avg@4": 0.5, "eval/greedy": 0.25}
    row.update(evals.learner_fallback(row, learners, version=6, step=6))
    assert row["eval/avg@4"] == 0.5 and row["eval/version"] == 6 and row["eval/actors"] == 0
    assert row["eval/final_on_learner"] == 1 and row["eval/lag_steps"] == 0
    assert row["eval/abandoned"] == 1 and row["eval/superseded"] == 1  # v3's left the row
    (tmp_path / "whole").mkdir()
    whole = book(tmp_path / "whole")
    whole.due(coord, 6, 6, final=True)
    work = coord.sent[-1][1]
    whole.receive(answer(work, 0, [1] * 5, [True] * 5))
    assert whole.final_complete


def test_the_codec_refuses_a_result_whose_lists_disagree():
    bad = EvalResult(protocol_version=PROTOCOL_VERSION, policy_version=1, eval_id="v1-a0",
                     actor_id=0, correct=[1, 2], greedy=[True], greedy_texts=["a", "b"])
    with pytest.raises(ProtocolError, match="length_mismatch"):
        decode(encode(bad))


@pytest.mark.slow
def test_actors_evaluate_what_the_learner_would_answer_for_answer(tmp_path, tiny_model):
    # two actors each take a share; the final evaluation's greedy answers are the learner's own
    # greedy answers on the final checkpoint, text for text, and the learner never paused for it
    run = tmp_path / "on-actors"
    done = run_rlvr(*quick_run_args(run, tiny_model, "run.steps=3", "run.eval_every=100",
                                    "run.eval_on=actors", "actors.count=2", "mode=async",
                                    "max_staleness=1", f"task.eval_samples={K}"))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3]  # no step-0 row: its evaluation came later
    evals = [json.loads(line) for line in (run / "evals.jsonl").read_text().splitlines()]
    assert [e["eval/version"] for e in evals] == [0, 3] and all(e["eval/actors"] == 2
                                                               for e in evals)
    assert rows[-1]["eval/version"] == 3 and rows[-1]["eval/greedy"] == evals[-1]["eval/greedy"]
    assert any(r.get("eval/version") == 0 for r in rows)  # the first one was logged too

    cfg = load_config(run / "config.yaml", [], run_folder=True)
    hf = latest_checkpoint(run) / "hf"
    tokenizer = load_tokenizer(hf)
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    problems = held_out(cfg)
    assert evals[-1]["prompt_ids"] == [p.prompt_id for p in problems]
    prompts = [prompt_token_ids(tokenizer, p.question, cfg.task.prompt_template) for p in problems]
    greedy = HFEngine(model).generate(prompts, [1] * len(prompts), cfg.rollout.max_new_tokens,
                                       temperature=0.0)
    texts = [tokenizer.decode(cs[0].token_ids, skip_special_tokens=True) for cs in greedy]
    assert evals[-1]["greedy_texts"] == texts


def test_a_sync_during_the_evaluation_does_not_reach_it(tiny_model):
    # the broadcast writes the next weights into the engine's model mid-evaluation: the
    # evaluation's answers stay those of the version it was asked for
    from actors.evaluation import ActorEval
    from protocol.messages import Prompt
    from tasks.verifier import Verifier

    tokenizer = load_tokenizer(tiny_model)
    problems = [Problem(f"p{i}", f"{i + 12}+{3 * i + 7}", str(4 * i + 19)) for i in range(6)]
    work = EvalWork(protocol_version=PROTOCOL_VERSION, policy_version=2, eval_id="v2-a0",
                    prompts=[Prompt(group_id=f"e{i}", prompt_id=p.prompt_id,
                                    prompt_token_ids=prompt_token_ids(tokenizer, p.question, "{question}"),
                                    answer=p.answer, n=K) for i, p in enumerate(problems)],
                    k=K, max_new_tokens=24, temperature=1.0)
    verifier = Verifier(10.0)
    try:
        def run(perturb: bool) -> list[str]:
            engine = HFEngine.load(str(tiny_model))
            ev = ActorEval(work, engine, tokenizer, verifier)
            ev.step()
            ev.step()
            assert not ev.done  # the weights change while the evaluation still decodes
            if perturb:
                with torch.no_grad():
                    for p in engine.model.parameters():
                        p.mul_(-1.0)
            while not ev.done:
                ev.step()
            ev.close()
            return ev.result(0).greedy_texts

        assert run(perturb=True) == run(perturb=False)
    finally:
        verifier.close()
