"""The actor's loop: receive work, sample and score groups, stream them back, take new weights.

Messages from the learner are drained into a local queue between work items, and weight syncs
are served before any queued work: a sync only makes the weights newer, so the staleness bound
the learner enforces at admission still holds, and the learner never waits in a broadcast for
more than the one work item the actor is in the middle of.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque

from transformers import AutoTokenizer

from actors.engines import make_engine
from actors.rollout import sample_work
from actors.verifier import Verifier
from protocol.config import Config
from protocol.messages import PROTOCOL_VERSION, Heartbeat, Hello, Shutdown, SyncWeights, Work
from protocol.transport import ActorEndpoint
from protocol.weights import WeightGroup

log = logging.getLogger(__name__)


def engine_kwargs(cfg: Config) -> dict:
    if cfg.actors.engine == "hf":
        return dict(device=cfg.model.device, dtype=cfg.model.dtype, max_batch=cfg.actors.max_batch)
    a = cfg.actors
    return dict(dtype=cfg.model.dtype, gpu_memory_utilization=a.gpu_memory_utilization,
                enable_prefix_caching=a.enable_prefix_caching, max_model_len=a.max_model_len,
                enforce_eager=a.enforce_eager, seed=cfg.run.seed)


def run_actor(cfg: Config, actor_id: int) -> int:
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    engine = make_engine(cfg.actors.engine, cfg.model.path, **engine_kwargs(cfg))
    verifier = Verifier(cfg.actors.verifier_timeout_s)
    endpoint = ActorEndpoint(cfg.net.learner_host, cfg.net.zmq_port, f"actor-{actor_id}".encode(),
                             curve_dir=cfg.net.curve_dir or None,
                             vocab_size=len(tokenizer))
    version = -1

    def send(msg_type, **kw):
        endpoint.send(msg_type(protocol_version=PROTOCOL_VERSION, policy_version=version, **kw))

    send(Hello, actor_id=actor_id, host=socket.gethostname(), pid=os.getpid())
    weights = WeightGroup.create(cfg.net.learner_host, cfg.net.weights_port, actor_id + 1,
                                 cfg.actors.count + 1, cfg.weight_sync.timeout_s,
                                 cfg.weight_backend)
    queue: deque = deque()
    last_beat = time.monotonic()
    try:
        while True:
            msg = endpoint.recv(0.0 if queue else cfg.actors.heartbeat_s)
            while msg is not None:
                queue.append(msg)
                msg = endpoint.recv(0.0)
            syncs = [m for m in queue if isinstance(m, SyncWeights)]
            for m in syncs:  # every broadcast must be joined, in order
                weights.receive(engine.weight_targets(), cfg.weight_sync.bucket_mb << 20)
                engine.commit_weights()
                version = m.policy_version
            queue = deque(m for m in queue if not isinstance(m, SyncWeights))
            if any(isinstance(m, Shutdown) for m in queue):
                log.info("shutdown at policy version %d", version)
                return 0
            if queue:
                work = queue.popleft()
                if isinstance(work, Work):
                    for group in sample_work(engine, tokenizer, verifier, work, actor_id, version):
                        endpoint.send(group)
            if time.monotonic() - last_beat >= cfg.actors.heartbeat_s:
                send(Heartbeat, actor_id=actor_id, busy=bool(queue))
                last_beat = time.monotonic()
    finally:
        weights.close()
        verifier.close()
        endpoint.close()
