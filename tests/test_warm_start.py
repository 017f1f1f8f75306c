"""The warm start's sloppy teacher and its level mix."""

from __future__ import annotations

import random

from tasks.arithmetic import Arithmetic
from rlvr.warm_start import corrupt_answer, warm_level_weights, warm_start_key
from protocol.config import load_config
from tests.conftest import TINY


def test_the_sloppy_teacher_changes_exactly_one_digit_at_the_noise_rate():
    rng = random.Random(0)
    changed = 0
    for _ in range(2000):
        out = corrupt_answer("4321", 0.4, rng)
        diffs = sum(a != b for a, b in zip(out, "4321"))
        assert len(out) == 4 and diffs in (0, 1)
        changed += diffs
    assert 0.35 < changed / 2000 < 0.45


def test_a_level_weighted_zero_in_the_warm_start_is_never_taught():
    cfg = load_config(TINY)
    weights = warm_level_weights(cfg)
    assert weights[cfg.task.levels.index(3)] == 0.0
    task = Arithmetic(levels=cfg.task.levels, ops=cfg.task.ops, seed=0)
    stream = task.train_stream(10_007, level_weights=weights)
    assert all(next(stream).level != 3 for _ in range(500))
    # ...while RL does see it
    stream = task.train_stream(0, level_weights=cfg.task.level_weights)
    assert any(next(stream).level == 3 for _ in range(500))


def test_the_cache_key_follows_everything_that_shapes_the_warm_start():
    cfg = load_config(TINY)
    assert warm_start_key(cfg) == warm_start_key(load_config(TINY))
    for override in ["warm_start.label_noise=0.1", "warm_start.level_weights=[0.5,0.5,0.0]",
                     "model.hidden=64", "warm_start.steps=10"]:
        assert warm_start_key(load_config(TINY, [override])) != warm_start_key(cfg), override
