"""`rlvr bench transport`: ZeroMQ + codec messages per second, and their share of a step.

    rlvr bench transport [CONFIG] [--out DIR] [--messages 2000] [--step-s S] [a.b=v ...]

Messages are Groups shaped like the config's: real prompts of the task (its PromptStream and
tokenizer), rollout.group_size responses of rollout.max_new_tokens tokens each (the longest a
response can be, so the estimate errs on the expensive side) with their log-probs.
  codec      encode, and decode with every check the learner runs (`protocol.codec.decode` with
             the vocabulary bound), in this process, messages/s;
  zeromq     an actor process (ActorEndpoint) streams the messages to this process's
             LearnerEndpoint (ROUTER) over loopback TCP; messages/s end to end, and the
             learner's CPU seconds per message (process time over the receive loop: socket, the
             ZeroMQ I/O thread and decoding, not the waiting);
  share      learner CPU per message x rollout.prompts_per_step Groups per step / learner step
             seconds (target < 2%).
The learner step is `--step-s` when given (e.g. `perf/step_time - perf/learner_idle_s` of a
real run), else measured here: `learner.update.policy_update` on the config's model with a
DeepSpeed engine as the learner builds it, on one step's rows (prompts_per_step x group_size
responses, every advantage nonzero so every row runs forward and backward), median of 3 after
one warm-up. That is only the update: a real step also builds the batch and syncs weights, so
the share is an upper estimate.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import time
from pathlib import Path

from rlvr.bench.common import machine, markdown_table, targets_table, with_steps, write_results
from rlvr.bench.run_metrics import median, ratio, share_of_step, timed_rounds
from rlvr.bench.targets import target

HOST = "127.0.0.1"


def make_groups(cfg, tokenizer, n: int, seed: int = 0) -> list:
    """`n` Group messages with the task's prompts and full-length random responses."""
    from learner.data import PromptStream
    from protocol.messages import PROTOCOL_VERSION, Group, Sample

    rng = random.Random(seed)
    vocab, r = len(tokenizer), cfg.rollout
    prompts = PromptStream(cfg, tokenizer)
    groups = []
    for i in range(n):
        p = next(prompts)
        samples = [Sample(token_ids=[rng.randrange(vocab) for _ in range(r.max_new_tokens)],
                          logprobs=[-rng.expovariate(1.0) for _ in range(r.max_new_tokens)],
                          policy_version=0, reward=float(k % 2), acc=bool(k % 2),
                          truncated=False) for k in range(r.group_size)]
        groups.append(Group(protocol_version=PROTOCOL_VERSION, policy_version=0,
                            group_id=p.group_id, prompt_id=p.prompt_id, actor_id=0,
                            work_id=f"w{i}", prompt_token_ids=p.prompt_token_ids,
                            samples=samples, gen_time_s=0.1))
    return groups


def codec_rates(groups: list, vocab_size: int) -> dict:
    from protocol.codec import decode, encode

    t0 = time.perf_counter()
    frames = [encode(g) for g in groups]
    encode_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for f in frames:
        decode(f, vocab_size=vocab_size)
    decode_s = time.perf_counter() - t0
    return {"bytes_per_message": sum(map(len, frames)) / len(frames),
            "encode_per_s": ratio(len(frames), encode_s),
            "decode_per_s": ratio(len(frames), decode_s)}


def _actor_sender(port: int, groups: list) -> None:
    """Actor process: say hello with a heartbeat, then send every group as fast as it can."""
    from protocol.messages import PROTOCOL_VERSION, Heartbeat
    from protocol.transport import ActorEndpoint

    with ActorEndpoint(HOST, port, b"bench-actor") as ep:
        ep.send(Heartbeat(protocol_version=PROTOCOL_VERSION, policy_version=0, actor_id=0,
                          busy=False))
        for g in groups:
            ep.send(g)
        ep.recv(timeout_s=60)  # stay until the learner says it has everything (linger is 0)


def zeromq_rates(groups: list, vocab_size: int, timeout_s: float = 60.0) -> dict:
    from protocol.messages import PROTOCOL_VERSION, Shutdown
    from protocol.transport import LearnerEndpoint

    ctx = mp.get_context("spawn")
    with LearnerEndpoint(HOST, 0, vocab_size=vocab_size) as ep:
        actor = ctx.Process(target=_actor_sender, args=(ep.port, groups), daemon=True)
        actor.start()
        try:
            first = ep.recv(timeout_s=timeout_s)  # the heartbeat: connected, actor started
            if first is None:
                raise RuntimeError("transport bench: the actor process never connected")
            peer = first[0]
            cpu0, t0 = time.process_time(), time.perf_counter()
            for i in range(len(groups)):
                if ep.recv(timeout_s=timeout_s) is None:
                    raise RuntimeError(f"transport bench: message {i} did not arrive")
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            ep.send(peer, Shutdown(protocol_version=PROTOCOL_VERSION, policy_version=0))
        finally:
            actor.join(timeout=10)
            if actor.is_alive():
                actor.terminate()
        rejected = sum(ep.rejected.values())
    return {"messages": len(groups), "messages_per_s": ratio(len(groups), wall),
            "learner_cpu_s_per_message": cpu / len(groups), "rejected": rejected}


def policy_update_seconds(cfg, tokenizer, groups: list, rounds: int = 4) -> list[float]:
    """Seconds of `policy_update` on one step's rows with the learner's DeepSpeed engine."""
    import torch

    from learner.engine import build_engine, init_learner_distributed
    from learner.update import LossRow, UpdateSpec, policy_update

    torch.set_num_threads(cfg.learner.threads)
    init_learner_distributed(cfg, rank=0, world_size=1)
    engine = build_engine(cfg, cfg.model.path)
    rows = [LossRow(prompt=g.prompt_token_ids, response=s.token_ids, behav_logp=s.logprobs,
                    adv=1.0 if k % 2 else -1.0, policy_version=0)
            for g in groups[:cfg.rollout.prompts_per_step] for k, s in enumerate(g.samples)]
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        policy_update(engine, rows, UpdateSpec.of(cfg), tokenizer.pad_token_id)
        times.append(time.perf_counter() - t0)
    return times


def run(config: str | None, out_dir: Path, overrides: list[str], messages: int,
        step_s: float | None) -> dict:
    from tasks.tiny_model import load_tokenizer

    from rlvr.launch import resolve
    from protocol.config import Config, load_config, with_overrides

    cfg = load_config(config, overrides) if config else with_overrides(Config(), overrides)
    cfg = resolve(cfg, log=lambda line: print(line, flush=True))  # model path (warm start), ports
    tokenizer = load_tokenizer(cfg.model.path)
    vocab = len(tokenizer)
    groups = make_groups(cfg, tokenizer, max(messages, cfg.rollout.prompts_per_step))
    codec = codec_rates(groups, vocab)
    zeromq = zeromq_rates(groups, vocab)
    if step_s is None:
        update = timed_rounds(policy_update_seconds(cfg, tokenizer, groups))
        step_s, source = update["median_s"], (
            "measured: median policy_update on one step's rows (prompts_per_step x group_size), "
            "DeepSpeed engine, learner.threads threads")
    else:
        update, source = None, "given with --step-s"
    per_step = cfg.rollout.prompts_per_step
    share = share_of_step(zeromq["learner_cpu_s_per_message"], per_step, step_s)
    results = {
        "bench": "transport", "config": config, "overrides": overrides,
        "message": {"kind": "group", "responses": cfg.rollout.group_size,
                    "tokens_per_response": cfg.rollout.max_new_tokens,
                    "prompt_tokens_median": median([len(g.prompt_token_ids) for g in groups])},
        "codec": codec, "zeromq": zeromq,
        "messages_per_step": per_step, "learner_step_s": step_s,
        "learner_step_source": source, "policy_update": update,
        "share_of_learner_step": share, "machine": machine(),
        "targets": {"transport_under_2pct_of_step": target(
            "learner CPU on one step's Group messages / learner step < 0.02", share, "<", 0.02)},
    }
    write_results(out_dir, results)
    print(report(results))
    print(f"results: {out_dir / 'results.json'}")
    return results


def report(results: dict) -> str:
    c, z = results["codec"], results["zeromq"]
    table = markdown_table(
        ["bytes/msg", "encode msg/s", "decode msg/s", "zeromq msg/s", "learner us/msg",
         "msgs/step", "learner step s", "share of step"],
        [[c["bytes_per_message"], c["encode_per_s"], c["decode_per_s"], z["messages_per_s"],
          z["learner_cpu_s_per_message"] * 1e6, results["messages_per_step"],
          results["learner_step_s"], f"{100 * (results['share_of_learner_step'] or 0):.3f}%"]])
    return f"{table}\n{targets_table(results['targets'])}"


# ---- the command line: `rlvr bench transport` (rlvr/bench/cli.py lists this module) ----

HELP = "ZeroMQ + codec messages/s and their share of a step"
NEEDS_CONFIG = False


def add_arguments(p) -> None:
    p.add_argument("--messages", type=int, default=2000, help="Group messages to send")
    p.add_argument("--step-s", type=float,
                   help="learner step seconds to compare with (default: measure policy_update)")


def check(args) -> str | None:
    return None


def main(args, out: Path, overrides: list[str]) -> None:
    run(args.config, out, with_steps(overrides, args.steps), args.messages, args.step_s)
