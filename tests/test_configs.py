"""Every shipped config loads and validates, and the GPU ones select the GPU path."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.config import ConfigError, load_config

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_loads_and_validates(path):
    cfg = load_config(path)
    assert cfg.run.steps >= 1


@pytest.mark.parametrize("path", [p for p in CONFIGS if p.name.startswith("qwen")],
                         ids=lambda p: p.name)
def test_real_model_configs_use_vllm_on_cuda_with_their_algorithm(path):
    cfg = load_config(path)
    assert cfg.actors.engine == "vllm" and cfg.model.device == "cuda"
    assert cfg.model.path.startswith("Qwen/")
    assert cfg.algorithm in path.name


def test_the_tiny_default_is_ar3po_in_async_mode():
    cfg = load_config(CONFIGS[-1] if CONFIGS[-1].name == "tiny-cpu.yaml"
                      else next(p for p in CONFIGS if p.name == "tiny-cpu.yaml"))
    assert (cfg.algorithm, cfg.mode) == ("ar3po", "async")


def test_learner_ranks_with_zero_stage_3_are_refused_at_launch_with_a_clear_message():
    from rlvr.launch import train

    with pytest.raises(ConfigError, match="learner.ranks > 1 with optim.zero_stage 3"):
        train(str(CONFIGS[0]), ["learner.ranks=2", "optim.zero_stage=3"], None, dry_run=True)
    with pytest.raises(ConfigError, match="learner.ranks must be >= 1"):
        train(str(CONFIGS[0]), ["learner.ranks=0"], None, dry_run=True)


def test_the_long_tail_config_spreads_answers_from_ten_to_over_two_hundred_tokens():
    # what the config exists for: most answers short, a heavy tail of long ones (its warm
    # start teaches these golden responses; generated lengths are in BENCHMARKS.md)
    import numpy as np

    from tasks.arithmetic import Arithmetic
    from tasks.tiny_model import build_tokenizer

    cfg = load_config(next(p for p in CONFIGS if p.name == "tiny-cpu-longtail.yaml"))
    t = cfg.task
    stream = Arithmetic(levels=t.levels, ops=t.ops, response_format=t.response_format
                        ).train_stream(0, t.level_weights)
    tok = build_tokenizer()
    lengths = np.array([len(tok(next(stream).solution).input_ids) + 1  # + EOS
                        for _ in range(2000)])
    p50, p90, top = np.percentile(lengths, 50), np.percentile(lengths, 90), lengths.max()
    assert lengths.min() <= 12 and top >= 200 and p50 <= 50 and p90 >= 2.5 * p50, \
        (lengths.min(), p50, p90, top)
    assert top < cfg.rollout.max_new_tokens  # the golden answers fit: nothing truncated
