"""The learner's prompt stream resumes where a checkpoint left it, GCPO's solutions included."""

from __future__ import annotations

from learner.data import PromptStream
from protocol.config import load_config
from tasks.tiny_model import build_tokenizer
from tests.conftest import TINY


def test_a_resumed_stream_continues_the_order_and_keeps_the_pending_prompts_solutions():
    cfg = load_config(TINY, ["algorithm=gcpo"])
    tok = build_tokenizer()
    first = PromptStream(cfg, tok, keep_solutions=True)
    handed = [next(first) for _ in range(5)]
    assert first.pop_solution("g0") is not None  # g0 trained: its solution was used
    saved = first.solutions_of([p.group_id for p in handed[1:]])  # g1..g4 pending
    assert sorted(saved) == ["g1", "g2", "g3", "g4"]

    resumed = PromptStream(cfg, tok, start=first.index, keep_solutions=True)
    resumed.restore_solutions(saved)
    assert next(resumed) == next(first)  # the stream goes on with the same problems
    for p in handed[1:]:
        assert resumed.pop_solution(p.group_id) == (p.answer, first.pop_solution(p.group_id)[1],
                                                    p.fields)
