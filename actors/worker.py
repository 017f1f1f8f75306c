"""The actor's loop: receive work, generate step by step, stream groups back, take new weights.

Between two decode steps the actor drains its messages: work goes to the per-prompt scheduler
(actors/stream.py, actors/scheduler.py), a prompt's group is sent the moment it is complete, and
a weight sync is served as `actors.inflight_update` says: `finish` waits until the samples
decoding are done (no new one starts meanwhile), `continue` loads the weights between two decode
steps and decodes on, `abort` drops the running samples and samples them again under the new
weights (one already started again `actors.abort_limit` times decodes on instead, so a response
longer than the time between syncs still ends), `recompute` stops them, keeps their tokens and
decodes on from prompt + partial response re-prefilled under the new weights. In sync mode
(bound 0) nothing is in flight when a sync arrives, so every policy stays exactly on-policy.

An `EvalWork` (`run.eval_on: actors`) is read after the sync that published its version: the
actor stops reading messages until the syncs before it are served, snapshots the weights it then
holds and decodes the evaluation beside its training rows (actors/evaluation.py); the next sync
is not held up by it. An actor that does not hold that version answers with a refusal.

A failed broadcast (another actor died in it) leaves this actor's weights half-written: it then
drops what it was decoding and generates nothing until the learner has formed a new weight group
and sent the weights again, and it beats at once so the learner knows it is alive. It also beats
all through a sync: a collective left waiting by a dead peer blocks for the whole
`weight_sync.timeout_s`, and the learner would otherwise take a silent live actor for dead.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from tasks.tiny_model import load_tokenizer

from actors.engines.factory import make_engine
from actors.evaluation import TRAINING_STEPS_PER_EVAL_STEP, ActorEval, refusal
from actors.stream import Rollouts, engine_load, to_group
from tasks.verifier import Verifier
from protocol.config import Config
from protocol.messages import (PROTOCOL_VERSION, EvalWork, Heartbeat, Hello, Shutdown,
                               SyncWeights, Work)
from protocol.transport import ActorEndpoint
from protocol.weights import WeightGroup, WeightSyncError, connect_store, sync_goes_ahead

log = logging.getLogger(__name__)


def engine_kwargs(cfg: Config, seed: int = 0) -> dict:
    """The engine's arguments; `seed`: this actor start's sampling seed (actors/seeds.py; the HF
    engine samples from torch's global generator, which actors/main.py seeds with it)."""
    if cfg.actors.engine == "hf":
        return dict(device=cfg.model.device, dtype=cfg.model.dtype, max_batch=cfg.actors.max_batch)
    a = cfg.actors
    return dict(device=cfg.model.device, dtype=cfg.model.dtype,
                gpu_memory_utilization=a.gpu_memory_utilization, kv_cache_gib=a.kv_cache_gib,
                enable_prefix_caching=a.enable_prefix_caching, max_model_len=a.max_model_len,
                enforce_eager=a.enforce_eager, seed=seed, max_batch=a.max_batch)


def while_beating(blocking: Callable[[], object], beat: Callable[[], None], every_s: float):
    """Run `blocking()` in a helper thread and return what it returns (or raise what it raises);
    meanwhile the calling thread, which owns the ZeroMQ socket (sockets are not thread-safe),
    calls `beat()` every `every_s`."""
    outcome: dict[str, object] = {}

    def target():
        try:
            outcome["value"] = blocking()
        except BaseException as e:  # noqa: BLE001 - handed to the caller as is
            outcome["error"] = e

    helper = threading.Thread(target=target, name="weight-sync", daemon=True)
    helper.start()
    while True:
        helper.join(every_s)
        if not helper.is_alive():
            break
        beat()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


class WeightMembership:
    """This actor's place in the learner's weight group, across the group's epochs. `beat` is
    called every `actors.heartbeat_s` while a sync blocks (waits for the learner's word, the
    rendezvous, the broadcast)."""

    def __init__(self, cfg: Config, engine, beat: Callable[[], None]):
        self.cfg, self.engine, self.beat = cfg, engine, beat
        self.store = connect_store(cfg.net.learner_host, cfg.net.weights_port,
                                   cfg.weight_sync.timeout_s)
        self.group: WeightGroup | None = None
        self.epoch: int | None = None
        self.version: int | None = None  # policy version of the weights; None = unusable

    def _blocking(self, call: Callable[[], object]):
        return while_beating(call, self.beat, self.cfg.actors.heartbeat_s)

    def sync(self, msg: SyncWeights) -> bool:
        """Join `msg`'s epoch if it is new, then receive the broadcast. False if it failed."""
        c = self.cfg
        try:
            if not self._blocking(lambda: sync_goes_ahead(self.store, msg.group_epoch,
                                                          msg.policy_version)):
                log.info("weight sync of version %d (epoch %d) called off by the learner",
                         msg.policy_version, msg.group_epoch)
                self.leave()  # the learner closes the group: a new epoch follows
                return False
            if msg.group_epoch != self.epoch:
                self.leave()
                self.group = self._blocking(lambda: WeightGroup.create(
                    c.net.learner_host, c.net.weights_port, msg.rank, msg.world_size,
                    c.weight_sync.timeout_s, c.weight_backend, epoch=msg.group_epoch,
                    store=self.store))
                self.epoch = msg.group_epoch
            self.version = None  # from here on a failure leaves half-written weights
            t0 = time.perf_counter()
            targets = self.engine.weight_targets()
            self._blocking(lambda: self.group.receive(targets, c.weight_sync.bucket_mb << 20))
            t1 = time.perf_counter()
            self.engine.commit_weights()
            self.version = msg.policy_version
            log.info("weights v%d live: receive %.3f s, commit %.3f s", msg.policy_version,
                     t1 - t0, time.perf_counter() - t1)  # read by `rlvr bench realshape`
            return True
        except WeightSyncError as e:
            log.warning("weight sync of version %d (epoch %d) failed: %s", msg.policy_version,
                        msg.group_epoch, e)
            self.leave()
            return False

    def leave(self) -> None:
        if self.group is not None:
            self.group.close()
        self.group, self.epoch = None, None


def newest_epoch_syncs(syncs: list[SyncWeights]) -> list[SyncWeights]:
    """The syncs to join, in order: an older epoch's are void once a newer one is announced."""
    if not syncs:
        return []
    newest = max(m.group_epoch for m in syncs)
    return [m for m in syncs if m.group_epoch == newest]


def run_actor(cfg: Config, actor_id: int, seed: int = 0) -> int:
    tokenizer = load_tokenizer(cfg.model.path)
    engine = make_engine(cfg.actors.engine, cfg.model.path, **engine_kwargs(cfg, seed))
    verifier = Verifier(cfg.actors.verifier_timeout_s, reward=cfg.task.reward)
    rollouts = Rollouts(engine, tokenizer, verifier, cfg.rollout.abort_on_first_correct,
                        every_verdict=cfg.run.deterministic)
    # the pid makes a restarted actor a new ZeroMQ peer (the learner then drops the old one)
    endpoint = ActorEndpoint(cfg.net.learner_host, cfg.net.zmq_port,
                             f"actor-{actor_id}-{os.getpid()}".encode(),
                             curve_dir=cfg.net.curve_dir or None, vocab_size=len(tokenizer))

    def send(msg_type, **kw):
        version = -1 if weights.version is None else weights.version
        endpoint.send(msg_type(protocol_version=PROTOCOL_VERSION, policy_version=version, **kw))

    def beat():
        send(Heartbeat, actor_id=actor_id, busy=rollouts.busy)

    weights = WeightMembership(cfg, engine, beat)
    send(Hello, actor_id=actor_id, host=socket.gethostname(), pid=os.getpid())
    syncs: list[SyncWeights] = []  # announced, not yet served
    announced_at = 0  # rollouts.decode_steps when the first of them arrived
    # an evaluation waits here until the syncs announced before it are served: its version is
    # then the one the actor holds; nothing more is read meanwhile (a later sync stays queued)
    eval_due: EvalWork | None = None
    evals: list[ActorEval] = []  # running on snapshots of their versions' weights
    last_beat = time.monotonic()
    try:
        while True:
            active = (rollouts.decoding or rollouts.verify.pending or bool(syncs) or bool(evals)
                      or eval_due is not None)
            msg = endpoint.recv(0.0 if active else cfg.actors.heartbeat_s) if eval_due is None \
                else None
            while msg is not None:
                match msg:
                    case SyncWeights():
                        if not syncs:
                            announced_at = rollouts.decode_steps
                        syncs.append(msg)
                    case Shutdown():
                        log.info("shutdown at policy version %s", weights.version)
                        return 0
                    case Work():
                        rollouts.add_work(msg)  # held while a sync is pending or failed
                    case EvalWork():
                        eval_due = msg
                        break
                msg = endpoint.recv(0.0)
            if syncs and serve_syncs(cfg.actors.inflight_update, rollouts, weights, syncs,
                                     cfg.actors.abort_limit):
                log.info("weights of version %s in, %d decode steps after the sync was announced "
                         "(%s); %d samples decoding; at decode step %d", weights.version,
                         rollouts.decode_steps - announced_at, cfg.actors.inflight_update,
                         len(engine.running()), rollouts.decode_steps)
                syncs = []
                if weights.version is None:
                    last_beat = 0.0  # beat now: the learner is sorting out who is alive
            if eval_due is not None and not syncs:
                if weights.version != eval_due.policy_version or cfg.actors.engine != "hf":
                    why = (f"actors.engine {cfg.actors.engine} cannot keep a snapshot of the "
                           "weights" if cfg.actors.engine != "hf" else
                           f"this actor holds version {weights.version}")
                    log.warning("evaluation %s of version %d refused: %s", eval_due.eval_id,
                                eval_due.policy_version, why)
                    endpoint.send(refusal(eval_due, actor_id, why, eval_due.policy_version))
                else:
                    evals.append(ActorEval(eval_due, engine, tokenizer, verifier))
                    log.info("evaluation %s of version %d started: %d prompts x (%d samples + "
                             "greedy)", eval_due.eval_id, eval_due.policy_version,
                             len(eval_due.prompts), eval_due.k)
                eval_due = None
            training = rollouts.decoding  # evaluation: in the idle time first, else a share
            for result in rollouts.step(
                    wait_s=0.0 if any(ev.engine.unfinished() for ev in evals) else 0.002):
                version = -1 if weights.version is None else weights.version
                endpoint.send(to_group(result, actor_id, version, engine_load(rollouts)))
            for ev in list(evals):
                ev.step(decode=not training
                        or rollouts.decode_steps % TRAINING_STEPS_PER_EVAL_STEP == 0)
                if ev.done:
                    result = ev.result(actor_id)
                    endpoint.send(result)
                    log.info("evaluation %s sent: %d tokens in %.1f s", result.eval_id,
                             result.tokens, result.seconds)
                    ev.close()
                    evals.remove(ev)
            if time.monotonic() - last_beat >= cfg.actors.heartbeat_s:
                beat()
                last_beat = time.monotonic()
    finally:
        for ev in evals:
            ev.close()
        weights.leave()
        rollouts.close()
        verifier.close()
        endpoint.close()
        engine.close()


def serve_syncs(policy: str, rollouts: Rollouts, weights: WeightMembership,
                syncs: list[SyncWeights], abort_limit: int | None = None) -> bool:
    """Serve the announced syncs if `policy` lets them go ahead now; False = not yet (`finish`
    with samples still decoding: they go on, and nothing new starts meanwhile)."""
    match policy:
        case "finish":
            rollouts.hold()
            if rollouts.engine.running():
                return False
        case "abort":
            rollouts.drop_in_flight(abort_limit)
        case "recompute":
            rollouts.interrupt_in_flight()
        case "continue":
            pass
    for m in newest_epoch_syncs(syncs):  # every broadcast must be joined, in order
        if not weights.sync(m):
            if weights.version is None:  # decoded under half-written weights: sample them again
                rollouts.drop_in_flight()
            return True  # held until a later sync succeeds
    rollouts.engine.policy_version = weights.version
    rollouts.release()
    return True
