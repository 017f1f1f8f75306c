"""GCPO's golden check asks the run's reward function with the prompt's own fields, as the
actors' scoring does, so a reward that reads them can accept a golden solution."""

from __future__ import annotations

from learner.data import PromptStream
from learner.goldens import Goldens
from protocol.config import load_config
from tasks.tiny_model import build_tokenizer
from tasks.verifier import Verifier
from tests.conftest import TINY
from tests.test_algorithms import group


def test_a_golden_is_checked_with_the_rows_fields_and_survives_a_checkpoint():
    cfg = load_config(TINY, ["algorithm=gcpo", "task.reward=tests.reward_plugins:by_level"])
    tok = build_tokenizer()
    stream = PromptStream(cfg, tok, keep_solutions=True)
    handed = [next(stream) for _ in range(3)]
    # the third prompt waits in a checkpoint and is trained after the resume
    resumed = PromptStream(cfg, tok, start=stream.index, keep_solutions=True)
    resumed.restore_solutions(stream.solutions_of([handed[2].group_id]))
    with Verifier(timeout_s=10.0, reward=cfg.task.reward) as verifier:
        for prompts, p in ((stream, handed[0]), (stream, handed[1]), (resumed, handed[2])):
            goldens = Goldens(prompts, verifier, tok)
            all_fail = group([False] * 4, prompt=p.prompt_id, gid=p.group_id)
            golden = goldens.of([all_fail])[p.group_id]  # KeyError: the golden was refused
            assert tok.decode(golden[:-1]) == f"\\boxed{{{p.answer}}}"
            assert golden[-1] == tok.eos_token_id
