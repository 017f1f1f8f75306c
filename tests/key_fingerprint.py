"""The fingerprint of what a run computes, without starting its processes (tests/test_every_key.py
tries every config key's other values against it): a learner step on a real DeepSpeed engine
(metrics and exact weights), the coordinator's first hand-out and an actor's samples for it
(real scheduler, HF engine and verifier), the warm start's model and first steps, the prompt
stream, the held-out set, two steps of `build_step` on fixed groups."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from protocol.config import Config, load_config

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny-cpu.yaml"

@pytest.fixture(scope="module")
def task_files(tmp_path_factory) -> list[str]:
    """Two small file tasks whose alternative field names hold other values."""
    folder = tmp_path_factory.mktemp("tasks")
    paths = []
    for name, shift in (("train", 0), ("eval", 5)):
        rows = [{"prompt": f"{i + shift}+1=", "question": f"{i + shift}+2=",
                 "answer": str(i + shift + 1), "ans": str(i + shift + 2),
                 "solution": f"\\boxed{{{i + shift + 1}}}", "sol": "x"} for i in range(6)]
        path = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths.append(str(path))
    return [f"task.train_path={paths[0]}", f"task.eval_path={paths[1]}"]


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """What the fingerprint runs on: a 1-layer tiny model on disk, a process that holds a learner
    world of one rank for real DeepSpeed engines (DeepSpeed's state lives in its modules: in this
    process it would meet the worlds other tests made and unmade), the verifiers it starts."""
    import multiprocessing

    from rlvr.launch import free_port
    from tasks.tiny_model import build_tiny

    path = build_tiny(tmp_path_factory.mktemp("probe") / "model", hidden=16, layers=1, heads=2,
                      ffn=32, seed=0)
    ctx = multiprocessing.get_context("spawn")
    server, client = ctx.Pipe()
    proc = ctx.Process(target=update_server, args=(client, str(path), free_port()), daemon=True)
    proc.start()
    _PROBE.update(path=str(path), server=server, verifiers={}, memo={})
    yield
    for verifier in _PROBE["verifiers"].values():
        verifier.close()
    _PROBE.clear()
    server.send(None)
    proc.join(60)
    if proc.is_alive():
        proc.kill()


def update_server(conn, model_path: str, port: int) -> None:
    """Child process: a learner world of one rank (gloo); `probe_update` of each config it is
    sent, until None (an exception comes back as its text)."""
    from learner.engine import init_learner_distributed, leave_distributed

    names = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")
    os.environ.update(zip(names, ("127.0.0.1", str(port), "0", "0", "1")))
    init_learner_distributed(load_config(TINY, [f"model.path={model_path}"]), 0, 1)
    try:
        while (cfg := conn.recv()) is not None:
            try:
                conn.send(probe_update(cfg))
            except Exception as e:  # noqa: BLE001 - the parent's part raises it
                conn.send(RuntimeError(repr(e)))
    finally:
        leave_distributed()


def update_in_server(cfg: Config) -> tuple:
    _PROBE["server"].send(cfg)
    reply = _PROBE["server"].recv()
    if isinstance(reply, Exception):
        raise reply
    return reply


def fingerprint(cfg: Config) -> dict[str, str]:
    """What a run of `cfg` computes, part by part, without starting its processes: never a copy
    of a config value, only what the code makes of it. A part that raises fails the check."""
    from learner.data import PromptStream, held_out
    from learner.update import UpdateSpec
    from tasks.tiny_model import build_tokenizer

    tok = build_tokenizer()
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=_PROBE["path"]))
    parts = {
        "update": lambda: memo(("update", UpdateSpec.of(cfg), cfg.optim, cfg.learner, cfg.model,
                                cfg.loss), lambda: update_in_server(cfg)),
        "generation": lambda: generation(cfg, tok),
        "warm_start": lambda: memo(("warm_start", cfg.model, cfg.warm_start, cfg.task,
                                    cfg.run.seed), lambda: warm_start_steps(cfg, tok)),
        "held_out": lambda: [(p.question, p.answer) for p in held_out(cfg)],
        "stream": lambda: [(p.prompt_token_ids, p.answer, p.n, s) for p, s in zip(
            PromptStream(cfg, tok, keep_solutions=True), range(24))],
        "solutions": lambda: first_solution(cfg, tok),
        "steps": lambda: two_steps(cfg),
    }
    out = {}
    for name, part in parts.items():
        try:
            out[name] = repr(part())
        except Exception as e:
            raise AssertionError(f"fingerprint part {name} raised {e!r}") from e
    return out


_PROBE: dict = {}


def memo(inputs, compute):
    """`compute()`, once per `inputs`: what a seeded part computes on one thread depends only on
    the config values it reads. `inputs` only keys the cache, never enters the print: a value
    left out of it could only make a key that acts look inert (and fail the check)."""
    key = repr(inputs)
    if key not in _PROBE["memo"]:
        _PROBE["memo"][key] = compute()
    return _PROBE["memo"][key]


def exact_hash(tensors) -> str:
    import hashlib

    digest = hashlib.sha256()
    for t in tensors:
        digest.update(t.detach().float().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


PROBE_LR_SCALE = 500.0
"""The probe's learning rate over the config's: the tiny config's 2e-4 becomes AdamW's 0.1, so
four optimizer steps (two mini-batches, two epochs) move the 1-layer model far enough for the
clip terms to act (loss.dual_clip's and gcpo.eps_c's only from about there)."""


def probe_update(cfg: Config) -> tuple:
    """One learner step of the run's update on fixed rows, on a real DeepSpeed engine built as
    the learner builds it (model.path: the 1-layer probe model), with the KL reference the learner
    would load: its metrics (without times) and the exact weights after."""
    import copy
    import random

    import torch

    from learner.engine import build_engine, build_reference
    from learner.update import ContrastGroup, LossRow, UpdateSpec, policy_update

    rng = random.Random(0)
    rows = []
    for g in range(4):
        prompt = [rng.randrange(5, 60) for _ in range(3)]
        for k in range(4):
            resp = [rng.randrange(5, 60) for _ in range(rng.randrange(2, 6))]
            adv = 0.0 if g == 0 else [-1.5, -0.5, 0.5, 1.5][k]
            behav = [-4.0 + rng.uniform(-2, 2) for _ in resp]  # w far from 1, some > cap
            reuse = {(1, 0): "policy_recomputed", (2, 0): "direct_replay"}.get((g, k), "")
            rows.append(LossRow(prompt, resp, behav, adv, 0, group_id=f"g{g}", reuse=reuse))
    contrasts = [ContrastGroup([7, 8, 9], [10, 11, 2], [[12, 13], [14, 15, 16]])]
    spec = UpdateSpec.of(cfg)
    spec = dataclasses.replace(spec, lr=spec.lr * PROBE_LR_SCALE)
    threads = torch.get_num_threads()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        torch.set_num_threads(1)  # a tiny model: threads only add their start-up
        try:
            engine = build_engine(cfg, cfg.model.path)
            metrics = policy_update(engine, copy.deepcopy(rows), spec, 0, contrasts,
                                    build_reference(cfg, engine), step=3)
            weights = exact_hash(full_parameters(engine))
        finally:
            torch.set_num_threads(threads)
    shown = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in metrics.items()
             if not k.startswith(("timing/", "perf/")) and k != "optim/lr"}  # lr: a copy
    return json.dumps(shown, sort_keys=True, default=str), weights


def full_parameters(engine) -> list:
    """The engine's parameters, gathered whole under ZeRO-3."""
    import contextlib

    import deepspeed

    params = list(engine.module.parameters())
    whole = (deepspeed.zero.GatheredParameters(params) if engine.zero_optimization_stage() == 3
             else contextlib.nullcontext())
    with whole:
        return [p.detach().clone() for p in params]


def generation(cfg: Config, tok) -> list:
    """The learner's first hand-out, from the coordinator the trainer builds (its work items kept
    instead of sent, to `actors.count` member actors), and what an actor samples for the first
    two items: its scheduler and engine (the probe model, seeded), the run's verifier, every
    verdict awaited before the next decode step (run.deterministic's order, so it repeats)."""
    from actors.worker import engine_kwargs
    from learner.algorithms import AlgorithmState
    from learner.coordinator import ActorState, run_coordinator
    from learner.data import PromptStream

    class Outbox:
        def __init__(self):
            self.sent = []

        def send(self, peer, message):
            self.sent.append((peer, message))

    # the hand-out as in a later epoch: every prompt seen before, 0-4 of 4 answers right
    state = AlgorithmState(cfg)
    for i, p in zip(range(cfg.generation_batch), PromptStream(cfg, tok)):
        state.observe(group(f"seen{i}", p.prompt_id, [k < i % 5 for k in range(4)]))
    coord = run_coordinator(cfg, Outbox(), PromptStream(cfg, tok), state.prompt_counts)
    for i in range(cfg.actors.count):
        peer = f"actor-{i}".encode()
        coord.actors[peer] = ActorState(i, peer, "probe", 0, 0.0, rank=i + 1)
    coord.admit(version=0)
    handed = [(peer, [(p.group_id, p.n, p.prior_correct, p.prior_incorrect) for p in w.prompts])
              for peer, w in coord.endpoint.sent]
    items = [work for _, work in coord.endpoint.sent[:2]]
    inputs = (items, cfg.actors.engine, engine_kwargs(cfg, 0), cfg.rollout.abort_on_first_correct,
              cfg.actors.verifier_timeout_s, cfg.task.reward)
    return handed, memo(inputs, lambda: sample(cfg, tok, items))


def sample(cfg: Config, tok, items: list) -> list:
    """Every sample an actor of `cfg` draws for work `items`, by group."""
    import torch

    from actors.rollouts import Rollouts
    from actors.worker import engine_kwargs, make_engine
    from tasks.verifier import Verifier

    verifiers = _PROBE["verifiers"]
    judge = (cfg.actors.verifier_timeout_s, cfg.task.reward)
    if judge not in verifiers:
        verifiers[judge] = Verifier(cfg.actors.verifier_timeout_s, reward=cfg.task.reward)
    threads = torch.get_num_threads()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        torch.set_num_threads(1)
        try:
            engine = make_engine(cfg.actors.engine, cfg.model.path, **engine_kwargs(cfg, 0))
            rollouts = Rollouts(engine, tok, verifiers[judge],
                                cfg.rollout.abort_on_first_correct, every_verdict=True)
            for work in items:
                rollouts.add_work(work)
            done = []
            while rollouts.busy:
                done += rollouts.step(wait_s=0.1)
        finally:
            torch.set_num_threads(threads)
    return sorted((r.prompt.group_id, [(s.token_ids, s.logprobs, s.stage, s.acc, s.reward,
                                        s.truncated) for s in r.samples]) for r in done)


def warm_start_steps(cfg: Config, tok) -> tuple:
    """The warm start's model before training (its config, written with it, and its seeded
    weights) and its first two supervised steps: the losses and the exact weights after."""
    import itertools

    import torch

    from rlvr.warm_start import initial_model, train_steps

    threads = torch.get_num_threads()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        torch.set_num_threads(1)
        try:
            model = initial_model(cfg, tok)
            before = model.config.to_json_string(use_diff=False), exact_hash(model.parameters())
            losses = list(itertools.islice(train_steps(cfg, model, tok), 2))
        finally:
            torch.set_num_threads(threads)
    return before, losses, exact_hash(model.parameters())


def first_solution(cfg: Config, tok):
    from learner.data import PromptStream

    stream = PromptStream(cfg, tok, keep_solutions=True)
    next(stream)
    return stream.pop_solution("g0")


def group(gid: str, prompt: str, accs: list[bool], version: int = 0, stages=None, lengths=None,
          truncated=()):
    """A returned group of prompt `prompt` with one sample per verdict in `accs`."""
    from protocol.messages import Group, Sample

    stages, lengths = stages or [0] * len(accs), lengths or [3 + i for i in range(len(accs))]
    samples = [Sample(token_ids=[7 + a] * n, logprobs=[-0.5 - 0.1 * i] * n,
                      policy_version=version, reward=float(a), acc=a,
                      truncated=i in truncated, stage=s)
               for i, (a, s, n) in enumerate(zip(accs, stages, lengths))]
    return Group(protocol_version=1, policy_version=version, group_id=gid, prompt_id=prompt,
                 actor_id=0, work_id="w", prompt_token_ids=[1, 2], samples=samples)


def two_steps(cfg: Config) -> list:
    """`build_step` on two learner steps of fixed groups: all-fail, all-correct, mixed, late
    stages, truncated and stale responses, a prompt seen twice (reuse, HORA counts)."""
    from learner.algorithms import AlgorithmState, build_step

    T, F = True, False
    steps = [
        [group("g0", "p0", [T, F, F, F, T, F, F, F]), group("g1", "p1", [T] * 8),
         group("g2", "p2", [F] * 8, stages=[0] * 4 + [1] * 4, truncated=(0,)),
         group("g3", "p3", [F, F, F, F, T, F, F, F], stages=[0] * 4 + [1] * 4),
         group("g4", "p4", [T, F, T, F, F, F, F, F, F, F, F, F])],
        [group("g5", "p0", [F] * 8), group("g6", "p2", [T, F] * 4, version=2),
         group("g7", "p3", [F, F, T, F, F, F, F, F], version=3, truncated=(2,))],
    ]
    state, out = AlgorithmState(cfg), []
    for v, groups in enumerate(steps):
        for g in groups:
            state.observe(g)
        b = build_step(groups, state, cfg, 5 + v, v, {"g2": [9, 9, 9], "g5": [9, 9]})
        out.append((b.rows, b.contrasts, json.dumps(b.metrics, sort_keys=True, default=str)))
    return [out, state.counts, state.state_dict()]
