"""The learner's side of the ZeroMQ conversation: actors, work hand-out and group ingest.

The learner is the run's coordinator. It hands out prompts as `Work` items, so it can bound
staleness by admission (ALGORITHMS.md 8.2): a group is handed out only while
`submitted + 1 <= (version + max_staleness + 1) * groups_per_step`, counting a group whose
samples were dropped as stale as never submitted. Groups are ingested at most once per group id,
so a prompt handed out twice (after an actor died) is never counted twice.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from learner.staleness import may_admit
from protocol.messages import (PROTOCOL_VERSION, Group, Heartbeat, Hello, Prompt, RolloutSpec,
                               Shutdown, SyncWeights, Work)
from protocol.transport import LearnerEndpoint

log = logging.getLogger(__name__)


@dataclass
class ActorState:
    actor_id: int
    peer: bytes
    last_seen: float
    inflight: dict[str, Prompt] = field(default_factory=dict)  # group_id -> prompt handed out


class Coordinator:
    def __init__(self, endpoint: LearnerEndpoint, prompts: Iterator[Prompt], rollout: RolloutSpec,
                 groups_per_step: int, prompts_per_work: int, max_staleness: int,
                 submitted: int = 0):
        self.endpoint = endpoint
        self.prompts = prompts
        self.rollout = rollout
        self.groups_per_step = groups_per_step
        self.prompts_per_work = prompts_per_work
        self.max_staleness = max_staleness
        self.actors: dict[bytes, ActorState] = {}
        self.ready: list[Group] = []
        self.seen_groups: set[str] = set()
        # groups handed out and not released by a drop; a resumed run starts as if every
        # earlier step's groups had been handed out (version x groups_per_step)
        self.submitted = submitted
        self.stats = Counter()
        self._work_seq = 0

    # -- messages ---------------------------------------------------------------------------
    def poll(self, timeout_s: float) -> bool:
        """Handle at most one incoming message; True if one arrived."""
        got = self.endpoint.recv(timeout_s)
        if got is None:
            return False
        peer, msg = got
        now = time.monotonic()
        match msg:
            case Hello():
                self.actors[peer] = ActorState(msg.actor_id, peer, now)
                log.info("actor %d joined from %s pid %d", msg.actor_id, msg.host, msg.pid)
            case Heartbeat():
                if peer in self.actors:
                    self.actors[peer].last_seen = now
            case Group():
                self._ingest(peer, msg, now)
            case _:
                self.stats["protocol/unexpected_kind"] += 1
        return True

    def _ingest(self, peer: bytes, group: Group, now: float) -> None:
        actor = self.actors.get(peer)
        if actor is not None:
            actor.last_seen = now
            actor.inflight.pop(group.group_id, None)
        if group.group_id in self.seen_groups:
            self.stats["groups/duplicates_ignored"] += 1
            return
        self.seen_groups.add(group.group_id)
        self.ready.append(group)

    def wait_for_actors(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.actors) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self.actors)} of {count} actors said hello "
                                   f"within {timeout_s:.0f} s")
            self.poll(0.1)

    # -- hand-out ---------------------------------------------------------------------------
    def admit(self, version: int, max_staleness: int | None = None) -> int:
        """Hand out as much work as the staleness bound allows; returns groups handed out.
        `max_staleness` overrides the bound for this call (a Mu-GRPO stage of L steps admits
        its L steps' groups at once: version = the stage's, bound = L - 1)."""
        bound = self.max_staleness if max_staleness is None else max_staleness
        handed = 0
        while self.actors:
            allowed = 0
            while (allowed < self.prompts_per_work and may_admit(
                    self.submitted + allowed, version, bound, self.groups_per_step)):
                allowed += 1
            if allowed == 0:
                break
            actor = min(self.actors.values(), key=lambda a: (len(a.inflight), a.actor_id))
            prompts = [next(self.prompts) for _ in range(allowed)]
            self._work_seq += 1
            work = Work(protocol_version=PROTOCOL_VERSION, policy_version=version,
                        work_id=f"w{self._work_seq}", prompts=prompts, rollout=self.rollout)
            self.endpoint.send(actor.peer, work)
            actor.inflight.update((p.group_id, p) for p in prompts)
            self.submitted += allowed
            handed += allowed
        return handed

    def release(self, groups: int) -> None:
        """Groups dropped (stale, or filtered by DAPO's dynamic sampling) free their admission
        slots, so more prompts are handed out in their place."""
        self.submitted -= groups

    def take(self, count: int) -> list[Group]:
        taken, self.ready = self.ready[:count], self.ready[count:]
        return taken

    # -- control ----------------------------------------------------------------------------
    def sync_weights(self, version: int) -> None:
        for actor in self.actors.values():
            self.endpoint.send(actor.peer, SyncWeights(protocol_version=PROTOCOL_VERSION,
                                                       policy_version=version))

    def shutdown(self, version: int, reason: str) -> None:
        for actor in self.actors.values():
            try:
                self.endpoint.send(actor.peer, Shutdown(protocol_version=PROTOCOL_VERSION,
                                                        policy_version=version, reason=reason))
            except Exception as e:  # noqa: BLE001 - an actor already gone is fine at shutdown
                log.info("shutdown of actor %d: %s", actor.actor_id, e)
