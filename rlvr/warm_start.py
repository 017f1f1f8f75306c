"""Warm start of the embedded tiny model: short supervised training on the synthetic task (or,
with `warm_start.source: task`, on a file task's own solutions: each training row's solution field,
one digit of it wrong with probability `label_noise`).

RL from a random model learns nothing (every group is all-wrong), so the tiny default model is
first trained on `\\boxed{answer}` targets. The targets come from a deliberately sloppy teacher:
with probability `label_noise` one digit of the answer is replaced by a wrong one. The model then
puts most of its mass on the right answer but, sampled at temperature 1, often slips, the gap
between greedy and sampled accuracy that RL with a verifier closes within minutes (measured in
README). The result is cached under `warm_start.cache_dir`, keyed by everything that shapes it.

    python -m rlvr.warm_start configs/tiny-cpu.yaml [--threads N] [key=value ...]
                                        # build (or find) the cached model, print its path
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers.utils import logging as hf_logging

from tasks.prompts import prompt_token_ids
from tasks.arithmetic import Arithmetic, response_text
from tasks.datasets import iterate_forever, load_problems
from tasks.tiny_model import build_model, build_tokenizer
from protocol.config import Config, load_config


def warm_start_key(cfg: Config) -> str:
    shaping = {
        "model": [cfg.model.hidden, cfg.model.layers, cfg.model.heads, cfg.model.ffn],
        "warm": [cfg.warm_start.steps, cfg.warm_start.batch_size, cfg.warm_start.lr,
                 cfg.warm_start.label_noise],
        "task": [list(cfg.task.levels), list(warm_level_weights(cfg)), list(cfg.task.ops),
                 cfg.task.prompt_template],
        "seed": cfg.run.seed, "format": 1,
    }
    if cfg.warm_start.source == "task":  # the rows it imitates, by content
        t = cfg.task
        shaping["on_task"] = [hashlib.sha256(Path(t.train_path).read_bytes()).hexdigest(),
                              t.prompt_field, t.answer_field, t.solution_field]
    # torch's CPU kernels differ by instruction set, and training amplifies their rounding into
    # a different model: the demo's 1,200-step one built with AVX-512 started at eval/avg@8
    # 0.343, with AVX2 (ATEN_CPU_CAPABILITY=avx2, or a machine without AVX-512) at 0.295. A cache
    # is what this machine would build, never a model another kernel path trained. Two AVX-512
    # machines can differ too (0.343 on one, 0.231 on another with AMX): the key cannot tell
    # them apart, so a cache is not meant to travel between machines
    kernels = torch.backends.cpu.get_cpu_capability()
    if kernels != "AVX512":  # caches built on AVX-512 machines keep their keys
        shaping["cpu_kernels"] = kernels
    if cfg.task.response_format != "boxed":  # older caches (boxed answers) keep their keys
        shaping["response_format"] = cfg.task.response_format
    if cfg.model.max_positions != 256:  # likewise for the models of 256 positions
        shaping["max_positions"] = cfg.model.max_positions
    if cfg.warm_start.micro_batch is not None:  # another summation order: other rounding
        shaping["micro_batch"] = cfg.warm_start.micro_batch
    return hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:12]


def warm_level_weights(cfg: Config) -> tuple[float, ...]:
    return cfg.warm_start.level_weights or cfg.task.level_weights


def corrupt_answer(answer: str, noise: float, rng: random.Random) -> str:
    """The sloppy teacher: with probability `noise`, one digit becomes a different digit."""
    digits = [i for i, ch in enumerate(answer) if ch.isdigit()]
    if not digits or rng.random() >= noise:
        return answer
    i = rng.choice(digits)
    wrong = rng.choice([d for d in "0123456789" if d != answer[i]])
    return answer[:i] + wrong + answer[i + 1:]


def supervised_batch(tokenizer, problems, noise: float, rng: random.Random, template: str,
                     response_format: str = "boxed"):
    """(B, T) input ids and labels (-100 outside the response) for next-token training. With
    the worked format the working is always right and only the boxed answer is sloppy; with
    response_format None the target is the problem's own solution, any digit of it sloppy."""
    rows = []
    for p in problems:
        prompt = prompt_token_ids(tokenizer, p.question, template)
        if response_format is None:
            text = corrupt_answer(p.solution, noise, rng)
        else:
            text = response_text(p.question, corrupt_answer(p.answer, noise, rng),
                                 response_format)
        target = tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        rows.append((prompt, target))
    width = max(len(a) + len(b) for a, b in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for r, (prompt, target) in enumerate(rows):
        ids[r, :len(prompt) + len(target)] = torch.tensor(prompt + target)
        labels[r, len(prompt):len(prompt) + len(target)] = torch.tensor(target)
    return ids, labels


def supervised_backward(model, ids, labels, pad_id: int, micro_batch: int | None) -> torch.Tensor:
    """Accumulate the gradient of the batch's mean next-token loss; return that loss. With
    `micro_batch` rows are sorted by length and run that many at a time, each cut to its own
    longest row (right padding: causal rows never see it), so a batch with one long answer does
    not pay its width on every row; each part's summed loss is divided by the whole batch's
    token count, which makes the gradient the one-pass gradient up to rounding."""
    if micro_batch is None:
        logits = model(input_ids=ids).logits[:, :-1]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
        loss.backward()
        return loss.detach()
    tokens = (labels[:, 1:] != -100).sum().clamp(min=1)
    lengths = (ids != pad_id).sum(dim=1)
    order = torch.argsort(lengths, stable=True)
    total = torch.zeros(())
    for start in range(0, len(order), micro_batch):
        rows = order[start:start + micro_batch]
        width = int(lengths[rows].max())
        logits = model(input_ids=ids[rows, :width]).logits[:, :-1]
        part = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                               labels[rows, 1:width].reshape(-1), reduction="sum") / tokens
        part.backward()
        total += part.detach()
    return total


def train_warm_start(cfg: Config, out: Path, log=print, threads: int | None = None) -> None:
    """`threads` None = every core, whatever the calling process had set (a test session, a
    launcher): one thread takes 1.8x as long on 2 cores (measured 0.21 against 0.12 s a step)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads or os.cpu_count() or 1)
    try:
        _train(cfg, out, log)
    finally:
        torch.set_num_threads(before)


def _train(cfg: Config, out: Path, log) -> None:
    tok = build_tokenizer()
    model = initial_model(cfg, tok)
    steps = cfg.warm_start.steps
    t0 = time.time()
    for step, loss in enumerate(train_steps(cfg, model, tok)):
        if step % 100 == 0 or step == steps - 1:
            log(f"warm start step {step + 1}/{steps} loss {loss:.3f} "
                f"({time.time() - t0:.0f} s)")
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    hf_logging.disable_progress_bar()  # `rlvr train` may build it: its terminal shows rlvr's lines
    model.save_pretrained(out)
    tok.save_pretrained(out)


def initial_model(cfg: Config, tok):
    """The embedded tiny model of `cfg`'s shape before its warm start, initialised from the
    run's seed."""
    return build_model(tok, hidden=cfg.model.hidden, layers=cfg.model.layers,
                       heads=cfg.model.heads, ffn=cfg.model.ffn, seed=cfg.run.seed,
                       max_positions=cfg.model.max_positions)


def train_steps(cfg: Config, model, tok) -> Iterator[float]:
    """The warm start's supervised steps on `model`, in place: `warm_start.steps` AdamW steps of
    `warm_start.batch_size` rows (the arithmetic task's, a sloppy teacher's at
    `warm_start.label_noise`, or the file task's solutions), warm-up and cosine decay; yields
    each step's loss."""
    ws = cfg.warm_start
    if ws.source == "task":
        stream, response_format = task_solutions(cfg), None
    else:
        task = Arithmetic(levels=cfg.task.levels, ops=cfg.task.ops, seed=cfg.run.seed,
                          eval_per_level=cfg.task.eval_per_level)
        stream = task.train_stream(cfg.run.seed + 10_007, level_weights=warm_level_weights(cfg))
        response_format = cfg.task.response_format
    opt = torch.optim.AdamW(model.parameters(), lr=ws.lr, weight_decay=0.0)
    warmup = max(1, ws.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * s / ws.steps)))
    rng = random.Random(cfg.run.seed)
    model.train()
    for _ in range(ws.steps):
        batch = [next(stream) for _ in range(ws.batch_size)]
        ids, labels = supervised_batch(tok, batch, ws.label_noise, rng, cfg.task.prompt_template,
                                       response_format)
        opt.zero_grad()
        loss = supervised_backward(model, ids, labels, tok.pad_token_id, ws.micro_batch)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        yield loss.item()


def task_solutions(cfg: Config):
    """The file task's training rows, shuffled endlessly, for `warm_start.source: task`; every row
    must have a solution (a ValueError names the first that has none)."""
    t = cfg.task
    problems = load_problems(t.train_path, t.prompt_field, t.answer_field, t.solution_field)
    if (bare := next((p for p in problems if not p.solution), None)) is not None:
        raise ValueError(f"warm_start.source task imitates each row's solution, but row "
                         f"{bare.prompt_id} of {t.train_path} has no {t.solution_field!r} field")
    return iterate_forever(problems, cfg.run.seed + 10_007)


def ensure_warm_start(cfg: Config, log=print, threads: int | None = None) -> Path:
    """Path of the cached warm-started tiny model, training it first if it is not there (on
    `threads` torch threads; None = every core)."""
    final = Path(cfg.warm_start.cache_dir) / f"tiny-{warm_start_key(cfg)}"
    if (final / "COMPLETE").exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    # Two runs (or test workers) starting at once on a cold cache: the second waits for the
    # first's model instead of spending minutes of CPU on the same one beside it.
    with open(final.with_name(final.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "COMPLETE").exists():
            return final
        # a killed builder's folder, safe to remove under the lock
        for left in final.parent.glob(final.name + ".tmp-*"):
            shutil.rmtree(left, ignore_errors=True)
        tmp = final.with_name(final.name + f".tmp-{os.getpid()}")
        tmp.mkdir(parents=True)
        log(f"warm start: training the tiny model ({cfg.warm_start.steps} supervised steps), "
            f"cached in {final}")
        try:
            train_warm_start(cfg, tmp, log, threads)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        (tmp / "COMPLETE").write_text("ok\n")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)  # atomic: a crash never leaves a half-written model that looks done
    return final


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m rlvr.warm_start",
                                 description="Build (or find) the cached warm-started tiny model "
                                             "and print its path.")
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, as for rlvr train")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads to train on (default: every core)")
    args = ap.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        ap.error(f"--threads must be >= 1, got {args.threads}")
    print(ensure_warm_start(load_config(args.config, args.overrides), threads=args.threads))


if __name__ == "__main__":
    main()
