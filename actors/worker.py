"""The actor's loop: receive work, generate step by step, stream groups back, take new weights.

Between two decode steps the actor drains its messages: work goes to the per-prompt scheduler
(actors/rollouts.py, actors/scheduler.py), a prompt's group is sent the moment it is complete,
and a weight sync is served as `actors.inflight_update` says: `finish` waits until the samples
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
from actors.rollouts import Rollouts, engine_load, to_group
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
        self.last_sync_s = 0.0  # the last sync's receive and commit (Heartbeat.sync_s)

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
            self.last_sync_s = time.perf_counter() - t0
            log.info("weights v%d live: receive %.3f s, commit %.3f s", msg.policy_version,
                     t1 - t0, time.perf_counter() - t1)  # read by `rlvr bench realshape`
            self.beat()  # the learner hears of the sync's seconds now (sync/s)
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


class Actor:
    """One actor process: its engine, scheduler, verifier, endpoint and place in the weight
    group, and what it holds between two turns of its loop: the syncs announced and not yet
    served, an evaluation waiting for them, the evaluations running."""

    def __init__(self, cfg: Config, actor_id: int, seed: int = 0):
        self.cfg, self.actor_id = cfg, actor_id
        self.tokenizer = load_tokenizer(cfg.model.path)
        self.engine = make_engine(cfg.actors.engine, cfg.model.path, **engine_kwargs(cfg, seed))
        self.verifier = Verifier(cfg.actors.verifier_timeout_s, reward=cfg.task.reward)
        self.rollouts = Rollouts(self.engine, self.tokenizer, self.verifier,
                                 cfg.rollout.abort_on_first_correct,
                                 every_verdict=cfg.run.deterministic)
        # the pid makes a restarted actor a new ZeroMQ peer (the learner then drops the old one)
        self.endpoint = ActorEndpoint(cfg.net.learner_host, cfg.net.zmq_port,
                                      f"actor-{actor_id}-{os.getpid()}".encode(),
                                      curve_dir=cfg.net.curve_dir or None,
                                      vocab_size=len(self.tokenizer))
        self.weights = WeightMembership(cfg, self.engine, self.beat)
        self.syncs: list[SyncWeights] = []  # announced, not yet served
        self.announced_at = 0  # rollouts.decode_steps when the first of them arrived
        # an evaluation waits here until the syncs announced before it are served: its version
        # is then the one the actor holds; nothing more is read meanwhile (a later sync stays
        # queued)
        self.eval_due: EvalWork | None = None
        self.evals: list[ActorEval] = []  # running on snapshots of their versions' weights
        self.last_beat = time.monotonic()

    @property
    def version(self) -> int:
        """The policy version of the weights held; -1 while they are unusable."""
        return -1 if self.weights.version is None else self.weights.version

    def send(self, msg_type, **kw) -> None:
        self.endpoint.send(msg_type(protocol_version=PROTOCOL_VERSION,
                                    policy_version=self.version, **kw))

    def beat(self) -> None:
        self.send(Heartbeat, actor_id=self.actor_id, busy=self.rollouts.busy,
                  sync_s=self.weights.last_sync_s)

    def run(self) -> int:
        """Serve the learner until it says Shutdown; returns the exit code."""
        self.send(Hello, actor_id=self.actor_id, host=socket.gethostname(), pid=os.getpid())
        self.last_beat = time.monotonic()
        try:
            while not self._read_messages():
                self._serve_syncs()
                self._start_due_evaluation()
                self._decode()
                if time.monotonic() - self.last_beat >= self.cfg.actors.heartbeat_s:
                    self.beat()
                    self.last_beat = time.monotonic()
            log.info("shutdown at policy version %s", self.weights.version)
            return 0
        finally:
            self.close()

    def _read_messages(self) -> bool:
        """Take in the messages waiting (when idle, waiting up to a heartbeat for one); True at
        Shutdown. Nothing is read while an evaluation waits for the syncs before it."""
        if self.eval_due is not None:
            return False
        r = self.rollouts
        active = r.decoding or r.verify.pending or bool(self.syncs) or bool(self.evals)
        msg = self.endpoint.recv(0.0 if active else self.cfg.actors.heartbeat_s)
        while msg is not None:
            match msg:
                case SyncWeights():
                    if not self.syncs:
                        self.announced_at = r.decode_steps
                    self.syncs.append(msg)
                case Shutdown():
                    return True
                case Work():
                    r.add_work(msg)  # held while a sync is pending or failed
                case EvalWork():
                    self.eval_due = msg
                    return False
            msg = self.endpoint.recv(0.0)
        return False

    def _serve_syncs(self) -> None:
        c, r = self.cfg.actors, self.rollouts
        if not self.syncs or not serve_syncs(c.inflight_update, r, self.weights, self.syncs,
                                             c.abort_limit):
            return
        log.info("weights of version %s in, %d decode steps after the sync was announced (%s); "
                 "%d samples decoding; at decode step %d", self.weights.version,
                 r.decode_steps - self.announced_at, c.inflight_update,
                 len(self.engine.running()), r.decode_steps)
        self.syncs = []
        if self.weights.version is None:
            self.last_beat = 0.0  # beat now: the learner is sorting out who is alive

    def _start_due_evaluation(self) -> None:
        """Start the evaluation waiting, once the syncs before it are served, or refuse it."""
        due, engine = self.eval_due, self.cfg.actors.engine
        if due is None or self.syncs:
            return
        if self.weights.version != due.policy_version or engine != "hf":
            why = (f"actors.engine {engine} cannot keep a snapshot of the weights"
                   if engine != "hf" else f"this actor holds version {self.weights.version}")
            log.warning("evaluation %s of version %d refused: %s", due.eval_id,
                        due.policy_version, why)
            self.endpoint.send(refusal(due, self.actor_id, why, due.policy_version))
        else:
            self.evals.append(ActorEval(due, self.engine, self.tokenizer, self.verifier))
            log.info("evaluation %s of version %d started: %d prompts x (%d samples + greedy)",
                     due.eval_id, due.policy_version, len(due.prompts), due.k)
        self.eval_due = None

    def _decode(self) -> None:
        """One decode step of the training rows, sending the groups it completes, and of the
        evaluations (in the idle time first, else a share), sending those it completes."""
        training = self.rollouts.decoding
        wait_s = 0.0 if any(ev.engine.unfinished() for ev in self.evals) else 0.002
        for result in self.rollouts.step(wait_s=wait_s):
            self.endpoint.send(to_group(result, self.actor_id, self.version,
                                        engine_load(self.rollouts)))
        for ev in list(self.evals):
            ev.step(decode=not training
                    or self.rollouts.decode_steps % TRAINING_STEPS_PER_EVAL_STEP == 0)
            if ev.done:
                result = ev.result(self.actor_id)
                self.endpoint.send(result)
                log.info("evaluation %s sent: %d tokens in %.1f s", result.eval_id,
                         result.tokens, result.seconds)
                ev.close()
                self.evals.remove(ev)

    def close(self) -> None:
        for ev in self.evals:
            ev.close()
        self.weights.leave()
        self.rollouts.close()
        self.verifier.close()
        self.endpoint.close()
        self.engine.close()


def run_actor(cfg: Config, actor_id: int, seed: int = 0) -> int:
    return Actor(cfg, actor_id, seed).run()


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
