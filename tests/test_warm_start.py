"""The warm start's sloppy teacher and its level mix."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import torch

from tasks.arithmetic import Arithmetic
from tasks.tiny_model import build_model, build_tokenizer
from rlvr.warm_start import (corrupt_answer, supervised_backward, supervised_batch,
                             warm_level_weights, warm_start_key)
from protocol.config import load_config
from tests.conftest import ROOT, TINY


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
                     "model.hidden=64", "warm_start.steps=10", "model.max_positions=320",
                     "warm_start.micro_batch=16"]:
        assert warm_start_key(load_config(TINY, [override])) != warm_start_key(cfg), override


def test_micro_batches_sorted_by_length_give_the_one_pass_gradient_and_loss():
    # the long-tail warm start runs 16 rows a pass; it must train the model one pass would
    tok = build_tokenizer()
    task = Arithmetic(levels=(1, 4, 12), ops=("+",), response_format="worked")
    problems = [task.train_problem(0, i) for i in range(13)]
    ids, labels = supervised_batch(tok, problems, 0.3, random.Random(0), "{question}", "worked")
    grads, losses = [], []
    for micro_batch in (None, 4):
        model = build_model(tok, hidden=32, layers=2, heads=2, ffn=64, seed=0)
        losses.append(supervised_backward(model, ids, labels, tok.pad_token_id, micro_batch))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(losses[0], losses[1], rtol=1e-5)
    assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-7)


def test_a_machine_with_other_cpu_kernels_builds_its_own_warm_start():
    # AVX2 kernels train the demo into another model (eval/avg@8 0.295 against AVX-512's 0.343):
    # a cache shared across such machines would hand one the other's starting point
    def key(env: dict) -> str:
        code = ("from protocol.config import load_config; from rlvr.warm_start import "
                f"warm_start_key; print(warm_start_key(load_config({str(TINY)!r})))")
        return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                              capture_output=True, text=True).stdout.strip()

    plain = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    assert key({**plain, "ATEN_CPU_CAPABILITY": "avx2"}) != key({**plain,
                                                                 "ATEN_CPU_CAPABILITY": "default"})


def test_the_warm_start_command_refuses_no_threads_and_two_at_once_build_one_model(tmp_path):
    def command(*args: str) -> list[str]:
        return [sys.executable, "-m", "rlvr.warm_start", str(TINY),
                f"warm_start.cache_dir={tmp_path}", "warm_start.steps=15", *args]

    refused = subprocess.run(command("--threads", "0"), cwd=ROOT, capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2 and "--threads must be >= 1" in refused.stderr
    assert not any(tmp_path.iterdir())  # refused before anything was built
    # two builds of the same cold cache at once (15 steps outlast the start-up skew): the
    # second waits on the first's lock and finds its model
    both = [subprocess.Popen(command("--threads", "1"), cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    try:
        outs = [p.communicate(timeout=180)[0] for p in both]
    finally:
        for p in both:
            p.kill()
    assert [p.returncode for p in both] == [0, 0], outs
    assert sum(out.count("warm start: training the tiny model") for out in outs) == 1, outs
    paths = {Path(out.strip().splitlines()[-1]) for out in outs}
    path = paths.pop()
    assert not paths and path.parent == tmp_path and (path / "COMPLETE").exists()
