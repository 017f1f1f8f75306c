"""The learner's side of the ZeroMQ conversation: actors, work hand-out and group ingest.

The learner is the run's coordinator. It hands out prompts as `Work` items, as many as the
staleness bound admits (learner/admission.py). Groups are ingested at most once per group id, so
a prompt handed out twice (after an actor died) is never counted twice.

Actors come and go. An actor is lost when it stays silent longer than the heartbeat timeout,
when a message to it cannot be delivered (ZeroMQ knows its connection closed), or when it says
hello again from a new process (a restart). A process whose connection closed or that was
replaced stays dead: heartbeats it sent before it died, read only afterwards, do not bring it
back (a slow actor reaped for silence does come back when it beats again). Its in-flight prompts are then handed out again,
first in line, with their group ids (no extra admission slot: they were counted once). Work
goes only to the members of the current weight group (they hold the weights); when the live
actors differ from the members, the learner forms a new group (`sync_weights(new_epoch=True)`)
before any more work goes out.

A checkpoint keeps every prompt handed out whose group the trainer has not taken (`handed`:
in flight, waiting to be reissued, or returned and ready), with the admission slots and the
counters; a resumed coordinator hands those prompts out again first (`load_state_dict`), so a
resume neither skips a prompt nor trains one twice.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import msgspec

from learner.admission import Admission
from learner.data import PromptSource, rollout_spec
from protocol.config import Config
from protocol.messages import (PROTOCOL_VERSION, EvalResult, Group, Heartbeat, Hello, Prompt,
                               Shutdown, SyncWeights)
from protocol.transport import LearnerEndpoint, PeerGone, TransportError

log = logging.getLogger(__name__)


@dataclass
class ActorState:
    actor_id: int
    peer: bytes
    host: str
    pid: int
    last_seen: float
    inflight: dict[str, Prompt] = field(default_factory=dict)  # group_id -> prompt handed out
    rank: int = 0  # rank in the current weight group; 0 = not a member yet (no weights)


def run_coordinator(cfg: Config, endpoint: LearnerEndpoint, prompts: Iterator[Prompt], counts,
                    version: int = 0) -> Coordinator:
    """The coordinator of a run of `cfg` at policy `version`: `prompts` sized by the rollout
    policy (and, for HORA, given their `counts` at hand-out), a generation batch of groups
    admitted per version in work items of `cfg.work_size`, within the admitted staleness; the
    slots of `version` generation batches taken (a resumed run's)."""
    batch = cfg.generation_batch
    return Coordinator(endpoint, Admission(PromptSource(cfg, prompts, counts), rollout_spec(cfg),
                                           batch, cfg.work_size, cfg.staleness,
                                           slots_taken=version * batch))


class Coordinator:
    def __init__(self, endpoint: LearnerEndpoint, admission: Admission):
        self.endpoint = endpoint
        self.admission = admission
        self.actors: dict[bytes, ActorState] = {}
        self.ready: list[Group] = []
        self.seen_groups: set[str] = set()
        self.stats = Counter()
        # every prompt handed out whose group the trainer has not taken yet (in flight, waiting
        # to be reissued, or returned and ready), in hand-out order: what a checkpoint keeps
        self.handed: dict[str, Prompt] = {}
        self.epoch = 0  # the weight group's epoch; members are the actors with rank > 0
        self.members: frozenset[bytes] = frozenset()
        self._ids_seen: set[int] = set()
        self.departed: set[bytes] = set()  # peers known dead: connection closed, or replaced
        self.lost: dict[bytes, ActorState] = {}  # taken for dead, maybe only slow: see _beat
        self.on_eval = None  # run.eval_on actors: takes each EvalResult (learner/actor_eval.py)
        self.sync_seconds: list[float] = []  # Heartbeat.sync_s of each sync, as reported
        self._sync_reported: dict[bytes, int] = {}  # peer -> the version of its last one

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
                self._hello(peer, msg, now)
            case Heartbeat():
                self._beat(peer, msg, now)
            case Group():
                self._ingest(peer, msg, now)
            case EvalResult() if self.on_eval is not None:
                if peer in self.actors:
                    self.actors[peer].last_seen = now
                self.on_eval(msg)
            case _:
                self.stats["protocol/unexpected_kind"] += 1
        return True

    def drain(self) -> None:
        """Handle every message already waiting (heartbeats queue up while the learner trains)."""
        while self.poll(0.0):
            pass

    def _hello(self, peer: bytes, msg: Hello, now: float) -> None:
        for old in [a for a in self.actors.values() if a.actor_id == msg.actor_id and a.peer != peer]:
            self.lose(old, f"restarted as pid {msg.pid}", departed=True)
        if msg.actor_id in self._ids_seen:
            self.stats["faults/actor_restarts"] += 1
        self._ids_seen.add(msg.actor_id)
        self.actors[peer] = ActorState(msg.actor_id, peer, msg.host, msg.pid, now)
        log.info("actor %d joined from %s pid %d", msg.actor_id, msg.host, msg.pid)

    def _beat(self, peer: bytes, msg: Heartbeat, now: float) -> None:
        if peer in self.actors:
            self.actors[peer].last_seen = now
            # every heartbeat repeats it: one value per actor and version
            if msg.sync_s > 0 and self._sync_reported.get(peer) != msg.policy_version:
                self._sync_reported[peer] = msg.policy_version
                self.sync_seconds.append(msg.sync_s)
        elif peer in self.departed or any(a.actor_id == msg.actor_id for a in self.actors.values()):
            # queued before its process died or was replaced, read only now: a comeback here
            # would put a dead peer into the next weight group and count its loss twice
            self.stats["faults/late_heartbeats"] += 1
        else:  # taken for dead while it was only slow (e.g. stuck in a failed sync)
            actor = self.lost.pop(peer, None) or ActorState(msg.actor_id, peer, "?", 0, now)
            actor.last_seen, actor.inflight = now, {}  # its prompts were handed out again
            if peer not in self.members:  # a group was formed without it: a newcomer
                actor.rank = 0
            # else it is still in the weight group it never left, with its rank: without it,
            # work would go to no one while the unchanged group formed no new epoch
            self.actors[peer] = actor
            log.warning("actor %d is alive after all: it rejoins", msg.actor_id)

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
                                   f"within {timeout_s:.0f} s (actors.start_timeout_s)")
            self.poll(0.1)

    # -- faults -----------------------------------------------------------------------------
    def lose(self, actor: ActorState, why: str, departed: bool = False) -> None:
        """Take `actor` for dead: forget it and hand its in-flight prompts out again. A
        `departed` one (connection closed, or replaced by a restart) cannot come back."""
        if departed:
            self.departed.add(actor.peer)
            self.lost.pop(actor.peer, None)
        if self.actors.pop(actor.peer, None) is None:
            return
        if not departed:
            self.lost[actor.peer] = actor
        pending = [p for p in actor.inflight.values() if p.group_id not in self.seen_groups]
        self.admission.reissue.extend(pending)
        self.stats["faults/actors_lost"] += 1
        self.stats["faults/prompts_reissued"] += len(pending)
        log.warning("actor %d (pid %d) lost: %s; %d in-flight prompts handed out again",
                    actor.actor_id, actor.pid, why, len(pending))

    def reap(self, timeout_s: float) -> list[ActorState]:
        """Lose every actor silent for longer than `timeout_s`; returns them. Messages waiting
        are read first: while the learner was busy (a broadcast that timed out waits 20 s) a
        live actor's heartbeats queue up unread, and judged before them it looks silent; it
        would be lost, come back on its next heartbeat, and count as a loss that never was."""
        self.drain()
        now = time.monotonic()
        silent = [a for a in self.actors.values() if now - a.last_seen > timeout_s]
        for a in silent:
            self.lose(a, f"silent for {now - a.last_seen:.1f} s")
        return silent

    @property
    def membership_changed(self) -> bool:
        """The live actors are not the weight group's members: form a new group."""
        return self.members != frozenset(self.actors)

    # -- hand-out ---------------------------------------------------------------------------
    def admit(self, version: int, bound: int | None = None) -> int:
        """Hand out as much work as the staleness bound allows, to the weight group's members;
        returns the prompts handed out. `bound` replaces the admitted staleness for this call (a
        Mu-GRPO stage of L steps admits its L steps' groups at once: version = the stage's,
        bound = L - 1). Prompts of lost actors go first: their slots are already counted."""
        handed = 0
        members = [a for a in self.actors.values() if a.rank > 0]
        while members and (work := self.admission.next_work(version, self.seen_groups, bound)):
            actor = min(members, key=lambda a: (len(a.inflight), a.actor_id))
            handed += len(work.prompts)
            actor.inflight.update((p.group_id, p) for p in work.prompts)
            self.handed.update((p.group_id, p) for p in work.prompts)
            try:
                self.endpoint.send(actor.peer, work)
            except TransportError as e:  # gone: these prompts join the reissue queue
                members.remove(actor)
                self.lose(actor, f"work not delivered: {e}", departed=isinstance(e, PeerGone))
        return handed

    def release(self, groups: int) -> None:
        """Groups dropped (stale, or filtered by DAPO's dynamic sampling) free their admission
        slots, so more prompts are handed out in their place."""
        self.admission.release(groups)

    def take(self, count: int, keep_pending: bool = False) -> list[Group]:
        """Up to `count` returned groups, in arrival order. With `keep_pending` their prompts
        stay `handed` (a checkpoint keeps them) until `trained` is called: groups that wait at
        the learner (stale_inject's delay line, docs/ALGORITHMS.md 8.2b) are not trained yet."""
        taken, self.ready = self.ready[:count], self.ready[count:]
        if not keep_pending:
            self.trained([g.group_id for g in taken])
        return taken

    def take_in_handout_order(self, count: int, keep_pending: bool = False) -> list[Group]:
        """`count` returned groups in the order their prompts were handed out, or none while
        fewer are ready (run.deterministic: with several actors the arrival order follows their
        timing, and so would the order the learner observes and trains them in)."""
        if len(self.ready) < count:
            return []
        taken = self.in_handout_order(self.take(count, keep_pending=True))
        if not keep_pending:
            self.trained([g.group_id for g in taken])
        return taken

    def in_handout_order(self, groups: list[Group]) -> list[Group]:
        """These groups, sorted by when their prompts were first handed out (a reissued prompt
        keeps its place). Pending ones only (taken with `keep_pending`, not trained yet) have a
        place: any other goes last, in the order given, as it would be trained without this."""
        place = {group_id: i for i, group_id in enumerate(self.handed)}
        return sorted(groups, key=lambda g: place.get(g.group_id, len(place)))

    def trained(self, group_ids: list[str]) -> None:
        """These groups are consumed (trained, filtered or dropped): a checkpoint forgets them."""
        for group_id in group_ids:
            self.handed.pop(group_id, None)

    def fault_metrics(self) -> dict:
        """Cumulative counts of what went wrong and was survived, and the live actors."""
        stats = self.stats
        return {"faults/actors_lost": stats["faults/actors_lost"],
                "faults/actor_restarts": stats["faults/actor_restarts"],
                "faults/prompts_reissued": stats["faults/prompts_reissued"],
                "faults/weight_sync_failures": stats["faults/weight_sync_failures"],
                "faults/late_heartbeats": stats["faults/late_heartbeats"],
                "faults/weight_group_epoch": self.epoch,
                "groups/duplicates_ignored": stats["groups/duplicates_ignored"],
                "actors/live": len(self.actors)}

    # -- checkpoint -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """What a resumed run needs to lose no prompt and repeat none: the prompts handed out
        whose groups were not taken (they are handed out again, first, with their group ids),
        the admission slots, the weight group's epoch and the cumulative counters (faults/*)."""
        return {"slots_taken": self.admission.slots_taken, "epoch": self.epoch,
                "pending": [msgspec.to_builtins(p) for p in self.handed.values()],
                "stats": dict(self.stats)}

    def load_state_dict(self, state: dict) -> None:
        self.admission.slots_taken, self.epoch = state["slots_taken"], state["epoch"]
        pending = [msgspec.convert(p, Prompt) for p in state["pending"]]
        self.admission.reissue.extend(pending)
        self.handed.update((p.group_id, p) for p in pending)
        self.stats.update(state["stats"])

    # -- control ----------------------------------------------------------------------------
    def sync_weights(self, version: int, new_epoch: bool) -> bool:
        """Tell the weight group's members to join the broadcast of `version` now. With
        `new_epoch`, the group is first formed anew from the live actors (ranks 1.. by actor
        id). Returns False when a member could not be reached (it is then lost): the broadcast
        must not go ahead, and a new epoch must be formed."""
        if new_epoch:
            self.epoch += 1
            for a in self.actors.values():
                a.rank = 0
            for rank, a in enumerate(sorted(self.actors.values(), key=lambda a: a.actor_id), 1):
                a.rank = rank
            self.members = frozenset(self.actors)
        world_size = len(self.members) + 1
        reached = True
        for peer in sorted(self.members):
            actor = self.actors.get(peer)
            if actor is None:  # lost since the group was formed
                reached = False
                continue
            try:
                self.endpoint.send(peer, SyncWeights(
                    protocol_version=PROTOCOL_VERSION, policy_version=version,
                    group_epoch=self.epoch, rank=actor.rank, world_size=world_size))
            except TransportError as e:
                self.lose(actor, f"weight sync not delivered: {e}",
                          departed=isinstance(e, PeerGone))
                reached = False
        return reached

    def roster(self) -> dict[str, dict]:
        """The live actors, for processes.json."""
        return {str(a.actor_id): {"pid": a.pid, "host": a.host, "zmq_identity": a.peer.decode(
            errors="replace"), "weight_rank": a.rank, "weight_epoch": self.epoch if a.rank else None}
            for a in sorted(self.actors.values(), key=lambda a: a.actor_id)}

    def shutdown(self, version: int, reason: str) -> None:
        for actor in self.actors.values():
            try:
                self.endpoint.send(actor.peer, Shutdown(protocol_version=PROTOCOL_VERSION,
                                                        policy_version=version, reason=reason))
            except Exception as e:  # noqa: BLE001 - an actor already gone is fine at shutdown
                log.info("shutdown of actor %d: %s", actor.actor_id, e)
